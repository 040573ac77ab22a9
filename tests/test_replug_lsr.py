"""REPLUG LSR (npm.replug.lsr; paper-map §R2.3): the KL loss, one training step (only the retriever moves), the
index refresh, own-document exclusion, and a resumed run. Tiny random encoder and LM; a six-document corpus."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch

from npm.baselines.decoder import BlockTexts
from npm.data.blocks import build_blocks
from npm.io import write_jsonl
from npm.replug.lsr import LsrConfig, Retriever, lm_scorer, load_queries, lsr_loss, lsr_step, train_lsr
from tests.conftest import WORDPIECE, save_tiny_bert
from tests.test_baselines import save_tiny_llama
from tests.test_replug_lm_eval import DOCS, TEXT


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("lsr_world")
    write_jsonl(root / "docs.jsonl", [{"id": f"d{i // 2}", "units": [t]} for i, t in enumerate(DOCS)])
    build_blocks(root / "docs.jsonl", root / "blocks.npz", WORDPIECE, max_seq_length=64)
    write_jsonl(root / "queries.jsonl", [{"id": "q0", "text": TEXT, "source_doc": "d0"},
                                         {"id": "q1", "text": DOCS[2] + " " + DOCS[5] + " " + TEXT,
                                          "source_doc": None}])
    return {"root": root, "blocks": [str(root / "blocks.npz")], "queries": str(root / "queries.jsonl"),
            "encoder": save_tiny_bert(root / "encoder"), "lm": save_tiny_llama(root / "lm")}


def test_kl_is_zero_when_the_distributions_agree_and_positive_otherwise():
    s = torch.tensor([[0.3, 0.1, -0.2]], requires_grad=True)
    same = lsr_loss(s, s.detach() * 2.0, gamma=0.1, beta=0.2)  # s / 0.1 == 2 s / 0.2
    assert float(same.detach()) == pytest.approx(0.0, abs=1e-12)
    lm = torch.tensor([[-5.0, -1.0, -9.0]], dtype=torch.float64)
    for kl in ("retriever_lm", "lm_retriever"):
        assert float(lsr_loss(s, lm, 0.1, 0.1, kl).detach()) > 0
    pr, q = torch.softmax(s.detach().double() / 0.1, -1), torch.softmax(lm / 0.1, -1)
    assert float(lsr_loss(s, lm, 0.1, 0.1).detach()) == pytest.approx(float((pr * (pr / q).log()).sum()))
    assert float(lsr_loss(s, lm, 0.1, 0.1, "lm_retriever").detach()) == pytest.approx(float((q * (q / pr).log()).sum()))
    lsr_loss(s, lm, 0.1, 0.1).backward()
    assert s.grad is not None and torch.isfinite(s.grad).all()
    with pytest.raises(ValueError, match="kl must be"):
        lsr_loss(s, lm, 0.1, 0.1, "forward")


def test_a_step_moves_only_the_retriever_and_a_refresh_changes_the_stored_vectors(world):
    from npm.baselines.lm import load_causal_lm

    lm, lm_tok = load_causal_lm(world["lm"])
    before_lm = {k: v.clone() for k, v in lm.state_dict().items()}
    retriever = Retriever(world["encoder"], world["blocks"])
    retriever.model.train()
    old_vectors = retriever.refresh()
    before_r = {k: v.clone() for k, v in retriever.model.state_dict().items()}
    queries = load_queries(world["queries"], lm_tok, x_len=8, y_len=6)
    scorer = lm_scorer(lm, lm_tok, BlockTexts(world["blocks"]), doc_len=8)
    opt = torch.optim.Adam(retriever.model.parameters(), lr=1e-2)
    loss, s, lm_s, computed = lsr_step(retriever, queries, 3, scorer, 0.1, 0.1)
    assert s.shape == lm_s.shape == (2, 3) and computed == 6 and math.isfinite(float(loss.detach()))
    loss.backward()
    opt.step()
    assert all(p.grad is None for p in lm.parameters())
    assert all(torch.equal(v, before_lm[k]) for k, v in lm.state_dict().items())  # the LM is bit-identical
    assert any(not torch.equal(v, before_r[k]) for k, v in retriever.model.state_dict().items())
    assert not np.allclose(retriever.refresh(), old_vectors)
    _, _, _, again = lsr_step(retriever, queries[:1], 3, scorer, 0.1, 0.1)
    assert again <= 3  # cached (query, block) scores are not recomputed


def test_a_query_never_retrieves_its_own_document(world):
    retriever = Retriever(world["encoder"], world["blocks"])
    retriever.refresh()
    own_blocks = np.flatnonzero(retriever.block_docs == "d0")
    assert len(own_blocks) == 2
    q = retriever.encode_blocks(own_blocks[:1]).detach().numpy()  # the query *is* one of d0's blocks
    found = retriever.search(q, 4, ["d0"])
    assert found.shape == (1, 4) and not set(found[0].tolist()) & set(own_blocks.tolist())
    assert retriever.search(q, 1, [None])[0, 0] == own_blocks[0]  # without the exclusion it finds itself
    with pytest.raises(ValueError, match="larger than the corpus"):
        retriever.search(q, 5, ["d0"])


def test_training_writes_a_retriever_and_resumes_its_own_run(world, tmp_path):
    from npm.baselines.dense import DenseBlockSearcher

    cfg = dict(encoder=world["encoder"], lm=world["lm"], blocks=world["blocks"], queries=world["queries"],
               out_dir=str(tmp_path / "out"), checkpoint_dir=str(tmp_path / "ckpt"), batch_size=2, k=3, x_len=8,
               y_len=6, doc_len=8, refresh_every=2, checkpoint_every=2, lr=1e-3)
    train_lsr(LsrConfig(steps=2, **cfg), progress=False)
    summary = train_lsr(LsrConfig(steps=3, **cfg), progress=False)  # a longer run is another run id
    assert summary["steps"] == 3
    runs = sorted((tmp_path / "ckpt").glob("run-*"))
    assert len(runs) == 2
    rows = list(csv.DictReader(open(tmp_path / "out" / "train_log.csv")))
    assert [int(r["step"]) for r in rows] == [1, 2, 3] and [r["refreshed"] for r in rows] == ["0", "1", "0"]
    # the same settings again: resumes the finished run at its last checkpoint and does no step
    again = train_lsr(LsrConfig(steps=3, **cfg), progress=False)
    assert again["run_id"] == summary["run_id"]
    assert len(list(csv.DictReader(open(tmp_path / "out" / "train_log.csv")))) == 3
    searcher = DenseBlockSearcher(str(tmp_path / "out"), world["blocks"])  # usable by the replug baseline
    ids, scores = searcher.search(DOCS[0], 2)
    assert len(ids) == 2


def test_train_lsr_cli_and_its_errors(world, tmp_path):
    from npm.cli import main as cli_main

    args = ["replug", "train-lsr", "--encoder", world["encoder"], "--lm", world["lm"], "--blocks", *world["blocks"],
            "--queries", world["queries"], "--out", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--batch-size", "2", "--x-len", "8", "--y-len", "6", "--doc-len", "8", "--refresh-every", "1",
            "--checkpoint-every", "1", "--threads", "1", "--steps", "1"]
    assert cli_main(args + ["--k", "2"]) == 0
    assert (tmp_path / "out" / "lsr_summary.json").exists() and (tmp_path / "out" / "config.json").exists()
    before = (tmp_path / "out" / "model.safetensors").read_bytes()
    assert cli_main(args + ["--k", "7"]) == 1  # larger than the corpus: a clear error
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == before  # the good output is untouched


# ------------------------------------------------------------------------------------------------ the index

@pytest.fixture(scope="module")
def textless_world(world):
    """The six documents plus one unit of 63 words that splits into a 64-token block and a block holding only the
    end token: a block without surface text, which no retriever may return (it has nothing to prepend)."""
    root = world["root"]
    write_jsonl(root / "docs_split.jsonl", [{"id": f"d{i // 2}", "units": [t]} for i, t in enumerate(DOCS)]
                + [{"id": "long", "units": [" ".join(["the"] * 63)]}])
    build_blocks(root / "docs_split.jsonl", root / "blocks_split.npz", WORDPIECE, max_seq_length=64)
    return [str(root / "blocks_split.npz")]


def test_the_trained_and_the_searching_retriever_index_the_same_blocks_with_text(world, textless_world):
    from npm.baselines.dense import DenseBlockSearcher
    from npm.data.blocks import load_blocks

    has_text = np.diff(load_blocks(textless_world[0], text=True)["text_offsets"]) > 0
    assert not has_text.all()  # the world really has a block without text
    with_text = set(np.flatnonzero(has_text).tolist())
    retriever = Retriever(world["encoder"], textless_world)
    retriever.refresh()
    q = retriever.encode_queries([DOCS[0]]).detach().numpy()
    assert set(retriever.search(q, len(with_text), [None])[0].tolist()) == with_text
    with pytest.raises(ValueError, match="larger than the corpus"):
        retriever.search(q, len(with_text) + 1, [None])
    searcher = DenseBlockSearcher(world["encoder"], textless_world)
    assert len(searcher) == len(with_text)
    assert set(searcher.search(DOCS[0], len(with_text) + 1)[0].tolist()) == with_text


def test_the_dense_index_comes_from_a_factory_string_with_clear_errors(world):
    from npm.baselines.dense import DenseBlockSearcher

    flat = DenseBlockSearcher(world["encoder"], world["blocks"])
    ivf = DenseBlockSearcher(world["encoder"], world["blocks"], index="IVF4,Flat")  # nlist cut to what 6 blocks allow
    assert ivf.index_info["factory"] == "IVF4,Flat" and ivf.index_info["nlist"] == 1
    for query in DOCS:
        (a, sa), (b, sb) = flat.search(query, 3), ivf.search(query, 3)
        assert a.tolist() == b.tolist() and np.allclose(sa, sb, atol=1e-6)  # one list probed: exact, exact scores
    with pytest.raises(ValueError, match="use factory 'Flat'"):
        DenseBlockSearcher(world["encoder"], world["blocks"], index="PQ4")  # too few blocks to train a PQ
    with pytest.raises(ValueError, match="FAISS rejected the factory string"):
        DenseBlockSearcher(world["encoder"], world["blocks"], index="NoSuchIndex")
    retriever = Retriever(world["encoder"], world["blocks"], index="IVF4,Flat")
    retriever.refresh()
    q = retriever.encode_queries([DOCS[3]]).detach().numpy()
    assert retriever.search(q, 3, [None]).tolist() == flat.search(DOCS[3], 3)[0][None].tolist()


def test_blocks_of_another_tokenizer_are_refused(world, tmp_path):
    from npm.baselines.dense import DenseBlockSearcher
    from npm.data.blocks import load_blocks

    arrays = dict(np.load(world["blocks"][0], allow_pickle=False))
    arrays["input_ids"] = arrays["input_ids"].astype(np.int64) + 100_000  # ids no MiniLM-sized vocabulary has
    np.savez(tmp_path / "other.npz", **arrays)
    load_blocks(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="another tokenizer"):
        DenseBlockSearcher(world["encoder"], [str(tmp_path / "other.npz")])
