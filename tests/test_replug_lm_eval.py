"""REPLUG's language-modelling evaluation (npm.replug.lm_eval; paper-map §R3): windows, teacher-forced scores, the
log-space ensemble, bits per byte. The LM is the tiny random Llama of tests/test_baselines.py; the retriever is a
scripted search over a list of documents, so each row's expected value is one plain forward pass."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from npm.baselines.replug import mix_logprobs
from npm.replug.lm_eval import (
    begin_token,
    bits_per_byte,
    mixture,
    score_texts,
    summarize,
    target_logprobs,
    token_perplexity,
    windows,
)
from tests.test_baselines import save_tiny_llama

DOCS = ["The prime minister said the election would be held in March.",
        "Fire crews were still fighting the blaze on Sunday near Sydney.",
        "Australia won the cricket match by six wickets.",
        "The bank raised interest rates for the second time this year.",
        "Police said the man was arrested at the airport.",
        "The company reported a rise in profits."]
TEXT = ("The prime minister said on Sunday that fire crews in Sydney were still fighting the blaze, and that the "
        "election would go ahead in March as planned. Police said the bank was closed.")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from npm.baselines.lm import load_causal_lm

    return load_causal_lm(save_tiny_llama(tmp_path_factory.mktemp("tiny_llama")))


def scripted_search(query: str, k: int):
    """Documents 0, 1, 2, ... with falling scores, whatever the query."""
    return np.arange(k), np.linspace(0.9, 0.5, k)


def manual_logprobs(model, row: list[int], n_target: int) -> np.ndarray:
    """One unpadded forward of the whole row; log-probabilities of its last n_target tokens."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([row])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    pos = range(len(row) - n_target, len(row))
    return np.array([float(logp[p - 1, row[p]]) for p in pos])


def test_windows_cover_every_token_once_with_their_context():
    w = windows(10, 3, 4)
    assert w == [(0, 0, 4), (1, 4, 8), (5, 8, 10)]
    assert windows(4, 0, 4) == [(0, 0, 4)]
    with pytest.raises(ValueError, match="pred_len"):
        windows(10, 3, 0)


def test_target_logprobs_of_padded_rows_equal_unpadded_forwards(lm):
    model, tok = lm
    bos = begin_token(tok)
    target = tok("were still fighting", add_special_tokens=False)["input_ids"]
    prefixes = [[bos], [bos] + tok(DOCS[0], add_special_tokens=False)["input_ids"], [bos, 40, 41]]
    got = target_logprobs(model, prefixes, target, tok.pad_token_id, batch_size=2)
    for p, row in zip(prefixes, got, strict=True):
        np.testing.assert_allclose(row, manual_logprobs(model, p + target, len(target)), atol=1e-5)


def test_mix_logprobs_k1_uniform_mean_and_very_negative_values():
    lp = np.log(np.array([[0.5, 0.1, 0.2], [0.1, 0.3, 0.2]]))
    np.testing.assert_allclose(mix_logprobs(lp[:1], [1.0]), lp[0])
    np.testing.assert_allclose(mix_logprobs(lp, [0.5, 0.5]), np.log(np.exp(lp).mean(axis=0)))
    far = mix_logprobs(np.array([[-2000.0, -5000.0], [-2001.0, -1e6]]), [0.5, 0.5])
    assert np.all(np.isfinite(far))
    np.testing.assert_allclose(far[0], -2000.0 + np.log(0.5 * (1 + np.exp(-1.0))))
    np.testing.assert_allclose(far[1], -5000.0 + np.log(0.5))


def test_k1_replug_equals_the_single_document_prepend_and_first_window_is_plain(lm):
    model, tok = lm
    scored = score_texts(model, tok, [TEXT], {"replug": scripted_search}, DOCS.__getitem__, len(DOCS), k_max=2,
                         context_len=8, pred_len=10, doc_len=6, seed=0, progress=False)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    bos = begin_token(tok)
    one = mixture(scored, "replug", 1)
    none = mixture(scored, "none", 1)
    assert len(one) == len(ids) == len(none)
    first = scored["window"] == 0
    np.testing.assert_array_equal(one[first], none[first])  # no context, no retrieval
    doc = tok(DOCS[0], add_special_tokens=False)["input_ids"][:6]
    for c, a, e in windows(len(ids), 8, 10)[1:]:
        at = slice(a, e)
        np.testing.assert_allclose(one[at], manual_logprobs(model, [bos] + doc + ids[c:e], e - a), atol=1e-5)
        np.testing.assert_allclose(none[at], manual_logprobs(model, [bos] + ids[c:e], e - a), atol=1e-5)
    assert scored["doc_ids"]["replug"][0].tolist() == [-1, -1] and scored["doc_ids"]["replug"][1].tolist() == [0, 1]
    assert scored["rows"]["random"].shape == (2, len(ids))


