"""A stand-in for the CUDA driver library, so the CUDA wheel's extensions load on a CPU host.

Compiled modules of vLLM's CUDA wheel (custom ops, FlashMLA, the cuMem allocator) link
`libcuda.so.1`, which only an NVIDIA driver installs, and vLLM's CUDA platform cannot import
without it. The symbols are read from their ELF sections, so a release that needs another
gets it; each answers CUDA_ERROR_NO_DEVICE, so a real reach for a GPU fails as it would on
a host without one.

    kvrig setup vllm --emulated      # installs the CUDA wheel, then builds it
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kvrig.define.models import cache_root

DRIVER = "libcuda.so.1"
NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE
# Functions with an out-parameter a caller reads even on failure get a body of their own.
_SPECIAL = {
    "cuGetErrorString": (
        "int cuGetErrorString(int error, const char **text) {\n"
        '  if (text) *text = "no CUDA device (kvrig stub driver)";\n'
        "  return 0;\n}\n"
    ),
    "cuGetErrorName": (
        "int cuGetErrorName(int error, const char **text) {\n"
        '  if (text) *text = "CUDA_ERROR_NO_DEVICE";\n'
        "  return 0;\n}\n"
    ),
}


class StubError(Exception):
    """The stub cannot be built; one paragraph saying what to install."""


def vllm_dir() -> Path:
    """The installed vllm package's folder, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise StubError(
            "vLLM is not installed in this Python environment, so there is no CUDA wheel to"
            " emulate a GPU with. Run the emulated columns through nox (nox -s emulated),"
            " which installs the CUDA wheel first."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def needed_symbols(libraries: Iterable[Path]) -> list[str]:
    """The driver (`cu*`) symbols the libraries that link libcuda.so.1 leave undefined."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    found: set[str] = set()
    for path in libraries:
        try:
            with open(path, "rb") as fh:
                elf = ELFFile(fh)
                needs = any(
                    tag.entry.d_tag == "DT_NEEDED" and tag.needed == DRIVER
                    for section in elf.iter_sections()
                    if isinstance(section, DynamicSection)
                    for tag in section.iter_tags()
                )
                if not needs:
                    continue
                dynsym = elf.get_section_by_name(".dynsym")
                if not isinstance(dynsym, SymbolTableSection):
                    continue
                for sym in dynsym.iter_symbols():
                    if (
                        sym["st_shndx"] == "SHN_UNDEF"
                        and sym.name.startswith("cu")
                        and sym.name[2:3].isupper()
                    ):
                        found.add(sym.name)
        except (OSError, ELFError):
            continue
    return sorted(found)


def source(symbols: Iterable[str]) -> str:
    """The stub's C source: every symbol answers CUDA_ERROR_NO_DEVICE."""
    lines = ["/* kvrig: a stand-in libcuda.so.1 for emulated GPU columns (no device). */\n"]
    for name in sorted(set(symbols) | set(_SPECIAL)):
        lines.append(_SPECIAL.get(name, f"int {name}(void) {{ return {NO_DEVICE}; }}\n"))
    return "".join(lines)


def ensure(package: Path | None = None, root: Path | None = None) -> tuple[Path, int]:
    """The folder holding the stub for the installed vLLM (built once), and how many driver
    symbols it stands in for."""
    package = package or vllm_dir()
    symbols = needed_symbols(sorted(package.rglob("*.so")))
    text = source(symbols)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = (root or cache_root() / "libcuda-stub") / digest
    target = folder / DRIVER
    if target.is_file():
        return folder, len(symbols)
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise StubError(
            "No C compiler was found (gcc or cc, or $CC), and the emulated GPU columns need"
            " one to build their stand-in libcuda.so.1. Install gcc (apt-get install gcc)"
            " and run again."
        )
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        c_file = Path(tmp) / "libcuda_stub.c"
        c_file.write_text(text)
        built = Path(tmp) / DRIVER
        command = [compiler, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{DRIVER}"]
        done = subprocess.run(
            [*command, "-o", str(built), str(c_file)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise StubError(
                f"Building the stand-in libcuda.so.1 with {compiler} failed:"
                f" {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no output'}."
                " Check that the compiler works (a plain C shared library), then run again."
            )
        os.replace(built, target)  # atomic: a concurrent builder sees a whole library
        (folder / "libcuda_stub.c").write_text(text)
    return folder, len(symbols)
