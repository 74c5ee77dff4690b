from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvrig import cli
from kvrig.define.matrix import Matrix, load
from kvrig.publish import pipeline

from ..builders import BASE, ROOT

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
        "ci": {"runs_on": ["self-hosted", "gpu"], "agents": {"queue": "gpu"}, "archs": [9.0]},
    }
    data["platforms"]["cpu"]["ci"] = {"shards": shards}
    return Matrix.model_validate(data)


def _step(steps: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(s for s in steps if s.get("name") == name)


def _index(steps: list[dict[str, Any]], name: str) -> int:
    return next(i for i, s in enumerate(steps) if s.get("name") == name)


def test_github_has_a_job_per_platform_and_a_gate_over_all() -> None:
    wf = yaml.safe_load(pipeline.render(_matrix(shards=3), "github"))
    jobs = wf["jobs"]
    assert list(jobs) == ["images-cuda", "cpu", "cuda-sm90", "emulated", "gate"]
    assert jobs["cuda-sm90"]["runs-on"] == ["self-hosted", "gpu", "sm90"]
    assert jobs["cpu"]["runs-on"] == "ubuntu-latest"
    assert jobs["cpu"]["strategy"]["matrix"]["shard"] == [1, 2, 3]
    run = _step(jobs["cpu"]["steps"], "Run the column")["run"]
    shard = "${{ matrix.shard }}"
    assert run == f"nox -s cpu -- --results results/cpu-shard{shard} --shard {shard}/3"
    upload = _step(jobs["cuda-sm90"]["steps"], "Upload the results")
    assert upload["with"] == {"name": "kvrig-cuda-sm90", "path": "results/cuda-sm90"}
    gate = jobs["gate"]
    assert gate["needs"] == ["cpu", "cuda-sm90"]
    assert gate["if"].startswith("always()")
    assert gate["steps"][-1]["run"].endswith("--platform cpu --platform cuda")
    assert wf[True if True in wf else "on"]["schedule"] == [{"cron": pipeline.NIGHTLY_CRON}]


def test_buildkite_has_a_step_per_shard_then_the_gate() -> None:
    steps = yaml.safe_load(pipeline.render(_matrix(shards=2), "buildkite"))["steps"]
    keys = [s.get("key") for s in steps]
    assert keys == [
        "images-cuda",
        "cpu-shard1",
        "cpu-shard2",
        "cuda-sm90",
        "emulated",
        None,
        "gate",
    ]
    steps = steps[1:]  # the column steps, past the image step
    assert steps[1]["command"].splitlines() == [
        "python3 -m venv .venv && .venv/bin/python -m pip install -q .",
        ".venv/bin/kvrig isa --markdown | buildkite-agent annotate --style info"
        " --context kvrig-isa-cpu-shard2",
        "nox -s cpu -- --results results/cpu-shard2 --shard 2/2",
    ]
    assert steps[2]["command"] == "nox -s cuda -- --gpu-arch 9.0 --results results/cuda-sm90"
    assert steps[2]["agents"] == {"queue": "gpu", "gpu_arch": "sm90"}
    assert steps[2]["artifact_paths"] == ["results/cuda-sm90/**/*"]
    assert steps[4] == {"wait": None, "continue_on_failure": True}
    assert (
        "nox -s gate -- --results artifacts --platform cpu --platform cuda" in steps[5]["command"]
    )


@pytest.mark.parametrize("shards", [1, 3])
def test_github_column_jobs_are_red_on_a_failed_cell_and_the_gate_still_decides(
    shards: int,
) -> None:
    """A continue-on-error column job stays green with failed cells: the nightly would
    never show a broken platform unless a gate cell broke it."""
    jobs = yaml.safe_load(pipeline.render(_matrix(shards=shards), "github"))["jobs"]
    for platform in ("cpu", "cuda-sm90"):
        job = jobs[platform]
        assert "continue-on-error" not in job, platform
        for step in job["steps"]:
            assert "continue-on-error" not in step, (platform, step)
        assert _step(job["steps"], "Upload the results")["if"] == "always()", platform
    gate = jobs["gate"]
    assert gate["needs"] == ["cpu", "cuda-sm90"]
    assert gate["if"].startswith("always()")
    assert "continue-on-error" not in gate


@pytest.mark.parametrize("shards", [1, 3])
def test_buildkite_column_steps_are_red_on_a_failed_cell_and_the_gate_still_decides(
    shards: int,
) -> None:
    """A soft_fail column step never turns the build red; the wait must still let the
    gate run after a red column."""
    steps = yaml.safe_load(pipeline.render(_matrix(shards=shards), "buildkite"))["steps"]
    columns = [
        s
        for s in steps
        if s.get("key") not in (None, "gate", "emulated")
        and not s["key"].startswith(pipeline.IMAGES_JOB)
    ]
    assert len(columns) == shards + 1
    for step in columns:
        assert "soft_fail" not in step, step["key"]
        assert step["artifact_paths"][0].startswith("results/"), step["key"]
    keys = [s.get("key") for s in steps]
    wait = steps[keys.index("gate") - 1]
    assert wait == {"wait": None, "continue_on_failure": True}
    assert keys[-1] == "gate"
    assert "soft_fail" not in steps[-1]


@pytest.mark.parametrize("shards", [1, 3])
def test_github_cpu_jobs_record_the_cpu_class_before_the_column(shards: int) -> None:
    """The CPU column's expectations follow the runner's ISA class; the summary must name
    it even when the column then fails or times out."""
    jobs = yaml.safe_load(pipeline.render(_matrix(shards=shards), "github"))["jobs"]
    steps = jobs["cpu"]["steps"]
    isa = [i for i, s in enumerate(steps) if "kvrig isa --markdown" in s.get("run", "")]
    assert len(isa) == 1
    run = steps[isa[0]]["run"]
    assert '>> "$GITHUB_STEP_SUMMARY"' in run
    assert "pip install ." in run
    assert isa[0] < _index(steps, "Run the column")
    assert "kvrig isa" not in yaml.safe_dump(jobs["cuda-sm90"])
    assert "kvrig isa" not in yaml.safe_dump(jobs["gate"])


@pytest.mark.parametrize("shards", [1, 3])
def test_buildkite_cpu_steps_annotate_the_cpu_class_before_the_column(shards: int) -> None:
    """Each shard may land on a different agent, so each annotates under its own context."""
    steps = yaml.safe_load(pipeline.render(_matrix(shards=shards), "buildkite"))["steps"]
    cpu = [s for s in steps if str(s.get("key", "")).startswith("cpu")]
    assert len(cpu) == shards
    for step in cpu:
        lines = step["command"].splitlines()
        annotate = [
            i
            for i, line in enumerate(lines)
            if "kvrig isa --markdown | buildkite-agent annotate" in line
        ]
        assert len(annotate) == 1, step["key"]
        assert f"--context kvrig-isa-{step['key']}" in lines[annotate[0]]
        column = [i for i, line in enumerate(lines) if line.startswith("nox -s cpu ")]
        assert annotate[0] < column[0], step["key"]
    others = [s for s in steps if s.get("key") in ("cuda-sm90", "gate")]
    assert len(others) == 2
    for step in others:
        assert "kvrig isa" not in step["command"], step["key"]


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


# --- what a public repository's self-hosted GPU runners are exposed to ---------------------

SHA = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


def _committed(fmt: str) -> dict[str, Any]:
    return yaml.safe_load(COMMITTED[fmt].read_text())


def test_no_device_job_runs_a_forks_pull_request() -> None:
    wf = _committed("github")
    assert "pull_request" in wf["on"]  # pull requests still get the CPU and emulated jobs
    for name in ("cuda-sm90", "cuda-sm120", "xpu"):
        condition = wf["jobs"][name]["if"]
        assert "github.event_name != 'pull_request'" in condition
        assert "github.event.pull_request.head.repo.full_name == github.repository" in condition
    assert "if" not in wf["jobs"]["cpu"]
    assert "pull_request" in wf["jobs"]["gate"]["if"]


def test_jobs_read_the_repository_only_unless_they_say_so() -> None:
    wf = _committed("github")
    assert wf["permissions"] == {"contents": "read"}
    assert wf["jobs"]["gate"]["permissions"] == {"contents": "read", "actions": "read"}


def test_every_action_is_pinned_by_commit() -> None:
    wf = _committed("github")
    used = [s["uses"] for job in wf["jobs"].values() for s in job["steps"] if "uses" in s]
    assert used and all(SHA.match(u) for u in used), used


def test_the_emulated_gpu_columns_run_on_a_cpu_runner_for_every_pull_request() -> None:
    job = _committed("github")["jobs"]["emulated"]
    assert job["runs-on"] == "ubuntu-latest" and "if" not in job
    assert any(s.get("run") == "nox -s emulated" for s in job["steps"])
    step = next(s for s in _committed("buildkite")["steps"] if s.get("key") == "emulated")
    assert "if" not in step


def test_the_gate_compares_with_the_previous_nightly_and_requires_the_release_columns() -> None:
    steps = _committed("github")["jobs"]["gate"]["steps"]
    fetch = _step(steps, "The previous nightly's results (for the drift check)")
    assert "--event schedule" in fetch["run"] and "gh run download" in fetch["run"]
    gate = _step(steps, "Release gate")["run"]
    assert "--previous previous" in gate
    data = copy.deepcopy(BASE)
    data["platforms"]["cuda"] = copy.deepcopy(data["platforms"]["cpu"])
    data["release"] = {"columns": ["cpu"]}
    wf = yaml.safe_load(pipeline.render(Matrix.model_validate(data), "github"))
    gate = _step(wf["jobs"]["gate"]["steps"], "Release gate")["run"]
    assert "--platform cpu" in gate and "--platform cuda" not in gate


def test_buildkite_runs_device_steps_only_on_trusted_builds() -> None:
    steps = {s.get("key"): s for s in _committed("buildkite")["steps"]}
    for key in ("cuda-sm80", "cuda-sm90", "xpu"):
        assert "build.pull_request.id == null" in steps[key]["if"]
    assert "if" not in steps["cpu-shard1"]


# --- one job per GPU architecture ----------------------------------------------------------


def test_each_cuda_architecture_is_a_job_on_runners_labelled_with_it() -> None:
    """A CUDA cell's outcome depends on the GPU's architecture: one job for every GPU
    would file an A100's and an H100's results under one column."""
    data = copy.deepcopy(BASE)
    data["platforms"]["cuda"] = {
        **copy.deepcopy(data["platforms"]["cpu"]),
        "ci": {"runs_on": ["self-hosted", "nvidia-gpu"], "archs": ["sm89", 10.0]},
    }
    m = Matrix.model_validate(data)
    jobs = yaml.safe_load(pipeline.render(m, "github"))["jobs"]
    assert [j for j in jobs if j.startswith("cuda")] == ["cuda-sm89", "cuda-sm100"]
    assert jobs["cuda-sm100"]["runs-on"] == ["self-hosted", "nvidia-gpu", "sm100"]
    run = _step(jobs["cuda-sm89"]["steps"], "Run the column")["run"]
    assert run == "nox -s cuda -- --gpu-arch 8.9 --results results/cuda-sm89"
    assert jobs["gate"]["needs"] == ["cpu", "cuda-sm89", "cuda-sm100"]
    steps = {s.get("key"): s for s in yaml.safe_load(pipeline.render(m, "buildkite"))["steps"]}
    assert steps["cuda-sm100"]["agents"]["gpu_arch"] == "sm100"
    # The gate requires each architecture's column.
    assert m.required_columns == ["cpu", "cuda-sm89", "cuda-sm100"]


def test_the_committed_workflow_has_a_job_per_declared_architecture() -> None:
    archs = load(ROOT / "matrix.yaml").ci_archs("cuda")
    jobs = _committed("github")["jobs"]
    assert archs and [j for j in jobs if j.startswith("cuda-")] == [
        f"cuda-sm{a.replace('.', '')}" for a in archs
    ]
    for a in archs:
        label = f"sm{a.replace('.', '')}"
        assert label in jobs[f"cuda-{label}"]["runs-on"]
        assert f"--gpu-arch {a} " in _step(jobs[f"cuda-{label}"]["steps"], "Run the column")["run"]


@pytest.mark.parametrize(
    ("platform", "archs", "message"),
    [
        ("cuda", ["7.0"], r"platforms\.cuda\.ci\.archs: '7\.0' is not a cuda architecture"),
        ("cuda", ["9.0", "sm90"], r"platforms\.cuda\.ci\.archs: an architecture is named twice"),
        ("xpu", ["bmg"], r"platforms\.xpu\.ci\.archs: only cuda and rocm run one job per GPU"),
        ("rocm", ["gfx90a"], r"platforms\.rocm\.ci\.archs: 'gfx90a' is not a rocm architecture"),
    ],
)
def test_ci_archs_are_known_architectures_of_cuda(platform: str, archs: list, message: str) -> None:
    from kvrig.define.matrix import MatrixError

    data = copy.deepcopy(BASE)
    data["platforms"][platform] = {
        **copy.deepcopy(data["platforms"]["cpu"]),
        "ci": {"archs": archs},
    }
    with pytest.raises((MatrixError, ValueError), match=message):
        Matrix.model_validate(data)


# --- images built once on a CPU runner, pulled by the device jobs --------------------------

DEVICE_JOBS = ("cuda-sm80", "cuda-sm90", "cuda-sm120", "xpu")


def test_each_device_platforms_image_is_built_once_on_a_cpu_runner_and_pushed() -> None:
    """A GPU runner that builds its own 20 GB image spends its time on a build a CPU
    runner could do once for every architecture's column."""
    jobs = _committed("github")["jobs"]
    for platform in ("cuda", "xpu"):
        job = jobs[f"images-{platform}"]
        assert job["runs-on"] == "ubuntu-latest"
        assert job["env"]["KVRIG_REGISTRY"] == "ghcr.io/${{ github.repository_owner }}"
        runs = [s.get("run", "") for s in job["steps"]]
        login = next(i for i, r in enumerate(runs) if "login ghcr.io" in r)
        build = runs.index(f"nox -s {platform} -- --build-only --push")
        assert login < build
        assert "--password-stdin" in runs[login]
        assert _step(job["steps"], "Log in to ghcr.io")["env"] == {
            "REGISTRY_TOKEN": "${{ github.token }}"
        }


def test_the_images_job_alone_may_write_packages_and_runs_where_device_jobs_run() -> None:
    """packages: write on a job that runs a pull request's code, or on the self-hosted
    device jobs, would let that code overwrite the images every runner pulls."""
    wf = _committed("github")
    for name, job in wf["jobs"].items():
        writes = job.get("permissions", {}).get("packages") == "write"
        assert writes == name.startswith("images-"), name
    assert wf["permissions"] == {"contents": "read"}
    for platform in ("cuda", "xpu"):
        assert wf["jobs"][f"images-{platform}"]["if"] == pipeline.DEVICE_JOBS_IF
        assert wf["jobs"][f"images-{platform}"]["permissions"] == {
            "contents": "read",
            "packages": "write",
        }


def test_every_device_job_needs_its_image_and_pulls_it_read_only() -> None:
    jobs = _committed("github")["jobs"]
    for name in DEVICE_JOBS:
        job = jobs[name]
        platform = name.split("-")[0]
        assert job["needs"] == f"images-{platform}", name
        assert job["permissions"] == {"contents": "read", "packages": "read"}, name
        assert job["env"]["KVRIG_REGISTRY"] == "ghcr.io/${{ github.repository_owner }}", name
        login = _index(job["steps"], "Log in to ghcr.io")
        assert login < _index(job["steps"], "Run the column"), name
    for name in ("cpu", "emulated", "gate"):
        assert "KVRIG_REGISTRY" not in jobs[name].get("env", {}), name
        assert "packages" not in jobs[name].get("permissions", {}), name
    # The gate waits for the columns, not for the images (a failed image is red there).
    assert not [n for n in jobs["gate"]["needs"] if n.startswith("images-")]


def test_buildkite_builds_each_image_on_a_cpu_agent_before_its_device_steps() -> None:
    steps = {s.get("key"): s for s in _committed("buildkite")["steps"]}
    for platform in ("cuda", "xpu"):
        images = steps[f"images-{platform}"]
        assert images["agents"] == {"queue": "cpu"}
        assert images["command"] == f"nox -s {platform} -- --build-only --push"
        assert images["if"] == pipeline.BUILDKITE_DEVICE_IF
    for key in DEVICE_JOBS:
        assert steps[key]["depends_on"] == f"images-{key.split('-')[0]}", key
    for key in ("cpu-shard1", "emulated", "gate"):
        assert "depends_on" not in steps[key], key
