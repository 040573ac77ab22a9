"""The FAISS kNN index over fp16 shard memmaps (paper-map §3.5, §4.1; npm/datastore/faiss_index.py)."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from npm.datastore.faiss_index import (  # noqa: E402
    build_faiss_index,
    exact_scores,
    load_faiss_index,
    memmap_vectors,
    sample_rows,
    search,
    shards_from_files,
    sidecar_path,
)

DIM = 32


@pytest.fixture(autouse=True, scope="module")
def one_faiss_thread():
    """One OpenMP thread: on a small shared machine FAISS's spinning threads make k-means tens of times slower."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


def clustered(n: int, dim: int, seed: int, n_clusters: int = 20, norms: bool = True) -> np.ndarray:
    """Clustered fp32 vectors; with ``norms`` the row norms vary (log-normal), so IP and L2 rankings differ."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_clusters, dim))
    x = centers[rng.integers(0, n_clusters, n)] + 0.5 * rng.normal(size=(n, dim))
    if norms:
        x *= rng.lognormal(0.0, 0.5, size=(n, 1))
    else:
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def write_shards(tmp_path, sizes, dim=DIM, seed=0, norms=True):
    """Raw fp16 memmap shards (no header) in tmp_path; returns ([(path, rows)], all rows as fp16 [N, dim])."""
    data = clustered(sum(sizes), dim, seed, norms=norms).astype(np.float16)
    shards, start = [], 0
    for k, rows in enumerate(sizes):
        path = tmp_path / f"shard{k}.f16"
        mm = np.memmap(path, dtype=np.float16, mode="w+", shape=(rows, dim))
        mm[:] = data[start : start + rows]
        mm.flush()
        del mm
        shards.append((path, rows))
        start += rows
    return shards, data


def brute_force_ip(data16: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    scores = queries @ data16.astype(np.float32).T
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found, exact, strict=True)]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shards")
    shards, data = write_shards(tmp, [3000, 5000])
    queries = clustered(50, DIM, seed=99)
    return shards, data, queries


def test_flat_inner_product_equals_numpy_brute_force_not_l2(corpus, tmp_path):
    shards, data, queries = corpus
    build_faiss_index(shards, DIM, tmp_path / "flat.faiss", factory="Flat", metric="ip")
    rows, valid = search(load_faiss_index(tmp_path / "flat.faiss"), queries, k=20)
    exact = brute_force_ip(data, queries, 20)
    assert valid.all()
    np.testing.assert_array_equal(np.sort(rows, axis=1), np.sort(exact, axis=1))
    # the data has rows of different norms, so the L2 top-k is a different set: the metric really is IP
    l2 = ((data.astype(np.float32)[None] - queries[:, None]) ** 2).sum(-1)
    l2_top = np.argsort(l2, axis=1)[:, :20]
    assert recall(l2_top, exact) < 0.9


def test_l2_metric_switch_gives_the_l2_ranking(corpus, tmp_path):
    shards, data, queries = corpus
    info = build_faiss_index(shards, DIM, tmp_path / "l2.faiss", factory="Flat", metric="l2")
    rows, _ = search(load_faiss_index(tmp_path / "l2.faiss"), queries, k=10)
    l2 = ((data.astype(np.float32)[None] - queries[:, None]) ** 2).sum(-1)
    np.testing.assert_array_equal(np.sort(rows, axis=1), np.sort(np.argsort(l2, axis=1)[:, :10], axis=1))
    assert info["metric"] == "l2"


def test_hnsw_recall_at_default_settings(corpus, tmp_path):
    shards, data, queries = corpus
    info = build_faiss_index(shards, DIM, tmp_path / "hnsw.faiss")  # default factory HNSW32, IP
    assert info["factory"] == "HNSW32" and info["metric"] == "ip"
    assert info["params"] == {"efSearch": 128} and info["ef_construction"] == 200
    rows, _ = search(load_faiss_index(tmp_path / "hnsw.faiss"), queries, k=10)
    assert recall(rows, brute_force_ip(data, queries, 10)) >= 0.95


def test_hnsw_search_raises_ef_search_to_k(corpus, tmp_path):
    shards, _, queries = corpus
    build_faiss_index(shards, DIM, tmp_path / "hnsw.faiss", factory="HNSW32", ef_search=16)
    index = load_faiss_index(tmp_path / "hnsw.faiss")
    rows, valid = search(index, queries, k=4096)
    assert rows.shape == (len(queries), 4096) and valid.all()
    assert len(set(rows[0].tolist())) == 4096
    assert faiss.downcast_index(index).hnsw.efSearch == 16  # the index itself is unchanged


def test_ivfpq_training_on_seeded_sample_is_deterministic(corpus, tmp_path):
    shards, _, queries = corpus
    kwargs = dict(factory="IVF32,PQ8", train_sample=4000, seed=1, add_chunk=1500)
    a = build_faiss_index(shards, DIM, tmp_path / "a.faiss", **kwargs)
    b = build_faiss_index(shards, DIM, tmp_path / "b.faiss", **kwargs)
    assert a["train_sample"] == b["train_sample"] == 4000 and a["ntotal"] == 8000
    assert a["polysemous_training"] is False  # index_factory's slow polysemous pass is switched off
    ra, va = search(load_faiss_index(tmp_path / "a.faiss"), queries, k=50)
    rb, vb = search(load_faiss_index(tmp_path / "b.faiss"), queries, k=50)
    np.testing.assert_array_equal(ra, rb)
    np.testing.assert_array_equal(va, vb)


def ivfpq_by_hand(quantizer, corpus, sample: np.ndarray | None = None) -> np.ndarray:
    """The 50 neighbours of the corpus's queries in IndexIVFPQ(quantizer, DIM, 32, 8, 8), FAISS's default (L2) metric,
    trained on the rows ``sample`` (default: those build_faiss_index draws with seed 1, 4,000 of 8,000), nprobe 8."""
    shards, data, queries = corpus
    if sample is None:
        sample = np.sort(np.random.default_rng(1).choice(8000, 4000, replace=False))
    index = faiss.IndexIVFPQ(quantizer, DIM, 32, 8, 8)
    index.do_polysemous_training = False
    index.train(memmap_vectors(shards, DIM)(sample))
    index.add(data.astype(np.float32))
    index.nprobe = 8
    return index.search(queries, 50)[1]


def test_code_metric_builds_the_original_codes_index_an_ip_quantizer_with_l2_codes(corpus, tmp_path):
    """datastore.faiss_metric: code = the original's IndexIVFPQ(IndexFlatIP(d), d, nlist, M, 8) with the metric left
    at FAISS's default (L2): the same neighbours as that index built by hand from FAISS's classes on the same
    training sample; another neighbour list than the inner-product IVF-PQ."""
    shards, data, queries = corpus
    info = build_faiss_index(shards, DIM, tmp_path / "code.faiss", factory="IVF32,PQ8", metric="code",
                             train_sample=4000, seed=1, nprobe=8)
    assert info["metric"] == "code"
    index = load_faiss_index(tmp_path / "code.faiss")  # owns the IVF part: keep it alive
    ours = faiss.extract_index_ivf(index)
    assert ours.metric_type == faiss.METRIC_L2
    assert faiss.downcast_index(ours.quantizer).metric_type == faiss.METRIC_INNER_PRODUCT
    rows, valid = search(index, queries, k=50)

    expected = ivfpq_by_hand(faiss.IndexFlatIP(DIM), corpus)  # its metric left at the default, L2
    np.testing.assert_array_equal(np.where(valid, rows, -1), expected)

    build_faiss_index(shards, DIM, tmp_path / "ip.faiss", factory="IVF32,PQ8", metric="ip", train_sample=4000,
                      seed=1, nprobe=8)
    ip_rows, _ = search(load_faiss_index(tmp_path / "ip.faiss"), queries, k=50)
    assert not np.array_equal(ip_rows, rows)


def test_l2_metric_builds_the_index_the_original_s_gpu_build_left_an_l2_quantizer_with_l2_codes(corpus, tmp_path):
    """datastore.faiss_metric: l2 (the paper routes') = the original's IndexIVFPQ after its default GPU training: FAISS
    1.7.2's GPU copy gives it an L2 coarse quantizer (the inner-product one is dropped) and the copy back keeps it,
    so the index is L2 throughout; the same neighbours as IndexIVFPQ(IndexFlatL2(d), ...) built by hand."""
    shards, data, queries = corpus
    info = build_faiss_index(shards, DIM, tmp_path / "l2.faiss", factory="IVF32,PQ8", metric="l2",
                             train_sample=4000, seed=1, nprobe=8)
    assert info["metric"] == "l2"
    index = load_faiss_index(tmp_path / "l2.faiss")
    ours = faiss.extract_index_ivf(index)
    assert ours.metric_type == faiss.METRIC_L2
    assert faiss.downcast_index(ours.quantizer).metric_type == faiss.METRIC_L2
    rows, valid = search(index, queries, k=50)
    expected = ivfpq_by_hand(faiss.IndexFlatL2(DIM), corpus)
    np.testing.assert_array_equal(np.where(valid, rows, -1), expected)


def original_sample(ntotal: int) -> np.ndarray:
    """The rows the original trains its index on, as its ``_train_index`` draws them: the global legacy generator
    seeded with 1, then a choice without replacement of at most 1,000,000 rows, kept in drawn order."""
    state = np.random.get_state()
    try:
        np.random.seed(1)
        return np.random.choice(np.arange(ntotal), size=[min(1000000, ntotal)], replace=False)
    finally:
        np.random.set_state(state)


def test_the_code_draw_trains_on_the_original_s_sample_in_its_drawn_order(corpus, tmp_path):
    """datastore.faiss_train_draw: code (the paper routes') trains on the original's sample, in its order (k-means
    picks its first centroids by position in the training set, so the order matters as well as the rows): the same
    neighbours as the index trained by hand on it, and not those of our default draw."""
    shards, _, queries = corpus
    info = build_faiss_index(shards, DIM, tmp_path / "code.faiss", factory="IVF32,PQ8", metric="l2",
                             train_sample=4000, seed=1, nprobe=8, train_draw="code")
    assert (info["train_draw"], info["train_sample"]) == ("code", 4000)
    rows, valid = search(load_faiss_index(tmp_path / "code.faiss"), queries, k=50)
    drawn = original_sample(8000)[:4000]  # at most 1,000,000: here train_sample caps it
    expected = ivfpq_by_hand(faiss.IndexFlatL2(DIM), corpus, drawn)
    np.testing.assert_array_equal(np.where(valid, rows, -1), expected)
    assert (expected != ivfpq_by_hand(faiss.IndexFlatL2(DIM), corpus)).any()
    assert not np.array_equal(np.sort(drawn), drawn)


def test_the_code_draw_shuffles_a_datastore_smaller_than_its_sample(corpus):
    """With fewer rows than the sample, the original still draws: every row, in a shuffled order; ours keeps them
    in row order."""
    np.testing.assert_array_equal(sample_rows(8000, 10_000, 1, "code"), original_sample(8000))
    np.testing.assert_array_equal(sample_rows(8000, 10_000, 1, "sorted"), np.arange(8000))
    np.testing.assert_array_equal(sample_rows(8000, 4000, 1, "code"), original_sample(8000)[:4000])


def test_code_metric_needs_an_ivf_factory(corpus, tmp_path):
    shards, _, _ = corpus
    with pytest.raises(ValueError, match="needs an IVF factory"):
        build_faiss_index(shards, DIM, tmp_path / "x.faiss", factory="HNSW32", metric="code")
    assert not (tmp_path / "x.faiss").exists()


def test_nprobe_is_recorded_and_applied_on_load(corpus, tmp_path):
    shards, _, queries = corpus
    out = tmp_path / "ivf.faiss"
    build_faiss_index(shards, DIM, out, factory="IVF32,PQ8", nprobe=3)
    assert json.loads(sidecar_path(out).read_text())["params"] == {"nprobe": 3}
    assert faiss.extract_index_ivf(load_faiss_index(out)).nprobe == 3
    wide = load_faiss_index(out, nprobe=32)
    assert faiss.extract_index_ivf(wide).nprobe == 32
    # probing every list finds a full list of candidates
    _, valid = search(wide, queries, k=2000)
    assert valid.all()


def test_exact_scores_are_dot_over_sqrt_h_of_the_fp16_rows(corpus):
    shards, data, queries = corpus
    rows = np.array([[0, 2999, 3000, 7999], [5, 4000, 1, 6000]], dtype=np.int64)
    got = exact_scores(queries[:2], rows, memmap_vectors(shards, DIM))
    want = np.einsum("qh,qkh->qk", queries[:2], data[rows].astype(np.float32)) / math.sqrt(DIM)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_padding_rows_score_minus_infinity(corpus):
    shards, _, queries = corpus
    rows = np.array([[4, -1, -1]], dtype=np.int64)
    got = exact_scores(queries[:1], rows, memmap_vectors(shards, DIM))
    assert np.isfinite(got[0, 0]) and np.isneginf(got[0, 1:]).all()


def test_global_row_ids_span_shards(tmp_path):
    shards, data = write_shards(tmp_path, [3000, 4000], norms=False)  # unit norm: a vector is its own top-1 by IP
    targets = np.array([3000, 3001, 5123, 6999])  # rows of shard 2
    queries = data[targets].astype(np.float32)
    for factory in ("Flat", "HNSW32"):
        out = tmp_path / f"{factory}.faiss"
        build_faiss_index(shards, DIM, out, factory=factory, add_chunk=1234)  # several add() calls per shard
        rows, _ = search(load_faiss_index(out), queries, k=1)
        np.testing.assert_array_equal(rows[:, 0], targets)
    np.testing.assert_array_equal(memmap_vectors(shards, DIM)(targets), queries)


def test_failed_build_leaves_no_file(corpus, tmp_path):
    shards, _, _ = corpus
    out = tmp_path / "bad.faiss"
    with pytest.raises(ValueError, match="factory string 'NoSuchIndex12'"):
        build_faiss_index(shards, DIM, out, factory="NoSuchIndex12")
    assert list(tmp_path.iterdir()) == []


def test_previous_index_survives_a_failed_rebuild(corpus, tmp_path):
    shards, _, _ = corpus
    out = tmp_path / "x.faiss"
    build_faiss_index(shards, DIM, out, factory="Flat")
    before = out.read_bytes()
    with pytest.raises(ValueError):
        build_faiss_index(shards, DIM, out, factory="IVF8,PQ7")
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["x.faiss", "x.faiss.json"]


def test_pq_m_not_dividing_dim_is_a_clear_error(corpus, tmp_path):
    shards, _, _ = corpus
    with pytest.raises(ValueError, match=r"PQ7 needs M to divide the vector dimension 32; choose M in \[1, 2, 4"):
        build_faiss_index(shards, DIM, tmp_path / "pq.faiss", factory="IVF16,PQ7")


def test_nlist_too_large_for_the_sample_is_reduced_with_a_warning(corpus, tmp_path, caplog):
    shards, _, queries = corpus
    with caplog.at_level(logging.WARNING, logger="npm.datastore.faiss_index"):
        info = build_faiss_index(shards, DIM, tmp_path / "ivf.faiss", factory="IVF4096,PQ16", train_sample=3000)
    assert "reducing nlist to 76" in caplog.text
    assert info["nlist_requested"] == 4096 and info["nlist"] == 3000 // 39
    assert info["factory_effective"] == "IVF76,PQ16" and info["factory"] == "IVF4096,PQ16"
    assert faiss.extract_index_ivf(load_faiss_index(tmp_path / "ivf.faiss")).nlist == 76
    rows, _ = search(load_faiss_index(tmp_path / "ivf.faiss"), queries, k=5)
    assert rows.shape == (len(queries), 5)


def test_pq_with_fewer_vectors_than_codewords_is_a_clear_error(tmp_path):
    shards, _ = write_shards(tmp_path, [100, 100])
    with pytest.raises(ValueError, match="8-bit PQ needs at least 256 training vectors.*use factory 'Flat'"):
        build_faiss_index(shards, DIM, tmp_path / "tiny.faiss", factory="IVF4096,PQ8")


def test_k_larger_than_ntotal_is_clamped(tmp_path):
    shards, data = write_shards(tmp_path, [30, 20])
    build_faiss_index(shards, DIM, tmp_path / "f.faiss", factory="Flat")
    rows, valid = search(load_faiss_index(tmp_path / "f.faiss"), data[:3].astype(np.float32), k=4096)
    assert rows.shape == (3, 50) and valid.all()
    assert (np.sort(rows, axis=1) == np.arange(50)).all()


def test_shard_size_mismatch_is_a_clear_error(corpus, tmp_path):
    shards, _, _ = corpus
    with pytest.raises(ValueError, match=r"shard0\.f16: 192000 bytes, but 3000 rows x 64 dims"):
        build_faiss_index(shards, 64, tmp_path / "f.faiss", factory="Flat")
    assert shards_from_files([p for p, _ in shards], DIM) == list(shards)


@pytest.mark.skipif(faiss.get_num_gpus() > 0, reason="this machine has a GPU")
def test_use_gpu_true_without_gpu_is_an_error(corpus, tmp_path):
    shards, _, _ = corpus
    with pytest.raises(RuntimeError, match="use_gpu=True but FAISS sees no GPU"):
        build_faiss_index(shards, DIM, tmp_path / "g.faiss", factory="IVF16,Flat", use_gpu=True)
    assert not (tmp_path / "g.faiss").exists()


@pytest.mark.parametrize("n_queries", [1, 2, 64])
def test_search_leaves_faiss_blas_threshold_as_it_found_it(tmp_path, n_queries):
    """FAISS's matrix-product threshold is a process-wide setting: ``search`` lowers it for a batch of vectors (the
    product is faster from 4 on) and only for that call; 1-3 vectors keep FAISS's own path (the lowered threshold
    made a 1-vector search 2.7x slower), and other FAISS users in the process (index training) never see it."""
    shards, data = write_shards(tmp_path, [40])
    build_faiss_index(shards, DIM, tmp_path / "f.faiss", factory="Flat")
    index = load_faiss_index(tmp_path / "f.faiss")
    before = faiss.cvar.distance_compute_blas_threshold
    rows, _ = search(index, data[:n_queries].astype(np.float32), k=10)
    assert faiss.cvar.distance_compute_blas_threshold == before
    assert np.array_equal(rows, brute_force_ip(data, data[:n_queries].astype(np.float32), 10))
