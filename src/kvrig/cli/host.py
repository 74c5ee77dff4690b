"""`kvrig isa`: this host's CPU class, its flags, and the classes a column can emulate here."""

from __future__ import annotations

import argparse
from typing import Any

from kvrig.host import hardware, isa


def cmd_isa(ns: argparse.Namespace, extra: list[str]) -> int:
    info = hardware.cpu_info()
    flags = hardware.cpu_flags()
    own = isa.host_class(flags, info["arch"])
    have = [f for f in hardware.ISA_FLAGS if f in flags]
    can = isa.emulatable(flags, info["arch"])
    if ns.lesser:  # for scripts: the classes below the host's own, space-separated
        print(" ".join(isa.lesser(flags, info["arch"])))
    elif ns.markdown:
        print(f"**CPU class:** {own or 'below avx2'} ({info['cpu_model']}, {info['arch']})  ")
        print(f"**flags:** {' '.join(have) or 'none'}  ")
        print(f"**can emulate:** {', '.join(can) or 'none'}")
    else:
        print(f"class:        {own or 'below avx2'}")
        print(f"cpu:          {info['cpu_model']} ({info['arch']}, {info['cores']} cores)")
        print(f"flags:        {' '.join(have) or 'none'}")
        print(f"can emulate:  {', '.join(can) or 'none'}")
    return 0


def register(sub: Any) -> None:
    i = sub.add_parser("isa", help="print this host's CPU class and what it can emulate")
    i.add_argument("--markdown", action="store_true", help="for a CI job summary")
    i.add_argument("--lesser", action="store_true", help="only the classes below the host's")
    i.set_defaults(run=cmd_isa)
