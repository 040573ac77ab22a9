"""The decoder systems through the harness (paper 6.2; paper-map §6, §R2.2): every decoder baseline writes NPM's
predictions and metrics files, bm25_lm prepends the blocks BM25 really returns (top-1 last), REPLUG with one passage is
bm25_lm with one passage, PMI is the manual difference of log-probabilities, and bad input is a clear error.

The world: the tiny random Llama of tests/test_baselines.py, two blocks files of real news paragraphs (gensim's Lee
corpus) plus a few facts, one pyserini BM25 index over both (docid = global block id), and task folders written by
hand in each task's own format (docs/task-formats.md).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from npm.baselines.decoder import BlockTexts
from npm.baselines.lm import (
    clean_passage,
    first_line,
    greedy_continuations,
    load_causal_lm,
    open_set_prompt,
    prepend_passages,
)
from npm.cli import build_parser
from npm.cli import main as cli_main
from npm.data.blocks import block_text, build_blocks, load_blocks
from npm.datastore.bm25 import Bm25Searcher, block_documents, bm25_query, build_bm25_index
from npm.evaluation.harness import evaluate
from npm.evaluation.systems import Inputs
from npm.io import read_jsonl, write_jsonl
from npm.settings import NAMES, Settings
from npm.tasks.metrics import exact_match, translation_prediction
from npm.tasks.registry import resolve_task
from tests.conftest import WORDPIECE, lee_corpus_lines, save_tiny_bert
from tests.test_baselines import save_tiny_llama

FACTS = ["Thessaloniki is the second largest city in Greece and a major port.",
         "The capital of Greece is Athens, home of the Acropolis.",
         "Seoul is the capital of South Korea. The Korean name of Seoul is 서울.",
         "Banpo Bridge crosses the Han River in Seoul."]
NQ = [{"id": "n1", "question": "what is the capital of greece"},
      {"id": "n2", "question": "which city is the second largest city in greece"},
      {"id": "n3", "question": "which river does banpo bridge cross"},
      {"id": "n4", "question": "who was arrested by police after the fires near sydney"}]
NQ_ANSWERS = {"n1": ["Athens"], "n2": ["Thessaloniki"], "n3": ["Han River"], "n4": ["a man"]}
SST2 = ["__label__5\tA wonderful, moving film", "__label__1\tthe plot is dull and the acting terrible",
        "__label__4\ta fine film", "__label__2\tan awful waste of time", "__label__3\tneutral, dropped",
        "__label__5\tgreat fun for the whole family"]
TRANSLATION = [{"id": "t1", "input": "The Korean translation of Seoul is: <mask>.", "answers": ["서울"], "lang": "ko"},
               {"id": "t2", "input": "The Greek translation of Athens is: <mask>.", "answers": ["Αθήνα"], "lang": "el"},
               {"id": "t3", "input": "The Korean translation of Banpo Bridge is: <mask>.", "answers": ["반포대교"],
                "lang": "ko"}]
NEW = 6  # max_new_tokens in the tests


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline_world")
    lines = lee_corpus_lines()[:10]
    shards = [FACTS[:2] + lines[:5], FACTS[2:] + lines[5:]]
    blocks = []
    for i, shard in enumerate(shards):
        write_jsonl(root / f"docs{i}.jsonl", [{"id": f"{i}-{j}", "units": [t]} for j, t in enumerate(shard)])
        build_blocks(root / f"docs{i}.jsonl", root / f"shard{i}.npz", WORDPIECE, max_seq_length=64)
        blocks.append(str(root / f"shard{i}.npz"))
    build_bm25_index(block_documents(blocks), root / "bm25")
    tasks = root / "tasks"
    (tasks / "nq").mkdir(parents=True)
    (tasks / "nq" / "nqopen-test.json").write_text(json.dumps(NQ))
    (tasks / "nq" / "test_id2answers.json").write_text(json.dumps(NQ_ANSWERS))
    (tasks / "sst2").mkdir()
    (tasks / "sst2" / "test.tsv").write_text("\n".join(SST2) + "\n")
    (tasks / "rte").mkdir()
    (tasks / "rte" / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tIt rains.\tIt is wet.\tentailment\n")
    write_jsonl(tasks / "entity_translation" / "test.jsonl", TRANSLATION)
    return {"root": root, "blocks": blocks, "bm25": str(root / "bm25"), "tasks": tasks,
            "lm": save_tiny_llama(root / "lm")}


def run(world, task, system, tmp_path, **kw):
    """The harness on one decoder system, with the world's corpus (bm25 / blocks / corpus overridable)."""
    kw = {"max_new_tokens": NEW, "bm25": world["bm25"], "blocks": world["blocks"], "corpus": "tiny", **kw}
    settings = Settings(**{n: kw.pop(n) for n in list(kw) if n in NAMES})
    bm25, blocks = kw.pop("bm25"), kw.pop("blocks")
    inputs = Inputs(checkpoint=world["lm"], bm25=[str(bm25)] if bm25 else [], blocks=list(blocks or []),
                    corpus=kw.pop("corpus"), encoder=kw.pop("encoder", None), device="cpu",
                    tasks_root=str(world["tasks"]))
    metrics = evaluate(task, system, inputs, settings, predictions_path=tmp_path / "p.jsonl",
                       metrics_path=tmp_path / "m.json", **kw)
    return metrics, list(read_jsonl(tmp_path / "p.jsonl")), json.loads((tmp_path / "m.json").read_text())


