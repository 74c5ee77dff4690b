"""`kvrig predict`: the block size vLLM will choose for a checkpoint, without vLLM.

kvrig.rules computes it from the config's shapes, as the verdicts do, so a prediction is
as good as the rules the matrix proves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvrig.cli.usage import UsageError
from kvrig.define.loader import default_matrix
from kvrig.define.matrix import MatrixError, load
from kvrig.define.vllm_names import SPECULATIVE_METHODS
from kvrig.host import hardware, isa
from kvrig.rules import choices, rocm, shapes, versions
from kvrig.rules import predict as predict_mod


def _read_config(given: str) -> dict:
    """A config.json, or the one in a checkpoint folder."""
    path = Path(given)
    if path.is_dir():
        path = path / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(
            f"Cannot read {path} ({exc.strerror}); pass a checkpoint's config.json or its folder."
        ) from None
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path} is not JSON ({exc}); pass the checkpoint's config.json."
        ) from None


def _release(ns: argparse.Namespace) -> tuple[str, str]:
    """(version, where it came from): --vllm, else the platform's in matrix.yaml, else
    kvrig's newest rules (a clean install has no matrix.yaml)."""
    if ns.vllm:
        return ns.vllm, "--vllm"
    try:
        m = load(Path(ns.matrix) if ns.matrix else default_matrix())
    except MatrixError:
        m = None
    spec = m.platforms.get(ns.platform) if m else None  # type: ignore[call-overload]
    found = versions.source_version(spec.vllm) if spec else None
    if found:
        return found, f"{m.path.name}'s {ns.platform} platform"  # type: ignore[union-attr]
    return versions.shown(versions.NEWEST), "kvrig's newest rules (no --vllm, no matrix pin)"


def cmd_predict(ns: argparse.Namespace, extra: list[str]) -> int:
    """The block size vLLM will choose for a checkpoint: steps, vLLM's log lines, or JSON."""
    config = _read_config(ns.config)
    release, origin = _release(ns)
    cls = ns.isa
    if ns.platform != "cpu" and cls is not None:
        raise UsageError(
            f"--isa {cls} names a CPU class, and {ns.platform} has none; leave it out."
        )
    if ns.platform == "cpu" and cls in (None, isa.NATIVE):
        cls = isa.host_class(hardware.cpu_flags(), hardware.cpu_info()["arch"])
    spec = _speculative(ns)
    settings = predict_mod.Settings(
        platform=ns.platform,
        vllm=release,
        backend=ns.backend,
        tp=ns.tp,
        dtype=ns.dtype,
        kv_cache_dtype=ns.kv_cache_dtype,
        mamba_ssm_cache_dtype=ns.mamba_ssm_cache_dtype,
        block_size=ns.block_size,
        prefix_caching=ns.prefix_caching,
        mamba_cache_mode=ns.mamba_cache_mode,
        num_speculative_tokens=_speculative_tokens(ns),
        speculative_method=spec.get("method"),
        draft_max_model_len=_draft_context(spec),
        enable_chunked_prefill=ns.enable_chunked_prefill,
        disable_hybrid_kv_cache_manager=ns.disable_hybrid_kv_cache_manager,
        decode_context_parallel_size=ns.decode_context_parallel_size,
        cp_kv_cache_interleave_size=ns.cp_kv_cache_interleave_size,
        prefix_match_unit=ns.prefix_match_unit,
        disable_chunked_mm_input=ns.disable_chunked_mm_input,
        gpu_arch=ns.gpu_arch,
        isa=cls if ns.platform == "cpu" else None,
        aiter=ns.aiter,
        pp=ns.pp,
        max_model_len=ns.max_model_len,
        mamba_block_size=ns.mamba_block_size,
        mamba_cache_dtype=ns.mamba_cache_dtype,
        kv_cache_dtype_skip_layers=tuple(ns.kv_cache_dtype_skip_layers or ()),
    )
    try:
        out = predict_mod.predict(config, settings)
    except (shapes.ConfigError, versions.VersionError) as exc:
        raise UsageError(str(exc)) from None
    # A release newer than any kvrig's rules were read in is answered with the newest
    # rules, and says so: never a plain answer.
    unread = versions.rules(ns.platform, release).unread
    if ns.json:
        print(json.dumps({**out.as_json(), "vllm": release, "unread": unread}, indent=2))
        return 0
    rows = [("vllm", f"{release} ({origin})"), *([("note", unread)] if unread else []), *out.steps]
    rows += [("vLLM logs", line) for line in out.log] or [("vLLM logs", "nothing (no change)")]
    rows += _planned_rows(out)
    rows.append(("block size", str(out.block_size)))
    for label, text in rows:
        print(f"{label:<12} {text}")
    return 0


def _planned_rows(out: predict_mod.Prediction) -> list[tuple[str, str]]:
    """What the engine core plans, what a deployment can reuse and hold, and warnings."""
    rows = []
    if out.stage_block_sizes:
        rows.append(("stages", ", ".join(map(str, out.stage_block_sizes))))
    core = out.engine_block_size
    rows.append(("engine core", str(core) if core is not None else "unknown (no max_model_len)"))
    if out.mamba_block_size is not None:
        rows.append(("mamba block", str(out.mamba_block_size)))
    prefix = out.cacheable_prefix
    rows.append(
        (
            "reusable",
            f"prefixes of {prefix} tokens or more (whole blocks)"
            if prefix is not None
            else "nothing (prefix caching off)",
        )
    )
    if out.pinned_tokens is not None:
        rows.append(
            (
                "per request",
                f"{out.kv_cache_groups} group(s) x {core} = {out.pinned_tokens} tokens of"
                " KV cache held at least",
            )
        )
    rows += [("warning", w) for w in out.warnings]
    return rows


