"""A package index in memory, for the pin check's tests (no network): simple-API pages
by URL, wheels built on the spot, byte ranges served as an index's file host serves them."""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Mapping
from typing import Any

from kvrig.provision.index import Response, Unreachable

INDEX = "https://index.example/simple"
FILES = "https://files.example/packages"
JSON = "application/vnd.pypi.simple.v1+json"


def wheel(name: str, version: str, requires: list[str], padding: int = 0) -> bytes:
    """A wheel whose METADATA pins `requires`, with a padding file before it (so a range
    read has to find it) and enough entries after it for a directory of some size."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = "\n".join(
        ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}"]
        + [f"Requires-Dist: {r}" for r in requires]
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{name}/big.bin", bytes(range(256)) * (padding // 256), zipfile.ZIP_STORED)
        zf.writestr(f"{dist}/METADATA", meta + "\n\nA description.\n")
        for i in range(40):
            zf.writestr(f"{name}/mod{i}.py", f"x = {i}\n")
        zf.writestr(f"{dist}/RECORD", "")
    return buf.getvalue()


class FakeIndex:
    """`get` for kvrig.provision.index: answers from `pages` (url -> body, content type),
    404 for anything else, and records every request."""

    def __init__(self, ranges: bool = True, down: bool = False) -> None:
        self.pages: dict[str, tuple[bytes, str]] = {}
        self.ranges = ranges
        self.down = down
        self.calls: list[tuple[str, dict[str, str]]] = []

    def project(
        self,
        name: str,
        versions: list[str],
        files: list[dict[str, Any]] | None = None,
        index: str = INDEX,
    ) -> None:
        """A project's page; a project already there gets the versions and files added."""
        url = f"{index}/{name}/"
        old = json.loads(self.pages[url][0]) if url in self.pages else {"versions": [], "files": []}
        body = {
            "meta": {"api-version": "1.1"},
            "name": name,
            "versions": [*old["versions"], *versions],
            "files": [*old["files"], *(files or [])],
        }
        self.pages[url] = (json.dumps(body).encode(), JSON)

    def release(
        self,
        name: str,
        version: str,
        requires: list[str],
        *,
        metadata: bool = False,
        padding: int = 0,
        index: str = INDEX,
    ) -> str:
        """A project page holding one release's wheel (and its .metadata when asked)."""
        filename = f"{name.replace('-', '_')}-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
        url = f"{FILES}/{filename}"
        data = wheel(name, version, requires, padding)
        self.pages[url] = (data, "application/zip")
        entry: dict[str, Any] = {"filename": filename, "url": url, "hashes": {}}
        if metadata:
            self.pages[url + ".metadata"] = (_metadata_of(data), "application/octet-stream")
            entry["core-metadata"] = {"sha256": "0"}
        self.project(name, [version], [entry], index)
        return url

    def __call__(self, url: str, headers: Mapping[str, str]) -> Response:
        self.calls.append((url, dict(headers)))
        if self.down:
            raise Unreachable("index.example did not answer (Name or service not known)")
        if url not in self.pages:
            raise Unreachable(f"{url} answered HTTP 404", 404)
        body, kind = self.pages[url]
        wanted = headers.get("Range")
        if wanted is None:
            return Response(body, kind)
        if not self.ranges:
            raise Unreachable("files.example does not serve parts of files")
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", wanted)
        assert m, wanted
        if m.group(1) == "":
            start, end = max(0, len(body) - int(m.group(2))), len(body) - 1
        else:
            start, end = int(m.group(1)), min(len(body) - 1, int(m.group(2)))
        return Response(body[start : end + 1], kind, len(body))

    def ranged(self) -> list[str]:
        return [h["Range"] for _, h in self.calls if "Range" in h]


def _metadata_of(data: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return zf.read(name)
