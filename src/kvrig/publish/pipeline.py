"""CI pipelines generated from matrix.yaml (`kvrig pipeline --format github|buildkite`).

The matrix already knows the columns; writing the same list again by hand in a workflow
file is how a platform ends up never run. On CUDA a cell's outcome depends on the GPU's
architecture, so each architecture is a job of its own. Two signals, on purpose: a column
job is red when any of its cells fails (the platform's health), the gate job is the
release decision. A device platform's image is built once on a CPU runner, so no GPU
runner spends its time building; only that job may write to the registry, never on a
fork's pull request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from kvrig.define import column_names, gpus, paths
from kvrig.define.matrix import Matrix
from kvrig.define.platform_spec import CiSpec

FORMATS = ("github", "buildkite")
NIGHTLY_CRON = "0 3 * * *"
GATE_RUNNER = "ubuntu-latest"
GATE_AGENTS = {"queue": "default"}
ARTIFACTS = "artifacts"
PYTHON = "3.12"


class ShardError(Exception):
    """A --shard value that is not I/N with 1 <= I <= N; one paragraph for the user."""


def parse_shard(text: str) -> str:
    """Checks `I/N` and returns it normalised."""
    i, n = _shard(text)
    return f"{i}/{n}"


def _shard(text: str) -> tuple[int, int]:
    try:
        i_text, n_text = text.split("/")
        i, n = int(i_text), int(n_text)
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise ShardError(
            f"--shard {text!r} is not a shard: write I/N with 1 <= I <= N (e.g. --shard 2/3"
            " runs the second of three equal parts of the column)."
        )
    return i, n


def shard_cells(cell_ids: list[str], shard: str) -> set[str]:
    """The cells of shard I/N, from the column's cell ids in matrix order (pure)."""
    i, n = _shard(shard)
    return {cid for k, cid in enumerate(cell_ids) if k % n == i - 1}


def results_folder(platform: str, shard: int | str | None) -> str:
    """The folder a CI job's column writes (and uploads), as a path in the workflow."""
    return paths.results_folder(platform, shard).as_posix()


@dataclass(frozen=True)
class ColumnJob:
    """One column's job (or set of shard jobs): a platform's, or on CUDA one GPU
    architecture's, on runners whose labels carry it."""

    column: str
    platform: str
    ci: CiSpec
    arch: str | None = None

    @property
    def label(self) -> str | None:
        """The runner label (GitHub) and agent tag (Buildkite) naming the GPU: sm90."""
        return gpus.gpu(self.platform, self.arch).label if self.arch else None

    @property
    def title(self) -> str:
        if not self.arch:
            return f"{self.column} column"
        return f"{self.column} column ({gpus.gpu(self.platform, self.arch).examples})"

    @property
    def runs_on(self) -> list[str]:
        return [*self.ci.runs_on, *([self.label] if self.label else [])]

    @property
    def agents(self) -> dict[str, str]:
        return {**self.ci.agents, **({ARCH_TAG: self.label} if self.label else {})}


# The Buildkite agent tag that names a runner's GPU architecture (gpu_arch=sm90).
ARCH_TAG = "gpu_arch"


def column_jobs(matrix: Matrix) -> list[ColumnJob]:
    """Every column job: one per platform, on CUDA one per architecture its ci.archs
    lists (all kvrig knows when it lists none), since the cells' outcomes depend on it."""
    jobs: list[ColumnJob] = []
    for platform, spec in matrix.platforms.items():
        if platform not in column_names.HARDWARE_PLATFORMS:
            continue  # its emulated columns run in the emulated job
        archs = matrix.ci_archs(platform)
        if not archs:
            jobs.append(ColumnJob(platform, platform, spec.ci))
            continue
        for arch in archs:
            jobs.append(ColumnJob(gpus.device_column(platform, arch), platform, spec.ci, arch))
    return jobs


def _column_command(job: ColumnJob, shard: str | None) -> str:
    folder = results_folder(job.column, shard)
    arch = f" --gpu-arch {job.arch}" if job.arch else ""
    tail = f" --shard {shard}/{job.ci.shards}" if shard is not None else ""
    return f"nox -s {job.platform} --{arch} --results {folder}{tail}"


def image_platforms(matrix: Matrix) -> list[str]:
    """The platforms whose image is built once on a CPU runner for their device jobs."""
    seen = [job.platform for job in column_jobs(matrix) if job.platform != ISA_PLATFORM]
    return list(dict.fromkeys(seen))