def all_block_texts(world) -> list[str]:
    out = []
    for path in world["blocks"]:
        arrays = load_blocks(path, text=True)
        out.extend(block_text(arrays, b) for b in range(len(arrays["block_doc"])))
    return out


# ------------------------------------------------------------------------------------------------ contract

@pytest.mark.parametrize("task,system", [("nq", "lm"), ("nq", "bm25_lm"), ("nq", "replug"), ("sst2", "lm"),
                                         ("sst2", "lm_pmi")])
def test_each_system_writes_predictions_and_metrics(world, tmp_path, task, system):
    metrics, preds, saved = run(world, task, system, tmp_path)
    closed = task == "sst2"
    retrieves = system in ("bm25_lm", "replug")
    assert len(preds) == metrics["n"] == (5 if closed else 4)
    for p in preds:
        assert {"id", "input", "prompt", "prediction", "correct", "passages"} <= set(p)
        if closed:
            assert p["label"] in (0, 1) and len(p["scores"]) == 2
            assert p["prediction"] == int(np.argmax(p["scores"])) and p["correct"] == (p["prediction"] == p["label"])
        else:
            assert p["prediction"] == first_line(p["raw_prediction"]) and isinstance(p["answers"], list)
            assert p["correct"] == exact_match(p["prediction"], p["answers"])
            assert (1 <= len(p["passages"]) <= 5) if retrieves else p["passages"] == []
    assert metrics["score"] == pytest.approx(100.0 * np.mean([p["correct"] for p in preds]))
    assert saved["metric"] == ("accuracy" if closed else "em") and saved["system"] == system
    assert saved["score"] == pytest.approx(metrics["score"]) and saved["queries_per_s"] > 0 and saved["seconds"] > 0
    assert saved["model"] == world["lm"] and saved["device"] == "cpu" and saved["parameters"] > 0
    assert saved["retrieval"] == ("bm25" if retrieves else None) and saved["corpus"] == ("tiny" if retrieves else None)
    assert saved["passages"] == (5 if retrieves else None)
    assert saved["max_new_tokens"] == (None if closed else NEW)
    total = sum(len(load_blocks(b)["input_ids"]) for b in world["blocks"])
    assert saved["corpus_tokens"] == (total if retrieves else None)
    assert ("replug_temperature" in saved) == (system == "replug")
    config = saved["provenance"]["config"]
    assert config["system"] == system and config["settings"]["max_new_tokens"] == NEW
    assert config["inputs"]["blocks"] == (world["blocks"] if retrieves else [])
    assert config["sampling_seed"] == 0


@pytest.mark.parametrize("native_bf16", [True, False])
def test_lm_precision_runs_the_decoder_under_autocast_and_is_recorded(world, tmp_path, monkeypatch, native_bf16):
    """inference.lm_precision bf16: every decoder forward (prompt and decoding) runs under a bf16 CPU autocast where
    the CPU has native bf16, in fp32 where it has not; the metrics say which; fp32 (the default) runs no autocast."""
    import npm.model
    from npm.baselines import lm as lm_module

    monkeypatch.setattr(npm.model, "cpu_has_bf16", lambda: native_bf16)
    seen = []
    real = lm_module.forward_last

    def spy(model, **inputs):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return real(model, **inputs)

    monkeypatch.setattr(lm_module, "forward_last", spy)
    _, _, saved = run(world, "nq", "bm25_lm", tmp_path / "bf16", lm_precision="bf16")
    assert saved["precision"] == ("bf16" if native_bf16 else "fp32")
    assert seen and set(seen) == {native_bf16}
    assert saved["provenance"]["config"]["settings"]["lm_precision"] == "bf16"
    seen.clear()
    _, _, saved = run(world, "nq", "bm25_lm", tmp_path / "fp32")
    assert saved["precision"] == "fp32" and set(seen) == {False}


