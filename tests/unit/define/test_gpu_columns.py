"""A real CUDA GPU's column carries its architecture (cuda-sm90): named, parsed, judged and
gated so, since the cells' outcomes depend on it (no GPU needed: fake records)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvrig.define import column_names, gpus
from kvrig.define.cells import expand
from kvrig.define.column_names import Column
from kvrig.define.matrix import Matrix
from kvrig.judge.verdict import Status, judge
from kvrig.publish import gate

from ..builders import gpu_matrix
from ..records import cell_row, configured


@pytest.mark.parametrize(
    ("name", "column"),
    [
        ("cpu", Column("cpu")),
        ("cpu-avx2", Column("cpu", isa="avx2")),
        ("xpu", Column("xpu")),
        ("cuda-sm90", Column("cuda", gpu_arch="9.0")),
        ("cuda-sm120", Column("cuda", gpu_arch="12.0")),
        ("cuda-sm90-emulated", Column("cuda", gpu_arch="9.0", device_emulated=True)),
        ("xpu-bmg-emulated", Column("xpu", gpu_arch="bmg", device_emulated=True)),
        ("rocm-gfx942-emulated", Column("rocm", gpu_arch="gfx942", device_emulated=True)),
        ("rocm-gfx1201-emulated", Column("rocm", gpu_arch="gfx1201", device_emulated=True)),
    ],
)
def test_a_column_name_is_read_back_as_made(name: str, column: Column) -> None:
    assert column_names.parse(name) == column
    assert column.name == name


@pytest.mark.parametrize(
    "name",
    ["cpu-mutation", "cuda-sm75", "cuda-sm90-overlay-1a2b", "rocm-gfx90a", "rocm-gfx90a-emulated"],
)
def test_a_side_run_or_unknown_name_is_no_column(name: str) -> None:
    assert column_names.parse(name) is None


def test_the_hardware_columns_carry_every_cuda_architecture_and_no_bare_cuda() -> None:
    columns = column_names.hardware_columns()
    assert "cuda" not in columns
    assert {"cpu", "xpu", "cuda-sm80", "cuda-sm90", "cuda-sm100", "cpu-avx2"} <= set(columns)
    assert not set(columns) & set(column_names.columns()[len(columns) :])  # emulated apart


def _real(arch: str = "9.0", **case: Any):
    return expand(Matrix.model_validate(gpu_matrix(**case)), "cuda", gpu_arch=arch)[0]


def _ran_on(cell: Any, host: dict[str, Any]) -> Any:
    return configured(
        cell,
        outcome="ran",
        tokens_generated=4,
        device_emulated=False,
        emulation=None,
        host=host,
    )


def test_a_real_cuda_cell_must_have_run_on_its_architecture() -> None:
    cell = _real("9.0")
    v = judge(cell, _ran_on(cell, {"gpu_compute_capability": "8.9"}))
    assert v.status is Status.FAIL
    assert "compute capability 8.9 GPU, and the cell is for 9.0" in v.reason
    v = judge(cell, _ran_on(cell, {}))
    assert v.status is Status.FAIL
    assert "names no GPU compute capability" in v.reason
    v = judge(cell, _ran_on(cell, {"gpu_compute_capability": "9.0"}))
    assert "compute capability" not in v.reason


def test_the_gate_reads_a_cuda_column_under_its_architectures_expectations() -> None:
    refused = {
        "8.0": {
            "why": "no sparse backend",
            "expect": {
                "outcome": "unsupported",
                "error": "ValueError",
                "match": "No valid attention backend",
                "function": "get_attn_backend_cls",
            },
        }
    }
    m = Matrix.model_validate(gpu_matrix(expect_by_arch=refused))
    [a100] = gate.column_cells(m, "cuda-sm80", [])
    [h100] = gate.column_cells(m, "cuda-sm90", [])
    assert (a100.id, a100.expect.outcome) == ("cuda-sm80-granite_hybrid-c", "unsupported")
    assert (h100.id, h100.expect.outcome) == ("cuda-sm90-granite_hybrid-c", "runs")
    assert gate.column_cells(m, "cuda-sm90-emulated", [])[0].device_emulated


def test_the_release_requires_one_column_per_ci_architecture() -> None:
    data = gpu_matrix()
    data["platforms"]["cuda"]["ci"] = {"archs": ["9.0", "sm100"]}
    data["release"] = {"columns": ["cpu", "cuda"]}
    m = Matrix.model_validate(data)
    assert m.required_columns == ["cpu", "cuda-sm90", "cuda-sm100"]
    # Another architecture's run found beside them is required too, and no side run is.
    found = ["cpu", "cuda-sm90", "cuda-sm89", "cpu-mutation"]
    assert gate.required_columns(m, found) == ["cpu", "cuda-sm90", "cuda-sm100", "cuda-sm89"]
    assert gate.named_columns(m, ["cuda", "cuda-sm90", "cpu"]) == [
        "cuda-sm90",
        "cuda-sm100",
        "cpu",
    ]


def test_an_allowance_names_a_cuda_cell_by_its_architecture() -> None:
    allowance = {"reason": "r", "owner": "o", "expires": "2099-01-01"}
    data = gpu_matrix()
    data["platforms"]["cuda"]["ci"] = {"archs": ["9.0"]}
    data["allowances"] = [{"cell": "cuda-sm90-granite_hybrid-c", **allowance}]
    Matrix.model_validate(copy.deepcopy(data))
    data["allowances"] = [{"cell": "cuda-granite_hybrid-c", **allowance}]
    with pytest.raises(ValueError, match="is not a cell of this matrix"):
        Matrix.model_validate(data)


def test_a_cells_rerun_names_its_gpu_architecture_or_its_emulated_device() -> None:
    from kvrig.publish import repro

    lines = repro.lines("cuda-sm90-granite_hybrid-c", "cuda-sm90")
    assert lines[0].endswith(
        "nox -s local -- --gpu-arch 9.0 --kvrig-cell cuda-sm90-granite_hybrid-c"
    )
    assert "nox -s cuda -- --gpu-arch 9.0 --kvrig-cell" in lines[1]
    assert "--platform cuda --results /results --gpu-arch 9.0" in lines[2]
    [emulated] = repro.lines("cuda-sm90-emulated-granite_hybrid-c", "cuda-sm90-emulated")
    assert emulated.endswith(
        "nox -s emulated -- --only cuda:9.0 --kvrig-cell cuda-sm90-emulated-granite_hybrid-c"
    )


def _real_rocm(arch: str = "gfx942") -> Any:
    data = gpu_matrix()
    data["platforms"]["rocm"] = {
        "vllm": {"kind": "image", "image": "vllm/vllm-openai-rocm:v0.34.0"},
        "base_image": "rocm/dev-ubuntu-24.04:7.0-complete",
        "default_backend": "ROCM_ATTN",
        "crafted_route": "custom",
    }
    data["cases"][0]["expect"] = {"rocm": {"outcome": "runs"}}
    return expand(Matrix.model_validate(data), "rocm", gpu_arch=arch)[0]


def test_a_real_rocm_cell_must_have_run_on_its_gfx_target() -> None:
    cell = _real_rocm("gfx942")
    assert cell.id == "rocm-gfx942-granite_hybrid-c" and not cell.device_emulated
    record = {"layer_backends": {"model.layers.1.self_attn.attn": "ROCM_ATTN"}}
    v = judge(cell, _ran_on(cell, {"gpu_gfx_target": "gfx950"}).model_copy(update=record))
    assert v.status is Status.FAIL
    assert "gfx target gfx950 GPU, and the cell is for gfx942" in v.reason
    v = judge(cell, _ran_on(cell, {}).model_copy(update=record))
    assert v.status is Status.FAIL
    assert "names no GPU gfx target (rocminfo and amd-smi" in v.reason
    v = judge(cell, _ran_on(cell, {"gpu_gfx_target": "gfx942"}).model_copy(update=record))
    assert v.status is Status.PASS, v.reason


def test_the_gate_requires_rocm_s_real_columns_never_its_emulated_ones() -> None:
    columns = column_names.hardware_columns()
    assert {"rocm-gfx942", "rocm-gfx950", "rocm-gfx1201"} <= set(columns)
    assert "rocm" not in columns and not [c for c in columns if c.endswith("-emulated")]


def _gated_gpu_matrix() -> Matrix:
    """gpu_matrix with a real ROCm platform beside CUDA, its case `c` gated on both."""
    data = gpu_matrix(gate=True)
    data["platforms"]["rocm"] = {
        "vllm": {"kind": "image", "image": "vllm/vllm-openai-rocm:v0.34.0"},
        "base_image": "rocm/dev-ubuntu-24.04:7.0-complete",
        "default_backend": "ROCM_ATTN",
        "crafted_route": "custom",
    }
    data["cases"][0]["expect"] = {"cuda": {"outcome": "runs"}, "rocm": {"outcome": "runs"}}
    return Matrix.model_validate(data)


SAW = {"cuda": ("9.0", "0.33.0"), "rocm": ("gfx942", "0.34.0")}


@pytest.mark.parametrize(
    ("platform", "claim", "said"),
    [
        ("cuda", {"gpu_arch": "8.0"}, "its gpu_arch is 8.0, and cuda-sm90's cells are for 9.0"),
        ("cuda", {"host": {"gpu_compute_capability": "8.0"}}, "compute capability 8.0 GPU"),
        ("rocm", {"host": {"gpu_gfx_target": "gfx950"}}, "gfx target gfx950 GPU, and rocm-gfx942"),
        ("rocm", {"host": {}}, "names no GPU gfx target its host saw"),
    ],
)
def test_the_gate_refuses_a_row_that_claims_another_device_than_its_column(
    platform: str, claim: dict[str, Any], said: str
) -> None:
    """The judge refuses such a record; a row edited, or filed under another runner's
    folder, is refused by the gate too."""
    import datetime as dt

    m = _gated_gpu_matrix()
    arch, pin = SAW[platform]
    cell = expand(m, platform, gpu_arch=arch)[0]
    host = {gpus.HOST_ARCH_KEY[platform]: arch}
    good = cell_row(cell, "pass", vllm_version=pin, host=host)
    today = dt.date(2026, 11, 29)
    assert gate.evaluate(m, [good], [cell.column], today).passed
    res = gate.evaluate(m, [{**good, **claim}], [cell.column], today)
    assert not res.passed
    assert any(line.startswith(f"FAIL    {cell.id}: ") and said in line for line in res.lines), (
        res.lines
    )
