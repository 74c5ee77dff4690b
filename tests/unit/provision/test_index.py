"""What a package index serves, read as uv reads it: the simple API (JSON or HTML), a
release's METADATA from its `.metadata` file or from the wheel by byte ranges. An index in
memory (fake_index), and a server on the loopback for urllib's part; no network."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvrig.provision import index
from kvrig.provision.index import File, Unreachable

from .fake_index import INDEX, FakeIndex, wheel

PINS = ["torch==2.14.0", "flashinfer-python==0.7.3"]


def test_the_index_is_uvs_own() -> None:
    assert index.default_index({}) == "https://pypi.org/simple"
    assert index.default_index({"UV_INDEX_URL": "https://old/simple"}) == "https://old/simple"
    both = {"UV_INDEX_URL": "https://old/simple", "UV_DEFAULT_INDEX": "https://new/simple"}
    assert index.default_index(both) == "https://new/simple"
    env = {"UV_INDEX": "torch=https://t/whl https://u/simple", "UV_EXTRA_INDEX_URL": "https://e"}
    assert index.extra_indexes(env) == ["https://t/whl", "https://u/simple", "https://e"]


def test_a_json_page_gives_versions_and_files() -> None:
    fake = FakeIndex()
    fake.project("flashinfer-python", ["0.7.2.post1", "0.7.4"])
    page = index.project(INDEX, "Flashinfer_Python", fake)  # asked by its normalized name
    assert page.versions == ["0.7.2.post1", "0.7.4"]
    assert fake.calls[0][0] == f"{INDEX}/flashinfer-python/"
    assert "application/vnd.pypi.simple.v1+json" in fake.calls[0][1]["Accept"]
    assert index.project(INDEX, "nothing-here", fake).versions == []  # 404: no such project


def test_an_html_page_gives_versions_from_its_file_names() -> None:
    fake = FakeIndex()
    html = (
        '<html><body><a href="../../packages/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl'
        '#sha256=00" data-core-metadata="sha256=11">torch-2.13.0+cpu-...whl</a>'
        '<a href="/p/torch-2.12.0.tar.gz">torch-2.12.0.tar.gz</a></body></html>'
    )
    fake.pages["https://t.example/whl/cpu/torch/"] = (html.encode(), "text/html")
    page = index.project("https://t.example/whl/cpu", "torch", fake)
    assert page.versions == ["2.13.0+cpu", "2.12.0"]
    assert page.files[0] == File(
        "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
        "https://t.example/whl/packages/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl",
        True,
    )
    assert not page.files[1].metadata


def test_a_page_that_is_not_the_simple_api_is_unreachable() -> None:
    fake = FakeIndex()
    fake.pages[f"{INDEX}/x/"] = (b"<not json", "application/vnd.pypi.simple.v1+json")
    with pytest.raises(Unreachable, match="not the simple API"):
        index.project(INDEX, "x", fake)
    with pytest.raises(Unreachable, match="did not answer"):
        index.project(INDEX, "x", FakeIndex(down=True))


def test_the_releases_metadata_comes_from_its_metadata_file_when_the_index_has_one() -> None:
    fake = FakeIndex()
    fake.release("vllm", "0.34.0", PINS, metadata=True)
    text = index.release_metadata(INDEX, "vllm", "0.34.0", fake)
    assert "Requires-Dist: flashinfer-python==0.7.3" in text
    assert fake.ranged() == []  # the wheel itself was not touched


def test_else_from_the_wheel_read_by_ranges_not_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeIndex()
    url = fake.release("vllm", "0.34.0", PINS, padding=400_000)
    size = len(fake.pages[url][0])
    text = index.release_metadata(INDEX, "vllm", "0.34.0", fake)
    assert "Requires-Dist: torch==2.14.0" in text
    # The end at once (the zip's directory), then METADATA: a fraction of the file.
    assert fake.ranged()[0] == f"bytes=-{index.TAIL_BYTES}"
    # A directory larger than the end read first is read by ranges too.
    monkeypatch.setattr(index, "TAIL_BYTES", 300)
    monkeypatch.setattr(index, "CHUNK_BYTES", 1024)
    fake.calls.clear()
    assert "Requires-Dist: torch==2.14.0" in index.release_metadata(INDEX, "vllm", "0.34.0", fake)
    assert 3 <= len(fake.ranged()) < 12
    fetched = sum(int(r.split("-")[-1]) - int(r[6:].split("-")[0] or 0) for r in fake.ranged()[1:])
    assert fetched < size / 10


def test_a_release_the_index_cannot_give_is_unreachable_with_why() -> None:
    fake = FakeIndex()
    fake.release("vllm", "0.34.0", PINS)
    with pytest.raises(Unreachable, match=r"lists no wheel of vllm 0\.35\.0"):
        index.release_metadata(INDEX, "vllm", "0.35.0", fake)
    no_ranges = FakeIndex(ranges=False)
    no_ranges.release("vllm", "0.34.0", PINS)
    with pytest.raises(Unreachable, match="does not serve parts of files"):
        index.release_metadata(INDEX, "vllm", "0.34.0", no_ranges)


def test_the_wheel_read_is_the_one_for_this_interpreter() -> None:
    wheels = [
        File("vllm-0.34.0-cp38-abi3-manylinux_2_28_aarch64.whl", "a"),
        File("vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl", "x"),
    ]
    tags = ["cp311-cp311-manylinux_2_28_x86_64", "cp38-abi3-manylinux_2_28_x86_64"]
    assert index.best_wheel(wheels, tags).url == "x"
    assert index.best_wheel(wheels[:1], tags).url == "a"  # none fits: the first


def test_a_local_wheel_and_a_find_links_folder(tmp_path: Path) -> None:
    path = tmp_path / "vllm-0.34.0-cp38-abi3-linux_x86_64.whl"
    path.write_bytes(wheel("vllm", "0.34.0", PINS))
    assert "Requires-Dist: flashinfer-python==0.7.3" in index.wheel_metadata(path)
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    (tmp_path / "torchvision-0.28.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    assert index.folder_versions(str(tmp_path), "torch") == ["2.13.0+cpu"]
    assert index.folder_versions(str(tmp_path / "gone"), "torch") == []
    with pytest.raises(Unreachable, match="could not be read as a wheel"):
        index.wheel_metadata(tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")


# --- urllib, against a server on the loopback ---------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b"0123456789" * 10
    ranges = True

    def do_GET(self) -> None:
        if self.path == "/missing":
            self.send_error(404)
            return
        wanted = self.headers.get("Range")
        if self.path == "/page":
            data, kind, status = json.dumps({"files": []}).encode(), index.ACCEPT.split(",")[0], 200
        elif wanted and self.ranges:
            start = len(self.body) - int(wanted.split("-")[-1])
            data, kind, status = self.body[start:], "application/zip", 206
        else:
            data, kind, status = self.body, "application/zip", 200
        self.send_response(status)
        self.send_header("Content-Type", kind)
        if status == 206:
            self.send_header(
                "Content-Range", f"bytes {start}-{len(self.body) - 1}/{len(self.body)}"
            )
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_http_get_reads_pages_and_ranges(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    page = index.http_get(f"{server}/page", {"Accept": index.ACCEPT})
    assert page.content_type == "application/vnd.pypi.simple.v1+json"
    part = index.http_get(f"{server}/w.whl", {"Range": "bytes=-10"})
    assert (part.body, part.total) == (b"0123456789", 100)
    with pytest.raises(Unreachable) as missing:
        index.http_get(f"{server}/missing", {})
    assert missing.value.status == 404
    monkeypatch.setattr(_Handler, "ranges", False)  # a host that sends the whole file
    with pytest.raises(Unreachable, match="does not serve parts of files"):
        index.http_get(f"{server}/w.whl", {"Range": "bytes=-10"})


def test_http_get_says_why_a_host_did_not_answer() -> None:
    with pytest.raises(Unreachable, match=r"^127.0.0.1:1 did not answer \("):
        index.http_get("http://127.0.0.1:1/simple/vllm/", {})