def _speculative(ns: argparse.Namespace) -> dict[str, Any]:
    """--speculative-config (vLLM's JSON), checked: a method of vLLM's and tokens a step."""
    if ns.speculative_config is None:
        return {}
    try:
        spec = json.loads(ns.speculative_config)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--speculative-config is not JSON ({exc}); give it as vLLM takes it, e.g."
            ' \'{"method": "mtp", "num_speculative_tokens": 1}\'.'
        ) from None
    tokens = spec.get("num_speculative_tokens") if isinstance(spec, dict) else None
    method = spec.get("method") if isinstance(spec, dict) else None
    if method not in SPECULATIVE_METHODS or not isinstance(tokens, int) or tokens < 1:
        raise UsageError(
            "--speculative-config needs a method of vLLM's"
            f" ({', '.join(sorted(SPECULATIVE_METHODS))}) and num_speculative_tokens of at"
            f" least 1; got {ns.speculative_config}."
        )
    return spec


def _speculative_tokens(ns: argparse.Namespace) -> int:
    """The tokens a step proposes: --speculative-config's, else --num-speculative-tokens."""
    spec = _speculative(ns)
    return int(spec["num_speculative_tokens"] if spec else ns.num_speculative_tokens)


def _draft_context(spec: dict[str, Any]) -> int | None:
    """The drafter's own context (the config's max_model_len), a positive count or none."""
    length = spec.get("max_model_len")
    if length is None:
        return None
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise UsageError(
            f"--speculative-config's max_model_len {length!r} is no context length; give a"
            " positive number of tokens, or leave it out for the drafter's own."
        )
    return length


def _at_least_one(text: str) -> int:
    """A count of ranks or tokens, as the engine argument takes it."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no count; give a whole number, 1 or more")
    return value


def register(sub: Any) -> None:
    pr = sub.add_parser(
        "predict", help="the block size vLLM picks for a checkpoint's config.json (no vLLM)"
    )
    pr.add_argument("config", help="a config.json, or a checkpoint folder holding one")
    pr.add_argument("--platform", choices=predict_mod.PLATFORMS, required=True)
    pr.add_argument("--vllm", help="the release (default: the platform's in matrix.yaml)")
    pr.add_argument("--backend", help="the attention backend (default: the platform's)")
    pr.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    pr.add_argument("--dtype", help="the model dtype (default: the config's)")
    pr.add_argument("--kv-cache-dtype", help="auto (the model dtype), fp8, ...")
    pr.add_argument("--mamba-ssm-cache-dtype", help="auto, float32, bfloat16, float16")
    pr.add_argument("--block-size", type=int, help="a user --block-size (skips phase 1)")
    pr.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: vLLM's (on for these hybrids)",
    )
    pr.add_argument("--mamba-cache-mode", choices=predict_mod.CACHE_MODES)
    pr.add_argument("--num-speculative-tokens", type=int, default=0)
    pr.add_argument(
        "--speculative-config",
        help='vLLM\'s JSON, e.g. \'{"method": "mtp", "num_speculative_tokens": 1}\'',
    )
    pr.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (default 1)")
    pr.add_argument("--max-model-len", type=int, help="default: the config's positions")
    pr.add_argument("--mamba-block-size", type=int, help="a user --mamba-block-size")
    pr.add_argument("--mamba-cache-dtype", help="the conv state's dtype: auto, float32, ...")
    pr.add_argument(
        "--kv-cache-dtype-skip-layers",
        type=lambda text: [part for part in text.split(",") if part],
        help="layers kept at the model dtype beside a quantized KV cache (0,3 or sliding_window)",
    )
    pr.add_argument(
        "--gpu-arch",
        help="the CUDA GPU's compute capability (decides the backend and GDN prefill), one"
        f" kvrig keeps rules for: {', '.join(choices.PREDICTED_GPUS)}; on rocm the gfx target"
        f" (decides the backend): {', '.join(rocm.ARCHS)} (default: the Instinct boards')",
    )
    pr.add_argument(
        "--aiter",
        action="store_true",
        help="on rocm: VLLM_ROCM_USE_AITER=1 with AMD's aiter installed (off by default)",
    )
    pr.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: vLLM's (on); a hybrid's prefix cache needs it",
    )
    pr.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action="store_true",
        help="one KV-cache spec for every layer, which a hybrid cannot have",
    )
    pr.add_argument(
        "--disable-chunked-mm-input",
        action="store_true",
        help="multimodal input scheduled whole, which a hybrid's prefix cache cannot take",
    )
    pr.add_argument(
        "--decode-context-parallel-size",
        "--dcp",
        type=_at_least_one,
        default=1,
        help="ranks sharing the decode KV cache (default 1)",
    )
    pr.add_argument(
        "--cp-kv-cache-interleave-size",
        type=_at_least_one,
        default=1,
        help="tokens a DCP rank takes in turn, which must divide the block (default 1)",
    )
    pr.add_argument(
        "--prefix-match-unit",
        type=_at_least_one,
        help="prefix-cache hits at another unit than the block (needs several KV-cache groups)",
    )
    pr.add_argument("--isa", help=f"the CPU class on cpu (default: this host's): {isa.CLASSES}")
    pr.add_argument("--json", action="store_true", help="one JSON object")
    pr.set_defaults(run=cmd_predict)
