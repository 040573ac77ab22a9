"""DensePhrases' phrase search (npm.densephrases.search; paper-map §D1.5) against brute force over every phrase of
a real blocks file: word boundaries, at most L words, one passage, no special token, exact scores."""

from __future__ import annotations

import numpy as np
import pytest

from npm.data.blocks import build_blocks, load_blocks
from npm.densephrases.search import PhraseTokens, candidates, refine, search
from npm.io import write_jsonl
from tests.conftest import WORDPIECE

DOCS = ["Athens is the capital of Greece.", "The Parthenon stands on the Acropolis of Athens.",
        "Paris is the capital and largest city of France.", "Unbelievably, photosynthesis converts sunlight."]


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("phrases")
    write_jsonl(root / "docs.jsonl", [{"id": f"d{i}", "units": [t]} for i, t in enumerate(DOCS)])
    build_blocks(root / "docs.jsonl", root / "blocks.npz", WORDPIECE, max_seq_length=64)
    blocks = load_blocks(root / "blocks.npz")
    tokens = PhraseTokens.from_flags(blocks["flags"], blocks["block_offsets"])
    h = np.random.default_rng(0).standard_normal((len(tokens), 8)).astype(np.float16)
    return blocks, tokens, h


def brute_force(tokens: PhraseTokens, max_words: int) -> set[tuple[int, int]]:
    """Every phrase of the dump, by definition."""
    out = set()
    for i in range(len(tokens)):
        for j in range(i, len(tokens)):
            inside = range(i, j + 1)
            if (tokens.word_start[i] and tokens.word_end[j] and len(set(tokens.passage[list(inside)])) == 1
                    and all(tokens.word[t] >= 0 for t in inside) and tokens.word[j] - tokens.word[i] < max_words):
                out.add((i, j))
    return out


def test_words_are_whole_words_between_special_tokens(dump):
    blocks, tokens, _ = dump
    ids = blocks["input_ids"]
    from npm.model import load_tokenizer

    tok = load_tokenizer(WORDPIECE)
    words = []
    for i in np.flatnonzero(tokens.word_start):
        j = i
        while not tokens.word_end[j]:
            j += 1
        words.append(tok.decode(ids[i:j + 1]).replace(" ", ""))
    assert words[:6] == ["athens", "is", "the", "capital", "of", "greece"] and words[6] == "the"  # "." ends no phrase
    punct = (blocks["flags"] & 32) != 0  # PUNCT_PIECE
    assert punct.any() and not (tokens.word_start & punct).any() and not (tokens.word_end & punct).any()
    assert (tokens.word[punct] >= 0).all()  # but a mark is a word of the passage (L counts it)
    assert "unbelievably" in words and "photosynthesis" in words  # WordPiece pieces joined into their word
    assert (tokens.word[(blocks["flags"] & 8) != 0] == -1).all()  # [CLS] / [SEP] belong to no word


@pytest.mark.parametrize("max_words", [1, 3, 20])
def test_candidates_are_every_phrase_through_a_retrieved_start_or_end(dump, max_words):
    _, tokens, _ = dump
    every = brute_force(tokens, max_words)
    rng = np.random.default_rng(max_words)
    starts, ends = rng.choice(len(tokens), 6, replace=False), rng.choice(len(tokens), 6, replace=False)
    want = {(i, j) for i, j in every if i in set(starts.tolist()) or j in set(ends.tolist())}
    got = candidates(starts, ends, tokens, max_words)
    assert {tuple(p) for p in got.tolist()} == want and len(got) == len(want)
    all_tokens = np.arange(len(tokens))
    assert {tuple(p) for p in candidates(all_tokens, all_tokens, tokens, max_words).tolist()} == every