def images_key(platform: str) -> str:
    return f"{IMAGES_JOB}-{platform}"


def _images_command(platform: str) -> str:
    """The image only, pushed: `kvrig check host` and `kvrig container` need no device
    for --build-only; the registry is KVRIG_REGISTRY's."""
    return f"nox -s {platform} -- --build-only --push"


IMAGES_JOB = "images"


def _images_timeout(matrix: Matrix, platform: str) -> int:
    """As long as the platform's column may take: building XPU's vLLM from its git ref on a
    CPU runner is no quicker than the column."""
    return matrix.platforms[platform].ci.timeout_minutes  # type: ignore[index]


def _gate_args(matrix: Matrix) -> str:
    """The platforms matrix.yaml's release requires (release.columns; on CUDA the gate
    takes one column per architecture of ci.archs)."""
    return " ".join(f"--platform {p}" for p in matrix.required_platforms)


# The CPU column's expected outcomes depend on the host's ISA class (AVX2 ... AMX), and a
# runner label does not pin one; without the class a red or green CPU job cannot be read.
ISA_PLATFORM = "cpu"
ISA_MARKDOWN = "kvrig isa --markdown"


# --- GitHub Actions ------------------------------------------------------------------------

# Third-party actions by commit, never by a tag that can be moved (the version each commit
# was released as is in the workflow's header).
ACTIONS = {
    "checkout": ("actions/checkout", "11bd71901bbe5b1630ceea73d27597364c9af683", "v4.2.2"),
    "setup-python": ("actions/setup-python", "a26af69be951a213d495a4c3e4e4022e16d87065", "v5.6.0"),
    "upload-artifact": (
        "actions/upload-artifact",
        "ea165f8d65b6e75b540449e92b4886f43607fa02",
        "v4.6.2",
    ),
    "download-artifact": (
        "actions/download-artifact",
        "d3f86a106a0bac45b974a628896c90dbdf5c8093",
        "v4.3.0",
    ),
}
# A label that lets a pull request from a branch of this repository run the device jobs;
# a fork's pull request never runs them, whatever its labels (its code would run on the
# self-hosted GPU runners, with their access).
DEVICE_LABEL = "kvrig-gpu"
DEVICE_JOBS_IF = (
    "github.event_name != 'pull_request' || ("
    "github.event.pull_request.head.repo.full_name == github.repository"
    f" && contains(github.event.pull_request.labels.*.name, '{DEVICE_LABEL}'))"
)
EMULATED_JOB = "emulated"
PREVIOUS = "previous"
# The images go to the repository owner's GitHub Packages, with the workflow's own token.
REGISTRY_HOST = "ghcr.io"
GITHUB_REGISTRY = REGISTRY_HOST + "/${{ github.repository_owner }}"


def uses(action: str) -> str:
    repo, commit, _ = ACTIONS[action]
    return f"{repo}@{commit}"


_SETUP = [
    {"uses": uses("checkout")},
    {"uses": uses("setup-python"), "with": {"python-version": PYTHON}},
    {"run": "python -m pip install nox"},
]

# Before the column, so the summary names the class even when the column fails or hangs;
# `kvrig isa` needs only kvrig itself (no vLLM), installed into the runner's Python.
_GITHUB_ISA = {
    "name": "Record the CPU class (job summary)",
    "run": f'python -m pip install . && {ISA_MARKDOWN} >> "$GITHUB_STEP_SUMMARY"',
}

# The gate's drift check compares with the last nightly that finished: its artifacts.
_PREVIOUS_NIGHTLY = {
    "name": "The previous nightly's results (for the drift check)",
    "env": {"GH_TOKEN": "${{ github.token }}"},
    "run": "\n".join(
        [
            'id=$(gh run list --repo "$GITHUB_REPOSITORY" --workflow kvrig.yml --event'
            " schedule --status completed --limit 1 --json databaseId --jq '.[0].databaseId')",
            'if [ -n "$id" ]; then gh run download "$id" --repo "$GITHUB_REPOSITORY" --pattern'
            f" 'kvrig-*' --dir {PREVIOUS} || echo \"no artifacts in nightly run $id\"; fi",
        ]
    ),
}


