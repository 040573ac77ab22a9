"""Checksums computed while the data is written, not by reading it back (issue 43; npm/checksums.py "Digest kinds").

A datastore shard is written in row ranges out of order (its blocks sorted by length), so its record is of kind
``parts-sha256`` (the sha256 over the sha256 of each ``part_bytes`` part, in file order), hashed from the bytes the
writer has in memory. Readers and ``npm-repro verify`` recompute every kind from the file; a datastore recorded
before (plain sha256 of each file) stays valid. The world is a real tiny encoder over real text with parts of 1000
bytes (shard rows are 64 bytes: pieces of parts arrive out of order and straddle rows).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import npm.checksums as checksums
from npm.data.blocks import tokenize_documents
from npm.datastore.embed import embed_corpus
from npm.datastore.store import load_datastore
from npm.io import save_npz
from tests.conftest import lee_corpus_lines, save_tiny_bert
from tests.test_integrity import _verify

pytestmark = pytest.mark.usefixtures("one_thread")
PART = 1000  # bytes: not a multiple of a row (64 bytes), several parts per shard


@pytest.fixture(scope="module")
def world(tmp_path_factory, wordpiece_tokenizer):
    """A datastore of 2 shards over 173 blocks of 2..64 tokens of news text, embedded with parts of ``PART`` bytes;
    the user's cache folder is the module's own."""
    root = tmp_path_factory.mktemp("write-digest")
    docs = [{"id": str(i), "units": [line[:300], line[300:700]]} for i, line in enumerate(lee_corpus_lines()[:60])]
    save_npz(root / "news.npz", **tokenize_documents(docs, wordpiece_tokenizer, max_seq_length=64))
    model = save_tiny_bert(root / "model")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root / "user-cache"))
        mp.setattr(checksums, "PART_BYTES", PART)
        calls = []
        real = checksums.file_fingerprint
        mp.setattr(checksums, "file_fingerprint", lambda p, *a: calls.append(Path(p).name) or real(p, *a))
        embed_corpus(model, [root / "news.npz"], root / "ds", batch_blocks=4, shards=2, device="cpu", progress=False)
        load_datastore(root / "ds")
    return {"root": root, "ds": root / "ds", "model": model, "hashed": calls}


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    """Each test's own user cache folder: copies are hashed afresh, nothing lands in the real one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))


def _shards(ds: Path) -> list[Path]:
    return sorted((ds / "embeddings").glob("shard*.f16"))


def _parts_digest(data: bytes, part: int) -> str:
    """parts-sha256 written out: the definition the tests hold the module to."""
    return hashlib.sha256(b"".join(hashlib.sha256(data[a:a + part]).digest()
                                   for a in range(0, len(data), part))).hexdigest()


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_writes_in_any_order_give_the_digest_recomputed_from_the_file(tmp_path, monkeypatch):
    """Runs of random length written at random places (a part often in several pieces, some before the bytes that
    precede them): the digest taken while writing equals the one recomputed from the file and the definition."""
    monkeypatch.setattr(checksums, "PART_BYTES", 100)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 10_007, dtype=np.uint8).tobytes()
    cuts = np.unique(np.concatenate([[0, len(data)], rng.integers(1, len(data), 300)]))
    runs = list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))
    rng.shuffle(runs)
    path, digest = tmp_path / "shard.f16", checksums.WriteDigest()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for a, b in runs:
            digest.update(a, data[a:b])
            os.pwrite(fd, data[a:b], a)
    finally:
        os.close(fd)
    fields = digest.fields()
    assert fields == {"sha256": _parts_digest(data, 100), "kind": "parts-sha256", "part_bytes": 100}
    assert checksums.file_fingerprint(path, 100) == fields["sha256"]
    unwritten = checksums.WriteDigest()
    for a, b in runs[1:]:
        unwritten.update(a, data[a:b])
    with pytest.raises(ValueError, match="were not all written"):
        unwritten.fields()


