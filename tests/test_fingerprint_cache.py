"""The model fingerprint's cache (docs/paper-map.md §9): the value of ``model_fingerprint`` is unchanged, the weights
are hashed once per (name, size, mtime, ctime, inode) of every file, and the cache lives in the user's cache folder,
never in the model folder (which may be read-only and shared)."""

import hashlib
import json
import os
import shutil
import subprocess

import pytest

import npm.fingerprint as fp
from tests.conftest import save_tiny_bert


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    return save_tiny_bert(tmp_path / "model")


def cache_of(folder):
    """The cache file of ``folder``'s fingerprint in the user's cache folder (npm.checksums.cache_folder)."""
    name = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()
    return folder.parent / "user-cache" / "npm-repro" / "fingerprints" / f"{name}.json"


@pytest.fixture
def hashes(monkeypatch):
    """Spy on the hashing of file bytes: the list of the file names of each call (the real hash still runs)."""
    calls, real = [], fp._hash_files
    monkeypatch.setattr(fp, "_hash_files", lambda files: calls.append([p.name for p in files]) or real(files))
    return calls


def uncached(name):
    folder = fp.model_folder(name)
    return fp._hash_files(fp._weight_files(folder))


def test_second_call_reads_the_cache_not_the_weights_and_the_value_is_unchanged(model, hashes, tmp_path):
    want = uncached(model)
    hashes.clear()
    before = sorted((tmp_path / "model").iterdir())
    assert fp.model_fingerprint(model) == want and len(hashes) == 1
    cache = json.loads(cache_of(tmp_path / "model").read_text())
    assert cache["fingerprint"] == want and [f[0] for f in cache["files"]] == ["config.json", "model.safetensors"]
    assert fp.model_fingerprint(model) == want and len(hashes) == 1  # no second hash
    assert sorted((tmp_path / "model").iterdir()) == before  # nothing written into the model folder


def test_a_touched_file_is_hashed_again_and_a_changed_byte_changes_the_value(model, hashes, tmp_path):
    weights = tmp_path / "model" / "model.safetensors"
    first = fp.model_fingerprint(model)
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert fp.model_fingerprint(model) == first and len(hashes) == 2  # same bytes, hashed again
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size, one byte changed
    weights.write_bytes(bytes(data))
    changed = fp.model_fingerprint(model)
    assert changed != first and changed == uncached(model) and len(hashes) == 4
    assert fp.model_fingerprint(model) == changed and len(hashes) == 4


def test_a_cache_whose_key_differs_or_is_unreadable_is_not_trusted(model, hashes, tmp_path):
    want = fp.model_fingerprint(model)
    cache = cache_of(tmp_path / "model")
    record = json.loads(cache.read_text())
    for key in range(1, 5):  # size, mtime_ns, ctime_ns, inode of the weights
        bad = json.loads(json.dumps(record))
        bad["files"][1][key] += 1
        bad["fingerprint"] = "0" * 64
        cache.write_text(json.dumps(bad))
        assert fp.model_fingerprint(model) == want
    cache.write_text("{not json")
    assert fp.model_fingerprint(model) == want
    copy = shutil.copytree(tmp_path / "model", tmp_path / "copy")  # a copied folder is hashed again
    assert fp.model_fingerprint(str(copy)) == want
    assert json.loads(cache_of(copy).read_text())["folder"] == str(copy.resolve())
    assert len(hashes) == 1 + 4 + 1 + 1


def _make_read_only(folder):
    """Make ``folder`` refuse new files, also for root (immutable attribute); skip where that is impossible."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)],
                                                        capture_output=True).returncode != 0:
        pytest.skip("root cannot make a read-only folder here (chattr +i failed)")
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_model_folder_caches_in_the_user_cache_folder(model, hashes, tmp_path):
    folder = tmp_path / "model"
    undo = _make_read_only(folder)
    try:
        assert not os.access(folder, os.W_OK)
        want = fp.model_fingerprint(model)
        assert fp.model_fingerprint(model) == want and len(hashes) == 1
        assert not (folder / fp.MODEL_FINGERPRINT_CACHE).exists()
    finally:
        undo()
    (cached,) = (tmp_path / "user-cache" / "npm-repro" / "fingerprints").iterdir()
    assert json.loads(cached.read_text())["fingerprint"] == want == uncached(model)
