"""What a package index serves, read the way uv reads it (the network edge of the pin check).

The pin check needs a release's metadata and the versions of each package it pins, from
the index uv will use. Without a PEP 658 `.metadata` file, the wheel's zip directory and
METADATA are read with HTTP range requests: a vLLM wheel is 240 MB, the two reads about
1 MB. Every failure is an `Unreachable`, so the caller says one line and leaves uv the
last word.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import platform as platform_mod
import re
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from kvrig.define.platform_spec import package_key
from kvrig.provision.pins import same_version

DEFAULT_INDEX = "https://pypi.org/simple"
ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2,"
    " text/html;q=0.01"
)
TIMEOUT_S = 20.0
# The end of a wheel read at once: the zip's directory (vLLM's is 0.7 MB) is in it.
TAIL_BYTES = 1 << 20
CHUNK_BYTES = 64 << 10


class Unreachable(Exception):
    """The index could not answer the question; `status` is the HTTP status, if any."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class Response:
    body: bytes
    content_type: str = ""
    total: int | None = None  # a range's Content-Range: the whole file's size


# (url, headers) -> the response; a Range request must get 206 or raise Unreachable.
Get = Callable[[str, Mapping[str, str]], Response]


def http_get(url: str, headers: Mapping[str, str]) -> Response:
    """One GET with urllib (proxies from the environment, as uv takes them)."""
    req = urllib.request.Request(url, headers={"User-Agent": "kvrig", **headers})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            if "Range" in headers and resp.status != 206:
                raise Unreachable(f"{_host(url)} does not serve parts of files")
            total = _range_total(resp.headers.get("Content-Range"))
            return Response(resp.read(), resp.headers.get_content_type(), total)
    except urllib.error.HTTPError as exc:
        raise Unreachable(f"{url} answered HTTP {exc.code}", exc.code) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise Unreachable(f"{_host(url)} did not answer ({reason})") from None


def _host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc or url


def _range_total(header: str | None) -> int | None:
    m = re.match(r"bytes \d+-\d+/(\d+)", header or "")
    return int(m.group(1)) if m else None


# --- where uv looks -------------------------------------------------------------------------


def default_index(environ: Mapping[str, str]) -> str:
    """The index uv installs from: UV_DEFAULT_INDEX, else UV_INDEX_URL, else PyPI."""
    return (environ.get("UV_DEFAULT_INDEX") or environ.get("UV_INDEX_URL") or DEFAULT_INDEX).strip()


