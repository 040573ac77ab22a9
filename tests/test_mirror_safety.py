"""``npm-repro mirror`` (npm.data.mirror) serves only regular files under its root: every part of the request path is
decoded and checked (no ``..``, no encoded separator, no double encoding), a link that leads out of the root is
neither served nor listed nor hashed, unsatisfiable ranges are a 416, a stale ``If-Range`` gets the whole file, and a
port in use is one line. Each test runs the real mirror on 127.0.0.1 and sends the raw request path over
``http.client`` (urllib would not send a path byte for byte)."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys

import pytest

from npm.data import mirror

SECRET = b"the key to the vault\n"


@pytest.fixture
def site(tmp_path):
    """A mirror root with one hub checkpoint and one static file, a secret folder beside it, links out of the root;
    (root, secret folder, (host, port))."""
    root, secret = tmp_path / "www", tmp_path / "secret"
    repo = root / "huggingface.co" / "owner" / "model"
    repo.mkdir(parents=True)
    (repo / "config.json").write_text("{}")
    (root / "example.org").mkdir()
    (root / "example.org" / "data.csv").write_bytes(b"0123456789")
    secret.mkdir()
    (secret / "secret.txt").write_bytes(SECRET)
    (repo / "leak.txt").symlink_to(secret / "secret.txt")  # a file link out of the root
    (repo / "outside").symlink_to(secret)  # a folder link out of the root, inside a checkpoint
    (root / "huggingface.co" / "owner" / "linked").symlink_to(secret)  # a checkpoint that is a link out
    (root / "example.org" / "leak.txt").symlink_to(secret / "secret.txt")
    server = mirror.serve(root)
    yield root, secret, server.server_address[:2]
    server.shutdown()
    server.server_close()


def request(address, path: str, headers: dict | None = None, method: str = "GET"):
    """(status, headers, body) of one request for the raw ``path``."""
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.headers, r.read()
    finally:
        conn.close()


ESCAPES = [
    "/huggingface.co/..%2F..%2Fsecret/resolve/main/secret.txt",
    "/huggingface.co/..%2f..%2fsecret/resolve/main/secret.txt",
    "/huggingface.co/..%252F..%252Fsecret/resolve/main/secret.txt",  # double-encoded
    "/huggingface.co/..%5C..%5Csecret/resolve/main/secret.txt",
    "/huggingface.co/owner/model/resolve/main/..%2F..%2F..%2F..%2Fsecret%2Fsecret.txt",
    "/huggingface.co/owner/model/resolve/main/../../../../secret/secret.txt",
    "/huggingface.co/owner/model/resolve/main/%2E%2E/%2E%2E/%2E%2E/%2E%2E/secret/secret.txt",
    "/huggingface.co/api/models/..%2F..%2Fsecret",
    "/huggingface.co/api/models/..%2F..%2Fsecret/tree/main",
    "/huggingface.co/api/models/..%252F..%252Fsecret/tree/main",
    "/..%2Fsecret/secret.txt",
    "/%2E%2E/secret/secret.txt",
    "/example.org/..%2F..%2Fsecret/secret.txt",
    "/example.org/%252E%252E/%252E%252E/secret/secret.txt",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_a_path_out_of_the_root_is_refused(site, path):
    """Fault: the repository part was URL-decoded after routing and joined to the root, serving and listing (with
    sha1 of every file) the folder beside it."""
    _, _, address = site
    status, _, body = request(address, path)
    assert status in (400, 404), (path, status)
    assert b"vault" not in body and b"secret.txt" not in body


def test_links_out_of_the_root_are_not_served_listed_or_hashed(site, monkeypatch):
    root, secret, address = site
    hashed = []
    real_digest = mirror._digest
    monkeypatch.setattr(mirror, "_digest", lambda path, h: hashed.append(path) or real_digest(path, h))
    mirror._file_info.cache_clear()
    for path in ("/huggingface.co/owner/model/resolve/main/leak.txt",
                 "/huggingface.co/owner/model/resolve/main/outside/secret.txt",
                 "/example.org/leak.txt",
                 "/huggingface.co/api/models/owner/linked", "/huggingface.co/api/models/owner/linked/tree/main",
                 "/huggingface.co/owner/linked/resolve/main/secret.txt"):
        status, _, body = request(address, path)
        assert status == 404 and b"vault" not in body, path
    status, _, body = request(address, "/huggingface.co/api/models/owner/model/tree/main")
    assert status == 200 and b"config.json" in body and b"leak" not in body and b"secret" not in body
    assert hashed and all(secret not in p.resolve().parents for p in hashed)
    status, _, body = request(address, "/example.org/data.csv")  # what is under the root is served
    assert status == 200 and body == b"0123456789"


@pytest.mark.parametrize("rng", ["bytes=5-3", "bytes=10-", "bytes=50-60", "bytes=-0"])
def test_an_unsatisfiable_range_is_a_416_with_the_size(site, rng):
    """Fault: ``Range: bytes=5-3`` got a 206 with an invalid (negative) Content-Length."""
    _, _, address = site
    status, headers, body = request(address, "/example.org/data.csv", {"Range": rng})
    assert status == 416 and headers["Content-Range"] == "bytes */10" and body == b""


@pytest.mark.parametrize("rng, part", [("bytes=3-5", b"345"), ("bytes=7-", b"789"), ("bytes=-2", b"89"),
                                       ("bytes=8-100", b"89")])
def test_a_satisfiable_range_is_a_206_of_those_bytes(site, rng, part):
    _, _, address = site
    status, headers, body = request(address, "/example.org/data.csv", {"Range": rng})
    assert status == 206 and body == part and int(headers["Content-Length"]) == len(part)


@pytest.mark.parametrize("path", ["/example.org/data.csv", "/huggingface.co/owner/model/resolve/main/config.json"])
def test_files_carry_validators_and_a_stale_if_range_gets_the_whole_file(site, path):
    """What lets a resumed download ask for the same version of the file (npm.data.download)."""
    root, _, address = site
    _, headers, whole = request(address, path)
    etag, modified = headers["ETag"], headers["Last-Modified"]
    assert etag.startswith('"') and modified
    for validator in (etag, modified):
        status, _, body = request(address, path, {"Range": "bytes=1-", "If-Range": validator})
        assert status == 206 and body == whole[1:]
    for stale in ('"0000"', 'W/' + etag, "Thu, 01 Jan 1970 00:00:00 GMT"):
        status, headers, body = request(address, path, {"Range": "bytes=1-", "If-Range": stale})
        assert status == 200 and body == whole and "Content-Range" not in headers


def test_a_changed_file_gets_a_new_etag(site):
    root, _, address = site
    path = root / "example.org" / "data.csv"
    _, first, _ = request(address, "/example.org/data.csv", method="HEAD")
    path.write_bytes(b"9876543210")  # same size
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    _, second, _ = request(address, "/example.org/data.csv", method="HEAD")
    assert first["ETag"] != second["ETag"]


def test_a_port_in_use_is_one_line_naming_it(tmp_path):
    """Fault: an OSError traceback."""
    (tmp_path / "www").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "npm.cli", "mirror", "--root", str(tmp_path / "www"),
                              "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], run.stderr
