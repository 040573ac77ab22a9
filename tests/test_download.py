"""Resumable, checksum-verified downloads, tested against a local HTTP server on loopback."""

import hashlib
import http.server
import threading
from functools import partial

import pytest

from npm.data.download import download


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(RangeHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler plus the single-range requests a resumed download sends."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        rng = self.headers.get("Range")
        if not rng:
            return super().do_GET()
        path = self.translate_path(self.path)
        data = open(path, "rb").read()
        start = int(rng.split("=")[1].split("-")[0])
        if start >= len(data):
            self.send_response(416)
            self.end_headers()
            return
        self.send_response(206)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])


def test_download_resumes_a_partial_file(server, tmp_path):
    root, base = server
    payload = bytes(range(256)) * 4000
    (root / "dump.bin").write_bytes(payload)
    out = tmp_path / "dump.bin"
    out.with_name("dump.bin.part").write_bytes(payload[:1000])  # an interrupted earlier run
    info = download(f"{base}/dump.bin", out, sha256=hashlib.sha256(payload).hexdigest())
    assert out.read_bytes() == payload
    assert info["bytes"] == len(payload)
    assert not out.with_name("dump.bin.part").exists()


def test_checksum_mismatch_is_an_error_and_leaves_no_file(server, tmp_path):
    root, base = server
    (root / "x.bin").write_bytes(b"abc")
    out = tmp_path / "x.bin"
    with pytest.raises(ValueError, match="checksum mismatch"):
        download(f"{base}/x.bin", out, sha256="0" * 64)
    assert not out.exists()


def test_unreachable_url_says_where_to_put_the_file(tmp_path):
    with pytest.raises(ValueError, match="place it at"):
        download("http://127.0.0.1:9/none.json", tmp_path / "none.json", timeout=2)