def offline(environ: Mapping[str, str]) -> bool:
    """uv told to stay off the network (UV_OFFLINE): kvrig reads no index either."""
    return environ.get("UV_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def extra_indexes(environ: Mapping[str, str]) -> list[str]:
    """The further indexes uv is given by its environment (UV_INDEX: `name=url` or url)."""
    out = []
    for var in ("UV_INDEX", "UV_EXTRA_INDEX_URL"):
        for item in (environ.get(var) or "").split():
            out.append(item.split("=", 1)[1] if re.match(r"^[\w.-]+=", item) else item)
    return out


# --- the simple API -----------------------------------------------------------------------


@dataclass(frozen=True)
class File:
    filename: str
    url: str
    metadata: bool = False  # the index serves url + ".metadata" (PEP 658/714)


@dataclass(frozen=True)
class Project:
    versions: list[str]
    files: list[File]


def version_of(filename: str) -> str | None:
    """A distribution file's version, from its name (wheel: name-ver-...; sdist: name-ver)."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return parts[1] if len(parts) >= 5 else None
    for ext in (".tar.gz", ".zip", ".tar.bz2", ".tgz"):
        if filename.endswith(ext):
            name, _, version = filename[: -len(ext)].rpartition("-")
            return version if name else None
    return None


def name_of(filename: str) -> str:
    return package_key(filename.split("-", 1)[0])


def project(index: str, name: str, get: Get = http_get) -> Project:
    """The versions and files of a project on an index; none where it has no page (404)."""
    url = f"{index.rstrip('/')}/{package_key(name)}/"
    try:
        resp = get(url, {"Accept": ACCEPT})
    except Unreachable as exc:
        if exc.status == 404:
            return Project([], [])
        raise
    if "json" in resp.content_type:
        return _from_json(resp.body, url)
    return _from_html(resp.body.decode(errors="replace"), url)


def _from_json(body: bytes, url: str) -> Project:
    try:
        data = json.loads(body)
        files = [
            File(
                f["filename"],
                urllib.parse.urljoin(url, f["url"]),
                bool(f.get("core-metadata") or f.get("dist-info-metadata")),
            )
            for f in data.get("files", [])
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise Unreachable(f"{url} answered with a page that is not the simple API") from None
    versions = data.get("versions") or _versions(files)
    return Project([str(v) for v in versions], files)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links.append(dict(attrs))


def _from_html(text: str, url: str) -> Project:
    parser = _Links()
    parser.feed(text)
    files = []
    for link in parser.links:
        href = link.get("href")
        if not href:
            continue
        full = urllib.parse.urljoin(url, href)
        filename = urllib.parse.unquote(urllib.parse.urlsplit(full).path.rsplit("/", 1)[-1])
        meta = link.get("data-core-metadata") or link.get("data-dist-info-metadata")
        files.append(File(filename, full.split("#", 1)[0], bool(meta) and meta != "false"))
    return Project(_versions(files), files)


def _versions(files: Sequence[File]) -> list[str]:
    seen: dict[str, None] = {}
    for f in files:
        v = version_of(f.filename)
        if v:
            seen.setdefault(v, None)
    return list(seen)


def folder_versions(folder: str, name: str, get: Get = http_get) -> list[str]:
    """The versions of a package in a find-links location (a folder or a page of links)."""
    if re.match(r"^https?://", folder):
        page = get(folder, {"Accept": "text/html"})
        files = _from_html(page.body.decode(errors="replace"), folder).files
        names = [f.filename for f in files]
    else:
        names = [p.name for p in Path(folder).iterdir()] if Path(folder).is_dir() else []
    key = package_key(name)
    return [v for n in names if name_of(n) == key and (v := version_of(n))]


# --- a release's metadata -----------------------------------------------------------------


def wheel_metadata(path: str | Path) -> str:
    """The METADATA of a wheel file on disk."""
    try:
        with zipfile.ZipFile(path) as zf:
            return _metadata_in(zf, str(path))
    except (OSError, zipfile.BadZipFile) as exc:
        raise Unreachable(f"{path} could not be read as a wheel ({exc})") from None


def _metadata_in(zf: zipfile.ZipFile, where: str) -> str:
    names = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
    if not names:
        raise Unreachable(f"{where} holds no .dist-info/METADATA")
    return zf.read(names[0]).decode("utf-8", errors="replace")


def release_metadata(
    index: str, package: str, version: str, get: Get = http_get, tags: Sequence[str] | None = None
) -> str:
    """The METADATA of the release's wheel for this interpreter, from the index."""
    wheels = [
        f
        for f in project(index, package, get).files
        if f.filename.endswith(".whl") and same_version(version_of(f.filename) or "", version)
    ]
    if not wheels:
        raise Unreachable(f"{index} lists no wheel of {package} {version}")
    wheel = best_wheel(wheels, tags)
    if wheel.metadata:
        try:
            return get(wheel.url + ".metadata", {}).body.decode("utf-8", errors="replace")
        except Unreachable:
            pass  # declared and not served: the wheel itself still has it
    try:
        with zipfile.ZipFile(_Ranged(wheel.url, get)) as zf:
            return _metadata_in(zf, wheel.filename)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise Unreachable(f"{wheel.filename} could not be read as a wheel ({exc})") from None


def best_wheel(wheels: Sequence[File], tags: Sequence[str] | None = None) -> File:
    """The wheel uv would take here: the first of this interpreter's tags that one of them
    carries; else one built for this machine; else the first (the pins rarely differ)."""
    order = list(tags) if tags is not None else _sys_tags()
    rank = {t: i for i, t in enumerate(order)}

    def score(f: File) -> int:
        return min((rank.get(t, len(rank)) for t in _wheel_tags(f.filename)), default=len(rank))

    best = min(wheels, key=score)
    if score(best) < len(rank):
        return best
    machine = platform_mod.machine()
    return next((f for f in wheels if machine in f.filename), wheels[0])


def _sys_tags() -> list[str]:
    try:
        from packaging.tags import sys_tags
    except ImportError:
        return []
    return [str(t) for t in sys_tags()]


def _wheel_tags(filename: str) -> list[str]:
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return []
    py, abi, plat = parts[-3:]
    return [f"{a}-{b}-{c}" for a in py.split(".") for b in abi.split(".") for c in plat.split(".")]


class _Ranged(io.RawIOBase):
    """A remote file read with range requests, for zipfile: its end (the zip directory) at
    once, the rest in chunks as zipfile asks for them."""

    def __init__(self, url: str, get: Get) -> None:
        super().__init__()
        self.url, self.get, self.pos = url, get, 0
        tail = get(url, {"Range": f"bytes=-{TAIL_BYTES}"})
        if tail.total is None:
            raise Unreachable(f"{_host(url)} did not say how large {url} is")
        self.size = tail.total
        self.parts: list[tuple[int, bytes]] = [(self.size - len(tail.body), tail.body)]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), max(0, self.size - self.pos))
        data = self._bytes(self.pos, want)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def _bytes(self, start: int, n: int) -> bytes:
        if n == 0:
            return b""
        for at, body in self.parts:
            if at <= start and start + n <= at + len(body):
                return body[start - at : start - at + n]
        end = min(self.size, start + max(n, CHUNK_BYTES)) - 1
        body = self.get(self.url, {"Range": f"bytes={start}-{end}"}).body
        self.parts.append((start, body))
        return body[:n]
