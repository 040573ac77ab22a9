"""The FAISS index's RAM, computed up front from its factory string (npm.datastore.faiss_index.index_bytes), and the
build refusing an index that does not fit the job's memory before any training (docs/paper-scale.md section 4)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from npm.datastore.faiss_index import _disable_polysemous_training, build_faiss_index, check_memory, index_bytes


@pytest.mark.parametrize("factory", ["Flat", "HNSW32", "HNSW16,SQ8", "IVF64,PQ16", "IVF64,SQ8", "OPQ16_64,IVF64,PQ16"])
def test_the_estimate_matches_the_index_faiss_writes(factory):
    d, n = 64, 10_000
    x = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
    index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    _disable_polysemous_training(index)  # as every build here: the pass only reorders codes (about 27 s for PQ16)
    if factory.startswith("OPQ"):  # one pass of the rotation's training (35 s at its default 50): the size is the same
        opq = faiss.downcast_VectorTransform(faiss.downcast_index(index).chain.at(0))
        opq.niter = opq.niter_pq = opq.niter_pq_0 = 1
    index.train(x)
    index.add(x)
    written = faiss.serialize_index(index).nbytes
    assert abs(index_bytes(factory, n, d) - written) <= 0.02 * written


def test_the_paper_scale_hnsw_does_not_fit_the_profile_and_says_what_would(tmp_path):
    # 116M vectors of roberta-large (enwiki-0 + cc_news, docs/paper-scale.md): HNSW32 about 500 GB, IVF4096,PQ64 ~8 GB.
    assert 450e9 < index_bytes("HNSW32", 116_000_000, 1024) < 560e9
    assert index_bytes("IVF4096,PQ64", 116_000_000, 1024) < 9e9
    with pytest.raises(ValueError, match=r"more than 90 % of this job's 128 GB.*IVF4096,PQ64"):
        check_memory("HNSW32", 116_000_000, 1024, 128_000, 1_000_000)
    assert check_memory("IVF4096,PQ64", 116_000_000, 1024, 128_000, 1_000_000)["index_bytes_estimate"] < 9e9


def test_the_build_refuses_before_writing_anything(tmp_path):
    vectors = np.random.default_rng(0).standard_normal((3000, 32)).astype(np.float16)
    shard = tmp_path / "shard0.f16"
    vectors.tofile(shard)
    with pytest.raises(ValueError, match="needs about"):
        build_faiss_index([(shard, 3000)], 32, tmp_path / "x.faiss", factory="Flat", mem_mb=1)
    assert not list(tmp_path.glob("x.faiss*"))
    record = build_faiss_index([(shard, 3000)], 32, tmp_path / "x.faiss", factory="Flat", mem_mb=1000)
    assert record["index_bytes_estimate"] == 3000 * 32 * 4