def test_equal_scores_give_the_uniform_mean(lm):
    model, tok = lm
    scored = score_texts(model, tok, [TEXT], {"replug": lambda q, k: (np.arange(k), np.full(k, 0.3))}, DOCS.__getitem__,
                         len(DOCS), k_max=3, context_len=8, pred_len=12, doc_len=6, seed=0, progress=False)
    np.testing.assert_allclose(mixture(scored, "replug", 3), mixture(scored, "replug", 3, "uniform"))
    later = scored["window"] > 0
    expected = np.log(np.exp(scored["rows"]["replug"][:, later]).mean(axis=0))
    np.testing.assert_allclose(mixture(scored, "replug", 3)[later], expected)


def test_bits_per_byte_counts_utf8_bytes_not_characters(lm):
    model, tok = lm
    text = "Zoë met the café owner in Kraków — 東京."
    assert len(text.encode("utf-8")) == len(text) + 9
    scored = score_texts(model, tok, [text], {"replug": scripted_search}, DOCS.__getitem__, len(DOCS), k_max=1,
                         context_len=4, pred_len=5, doc_len=4, seed=0, progress=False)
    assert scored["n_bytes"] == len(text.encode("utf-8"))
    lp = np.full(7, math.log(0.5))  # 7 tokens at p = 1/2: 7 bits
    assert bits_per_byte(lp, 14) == pytest.approx(0.5)
    assert token_perplexity(lp) == pytest.approx(2.0)
    nll = -mixture(scored, "none", 1).sum()
    assert bits_per_byte(mixture(scored, "none", 1), scored["n_bytes"]) == pytest.approx(
        nll / math.log(2) / scored["n_bytes"])


def test_bad_input_is_a_clear_error(lm):
    model, tok = lm
    with pytest.raises(ValueError, match="empty evaluation text"):
        score_texts(model, tok, ["  "], {"replug": scripted_search}, DOCS.__getitem__, len(DOCS), k_max=1,
                    seed=0, progress=False)
    with pytest.raises(ValueError, match="corpus has 6"):
        score_texts(model, tok, [TEXT], {"replug": scripted_search}, DOCS.__getitem__, len(DOCS), k_max=4,
                    seed=0, progress=False)
    scored = score_texts(model, tok, [TEXT], {"replug": scripted_search}, DOCS.__getitem__, len(DOCS), k_max=2,
                         context_len=8, pred_len=40, seed=0, progress=False)
    with pytest.raises(ValueError, match="k must be in 1..2"):
        mixture(scored, "replug", 3)


# ------------------------------------------------------------------------------------------------ texts, CLI, report

def test_texts_take_body_sections_of_articles_whose_lead_is_in_the_corpus(tmp_path):
    from npm.io import write_jsonl
    from npm.replug.texts import lm_eval_texts, lsr_queries

    body = "Fire crews fought the blaze for three days. " * 20
    write_jsonl(tmp_path / "articles.jsonl", [
        {"id": "1", "title": "Sydney", "units": ["Sydney. The lead.", "Sydney. short", f"Sydney. {body}"]},
        {"id": "2", "title": "Perth", "units": ["Perth. The lead.", f"Perth. {body}"]},
        {"id": "3", "title": "Hobart", "units": ["Hobart. The lead only."]}])
    write_jsonl(tmp_path / "corpus.jsonl", [{"id": t, "title": t, "units": [f"{t}. The lead."]}
                                            for t in ("Sydney", "Hobart")])
    texts = lm_eval_texts(tmp_path / "articles.jsonl", tmp_path / "corpus.jsonl", 1, max_chars=300, min_chars=100,
                          seed=0)
    assert [t["title"] for t in texts] == ["Sydney"]  # Perth's lead is not in the corpus, Hobart has no body
    assert texts[0]["text"].startswith("Sydney. Fire crews") and texts[0]["text"].endswith("days.")
    assert len(texts[0]["text"]) <= 300
    with pytest.raises(ValueError, match="only 1 articles"):
        lm_eval_texts(tmp_path / "articles.jsonl", tmp_path / "corpus.jsonl", 2, min_chars=100, seed=0)
    write_jsonl(tmp_path / "texts.jsonl", texts)
    queries = lsr_queries(tmp_path / "articles.jsonl", tmp_path / "corpus.jsonl", tmp_path / "texts.jsonl", 3,
                          chars=200, seed=0)
    assert {q["title"] for q in queries} == {"Perth"}  # Sydney is an evaluation text; Hobart has no body
    assert all(len(q["text"]) <= 200 and q["source_doc"] is None for q in queries)  # Perth's lead: not in corpus