def test_bm25_lm_prompt_holds_the_retrieved_blocks_top1_last(world, tmp_path):
    _, preds, _ = run(world, "nq", "bm25_lm", tmp_path, passages=3)
    texts = all_block_texts(world)
    searcher = Bm25Searcher(world["bm25"])
    for p in preds:
        ids, _ = searcher.search(bm25_query(p["input"], True), 3)  # NQ is a question task: up to the "?"
        assert p["passages"] == ids.tolist()
        bare = open_set_prompt("nq", p["input"])
        top = [texts[b] for b in p["passages"]]
        assert p["prompt"] == "\n".join(reversed(top)) + "\n" + bare  # p3 \n p2 \n p1 \n question
        assert p["prompt"].endswith(top[0] + "\n" + bare)
    assert "Athens" in preds[[p["id"] for p in preds].index("n1")]["prompt"]  # the fact block was found


def test_raw_prediction_is_the_greedy_continuation_of_the_prompt(world, tmp_path):
    _, preds, _ = run(world, "nq", "bm25_lm", tmp_path, passages=2)
    model, tok = load_causal_lm(world["lm"])
    raws = greedy_continuations(model, tok, [p["prompt"] for p in preds], max_new_tokens=NEW, batch_size=1)
    assert [p["raw_prediction"] for p in preds] == raws


def test_replug_with_one_passage_equals_bm25_lm_with_one_passage(world, tmp_path):
    _, concat, _ = run(world, "nq", "bm25_lm", tmp_path / "a", passages=1)
    metrics, replug, _ = run(world, "nq", "replug", tmp_path / "b", passages=1)
    assert [p["passages"] for p in replug] == [p["passages"] for p in concat]
    assert [p["raw_prediction"] for p in replug] == [p["raw_prediction"] for p in concat]
    assert all(p["passage_weights"] == [1.0] for p in replug) and metrics["replug_temperature"] == 1.0


def test_replug_weights_are_softmax_of_scores_over_temperature(world, tmp_path):
    _, preds, _ = run(world, "nq", "replug", tmp_path, passages=3, replug_temperature=2.0)
    for p in preds:
        expected = torch.softmax(torch.tensor(p["passage_scores"], dtype=torch.float64) / 2.0, 0)
        assert np.allclose(p["passage_weights"], expected.numpy(), atol=1e-6)
        assert p["prompt"] == open_set_prompt("nq", p["input"])  # REPLUG's rows are "passage\n" + this prompt


def test_replug_answer_vote_with_one_passage_is_the_mixture_and_records_its_votes(world, tmp_path):
    _, mixed, _ = run(world, "nq", "replug", tmp_path / "a", passages=1)
    metrics, voted, _ = run(world, "nq", "replug", tmp_path / "b", passages=1, replug_ensemble="vote")
    assert metrics["replug_ensemble"] == "vote"
    assert [p["raw_prediction"] for p in voted] == [p["raw_prediction"] for p in mixed]  # k = 1: one greedy row
    _, preds, _ = run(world, "nq", "replug", tmp_path / "c", passages=3, replug_ensemble="vote")
    model, tok = load_causal_lm(world["lm"])
    for p in preds:
        assert len(p["passage_answers"]) == len(p["passages"]) == 3 and p["prediction"] in p["passage_answers"]
        rows = [prepend_passages(p["prompt"], [clean_passage(all_block_texts(world)[b])]) for b in p["passages"]]
        raws = greedy_continuations(model, tok, rows, max_new_tokens=NEW, batch_size=1)
        assert [first_line(r) for r in raws] == p["passage_answers"]  # each passage decodes its own answer
        best = max(p["votes"].values())
        assert p["votes"][p["prediction"]] == best


