"""Resumable, checksum-verified downloads, tested against a local HTTP server on loopback."""

import hashlib
import json
import os
import urllib.request

import pytest

from npm.data.download import download


def version(url: str) -> str:
    """The validator (ETag) the mirror sends for ``url`` now: what a download records beside its part file."""
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")) as r:
        return r.headers["ETag"]


def test_download_resumes_a_partial_file(server, tmp_path):
    root, base = server
    payload = bytes(range(256)) * 4000
    (root / "dump.bin").write_bytes(payload)
    out = tmp_path / "dump.bin"
    out.with_name("dump.bin.part").write_bytes(payload[:1000])  # an interrupted earlier run of the same URL
    out.with_name("dump.bin.part.json").write_text(json.dumps({"url": f"{base}/dump.bin",
                                                               "validator": version(f"{base}/dump.bin")}))
    info = download(f"{base}/dump.bin", out, sha256=hashlib.sha256(payload).hexdigest())
    assert out.read_bytes() == payload
    assert info["bytes"] == len(payload)
    assert not out.with_name("dump.bin.part").exists()


def test_an_old_part_resumed_against_a_newer_file_on_the_mirror_gives_the_new_file(server, tmp_path):
    """Fault (issue 41): the old part's first bytes and the new file's rest were installed as one file."""
    root, base = server
    old, new = bytes(range(256)) * 4000, bytes(reversed(range(256))) * 4000  # the same size
    served = root / "dump.bin"
    served.write_bytes(old)
    out = tmp_path / "dump.bin"
    out.with_name("dump.bin.part").write_bytes(old[:300_000])  # an earlier run, cut short
    out.with_name("dump.bin.part.json").write_text(json.dumps({"url": f"{base}/dump.bin",
                                                               "validator": version(f"{base}/dump.bin")}))
    served.write_bytes(new)  # the file changes on the server before the resume
    st = served.stat()
    os.utime(served, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    download(f"{base}/dump.bin", out)
    assert out.read_bytes() == new


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


def test_a_checkpoint_file_that_differs_from_the_hub_sha256_is_refused(tmp_path):
    from npm.data.download import sha256_of, verify_checkpoint

    (tmp_path / "model.safetensors").write_bytes(b"weights")
    good = sha256_of(tmp_path / "model.safetensors")
    assert verify_checkpoint(tmp_path, {"model.safetensors": good}) == {"model.safetensors": good}
    with pytest.raises(ValueError, match="checksum mismatch.*model.safetensors"):
        verify_checkpoint(tmp_path, {"model.safetensors": "0" * 64})
    with pytest.raises(ValueError, match="pytorch_model.bin is missing"):
        verify_checkpoint(tmp_path, {"pytorch_model.bin": good})


def test_an_unreachable_hub_says_how_to_place_the_checkpoint_by_hand(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from npm.data.download import download_checkpoint

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(ValueError, match=r"cannot download facebook/npm .*hf download facebook/npm --local-dir"):
        download_checkpoint("facebook/npm", tmp_path / "npm")
    assert not (tmp_path / "npm").exists()
