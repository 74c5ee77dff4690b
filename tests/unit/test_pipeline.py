from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from kvrig import cli
from kvrig.define.matrix import Matrix, load
from kvrig.publish import pipeline

from .conftest import BASE

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = {
    "github": ROOT / ".github" / "workflows" / "kvrig.yml",
    "buildkite": ROOT / "ci" / "buildkite.yml",
}


@pytest.mark.parametrize("fmt", pipeline.FORMATS)
def test_committed_pipelines_are_what_matrix_yaml_generates(fmt: str) -> None:
    expected = pipeline.render(load(ROOT / "matrix.yaml"), fmt)
    assert COMMITTED[fmt].read_text() == expected, (
        f"{COMMITTED[fmt].relative_to(ROOT)} is out of date with matrix.yaml; regenerate it:"
        f" kvrig pipeline --format {fmt} --output {COMMITTED[fmt].relative_to(ROOT)}"
    )


def _matrix(shards: int = 1) -> Matrix:
    data = copy.deepcopy(BASE)
    data["platforms"]["cuda"] = {
        **copy.deepcopy(data["platforms"]["cpu"]),
        "ci": {"runs_on": ["self-hosted", "gpu"], "agents": {"queue": "gpu"}},
    }
    data["platforms"]["cpu"]["ci"] = {"shards": shards}
    return Matrix.model_validate(data)


def test_github_has_a_job_per_platform_and_a_gate_over_all() -> None:
    wf = yaml.safe_load(pipeline.render(_matrix(shards=3), "github"))
    jobs = wf["jobs"]
    assert list(jobs) == ["cpu", "cuda", "gate"]
    assert jobs["cuda"]["runs-on"] == ["self-hosted", "gpu"]
    assert jobs["cpu"]["runs-on"] == "ubuntu-latest"
    assert jobs["cpu"]["strategy"]["matrix"]["shard"] == [1, 2, 3]
    run = jobs["cpu"]["steps"][3]["run"]
    shard = "${{ matrix.shard }}"
    assert run == f"nox -s cpu -- --results results/cpu-shard{shard} --shard {shard}/3"
    upload = jobs["cuda"]["steps"][4]
    assert upload["with"] == {"name": "kvrig-cuda", "path": "results/cuda"}
    gate = jobs["gate"]
    assert gate["needs"] == ["cpu", "cuda"] and gate["if"] == "always()"
    assert gate["steps"][-1]["run"].endswith("--platform cpu --platform cuda")
    assert wf[True if True in wf else "on"]["schedule"] == [{"cron": pipeline.NIGHTLY_CRON}]


def test_buildkite_has_a_step_per_shard_then_the_gate() -> None:
    steps = yaml.safe_load(pipeline.render(_matrix(shards=2), "buildkite"))["steps"]
    assert [s.get("key") for s in steps] == ["cpu-shard1", "cpu-shard2", "cuda", None, "gate"]
    assert steps[1]["command"] == "nox -s cpu -- --results results/cpu-shard2 --shard 2/2"
    assert steps[2]["agents"] == {"queue": "gpu"}
    assert steps[2]["artifact_paths"] == ["results/cuda/**/*"]
    assert steps[3] == {"wait": None, "continue_on_failure": True}
    assert (
        "nox -s gate -- --results artifacts --platform cpu --platform cuda" in steps[4]["command"]
    )


def test_shards_split_a_column_into_disjoint_parts_that_cover_it() -> None:
    ids = [f"cpu-m-{i}" for i in range(11)]
    parts = [pipeline.shard_cells(ids, f"{i}/3") for i in (1, 2, 3)]
    assert set().union(*parts) == set(ids)
    assert sum(len(p) for p in parts) == len(ids)
    assert sorted(len(p) for p in parts) == [3, 4, 4]
    assert pipeline.shard_cells(ids, "1/1") == set(ids)
    assert pipeline.parse_shard(" 2/3".strip()) == "2/3"


@pytest.mark.parametrize("bad", ["0/2", "3/2", "a/b", "2", "1/2/3"])
def test_bad_shard_is_one_paragraph(bad: str) -> None:
    with pytest.raises(pipeline.ShardError, match="write I/N with 1 <= I <= N"):
        pipeline.parse_shard(bad)


def test_pipeline_command_prints_or_writes(tmp_path: Path, capsys) -> None:
    m = str(ROOT / "matrix.yaml")
    assert cli.main(["--matrix", m, "pipeline", "--format", "buildkite"]) == 0
    assert capsys.readouterr().out == COMMITTED["buildkite"].read_text()
    out = tmp_path / "wf.yml"
    assert cli.main(["--matrix", m, "pipeline", "--format", "github", "--output", str(out)]) == 0
    assert out.read_text() == COMMITTED["github"].read_text()


def test_ci_block_is_validated(write_matrix, base) -> None:
    from kvrig.define.matrix import MatrixError

    base["platforms"]["cpu"]["ci"] = {"shards": 0}
    with pytest.raises(MatrixError, match=r"platforms\.cpu\.ci\.shards"):
        load(write_matrix(base))
