"""Predictor end to end on a small real datastore (paper-map §3.5-§3.8; §9 items 22-25): the
BM25-restricted and the exact FAISS paths agree when they see the same candidates, surface strings are exact,
and bad input is a clear error."""

import re
import subprocess
import sys

import numpy as np
import pytest

from npm.cli import main
from npm.datastore.exact_knn import ExactKnn
from npm.datastore.faiss_index import build_faiss_index, exact_scores, search
from npm.datastore.store import load_datastore
from npm.inference.predictor import Predictor
from npm.settings import Settings
from tests.conftest import build_tiny_corpus, lee_corpus_lines, load_benchmark, save_tiny_bert


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny random BERT (MiniLM vocabulary), 40 news paragraphs as blocks of <= 64 tokens, its datastore, an
    exact FAISS index and a BM25 index."""
    root = tmp_path_factory.mktemp("world")
    save_tiny_bert(root / "model", seed=0)
    lines = lee_corpus_lines()[:12]
    lines[3] = "Thessaloniki is the second largest city in Greece, with the café Ω on its waterfront."
    build_tiny_corpus(root, str(root / "model"), lines)
    return root, load_datastore(root / "ds")


def predictor(world, model="npm", l_max=10, **settings):
    """The Predictor of the tiny corpus; ``settings``: fields of Settings."""
    root, _ = world
    return Predictor(str(root / "model"), str(root / "ds"), model, Settings(**settings), bm25=str(root / "bm25"),
                     faiss=str(root / "flat.faiss"), l_max=l_max)


@pytest.mark.parametrize(("model", "form"), [("npm", "paper"), ("npm_single", "paper"), ("npm_single", "code")])
def test_restricted_and_exact_faiss_paths_agree_on_the_same_candidates(world, model, form):
    """All blocks in restricted mode and all rows through an exact index: the same spans, the same phrases and
    scores (the restricted mode scores every stored vector of its blocks exactly, paper-map §3.7-§3.8). Not for
    NPM's "code" span score: there restricted mode's start softmax runs over every stored vector of the blocks,
    the unrestricted one's over valid word starts only (as the original's two modes)."""
    _, ds = world
    p = predictor(world, model, span_score=form, k=ds.n_rows)
    p.retrieve_blocks_batch = lambda texts, q: [np.arange(ds.n_blocks)] * len(texts)  # BM25: only matching blocks
    query = "Thessaloniki is the second largest city in <mask>."
    restricted = p.predict(query, top=10, mode="restricted")
    exact = p.predict(query, top=10, mode="faiss")
    assert [r["text"] for r in restricted] == [r["text"] for r in exact]
    np.testing.assert_allclose([r["score"] for r in restricted], [r["score"] for r in exact], rtol=1e-5)
    assert len(restricted) == 10


@pytest.mark.parametrize("model", ["npm", "npm_single"])
def test_unrestricted_candidates_are_the_k_nearest_content_rows_at_word_boundaries(world, model):
    """Unrestricted (FAISS) open-set mode as the original's open-set datastore, which holds no stop-word vector:
    the k neighbours of each query vector are the k best non-stop-word rows (stop words never take a place), and
    NPM's start (end) candidates are those of them at valid word starts (ends). Before: stop-word rows took places
    among the k and were dropped after, and non-start positions entered the start softmax."""
    from npm.datastore.faiss_index import search

    _, ds = world
    k = 40
    p = predictor(world, model, k=k)
    q = p.encode(["Thessaloniki is the second largest city in <mask>."])
    token = ds.row_tokens
    content = ~np.isin(token, ds.stopword_ids)
    assert (~content).sum() > k  # stop-word rows could take every place
    rows, valid = search(p._faiss_index(), q[0], k, rows=p._open_rows())
    assert valid.all() and rows.shape == (q.shape[1], k)
    full = p._view(np.arange(ds.n_blocks))
    view, start, end = p._faiss_candidates(q)
    for side, cand, boundary in ((0, start, "valid_start"), (-1, end, "valid_end")):
        sims = ds.vectors(np.arange(ds.n_rows)) @ q[0, side]
        got = rows[side]
        assert content[got].all()
        others = np.setdiff1d(np.flatnonzero(content), got)
        assert sims[got].min() >= sims[others].max() - 1e-5  # the k best content rows
        expected = got[np.isin(got, full["rows"][full[boundary]])] if model == "npm" else got
        np.testing.assert_array_equal(np.sort(view["rows"][cand]), np.sort(expected))
        if model == "npm":
            assert view[boundary][cand].all()


def test_phrases_are_exact_corpus_strings_with_evidence(world):
    _, ds = world
    p = predictor(world, restricted_blocks=ds.n_blocks, l_max=10)
    for r in p.predict("Thessaloniki is the second largest city in <mask>.", top=50):
        assert r["text"] and any(r["text"] in passage for _, passage in r["evidence"])
        assert r["text"] == r["text"].strip() and r["occurrences"] >= 1
    # The uncased WordPiece tokenizer lowercases and strips accents; the corpus text keeps them.
    assert "café Ω" in p.block_text(int(p.retrieve_blocks("Thessaloniki café waterfront <mask>.")[0]))


def test_restricted_mode_uses_the_top_bm25_blocks(world):
    p = predictor(world)
    blocks = p.retrieve_blocks("Thessaloniki is the second largest city in <mask>.")
    assert len(blocks) == 3 and "Thessaloniki" in p.block_text(int(blocks[0]))


def test_closed_set_label_scores_are_a_distribution_over_verbalizer_tokens(world):
    p = predictor(world, "npm_single", k=50)
    tok = p.tokenizer
    words = [np.array(tok.convert_tokens_to_ids(w)) for w in (["the"], ["a", "an"])]
    scores = p.label_scores("It was <mask>.", words, tau=5.0)
    assert scores.shape == (2,) and (scores >= 0).all() and scores.sum() <= 1 + 1e-9
    ids, sims = p.knn("It was <mask>.")
    assert len(ids) == 50 and np.all(np.diff(np.sort(sims)) >= 0)


def test_the_original_open_set_stand_in_of_the_speed_benchmark_predicts_what_the_project_predicts(world):
    """benchmarks/predict.py's stand-in of the original's predict_span (one example at a time, spans walked and
    scored in Python dicts) against the project's batched open set with the code's span score: the same phrase for
    every query, so that the benchmark's ratio compares two ways of computing one answer."""
    bench = load_benchmark("predict")
    p = predictor(world, span_score="code")
    queries = ["Thessaloniki is the second largest city in <mask>.", "The capital of Greece is <mask>.",
               "Who won the <mask> election?", "The <mask> said on Monday that the talks had failed."]
    original = bench.original_open_set(p, queries, bench._masked_lm(p.encoder), bench.OriginalLayout(p))
    project = [r[0]["text"] if r else "" for r in p.predict_batch(queries, top=1)]
    assert original == project and any(original)