def test_the_embed_writer_s_pool_writes_and_hashes_batches_of_runs_as_one_thread_would(tmp_path, monkeypatch):
    """``_write_rows`` with a pool (the positioned writes in one of its threads, whole parts hashed in tasks by the
    others, ``WriteDigest.update_many``), fed batches of rows scattered over the file as the embedder's are: the
    file and its digest equal those of the rows written and hashed one by one, and the definition."""
    from concurrent.futures import ThreadPoolExecutor

    from npm.datastore.embed import _write_rows

    monkeypatch.setattr(checksums, "PART_BYTES", 256)
    monkeypatch.setattr(checksums, "TASK_PARTS", 3)  # several tasks per batch
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((997, 24)).astype(np.float16)  # 48-byte rows: parts cut rows and runs
    order = rng.permutation(len(rows))
    path, digest = tmp_path / "shard.f16", checksums.WriteDigest()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        with ThreadPoolExecutor(3) as pool:
            for batch in np.array_split(np.sort(order[:600]), 7) + np.array_split(order[600:], 5):
                _write_rows(fd, rows[batch], batch, digest, pool)
    finally:
        os.close(fd)
    assert path.read_bytes() == rows.tobytes()
    assert digest.fields()["sha256"] == _parts_digest(rows.tobytes(), 256) == checksums.file_fingerprint(path, 256)


