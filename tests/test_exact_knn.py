"""Exact closed-set kNN in torch (``npm.datastore.exact_knn``, issues 42-43): FAISS Flat's neighbours for inner
product, ties defined (the k-th place to the lower row id; equal scores listed as FAISS lists them, higher id first),
single query and batched, across block boundaries, k larger than the datastore."""

import faiss
import numpy as np
import pytest

from npm.datastore.exact_knn import ExactKnn
from npm.datastore.faiss_index import search

H = 16


def distinct_world(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """fp16 vectors [n, H] and fp32 queries [64, H] of small integers whose inner products are exact in fp32 in any
    summation order and all distinct per query (the last term, 64 * (p // 64) + p % 64 = p, a permutation of the
    rows, separates the rest, a multiple of 4096): every exact search must return the same list."""
    assert n <= 4096
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    x = np.zeros((n, H), np.float16)
    x[:, 0], x[:, 1] = perm // 64, perm % 64
    x[:, 2:] = rng.integers(-4, 5, (n, H - 2))
    q = np.zeros((64, H), np.float32)
    q[:, 0], q[:, 1] = 64, 1
    q[:, 2:] = 4096 * rng.integers(-3, 4, (64, H - 2))
    return x, q


def tied_world(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """fp16 vectors [n, H] with many exact ties: every row is one of 30 integer vectors (duplicates scattered over
    the rows, so over blocks), queries of small integers (exact scores in any order)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-3, 4, (30, H))
    return base[rng.integers(0, 30, n)].astype(np.float16), rng.integers(-3, 4, (64, H)).astype(np.float32)


def flat(x: np.ndarray):
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x.astype(np.float32))
    return index


def defined(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """The defined answer from exact (integer) scores: the k best by (score desc, row asc), listed by (score desc,
    row desc)."""
    s = q.astype(np.float64) @ x.astype(np.float64).T
    rows = np.arange(len(x))
    out = []
    for si in s:
        top = np.lexsort((rows, -si))[:k]
        out.append(top[np.lexsort((-top, -si[top]))])
    return np.array(out)


@pytest.mark.parametrize("block_rows", [97, 1000, 1 << 15])
@pytest.mark.parametrize("nq", [1, 2, 16, 64])
def test_the_neighbours_and_their_order_are_faiss_flats(nq, block_rows):
    x, q = distinct_world(3000)
    knn = ExactKnn([(0, x[:1234]), (1234, x[1234:])], block_rows=block_rows)  # two shards, as iter_vectors
    for k in (1, 10, 100, 1000, 2999, 3000):
        scores, expected = flat(x).search(q[:nq], k)
        rows, got = knn.search(q[:nq], k)
        assert np.array_equal(rows, expected), (k, nq)
        assert np.array_equal(got, scores)  # exact data: the same fp32 numbers


def test_k_larger_than_the_datastore_returns_every_row_as_the_projects_faiss_search():
    x, q = distinct_world(500)
    rows, _ = ExactKnn([(0, x)], block_rows=64).search(q[:3], 4096)
    expected, valid = search(flat(x), q[:3], 4096)
    assert rows.shape == (3, 500) and valid.all() and np.array_equal(rows, expected)


@pytest.mark.parametrize("block_rows", [37, 256, 1 << 15])
@pytest.mark.parametrize("nq", [1, 16, 64])
def test_ties_the_kth_place_goes_to_the_lower_row_and_equal_scores_list_as_faiss(nq, block_rows):
    """Rows with equal scores straddle the k boundary and the block boundaries; FAISS Flat keeps any of the tied
    rows at the k-th place (its reservoir), so against FAISS the scores agree and so do the rows above the last
    tied score (same rows, same order: equal scores by row id descending)."""
    x, q = tied_world(2000)
    knn = ExactKnn([(0, x)], block_rows=block_rows)
    for k in (1, 37, 150, 999, 2000):
        rows, got = knn.search(q[:nq], k)
        assert np.array_equal(rows, defined(x, q[:nq], k)), (k, nq)
        scores, found = flat(x).search(q[:nq], k)
        assert np.array_equal(got, scores)
        inside = scores > scores[:, -1:]  # the tie at the k-th score is FAISS's choice
        assert np.array_equal(rows[inside], found[inside])


def test_a_tie_group_larger_than_k_keeps_its_lowest_rows():
    x = np.ones((100, H), np.float16)
    rows, scores = ExactKnn([(0, x)], block_rows=9).search(np.ones((1, H), np.float32), 10)
    assert rows.tolist() == [list(range(9, -1, -1))] and (scores == H).all()


def test_fp32_and_fp16_storage_and_several_input_blocks_agree():
    x, q = tied_world(700, seed=3)
    a = ExactKnn([(0, x)]).search(q, 50)
    b = ExactKnn([(0, x[:300].astype(np.float32)), (300, x[300:].astype(np.float32))], block_rows=128).search(q, 50)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_a_nan_score_ranks_last_and_bad_input_is_an_error():
    x, q = distinct_world(50)
    x[3, 2] = np.inf  # overflowed fp16: inf * 0 = NaN for a query with a zero there
    q0 = q[:1].copy()
    q0[0, 2] = 0
    rows, _ = ExactKnn([(0, x)]).search(q0, 50)
    assert rows[0, -1] == 3
    with pytest.raises(ValueError, match="k must be >= 1"):
        ExactKnn([(0, x)]).search(q0, 0)
    with pytest.raises(ValueError, match=r"queries must be \[q, 16\]"):
        ExactKnn([(0, x)]).search(q0[:, :8], 5)
    with pytest.raises(ValueError, match="does not follow"):
        ExactKnn([(0, x), (60, x)])