def test_another_model_is_refused(world, tmp_path):
    root, _ = world
    save_tiny_bert(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="model"):
        Predictor(str(tmp_path / "other"), str(root / "ds"))


def test_predict_cli_prints_phrases_and_evidence(world, capsys):
    root, _ = world
    rc = main(["predict", "--checkpoint", str(root / "model"), "--datastore", str(root / "ds"), "--bm25",
               str(root / "bm25"), "--top", "2", "Thessaloniki is the second largest city in <mask>."])
    out = capsys.readouterr().out
    assert rc == 0 and "1. " in out and "2. " in out and "block " in out
    import npm
    assert npm.Predictor is Predictor
    rc = main(["predict", "--checkpoint", str(root / "model"), "--datastore", str(root / "ds"), "--bm25",
               str(root / "bm25"), "No mask in this query."])
    assert rc == 1 and "no mask" in capsys.readouterr().err


def _predict_output(root, *extra) -> str:
    """stdout and stderr of `npm-repro predict` in a fresh process (the JVM starts once per process)."""
    out = subprocess.run([sys.executable, "-m", "npm.cli", "predict", "--checkpoint", str(root / "model"),
                          "--datastore", str(root / "ds"), "--bm25", str(root / "bm25"), "--top", "1", *extra,
                          "Thessaloniki is the second largest city in <mask>."], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "1. " in out.stdout
    return out.stdout + out.stderr


def test_predict_prints_no_library_chatter_unless_verbose(world):
    """transformers' "Loading weights" bars and Lucene's INFO lines (java.util.logging: "INFO: Using
    MemorySegmentIndexInput ...") appear only with --verbose (npm.verbosity)."""
    root, _ = world
    quiet = _predict_output(root)
    assert "Loading weights" not in quiet, quiet
    assert "org.apache.lucene" not in quiet and not re.search(r"^INFO: ", quiet, re.M), quiet
    verbose = _predict_output(root, "--verbose")
    assert "Loading weights" in verbose and "org.apache.lucene" in verbose, verbose[-3000:]


def _knn_through_faiss(p, vectors: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Closed-set kNN through FAISS (the path before the exact one, and still that of any other index): FAISS's
    list, rescored exactly and listed by exact score."""
    n, m, h = vectors.shape
    flat = np.ascontiguousarray(vectors.reshape(n * m, h), dtype=np.float32)
    rows, valid = search(p._faiss_index(), flat, p.settings.k)
    rows = p.ds.index_rows(rows)
    sims = exact_scores(flat, rows, p.ds.vectors)
    order = np.lexsort((-rows, -sims), axis=1)  # by exact score, equal ones by row id descending, as knn_vectors
    rows, valid, sims = (np.take_along_axis(a, order, axis=1).reshape(n, -1) for a in (rows, valid, sims))
    return [(p.ds.row_token_ids(r[v]), s[v]) for r, v, s in zip(rows, valid, sims, strict=True)]


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("k", [50, 4096])
@pytest.mark.parametrize("model", ["npm", "npm_single"])
def test_closed_set_knn_over_a_flat_index_is_exact_in_torch_with_faiss_flats_list(world, model, k, shuffled):
    """Closed-set kNN over the Flat index goes through ``npm.datastore.exact_knn``, not FAISS, and gives exactly
    FAISS Flat's list, rescored: the same neighbour tokens and scores in the same order (by exact score, so that
    two neighbours FAISS's one-vector scan and torch's product round a unit apart cannot swap), so the same label
    scores, for one query and a batch, k under and over the datastore's rows, and the negative control's shuffled
    rows."""
    _, ds = world
    p = predictor(world, model, k=k)
    if shuffled:
        p.ds.shuffle_vectors(seed=0)
    texts = ["It was <mask>.", "Thessaloniki is a city in <mask>.", "The <mask> said on Tuesday.", "<mask> won."]
    vectors = p.encode(texts)
    batched = p.knn_vectors(vectors)
    assert isinstance(p._exact, ExactKnn)
    expected = _knn_through_faiss(p, vectors)
    singles = [p.knn_vectors(vectors[i:i + 1])[0] for i in range(len(texts))]
    for (ids, sims), (one_ids, one_sims), (want_ids, want_sims) in zip(batched, singles, expected, strict=True):
        assert len(ids) == min(k, ds.n_rows) * (2 if model == "npm" else 1)
        assert np.array_equal(ids, want_ids) and np.array_equal(sims, want_sims)
        assert np.array_equal(one_ids, want_ids) and np.array_equal(one_sims, want_sims)


def test_closed_set_knn_over_another_index_stays_with_faiss(world, tmp_path):
    """An approximate index (HNSW, IVF-PQ at paper scale) is searched by FAISS, as before."""
    root, ds = world
    build_faiss_index(ds.vector_shards(), ds.hidden_size, tmp_path / "hnsw.faiss", factory="HNSW32",
                      datastore=ds)
    p = Predictor(str(root / "model"), str(root / "ds"), "npm_single", Settings(k=50),
                  faiss=str(tmp_path / "hnsw.faiss"))
    vectors = p.encode(["It was <mask>."])
    ids, sims = p.knn_vectors(vectors)[0]
    assert p._exact is False
    want_ids, want_sims = _knn_through_faiss(p, vectors)[0]
    assert np.array_equal(ids, want_ids) and np.array_equal(sims, want_sims)
