"""What vLLM decides before it sizes a block: the SSM state dtype and the GDN prefill kernel.

Both change the size without any block-size code being involved: the state dtype doubles
or halves the mamba page, and only GDN layers on FlashInfer's prefill kernel ask for a
64-token prefill checkpoint. Each decision is made in a different vLLM file, on facts
(the release, the CPU class, the GPU architecture) that the block-size code never sees;
restating them apart keeps every one next to the code it follows.

Pure: settings in, a decision (or ConfigError saying what is unknown) out.
"""

from __future__ import annotations

from kvrig.define import gpus
from kvrig.define.vllm_models import Family
from kvrig.facts.gpus import parse_capability
from kvrig.rules.shapes import ConfigError, Shapes, dtype_name
from kvrig.rules.versions import Rules, shown

# NemotronH's config classes, whose "auto" SSM state follows NemotronHForCausalLMConfig.
NEMOTRON_H = ("NemotronHForCausalLM",)
# Kimi delta attention keeps its recurrent state in float32 unless told otherwise
# (MambaStateDtypeCalculator.kda_state_dtype).
KDA = ("KimiLinearForCausalLM",)


def ssm_dtype(
    architecture: str,
    config_ssm_dtype: str | None,
    model_dtype: str,
    knob: str | None,
    rules: Rules,
    *,
    cpu_resets_to_float32: bool = False,
) -> str:
    """The SSM (temporal) state dtype the engine ends up with, in vLLM's order:

    - Qwen3.5/3.6 (`Qwen3_5ForConditionalGeneration.verify_and_update_config`, models/
      config.py): an "auto" state takes the config's `mamba_ssm_dtype`;
    - NemotronH (`NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype`): an "auto"
      state takes the config's `mamba_ssm_cache_dtype`, else the release's fallback;
    - CPU with AVX512-BF16 (`CpuPlatform.check_and_update_config`): only an fp16/bf16
      state is kept, anything else becomes float32;
    - otherwise "auto" follows the conv state, the model dtype
      (`MambaStateDtypeCalculator`).
    """
    chosen = dtype_name(knob) if knob not in (None, "auto") else "auto"
    if chosen == "auto" and architecture in KDA:
        chosen = "float32"
    elif chosen == "auto" and config_ssm_dtype:
        chosen = dtype_name(config_ssm_dtype)
    elif chosen == "auto" and architecture in NEMOTRON_H:
        if rules.nemotron_ssm_fallback is None:
            raise ConfigError(
                f"NemotronH's fallback SSM state dtype at vLLM {shown(rules.version)} is"
                " not known to kvrig (float16 at 0.13.0, float32 from 0.32.0; the change"
                " landed in between), and the config sets no mamba_ssm_cache_dtype. Pass"
                " --mamba-ssm-cache-dtype, or the version vLLM logged."
            )
        else:
            chosen = rules.nemotron_ssm_fallback
    if cpu_resets_to_float32 and chosen != "float32":
        return chosen if chosen in ("float16", "bfloat16") else "float32"
    return model_dtype if chosen == "auto" else chosen


def compute_capability(gpu_arch: str) -> tuple[int, int]:
    """A compute capability written as "9.0", "sm90", "sm_100" or "12.1", as (major, minor)."""
    cc = parse_capability(gpu_arch)
    if cc is None:
        raise ConfigError(
            f"Cannot read the GPU architecture {gpu_arch!r}; give its compute capability"
            " as nvidia-smi prints it (e.g. 9.0 for H100/H200/H20, 8.0 for A100, 10.0 for"
            " B200, 12.1 for GB10) or as sm90."
        )
    return cc


# The CUDA architectures kvrig keeps rules for: each GPU the emulated columns fake
# (kvrig.define.gpus), every one confirmed by its column, and GB10's 12.1, confirmed by a
# published log (tests/unit/rules/test_published_logs.py). vLLM's stock backends and GDN
# prefill are restated for these; below 8.0 neither FLASH_ATTN nor FLASHINFER is valid
# (supports_compute_capability), and what vLLM falls back to there is not restated.
PREDICTED_GPUS = {**{a: g.examples for a, g in gpus.CUDA_GPUS.items()}, "12.1": "GB10"}


def known_gpu_arch(gpu_arch: str) -> str:
    """The compute capability --gpu-arch names ("9.0"), if kvrig keeps rules for it;
    else ConfigError naming those it keeps, so no GPU gets another GPU's answer."""
    major, minor = compute_capability(gpu_arch)
    arch = f"{major}.{minor}"
    if arch in PREDICTED_GPUS:
        return arch
    listed = ", ".join(f"{a} ({boards})" for a, boards in PREDICTED_GPUS.items())
    below = (
        " vLLM's FLASH_ATTN and FLASHINFER need compute capability 8.0 or newer, so there"
        " it falls back to TRITON_ATTN (and a bfloat16 model to float16), which kvrig does"
        " not restate."
        if major < 8
        else ""
    )
    raise ConfigError(
        f"kvrig keeps no rules for CUDA compute capability {arch} (--gpu-arch {gpu_arch}):"
        f" it predicts for {listed} only.{below} Pass the compute capability of one of"
        " those GPUs; for another, kvrig has no answer."
    )


def flashinfer_gdn_prefill(s: Shapes, platform: str, gpu_arch: str | None) -> bool | None:
    """_resolve_gdn_prefill_backend (vllm/model_executor/layers/mamba/gdn/
    qwen_gdn_linear_attn.py), for "auto": FlashInfer's GDN prefill on CUDA on Hopper
    (SM90), or on Blackwell (SM10.x, SM12.x) when head_k_dim is 128 (the 0.33.0 wheel's
    CUDA 13 runtime meets its cuda_runtime >= 13); Triton everywhere else. The Blackwell
    answers are the least certain: copies of vLLM's sources differ there (SM12.x left
    out, SM10.x also needing an intact nvidia-cutlass-dsl-libs-cu13 install).

    None: on CUDA without a known architecture the choice cannot be made.
    """
    if platform != "cuda" or s.family != Family.GDN:
        return False
    if gpu_arch is None:
        return None
    major, minor = compute_capability(gpu_arch)
    if (major, minor) == (9, 0):
        return True
    return major in (10, 12) and s.head_k_dim == 128


# The architectures where one of vLLM 0.33.0's sparse-MLA backends declares itself valid
# (platforms/cuda.py _get_backend_priorities; each backend's validate_configuration):
# FLASH_ATTN_MLA_SPARSE/FLASHMLA_SPARSE on SM90, FLASHINFER_MLA_SPARSE/FLASHMLA_SPARSE on
# SM10.x, FLASHINFER_MLA_SPARSE_SM120 on SM12.x. Seen by the emulated columns.
SPARSE_MLA_MAJORS = (9, 10, 12)


def sparse_mla_refusal(
    platform: str, family: Family, gpu_arch: str | None, named: str | None = None
) -> str | None:
    """Why vLLM finds no attention backend for a DSA model on this GPU, or None. A backend
    named is validated alone, not searched for (kvrig.rules.refusals.named_invalid)."""
    if platform != "cuda" or family != Family.DSA or gpu_arch is None or named is not None:
        return None
    major, minor = compute_capability(gpu_arch)
    if major in SPARSE_MLA_MAJORS:
        return None
    return (
        "No valid attention backend found for cuda: the sparse-MLA backends declare compute"
        f" capability 9.x, 10.x and 12.x only, and this GPU is {major}.{minor}"
    )
