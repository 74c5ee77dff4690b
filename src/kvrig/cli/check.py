"""`kvrig check WHAT`: the proofs the nox sessions run beside the columns.

Each is red (exit 1) when what it proves does not hold, and refuses (exit 2, one
paragraph) when it cannot be proved here, so a host that cannot check is never green.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvrig.cli import reach
from kvrig.cli.usage import UsageError
from kvrig.containers import host_check, preflight
from kvrig.define import column_choice, gpus
from kvrig.define.paths import results_folder
from kvrig.provision import uv_cache
from kvrig.publish import container_check, mutation_check, seeded_mutations
from kvrig.rules import backend_facts
from kvrig.run import prefixed

SIDE_BY_SIDE = 2

BACKEND_FACTS = "backend-facts"


def cmd_host(ns: argparse.Namespace, extra: list[str]) -> int:
    """The host's readiness, or with --dry-run the plan's lines (exit 0, so a dry run shows
    the plan on any host)."""
    if ns.gpu_arch and ns.platform not in gpus.BY_ARCH:
        owner = gpus.arch_platform(ns.gpu_arch)
        raise preflight.PreflightError(
            f"--gpu-arch {ns.gpu_arch} names the architecture of the CUDA or ROCm GPU a column"
            f" runs on, and the {ns.platform} column has none: leave it out, or check that"
            f" column's host (`kvrig check host {owner} --gpu-arch {ns.gpu_arch}`)."
        )
    if ns.gpu_arch:  # a label no GPU could match is the command line's fault, dry or not
        column_choice.requested(ns.platform, gpu_arch=ns.gpu_arch)
    if ns.build_only:
        # A CPU runner builds (and pushes) the image that GPU runners pull: no device.
        print(
            f"{'# ' if ns.dry_run else 'kvrig: '}--build-only builds the {ns.platform} image"
            " and runs no column, so no device is needed"
        )
        return 0
    if ns.dry_run:
        lines = host_check.dry_run_lines(ns.platform, matrix=ns.matrix, gpu_arch=ns.gpu_arch)
        print("\n".join(lines))
        return 0
    if ns.platform == "cpu":
        print("kvrig: the cpu column needs no device; nothing to check before its container")
        return 0
    host_check.check_host(ns.platform, matrix=ns.matrix, gpu_arch=ns.gpu_arch)
    print(f"kvrig: this host has what the {ns.platform} column needs before its container")
    return 0


def cmd_container(ns: argparse.Namespace, extra: list[str]) -> int:
    matrix = Path(ns.matrix) if ns.matrix else None
    return container_check.in_container(extra, matrix, emulate=ns.emulate)


def cmd_mutation(ns: argparse.Namespace, extra: list[str]) -> int:
    devices = ns.emulate or []
    for device in devices:
        try:
            gpus.gpu(*mutation_check.emulated_device(device))
        except gpus.GpuError as exc:
            raise UsageError(
                f"--emulate {device}: {exc} (a CUDA architecture alone, 9.0, or a device"
                " as kvrig emulated --only names it: rocm:gfx942, xpu:bmg)"
            ) from None
    if len(devices) > 1:
        return _mutation_beside(ns, extra, devices)
    options = mutation_check.Options(
        container=ns.container,
        emulate=devices[0] if devices else None,
        patch=ns.patch,
        results=ns.results,
        matrix=ns.matrix,
        pytest_args=tuple(extra),
        vllm=ns.vllm,
    )
    if ns.seeded:
        if ns.container:
            raise UsageError(
                "--seeded runs on this host or an emulated device's column (--emulate); the"
                " CPU image runs the early-check mutation only. Leave --container out."
            )
        return seeded_mutations.run(options)
    return mutation_check.run(options)


def _mutation_beside(ns: argparse.Namespace, extra: list[str], devices: list[str]) -> int:
    """Each device's check in a process of its own, two side by side (each mostly waits on
    one import of vLLM), its lines prefixed by the device; 1 if any is red, else the
    highest exit code."""
    if ns.results:
        raise UsageError(
            "--results names one check's folder, and several --emulate devices each write"
            " their own: leave --results out, or check one device at a time."
        )
    options = [
        *(["--patch", ns.patch] if ns.patch != str(mutation_check.PATCH) else []),
        *(["--seeded"] if ns.seeded else []),
        *(["--vllm", ns.vllm] if ns.vllm else []),
    ]
    matrix = ["--matrix", ns.matrix] if ns.matrix else []
    pytest_args = mutation_check.one_worker(tuple(extra))
    commands = [
        [sys.executable, "-m", "kvrig", *matrix, "check", "mutation", "--emulate", device,
         *options, "--", *pytest_args]
        for device in devices
    ]  # fmt: skip
    with ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        codes = list(pool.map(prefixed.run, devices, commands))
    return 1 if 1 in codes else max(codes)


def cmd_uv_cache(ns: argparse.Namespace, extra: list[str]) -> int:
    file = Path(ns.file)
    return uv_cache.snapshot(file) if ns.action == "snapshot" else uv_cache.compare(file)


def backend_facts_file(platform: str, given: str | None) -> Path:
    return Path(given) if given else results_folder(BACKEND_FACTS) / f"{platform}.json"


def cmd_backend_facts(ns: argparse.Namespace, extra: list[str]) -> int:
    """1 when a backend kvrig's table restates declares other sizes in this vLLM; a backend
    vLLM cannot answer for here is listed with why, as unchecked."""
    # vLLM's platform follows the device it was built for; name it before vLLM imports.
    os.environ.setdefault("VLLM_TARGET_DEVICE", ns.platform)
    from kvrig.run import backend_answers

    version, answers = backend_answers.ask_vllm()
    out = backend_facts_file(ns.platform, ns.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"vllm": version, "answers": answers}, indent=2))
    findings = backend_facts.compare(ns.platform, answers)
    readable = sum(1 for f in findings if f.status != "unreadable")
    print(f"vLLM {version}: {readable} of {len(answers)} backends answered ({ns.platform})")
    for f in findings:
        print(f.line)
    for f in backend_facts.unchecked(findings, ns.platform):
        print(f"unchecked: {f.line}")
    print(f"vLLM's answers: {out}")
    bad = backend_facts.failed(findings)
    if bad:
        print(f"{len(bad)} backend(s) of kvrig's table differ from vLLM's:", file=sys.stderr)
        for f in bad:
            print(f"  {f.line}", file=sys.stderr)
    return 1 if bad else 0


def register(sub: Any) -> None:
    c = sub.add_parser("check", help="the proofs beside the columns (host, container, mutation)")
    what = c.add_subparsers(dest="what", required=True, metavar="WHAT")
    h = what.add_parser(
        "host",
        help="a GPU host has its device, driver and container toolkit, before anything is"
        " installed or built",
    )
    h.add_argument("platform", choices=("cpu", "cuda", "xpu", "rocm"))
    h.add_argument(
        "--gpu-arch",
        metavar="ARCH",
        help="the CUDA or ROCm architecture the column is for (a runner's sm90 or gfx942"
        " label); the GPU must be one. The column's other arguments may follow, and are not"
        " read here",
    )
    h.add_argument(
        "--build-only",
        action="store_true",
        help="the image is only built (kvrig container --build-only): nothing is checked",
    )
    h.add_argument(
        "--dry-run",
        action="store_true",
        help="print what a run would stop at, and what the container-engine set-up would do,"
        " as comment lines of the plan; refuse nothing (exit 0)",
    )
    # `nox -s cuda -- ARGS` hands the column's arguments here too, for --gpu-arch,
    # --build-only and --dry-run.
    h.set_defaults(run=cmd_host, pytest_args=True)
    ct = what.add_parser(
        "container",
        help="the CPU column in its container (results/cpu-container), checked against the"
        " matrix and the host's run in results/cpu (extra args go to the column's pytest)",
        allow_abbrev=False,
    )
    ct.add_argument(
        "--emulate",
        metavar="ARCH",
        help="instead: the emulated CUDA column of this architecture in the CUDA image, no"
        " device passed in (results/cuda-<arch>-emulated-container), checked against the"
        " host's results/cuda-<arch>-emulated",
    )
    ct.set_defaults(run=cmd_container, pytest_args=True)
    m = what.add_parser(
        "mutation",
        help="every early_error cell turns red with vLLM's early check patched out (extra"
        " args go to the column's pytest)",
        allow_abbrev=False,
    )
    where = m.add_mutually_exclusive_group()
    where.add_argument(
        "--container", action="store_true", help="in the CPU image, built with the mutation"
    )
    where.add_argument(
        "--emulate",
        action="append",
        metavar="DEVICE",
        help="on an emulated device's column: a CUDA architecture (9.0), or cuda:9.0,"
        " rocm:gfx942, xpu:bmg; repeatable (two devices' checks run side by side)",
    )
    m.add_argument("--patch", default=str(mutation_check.PATCH), help="the mutation, a diff")
    m.add_argument(
        "--seeded",
        action="store_true",
        help="instead: each seeded change of a block-size branch the knobs reach"
        " (patches/seeded/) turns its cells red",
    )
    m.add_argument("--results", help="default: results/cpu-mutation[-container]")
    m.add_argument(
        "--vllm",
        metavar="RELEASE",
        help="with --emulate: this release instead of matrix.yaml's, in its own environment",
    )
    m.set_defaults(run=cmd_mutation, pytest_args=True)
    u = what.add_parser(
        "uv-cache",
        help="uv's cache of vLLM byte-identical to a snapshot (nothing wrote through an"
        " installed vLLM)",
    )
    u.add_argument("action", choices=("snapshot", "compare"))
    u.add_argument("file", help="the snapshot: written by snapshot, read by compare")
    u.set_defaults(run=cmd_uv_cache)
    b = what.add_parser(
        BACKEND_FACTS,
        help="kvrig's backend block-size table against the installed vLLM's own answers",
    )
    b.add_argument("--platform", required=True, choices=("cpu", "cuda", "xpu", "rocm"))
    b.add_argument("--json", help="vLLM's answers (default: results/backend-facts/<platform>.json)")
    b.set_defaults(run=cmd_backend_facts)
    reach.register(what)


USER_ERRORS = (preflight.PreflightError, uv_cache.UvCacheError)