def test_eval_lm_cli_writes_rows_table_and_figure(tmp_path):
    from npm.cli import main as cli_main
    from npm.data.blocks import build_blocks
    from npm.io import write_jsonl
    from tests.conftest import WORDPIECE, save_tiny_bert

    write_jsonl(tmp_path / "docs.jsonl", [{"id": str(i), "units": [t]} for i, t in enumerate(DOCS)])
    build_blocks(tmp_path / "docs.jsonl", tmp_path / "blocks.npz", WORDPIECE, max_seq_length=64)
    write_jsonl(tmp_path / "texts.jsonl", [{"id": "a", "title": "A", "text": TEXT},
                                           {"id": "b", "title": "B", "text": DOCS[3] + " " + DOCS[4]}])
    lm = save_tiny_llama(tmp_path / "lm")
    encoder = save_tiny_bert(tmp_path / "encoder")
    out = tmp_path / "lm_eval.json"
    args = ["replug", "eval-lm", "--lm", lm, "--texts", str(tmp_path / "texts.jsonl"), "--blocks",
            str(tmp_path / "blocks.npz"), "--encoder", encoder, "--context-len", "8", "--pred-len", "12",
            "--threads", "1", "--out", str(out)]
    assert cli_main(args + ["--k", "1", "2", "--lsr-encoder", encoder]) == 0
    results = json.loads(out.read_text())
    rows = {(r["system"], r["k"]): r for r in results["rows"]}
    assert set(rows) == {("lm", 0), ("replug", 1), ("replug", 2), ("replug_lsr", 1), ("replug_lsr", 2),
                         ("random_docs", 1), ("random_docs", 2)}
    assert rows[("replug_lsr", 2)]["bpb"] == pytest.approx(rows[("replug", 2)]["bpb"])  # the same encoder twice
    for r in rows.values():
        assert r["bpb_ci95"][0] <= r["bpb"] <= r["bpb_ci95"][1] and r["perplexity"] > 1
    assert rows[("lm", 0)]["gain_pct"] == 0.0 and results["provenance"]["git_commit"]
    assert cli_main(["replug", "report", "--results", str(out), "--table", str(tmp_path / "t.csv"),
                     "--figure", str(tmp_path / "f.pdf")]) == 0
    for name in ("t.csv", "t.md", "f.pdf", "f.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "+ REPLUG" in (tmp_path / "t.md").read_text()
    from npm.replug.report import lm_table

    table = lm_table(out)
    columns = next(n for n in table.notes if n.startswith("Columns:"))
    assert all(f"**{c}**" in columns for c in table.columns) and columns in (tmp_path / "t.md").read_text()
    assert cli_main(args + ["--k", "4"]) == 1  # 4 retrieved + 4 random documents need 8 blocks; the corpus has 6
    assert json.loads(out.read_text()) == results  # the failed run left the good output alone
    (tmp_path / "empty.jsonl").write_text('{"id": "x", "title": "X", "text": " "}\n')
    assert cli_main([*args[:5], str(tmp_path / "empty.jsonl"), *args[6:], "--k", "1"]) == 1


def test_concatenation_mode_k1_is_the_single_document_and_k2_one_joined_pass(lm):
    """The authors' ensemble = 0 mode (NPM's baseline): the top k documents joined, cut to doc_len, one pass."""
    model, tok = lm
    scored = score_texts(model, tok, [TEXT], {"replug": scripted_search}, DOCS.__getitem__, len(DOCS), k_max=2,
                         context_len=8, pred_len=10, doc_len=6, concat_ks=[1, 2], seed=0, progress=False)
    np.testing.assert_allclose(scored["concat"][1], mixture(scored, "replug", 1), atol=1e-6)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    docs = [tok(d, add_special_tokens=False)["input_ids"][:6] for d in DOCS[:2]]
    joined = (docs[0] + docs[1])[:6]
    c, a, e = windows(len(ids), 8, 10)[1]
    row = manual_logprobs(model, [begin_token(tok)] + joined + ids[c:e], e - a)
    np.testing.assert_allclose(scored["concat"][2][a:e], row, atol=1e-5)
    rows = summarize(scored, [TEXT], [1, 2], seed=0)
    assert [(r["system"], r["k"]) for r in rows if r["system"] == "concat"] == [("concat", 1), ("concat", 2)]
    with pytest.raises(ValueError, match="concatenation k must be in 1..2"):
        score_texts(model, tok, [TEXT], {"replug": scripted_search}, DOCS.__getitem__, len(DOCS), k_max=2,
                    concat_ks=[3], seed=0, progress=False)