# A GitHub-hosted runner has about 14 GB free; the toolchains it carries and kvrig does not
# use make room for a CUDA image (the images job runs on GitHub's runners only).
_FREE_DISK = {
    "name": "Make room for the image",
    "run": "sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc"
    " /opt/hostedtoolcache/CodeQL && df -h /",
}


def _login(engine_auto: bool) -> dict[str, Any]:
    """Logs in to the registry with the job's own token the engine `kvrig container` will
    take, so the pull or push uses the login."""
    engine = (
        'engine="${KVRIG_ENGINE:-auto}"; if [ "$engine" = auto ]; then engine=$(docker info'
        " >/dev/null 2>&1 && echo docker || echo podman); fi\n"
        if engine_auto
        else "engine=docker\n"
    )
    return {
        "name": f"Log in to {REGISTRY_HOST}",
        "env": {"REGISTRY_TOKEN": "${{ github.token }}"},
        "run": engine + f'echo "$REGISTRY_TOKEN" | "$engine" login {REGISTRY_HOST} --username'
        ' "$GITHUB_ACTOR" --password-stdin',
    }


def _images_job(matrix: Matrix, platform: str) -> dict[str, Any]:
    """A device platform's image, built and pushed on a CPU runner: the one job that may
    write packages, and only where device jobs run (its build runs the branch's code)."""
    return {
        "name": f"{platform} image (built once for the {platform} columns)",
        "if": DEVICE_JOBS_IF,
        "runs-on": GATE_RUNNER,
        "timeout-minutes": _images_timeout(matrix, platform),
        "permissions": {"contents": "read", "packages": "write"},
        "env": {"KVRIG_REGISTRY": GITHUB_REGISTRY},
        "steps": [
            *_SETUP,
            _FREE_DISK,
            _login(engine_auto=False),
            {"name": "Build and push the image", "run": _images_command(platform)},
        ],
    }


def _gate_command(matrix: Matrix) -> str:
    previous = f"$([ -d {PREVIOUS} ] && echo --previous {PREVIOUS})"
    return f"nox -s gate -- --results {ARTIFACTS} {previous} {_gate_args(matrix)}"


def _emulated_job() -> dict[str, Any]:
    """vLLM's own CUDA, XPU and ROCm code on every GPU architecture, on a CPU runner: on every
    pull request, fork or not, since it runs no device and needs no self-hosted runner."""
    return {
        "name": "emulated GPU columns (vLLM's code, no device)",
        "runs-on": GATE_RUNNER,
        "timeout-minutes": 60,
        "steps": [
            *_SETUP,
            {"name": "Run the emulated columns", "run": "nox -s emulated"},
            {
                "name": "Upload the results",
                "if": "always()",
                "uses": uses("upload-artifact"),
                "with": {"name": "kvrig-emulated", "path": "results/*-emulated*"},
            },
        ],
    }


def _github_job(job: ColumnJob) -> dict[str, Any]:
    ci = job.ci
    sharded = ci.shards > 1
    shard = "${{ matrix.shard }}" if sharded else None
    name = job.title + (f" (shard ${{{{ matrix.shard }}}}/{ci.shards})" if sharded else "")
    out: dict[str, Any] = {"name": name}
    device = job.platform != ISA_PLATFORM
    if device:
        out["if"] = DEVICE_JOBS_IF
        # The image its images job pushed, pulled (read-only packages).
        out["needs"] = images_key(job.platform)
        out["permissions"] = {"contents": "read", "packages": "read"}
        out["env"] = {"KVRIG_REGISTRY": GITHUB_REGISTRY}
    runs_on = job.runs_on
    out["runs-on"] = runs_on[0] if len(runs_on) == 1 else runs_on
    out["timeout-minutes"] = ci.timeout_minutes
    if sharded:
        out["strategy"] = {"fail-fast": False, "matrix": {"shard": list(range(1, ci.shards + 1))}}
    isa_steps = [_GITHUB_ISA] if job.platform == ISA_PLATFORM else []
    login = [_login(engine_auto=True)] if device else []
    out["steps"] = [
        *_SETUP,
        *isa_steps,
        *login,
        {
            # No continue-on-error: the job is the column's health, red on any failed
            # cell; the upload and the gate below run all the same.
            "name": "Run the column",
            "run": _column_command(job, shard),
        },
        {
            "name": "Upload the results",
            "if": "always()",
            "uses": uses("upload-artifact"),
            "with": {
                "name": paths.artifact_name(job.column, shard),
                "path": results_folder(job.column, shard),
            },
        },
    ]
    return out