def test_the_embed_job_hashes_its_shards_as_it_writes_them_and_never_reads_them_back(world):
    """Before: `embed_shard` read each finished shard back to hash it (0.51 of the bare forward on an H100).
    Expected: no shard is hashed from its file, by the embed job or by the first load (the writer filled the cache),
    and each recorded digest is the file's parts-sha256."""
    assert not [name for name in world["hashed"] if name.endswith(".f16")], world["hashed"]
    meta = json.loads((world["ds"] / "meta.json").read_text())
    for shard in _shards(world["ds"]):
        recorded = meta["checksums"][f"embeddings/{shard.name}"]
        assert (recorded["kind"], recorded["part_bytes"]) == ("parts-sha256", PART)
        assert shard.stat().st_size > 3 * PART and recorded["bytes"] == shard.stat().st_size
        assert recorded["sha256"] == _parts_digest(shard.read_bytes(), PART)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flipped_byte_in_any_part_of_a_shard_is_caught_by_verify_and_the_loader(world, tmp_path, capsys, where):
    ds = Path(shutil.copytree(world["ds"], tmp_path / "ds"))
    shard = _shards(ds)[-1]
    size = shard.stat().st_size
    _flip(shard, {"first": 0, "middle": size // 2, "last": size - 1}[where])
    code, out, err = _verify(capsys, ds)
    assert code == 1 and f"MISMATCH  {shard}" in out, (out, err)
    assert len(err.strip().splitlines()) == 1 and f"first: {shard} does not match the checksum" in err, err
    with pytest.raises(ValueError) as e:
        load_datastore(ds)
    message = str(e.value)
    assert "\n" not in message and message.startswith(
        f"{shard} does not match the checksum recorded when it was built (parts-sha256 "), message
    assert "by rule embed_shard / npm-repro embed --step shard" in message, message


def test_a_datastore_recorded_with_plain_sha256_digests_still_verifies(world, tmp_path, capsys):
    """A datastore built before issue 43: its shard entries hold the sha256 of the file and no kind. Expected: it
    loads and verifies as before, and a changed byte is still caught (message as before)."""
    ds = Path(shutil.copytree(world["ds"], tmp_path / "ds"))
    for record_file in [ds / "meta.json", *sorted((ds / "embeddings").glob("*.done.json"))]:
        record = json.loads(record_file.read_text())
        for name, recorded in record["checksums"].items():
            if name.endswith(".f16"):
                shard = record_file.parent / name
                record["checksums"][name] = {"sha256": hashlib.sha256(shard.read_bytes()).hexdigest(),
                                             "bytes": recorded["bytes"], "rule": recorded["rule"],
                                             "command": recorded["command"]}
        record_file.write_text(json.dumps(record))
    load_datastore(ds)
    code, out, err = _verify(capsys, ds)
    assert code == 0 and {line.split("  ")[0] for line in out} <= {"ok", "record", "lock"}, (out, err)
    shard = _shards(ds)[0]
    _flip(shard, 5)
    with pytest.raises(ValueError, match=r"does not match the checksum recorded when it was built \(sha256 "):
        load_datastore(ds)
    assert _verify(capsys, shard)[:2] == (1, [f"MISMATCH  {shard}"])


def test_a_record_of_a_kind_this_version_does_not_know_is_refused(world, tmp_path, capsys):
    ds = Path(shutil.copytree(world["ds"], tmp_path / "ds"))
    meta = json.loads((ds / "meta.json").read_text())
    shard = _shards(ds)[0]
    meta["checksums"][f"embeddings/{shard.name}"]["kind"] = "blake3"
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="checksum kind 'blake3'.* is not one this version of npm-repro computes"):
        load_datastore(ds)


def test_the_cache_keeps_each_kind_apart_and_hashes_each_once(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 40)
    calls = []
    real = checksums.file_fingerprint
    monkeypatch.setattr(checksums, "file_fingerprint", lambda p, *a: calls.append(a) or real(p, *a))
    parts = {"kind": "parts-sha256", "part_bytes": 1000}
    for _ in range(2):
        assert checksums.file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
        assert checksums.file_sha256(path, parts) == _parts_digest(path.read_bytes(), 1000)
    assert calls == [(None,), (1000,)]


def test_a_faiss_index_is_hashed_as_it_is_written(world, tmp_path, monkeypatch):
    """The index's bytes are streamed through faiss.write_index's callback: written and hashed together, never read
    back; the record stays the plain sha256 of the file (what `sha256sum` prints)."""
    from npm.datastore.faiss_index import build_faiss_index, load_faiss_index

    ds = load_datastore(world["ds"])
    calls = []
    real = checksums.file_fingerprint
    monkeypatch.setattr(checksums, "file_fingerprint", lambda p, *a: calls.append(Path(p).name) or real(p, *a))
    out = tmp_path / "flat.faiss"
    record = build_faiss_index(ds.vector_shards(), ds.hidden_size, out, factory="Flat", datastore=ds)
    assert not [name for name in calls if ".faiss" in name], calls
    assert record["checksums"]["flat.faiss"]["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert "kind" not in record["checksums"]["flat.faiss"]
    load_faiss_index(out, datastore=ds)


def test_a_checkpoints_state_is_hashed_as_torch_save_writes_it(tmp_path, monkeypatch):
    """The state file (optimiser and all: the largest file of a checkpoint) is hashed from the bytes torch.save
    writes; only the model's files, written by save_pretrained in one go, are hashed from the folder. The checkpoint
    is still found, and a changed state byte still sets it aside."""
    import torch

    from npm import checkpoints

    layout = checkpoints.Layout(prefix="step", state_file="state.pt", rule="test", command="pytest")
    calls = []
    real = checksums.file_fingerprint
    monkeypatch.setattr(checksums, "file_fingerprint", lambda p, *a: calls.append(Path(p).name) or real(p, *a))
    write = lambda tmp: torch.save({"w": torch.ones(3)}, tmp / "weights.pt")  # noqa: E731
    final = checkpoints.save(tmp_path, 1, {"step": 1, "m": torch.arange(1000.0)}, layout, write)
    assert calls == ["weights.pt"]
    recorded = json.loads((final / "sha256.json").read_text())["checksums"]["state.pt"]
    assert recorded["sha256"] == hashlib.sha256((final / "state.pt").read_bytes()).hexdigest()
    read = lambda ckpt: torch.load(ckpt / "weights.pt", weights_only=True)  # noqa: E731
    assert checkpoints.latest(tmp_path, layout, read)[1]["step"] == 1
    _flip(final / "state.pt", -100)
    assert checkpoints.latest(tmp_path, layout, read) is None
