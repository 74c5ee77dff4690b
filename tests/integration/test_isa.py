"""The CPU-class emulation is what vLLM sees: in every process of a cell, and in vLLM's own
decisions (the kernel library it loads, the SSM state dtype it settles on, the size).

A class above this host's cannot be emulated; its tests skip, naming the missing flags.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvrig.column.one_cell import run_and_judge
from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import load
from kvrig.host import hardware, isa
from kvrig.run.cell import ISA_BOOT, emulation_env

ROOT = Path(__file__).resolve().parents[2]
FLAGS = hardware.cpu_flags()
ARCH = hardware.cpu_info()["arch"]

CHILD = textwrap.dedent(
    """
    import json, multiprocessing as mp, os, sys

    def report(q):
        import torch
        caps = torch.cpu.get_capabilities()
        q.put({"pid": os.getpid(), "class": caps.get("kvrig_isa"),
               "avx512": torch.cpu._is_avx512_supported(),
               "avx512_bf16": torch.cpu._is_avx512_bf16_supported(),
               "amx": torch.cpu._is_amx_tile_supported(),
               "aten": os.environ.get("ATEN_CPU_CAPABILITY")})

    if __name__ == "__main__":
        seen = []
        q = mp.get_context("spawn").Queue()
        report(q)
        seen.append(("main", q.get(timeout=60)))
        for method in ("spawn", "fork", "forkserver"):
            ctx = mp.get_context(method)
            q = ctx.Queue()
            p = ctx.Process(target=report, args=(q,))
            p.start()
            seen.append((method, q.get(timeout=120)))
            p.join()
        print(json.dumps(seen))
    """
)


def emulable(cls: str) -> None:
    try:
        isa.resolve(cls, FLAGS, ARCH)
    except isa.IsaError as exc:
        pytest.skip(f"cannot emulate {cls} here: {exc}")


def cell(case: str, cls: str) -> Cell:
    cells = expand(load(ROOT / "matrix.yaml"), "cpu", isa=cls, emulated=True)
    return next(c for c in cells if c.id == f"cpu-{cls}-{case}")


@pytest.mark.parametrize("cls", isa.CLASSES)
def test_every_interpreter_of_an_emulated_cell_sees_its_class(tmp_path: Path, cls: str) -> None:
    emulable(cls)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {
        **dict(__import__("os").environ),
        **emulation_env(cell("granite_hybrid-default", cls), None),
    }
    assert env["PYTHONPATH"].split(":")[0] == str(ISA_BOOT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr
    facts = isa.facts(cls)
    for where, seen in json.loads(done.stdout.splitlines()[-1]):
        assert seen["class"] == cls, where
        assert seen["avx512"] == facts.avx512, where
        assert seen["avx512_bf16"] == facts.avx512_bf16, where
        assert seen["amx"] == facts.amx, where
        assert seen["aten"] == isa.ATEN_CAPABILITY[cls], where


def vllm_view(case: str, cls: str, tmp_path: Path) -> tuple[dict, object]:
    judged = run_and_judge(cell(case, cls), tmp_path / "results")
    return judged.record.isa_view or {}, judged


@pytest.mark.parametrize("cls", isa.CLASSES)
def test_vllm_loads_the_kernels_and_keeps_the_state_its_class_gets(
    tmp_path: Path, cls: str
) -> None:
    """A fresh interpreter per cell (no warm parent), the multiprocess engine: what the
    worker's vLLM saw, against vllm/platforms/cpu.py's decisions for the class."""
    emulable(cls)
    facts = isa.facts(cls)
    seen, judged = vllm_view("granite_hybrid-sibling_rejects_mp", cls, tmp_path)
    assert seen.get("emulated_class") == cls
    assert seen["kernel_libraries"] == [facts.kernel_library]
    assert (seen["avx512"], seen["avx512_bf16"], seen["amx"]) == (
        facts.avx512,
        facts.avx512_bf16,
        facts.amx,
    )
    state = seen["mamba_ssm_cache_dtype"]
    assert state == ("float32" if facts.resets_ssm_to_float32 else "auto")
    assert judged.verdict.passed, judged.verdict.reason  # its class's size, rejected early