def test_vote_weighs_answers_by_retrieval_and_answer_probability():
    from npm.baselines.replug import vote

    # Paris: 0.2 x 0.5 + 0.3 x 0.5 = 0.25; Lyon: 0.5 x 0.9 = 0.45
    best, totals = vote(["Paris", "Lyon", "Paris"], [0.2, 0.5, 0.3], np.log([0.5, 0.9, 0.5]))
    assert best == 1 and totals == pytest.approx({"Paris": 0.25, "Lyon": 0.45})
    assert vote(["Paris", "Lyon", "Paris"], [0.2, 0.5, 0.3], np.log([0.9, 0.5, 0.9]))[0] == 0  # 0.45 against 0.25
    assert vote(["a", "b"], [0.5, 0.5], [0.0, 0.0])[0] == 0  # a tie: the answer of the better passage
    assert vote(["", "x"], [0.99, 0.01], [0.0, -5.0])[0] == 1  # an empty answer has no vote
    assert vote(["", ""], [0.5, 0.5], [-np.inf, -np.inf])[0] == 0
    with pytest.raises(ValueError, match="answers"):
        vote(["a"], [0.5, 0.5], [0.0])


def manual_logprob(model, tok, prompt, word):
    """log P(word | prompt), fully recomputed without padding: the word's tokens are the last of the sequence."""
    p = [tok.bos_token_id] + tok(prompt, add_special_tokens=False)["input_ids"]
    w = tok(word, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([p + w])).logits[0].double(), -1)
    return sum(float(lp[len(p) - 1 + j, t]) for j, t in enumerate(w))


def test_lm_pmi_is_the_manual_pmi(world, tmp_path):
    _, plain, _ = run(world, "sst2", "lm", tmp_path / "a")
    metrics, pmi, _ = run(world, "sst2", "lm_pmi", tmp_path / "b")
    model, tok = load_causal_lm(world["lm"])
    words = resolve_task("sst2").label_words

    def logprob(prompt, word):
        return manual_logprob(model, tok, prompt, word)

    domain = np.array([logprob(resolve_task("sst2").pmi_premise, w) for w in words])
    assert np.allclose(metrics["domain_logprobs"], domain, atol=1e-5)
    for a, b in zip(plain, pmi, strict=True):
        assert a["prompt"] == b["prompt"] and a["prompt"].endswith(" It was")
        manual = np.array([logprob(a["prompt"], w) for w in words])
        assert np.allclose(a["scores"], manual, atol=1e-5) and np.allclose(b["logprobs"], manual, atol=1e-5)
        assert np.allclose(b["scores"], manual - domain, atol=1e-5)
        assert b["prediction"] == int(np.argmax(manual - domain))
    # The random LM puts ~13 nats more prior mass on " great" than on " terrible" whatever the review says; PMI
    # divides that prior out, which changes the ranking of some examples.
    assert [a["prediction"] for a in plain] != [b["prediction"] for b in pmi]


def test_rte_decoders_score_the_label_word_last_in_shi_et_al_form(world, tmp_path):
    """Table 1's decoder rows on RTE (NPM's template puts the hypothesis after the mask): the prompt is Shi et al.
    (2022)'s "{premise}\\n question: {hypothesis} true or false?\\n answer:", the scored continuation is the label
    word (" true" / " false") at its end, and PMI divides out its domain premise "true or false?\\n answer:"."""
    _, (plain,), saved = run(world, "rte", "lm", tmp_path / "a")
    metrics, (pmi,), _ = run(world, "rte", "lm_pmi", tmp_path / "b")
    assert plain["input"] == "It rains, right?<mask>, it is wet."  # NPM's template, unchanged
    assert plain["prompt"] == pmi["prompt"] == "It rains.\n question: It is wet. true or false?\n answer:"
    premise = resolve_task("rte").pmi_premise
    assert saved["label_words"] == [" true", " false"] and metrics["domain_premise"] == premise
    model, tok = load_causal_lm(world["lm"])
    manual = np.array([manual_logprob(model, tok, plain["prompt"], w) for w in (" true", " false")])
    domain = np.array([manual_logprob(model, tok, premise, w) for w in (" true", " false")])
    assert np.allclose(plain["scores"], manual, atol=1e-5) and np.allclose(pmi["scores"], manual - domain, atol=1e-5)
    assert plain["label"] == 0 and plain["prediction"] == int(np.argmax(manual))


