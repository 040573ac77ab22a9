"""Resumable, checksum-verified downloads, tested against a local HTTP server on loopback."""

import hashlib
import json

import pytest

from npm.data.download import download


def test_download_resumes_a_partial_file(server, tmp_path):
    root, base = server
    payload = bytes(range(256)) * 4000
    (root / "dump.bin").write_bytes(payload)
    out = tmp_path / "dump.bin"
    out.with_name("dump.bin.part").write_bytes(payload[:1000])  # an interrupted earlier run of the same URL
    out.with_name("dump.bin.part.json").write_text(json.dumps({"url": f"{base}/dump.bin"}))
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