def test_search_returns_the_brute_force_best_phrases_with_exact_scores(dump):
    import faiss

    _, tokens, h = dump
    index = faiss.IndexFlatIP(h.shape[1])
    index.add(h.astype(np.float32))
    rng = np.random.default_rng(1)
    q_start, q_end = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
    every = np.array(sorted(brute_force(tokens, 5)))
    hf = h.astype(np.float32)
    results = search(index, h, tokens, q_start, q_end, k=len(tokens), max_words=5, top_n=4)
    for n, (pairs, scores) in enumerate(results):
        brute = hf[every[:, 0]] @ q_start[n] + hf[every[:, 1]] @ q_end[n]
        best = np.argsort(-brute, kind="stable")[:4]
        assert pairs.tolist() == every[best].tolist() and np.allclose(scores, brute[best], atol=1e-5)
    # k below the dump: the top start's phrases are still found, every score exact
    (pairs, scores), = search(index, h, tokens, q_start[:1], q_end[:1], k=3, max_words=5, top_n=50)
    assert np.allclose(scores, hf[pairs[:, 0]] @ q_start[0] + hf[pairs[:, 1]] @ q_end[0], atol=1e-5)
    assert np.all(np.diff(scores) <= 0)
    with pytest.raises(ValueError, match="not one phrase dump"):
        search(index, h[:-1], tokens, q_start, q_end, k=3)


def test_a_filtered_dump_keeps_the_phrases_whose_start_and_end_it_keeps(dump):
    _, tokens, _ = dump
    keep = np.flatnonzero(np.random.default_rng(3).random(len(tokens)) < 0.6)
    kept = tokens.subset(keep)
    every = brute_force(tokens, 4)
    want = {(i, j) for i, j in every if i in set(keep.tolist()) and j in set(keep.tolist())}
    rows = np.arange(len(kept))
    got = {(int(keep[a]), int(keep[b])) for a, b in candidates(rows, rows, kept, 4).tolist()}
    assert got == want  # across a dropped special token no phrase appears: segments come from the full table
    assert PhraseTokens.from_arrays(kept.arrays("t_"), "t_").word.tolist() == kept.word.tolist()


def test_refining_a_lossy_index_recovers_the_exact_search(dump):
    """A compressed index only proposes candidates: with refine_factor r it returns r k starts and ends, and the k
    with the highest exact inner product with the dump's vectors are kept; an index whose own ranking is wrong then
    gives the exact result once r k covers the right tokens, and an exact index is unchanged by r."""
    import faiss

    _, tokens, h = dump
    exact = faiss.IndexFlatIP(h.shape[1])
    exact.add(h.astype(np.float32))
    lossy = faiss.IndexFlatIP(h.shape[1])  # a stand-in for quantisation error: the index holds noisy vectors
    lossy.add(h.astype(np.float32) + np.random.default_rng(5).standard_normal(h.shape).astype(np.float32))
    rng = np.random.default_rng(2)
    q_start, q_end = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    want = search(exact, h, tokens, q_start, q_end, k=3, max_words=4, top_n=5)
    same = search(exact, h, tokens, q_start, q_end, k=3, max_words=4, top_n=5, refine_factor=4)
    assert all(a[0].tolist() == b[0].tolist() for a, b in zip(want, same, strict=True))
    unrefined = search(lossy, h, tokens, q_start, q_end, k=3, max_words=4, top_n=5)
    assert any(a[0].tolist() != b[0].tolist() for a, b in zip(want, unrefined, strict=True))
    refined = search(lossy, h, tokens, q_start, q_end, k=3, max_words=4, top_n=5, refine_factor=-(-len(h) // 3))
    for (pairs, scores), (pairs_r, scores_r) in zip(want, refined, strict=True):
        assert pairs_r.tolist() == pairs.tolist() and np.allclose(scores_r, scores)
    assert refine(np.array([[4, -1, 2]]), h, q_start[:1], 5).tolist()[0][2] == -1  # -1 padded, never invented
    with pytest.raises(ValueError, match="refine_factor"):
        search(exact, h, tokens, q_start, q_end, k=3, refine_factor=0)
