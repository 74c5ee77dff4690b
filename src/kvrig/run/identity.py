"""Which vLLM a cell's process really imported, and whether it is the one it stands for.

A cell named for an overlay (kvrig.provision.overlay) must have imported the overlay's
copy, not the base underneath, or its verdict would be about the wrong vLLM; real
engines and emulated devices ask the same question the same way. The overrides the
environment was installed with (kvrig.provision.stamp) go with the version: the release
ran, but not on its own dependencies.
"""

from __future__ import annotations

import os
from typing import Any

from kvrig.provision import overlay, stamp


def vllm_identity(out: dict[str, Any]) -> dict[str, str] | None:
    """Writes the imported vLLM's version, commit and file, torch's version and the
    environment's overrides into the cell's summary; returns the error to record when an
    overlay asked for is not in force."""
    import torch
    import vllm

    out["vllm_version"] = getattr(vllm, "__version__", None)
    try:
        from vllm import _version

        out["vllm_commit"] = getattr(_version, "__commit_id__", None)
    except ImportError:
        out["vllm_commit"] = None
    out["torch_version"] = torch.__version__
    out["vllm_file"] = vllm.__file__
    out["vllm_overrides"] = stamp.overrides_in_force(stamp.read())
    manifest = os.environ.get(overlay.OVERLAY_ENV)
    problem = overlay.in_force(manifest, str(vllm.__file__)) if manifest else None
    return {"type": "OverlayNotInForce", "message": problem} if problem else None
