"""Predictor end to end on a small real datastore (paper-map §3.5-§3.8; §9 items 22-25): the
BM25-restricted and the exact FAISS paths agree when they see the same candidates, surface strings are exact,
and bad input is a clear error."""

import numpy as np
import pytest

from npm.cli import main
from npm.datastore.store import load_datastore
from npm.inference.predictor import Predictor
from tests.conftest import build_tiny_corpus, lee_corpus_lines, save_tiny_bert


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


def predictor(world, **kw):
    root, _ = world
    return Predictor(str(root / "model"), str(root / "ds"), bm25=str(root / "bm25"), faiss=str(root / "flat.faiss"),
                     **kw)


@pytest.mark.parametrize("kind", ["npm", "npm_single"])
@pytest.mark.parametrize("form", ["paper", "code"])
def test_restricted_and_exact_faiss_paths_agree_on_the_same_candidates(world, kind, form):
    """All blocks in restricted mode and all rows through an exact index: the same candidates, the same phrases
    and scores (the restricted mode scores every stored vector of its blocks exactly, paper-map §3.7-§3.8)."""
    _, ds = world
    p = predictor(world, kind=kind, form=form, k=ds.n_rows)
    p.retrieve_blocks = lambda text, is_question=None: np.arange(ds.n_blocks)  # BM25 returns only matching blocks
    query = "Thessaloniki is the second largest city in <mask>."
    restricted = p.predict(query, top=10, mode="restricted")
    exact = p.predict(query, top=10, mode="faiss")
    assert [r["text"] for r in restricted] == [r["text"] for r in exact]
    np.testing.assert_allclose([r["score"] for r in restricted], [r["score"] for r in exact], rtol=1e-5)
    assert len(restricted) == 10


def test_phrases_are_exact_corpus_strings_with_evidence(world):
    _, ds = world
    p = predictor(world, n_blocks=ds.n_blocks, l_max=10)
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
    p = predictor(world, kind="npm_single", k=50)
    tok = p.tokenizer
    words = [np.array(tok.convert_tokens_to_ids(w)) for w in (["the"], ["a", "an"])]
    scores = p.label_scores("It was <mask>.", words, tau=5.0)
    assert scores.shape == (2,) and (scores >= 0).all() and scores.sum() <= 1 + 1e-9
    ids, sims = p.knn("It was <mask>.")
    assert len(ids) == 50 and np.all(np.diff(np.sort(sims)) >= 0)


def test_another_model_is_refused(world, tmp_path):
    root, _ = world
    save_tiny_bert(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="model"):
        Predictor(str(tmp_path / "other"), str(root / "ds"))


def test_predict_cli_prints_phrases_and_evidence(world, capsys):
    root, _ = world
    rc = main(["predict", "--model", str(root / "model"), "--datastore", str(root / "ds"), "--bm25",
               str(root / "bm25"), "--top", "2", "Thessaloniki is the second largest city in <mask>."])
    out = capsys.readouterr().out
    assert rc == 0 and "1. " in out and "2. " in out and "block " in out
    import npm
    assert npm.Predictor is Predictor
    rc = main(["predict", "--model", str(root / "model"), "--datastore", str(root / "ds"), "--bm25",
               str(root / "bm25"), "No mask in this query."])
    assert rc == 1 and "no mask" in capsys.readouterr().err