def github(matrix: Matrix) -> dict[str, Any]:
    jobs: dict[str, Any] = {images_key(p): _images_job(matrix, p) for p in image_platforms(matrix)}
    columns = [job.column for job in column_jobs(matrix)]
    jobs.update({job.column: _github_job(job) for job in column_jobs(matrix)})
    jobs[EMULATED_JOB] = _emulated_job()
    jobs["gate"] = {
        "name": "release gate",
        "needs": columns,
        # A release decision over the device columns, which a pull request does not run.
        "if": "always() && github.event_name != 'pull_request'",
        "runs-on": GATE_RUNNER,
        # The previous nightly's artifacts are read through the Actions API.
        "permissions": {"contents": "read", "actions": "read"},
        "steps": [
            *_SETUP,
            {
                "uses": uses("download-artifact"),
                "with": {"pattern": "kvrig-*", "path": ARTIFACTS},
            },
            _PREVIOUS_NIGHTLY,
            {
                "name": "Report (also into the job summary)",
                "run": f"nox -s report -- {ARTIFACTS} --out report",
            },
            {
                "name": "Upload the report",
                "if": "always()",
                "uses": uses("upload-artifact"),
                "with": {"name": "kvrig-report", "path": "report"},
            },
            {"name": "Release gate", "if": "always()", "run": _gate_command(matrix)},
        ],
    }
    return {
        "name": "kvrig",
        "on": {
            "push": {"branches": ["main"]},
            "pull_request": {},
            "schedule": [{"cron": NIGHTLY_CRON}],
            "workflow_dispatch": {},
        },
        # Every job reads the repository and nothing else unless it says so.
        "permissions": {"contents": "read"},
        "jobs": jobs,
    }


# --- Buildkite -----------------------------------------------------------------------------


# Device steps run only on builds of trusted code: the schedule, main, or a build started
# by hand; never a pull request's (Buildkite builds forks' pull requests when asked to).
BUILDKITE_DEVICE_IF = (
    "build.pull_request.id == null && (build.source == 'schedule' || build.branch =="
    " pipeline.default_branch || build.source == 'ui' || build.source == 'api')"
)


def _buildkite_isa(key: str) -> list[str]:
    """Lines that annotate the build with the agent's CPU class, one context per step so
    shards on different hosts do not overwrite each other; a venv, as PEP 668 may refuse
    pip on the system Python."""
    return [
        "python3 -m venv .venv && .venv/bin/python -m pip install -q .",
        f".venv/bin/{ISA_MARKDOWN} | buildkite-agent annotate --style info"
        f" --context kvrig-isa-{key}",
    ]


def _buildkite_steps(job: ColumnJob) -> list[dict[str, Any]]:
    ci = job.ci
    shards = [str(i) for i in range(1, ci.shards + 1)] if ci.shards > 1 else [None]
    steps = []
    for shard in shards:
        suffix = f" (shard {shard}/{ci.shards})" if shard else ""
        key = job.column + (f"-shard{shard}" if shard else "")
        isa_lines = _buildkite_isa(key) if job.platform == ISA_PLATFORM else []
        # No soft_fail: the step is the column's health, red on any failed cell;
        # artifact_paths upload on failure too and the wait below lets the gate run.
        step: dict[str, Any] = {"label": f"{job.title}{suffix}", "key": key}
        if job.platform != ISA_PLATFORM:
            step["if"] = BUILDKITE_DEVICE_IF
            step["depends_on"] = images_key(job.platform)  # the image it pulls
        step.update(
            {
                "command": "\n".join([*isa_lines, _column_command(job, shard)]),
                "agents": job.agents,
                "timeout_in_minutes": ci.timeout_minutes,
                "artifact_paths": [f"{results_folder(job.column, shard)}/**/*"],
            }
        )
        steps.append(step)
    return steps


def _buildkite_images(matrix: Matrix, platform: str) -> dict[str, Any]:
    """A device platform's image, built and pushed on a CPU agent (the CPU column's
    queue) to the registry the pipeline's KVRIG_REGISTRY names, on trusted builds only."""
    cpu = matrix.platforms.get(ISA_PLATFORM)  # type: ignore[call-overload]
    return {
        "label": f"{platform} image (built once for the {platform} columns)",
        "key": images_key(platform),
        "if": BUILDKITE_DEVICE_IF,
        "command": _images_command(platform),
        "agents": dict(cpu.ci.agents) if cpu else {"queue": ISA_PLATFORM},
        "timeout_in_minutes": _images_timeout(matrix, platform),
    }