def test_entity_translation_cut_at_punctuation_and_macro_over_languages(world, tmp_path):
    metrics, preds, _ = run(world, "entity_translation", "bm25_lm", tmp_path, passages=2)
    for p in preds:
        assert p["prediction"] == translation_prediction(first_line(p["raw_prediction"]))
        assert p["group"] == p["lang"] and p["prompt"].endswith(p["input"].split("<mask>")[0].strip())
    assert metrics["average"] == "macro" and set(metrics["groups"]) == {"ko", "el"}


def test_block_texts_follow_the_global_order(world):
    texts = BlockTexts(world["blocks"])
    expected = all_block_texts(world)
    assert len(texts) == len(expected) and [texts(b) for b in range(len(texts))] == expected
    with pytest.raises(IndexError, match="other blocks files"):
        texts(len(texts))


# ------------------------------------------------------------------------------------------------ dense REPLUG

def test_dense_retriever_finds_a_block_by_its_own_text(world, tmp_path):
    from npm.baselines.dense import DenseBlockSearcher

    encoder = save_tiny_bert(tmp_path / "encoder")
    searcher = DenseBlockSearcher(encoder, world["blocks"])
    texts = all_block_texts(world)
    b = texts.index(FACTS[1])
    ids, scores = searcher.search(FACTS[1], 3)
    assert ids[0] == b and scores[0] == pytest.approx(1.0, abs=1e-4) and np.all(np.diff(scores) <= 0)
    metrics, preds, _ = run(world, "nq", "replug", tmp_path, retriever="dense", encoder=encoder, passages=2,
                            bm25=None, corpus=None)
    assert metrics["retrieval"] == "dense" and all(len(p["passages"]) == 2 for p in preds)
    # REPLUG LSR: the same ensemble over its own (LSR-trained) dense retriever, whatever inference.retriever says
    lsr, lsr_preds, _ = run(world, "nq", "replug_lsr", tmp_path, encoder=encoder, passages=2, bm25=None, corpus=None)
    assert lsr["retrieval"] == "dense" and [p["prediction"] for p in lsr_preds] == [p["prediction"] for p in preds]


# ------------------------------------------------------------------------------------------------ errors, CLI

def test_errors_are_clear(world, tmp_path):
    with pytest.raises(ValueError, match="bm25_lm does not apply to closed-set"):
        run(world, "sst2", "bm25_lm", tmp_path)
    with pytest.raises(ValueError, match="lm_pmi does not apply to open-set"):
        run(world, "nq", "lm_pmi", tmp_path)
    with pytest.raises(ValueError, match="unknown system"):
        run(world, "nq", "gpt3", tmp_path)
    with pytest.raises(ValueError, match="needs --bm25"):
        run(world, "nq", "bm25_lm", tmp_path, bm25=None)
    with pytest.raises(FileNotFoundError, match="bm25 .* does not exist"):
        run(world, "nq", "replug", tmp_path, bm25=tmp_path / "absent")
    with pytest.raises(ValueError, match="needs --blocks"):
        run(world, "nq", "replug", tmp_path, blocks=None)
    with pytest.raises(ValueError, match="needs the NPM encoder"):
        run(world, "nq", "replug", tmp_path, retriever="dense")
    with pytest.raises(ValueError, match="passages must be >= 1"):
        run(world, "nq", "bm25_lm", tmp_path, passages=0)
    with pytest.raises(FileNotFoundError, match="task folder"):
        run(world, "triviaqa", "lm", tmp_path)
    with pytest.raises(KeyError, match="unknown task"):
        run(world, "nope", "lm", tmp_path)


def test_cli_evaluate_runs_a_decoder_system(world, tmp_path):
    code = cli_main(["evaluate", "--task", "nq", "--system", "replug", "--checkpoint", world["lm"],
                     "--tasks-root", str(world["tasks"]), "--bm25", world["bm25"], "--blocks", *world["blocks"],
                     "--corpus", "tiny", "--passages", "2", "--replug-temperature", "0.5", "--max-new-tokens", "4",
                     "--n-samples", "3", "--device", "cpu", "--predictions", str(tmp_path / "p.jsonl"),
                     "--metrics", str(tmp_path / "m.json")])
    assert code == 0
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["n"] == 3 and saved["passages"] == 2 and saved["replug_temperature"] == 0.5
    assert saved["max_new_tokens"] == 4 and len(list(read_jsonl(tmp_path / "p.jsonl"))) == 3
    convert = build_parser().parse_args(["convert-smollm2", "--out", str(tmp_path / "smollm2")])
    assert convert.out == tmp_path / "smollm2" and convert.gguf is None and callable(convert.func)
