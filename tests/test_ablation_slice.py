"""Figure 7's subsampled datastores as rows of the full datastore (npm.datastore.embed.slice_shard; paper 6.4).

Each block is encoded on its own, so the datastore of a seeded subsample of a corpus's blocks is, row for row, the
full datastore's rows of those blocks. The test re-embeds the subsample with the same encoder and compares the two
datastores byte for byte. That holds when every batch is padded to one length (``max_length``, as the original pads
to 256): with per-batch padding the matrix products take other shapes, and about 1e-5 of the fp16 values of a
re-embedding differ in the last bit (measured), while the sliced rows stay the full datastore's own.
"""

from __future__ import annotations

import numpy as np
import pytest

from npm.data.blocks import build_blocks, subsample_blocks
from npm.datastore.embed import embed_corpus, finish_datastore, plan_datastore, slice_shard
from npm.datastore.store import load_datastore, shard_path
from npm.io import load_npz, write_jsonl
from tests.conftest import WORDPIECE, lee_corpus_lines, save_tiny_bert


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("slice")
    lines = lee_corpus_lines()[:80]
    write_jsonl(d / "docs.jsonl", [{"id": str(i), "units": [line]} for i, line in enumerate(lines)])
    build_blocks(d / "docs.jsonl", d / "full.npz", WORDPIECE, max_seq_length=64)
    model = save_tiny_bert(d / "model")
    embed_corpus(model, [d / "full.npz"], d / "full", batch_blocks=8, shards=3, max_length=64, progress=False)
    subsample_blocks([d / "full.npz"], 0.3, d / "p30.npz", seed=0)
    return d, model


def test_sliced_datastore_equals_the_re_embedded_subsample_byte_for_byte(corpus):
    d, model = corpus
    embed_corpus(model, [d / "p30.npz"], d / "reembedded", batch_blocks=8, shards=2, max_length=64, progress=False)
    plan = plan_datastore(model, [d / "p30.npz"], d / "sliced", shards=2, max_length=64)
    infos = [slice_shard(d / "sliced", k, d / "full") for k in range(len(plan["shards"]))]
    meta = finish_datastore(d / "sliced")
    assert all(not i["reused"] and i["device"].startswith("rows of") for i in infos)
    for k in range(2):
        assert shard_path(d / "sliced", k).read_bytes() == shard_path(d / "reembedded", k).read_bytes()
    again = load_datastore(d / "reembedded").meta
    assert (meta["plan"], meta["corpus_fingerprint"], meta["n_rows"]) == (again["plan"], again["corpus_fingerprint"],
                                                                          again["n_rows"])
    assert slice_shard(d / "sliced", 0, d / "full")["reused"]  # a finished shard of the same plan is kept


def test_a_datastore_that_is_not_the_base_is_refused(corpus, tmp_path):
    d, model = corpus
    other = tmp_path / "other.npz"
    write_jsonl(tmp_path / "docs.jsonl", [{"id": str(i), "units": [line]}
                                          for i, line in enumerate(lee_corpus_lines()[100:160])])
    build_blocks(tmp_path / "docs.jsonl", other, WORDPIECE, max_seq_length=64)
    embed_corpus(model, [other], tmp_path / "other", batch_blocks=8, shards=1, progress=False)
    plan_datastore(model, [d / "p30.npz"], tmp_path / "sliced", shards=1, max_length=64)
    with pytest.raises(ValueError, match="max_length"):  # vectors padded otherwise are not these rows
        slice_shard(tmp_path / "sliced", 0, tmp_path / "other")
    embed_corpus(model, [other], tmp_path / "other", batch_blocks=8, shards=1, max_length=64, progress=False)
    with pytest.raises(ValueError, match="not a subsample|outside"):
        slice_shard(tmp_path / "sliced", 0, tmp_path / "other")
    plan_datastore(model, [d / "full.npz"], tmp_path / "not_subsampled", shards=1, max_length=64)
    with pytest.raises(ValueError, match="source_blocks"):
        slice_shard(tmp_path / "not_subsampled", 0, d / "full")
    assert not shard_path(tmp_path / "sliced", 0).exists()


def test_subsample_records_its_source_blocks(corpus):
    d, _ = corpus
    full, sub = load_npz(d / "full.npz"), load_npz(d / "p30.npz")
    src = sub["source_blocks"]
    assert np.all(np.diff(src) > 0)
    for b, s in enumerate(src[:5]):
        a, e = full["block_offsets"][s], full["block_offsets"][s + 1]
        np.testing.assert_array_equal(sub["input_ids"][sub["block_offsets"][b]:sub["block_offsets"][b + 1]],
                                      full["input_ids"][a:e])