def buildkite(matrix: Matrix) -> dict[str, Any]:
    steps: list[Any] = [_buildkite_images(matrix, p) for p in image_platforms(matrix)]
    steps += [s for job in column_jobs(matrix) for s in _buildkite_steps(job)]
    steps.append(
        {
            "label": "emulated GPU columns (vLLM's code, no device)",
            "key": EMULATED_JOB,
            "command": "nox -s emulated",
            "agents": dict(GATE_AGENTS),
            "timeout_in_minutes": 60,
            "artifact_paths": ["results/*-emulated*/**/*"],
        }
    )
    steps.append({"wait": None, "continue_on_failure": True})
    steps.append(
        {
            "label": "release gate",
            "key": "gate",
            "agents": dict(GATE_AGENTS),
            "command": "\n".join(
                [
                    f"buildkite-agent artifact download 'results/**/*' {ARTIFACTS}/",
                    f"nox -s report -- {ARTIFACTS} --out report || true",
                    "if [ -f report/report.md ]; then buildkite-agent annotate --style info"
                    " --context kvrig < report/report.md; fi",
                    f"nox -s gate -- --results {ARTIFACTS} {_gate_args(matrix)}",
                ]
            ),
            "artifact_paths": ["report/*"],
        }
    )
    return {"steps": steps}


# --- rendering -----------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line commands, no anchors: a file people read in review."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)

_HEADER = {
    "github": [
        "# Generated from matrix.yaml by `kvrig pipeline --format github --output",
        "# .github/workflows/kvrig.yml`; do not edit by hand.",
        "# One job per column (runners: the platform's ci.runs_on; a CUDA job per GPU",
        "# architecture in ci.archs, on runners also labelled with it: sm90), the emulated",
        "# GPU columns on a CPU runner, then the release gate over the columns matrix.yaml's",
        "# release requires; nightly at " + NIGHTLY_CRON + " (UTC).",
        "# The column jobs are the nightly health signal: red on any failed cell (cpu jobs",
        "# also record the runner's CPU class in the job summary). The gate job is the",
        "# release decision: only `gate: true` cells, with their allowances; it runs",
        "# after the column jobs whatever their status, against the previous nightly.",
        "# Device jobs never run a fork's pull request: only the schedule, main, a manual",
        f"# dispatch, or a pull request from this repository labelled {DEVICE_LABEL!r}.",
        "# Each device platform's image is built once on a CPU runner and pushed to",
        f"# {REGISTRY_HOST}/<owner> (that job alone may write packages, and runs only where",
        "# device jobs run); the device jobs need it and pull it (packages: read).",
        "# The emulated GPU columns need no device and run on every pull request.",
        "# Actions are pinned by commit: "
        + "; ".join(f"{repo} {tag}" for repo, _, tag in ACTIONS.values())
        + ".",
    ],
    "buildkite": [
        "# Generated from matrix.yaml by `kvrig pipeline --format buildkite --output",
        "# ci/buildkite.yml`; do not edit by hand.",
        "# One step per column (agents: the platform's ci.agents; a CUDA step per GPU",
        "# architecture in ci.archs, on agents also tagged gpu_arch=sm90; each needs nox and",
        "# a Docker or Podman engine), then the release gate over every column's results.",
        "# The column steps are the nightly health signal: red on any failed cell (cpu steps",
        "# also annotate the build with the agent's CPU class). The gate step is the release",
        "# decision: only `gate: true` cells, with their allowances; the wait lets it run",
        "# after failed column steps.",
        "# Device steps run only on trusted builds (schedule, the default branch, by hand or",
        "# API), never a pull request's; the emulated GPU columns run on every build.",
        "# Each device platform's image is built once on a CPU agent and pushed to the",
        "# registry KVRIG_REGISTRY names (set it in the pipeline's environment, and log the",
        "# agents in to it: `docker login`); the device steps depend on it and pull it.",
        f"# Nightly: add a schedule with cron {NIGHTLY_CRON!r} in the pipeline's settings.",
    ],
}


def render(matrix: Matrix, fmt: str) -> str:
    data = github(matrix) if fmt == "github" else buildkite(matrix)
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return "\n".join(_HEADER[fmt]) + "\n" + body
