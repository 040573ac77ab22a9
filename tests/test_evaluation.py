"""The evaluation harness on a tiny real world (paper-map §4.1, §5.2): the closed-set union of datastores is one
softmax over the concatenated neighbour lists, verbalizers fall back to the label words, accuracy / EM / macro-micro
averages are what the predictions say, every switch of Settings reaches the scorer, and bad input is a clear error."""

import dataclasses
import json

import numpy as np
import pytest

from npm.evaluation.harness import evaluate, evaluate_tasks, score_examples, task_metrics
from npm.evaluation.systems import Inputs, Output
from npm.inference.closed_set import label_scores
from npm.inference.predictor import Predictor
from npm.inference.scoring import closed_set_scores
from npm.io import read_jsonl, write_jsonl
from npm.settings import Settings
from npm.tasks.metrics import exact_match, translation_prediction
from npm.tasks.registry import label_verbalizers, resolve_task
from tests.conftest import build_tiny_corpus, lee_corpus_lines, save_tiny_bert

K = 30


def _corpus(root, name, lines):
    """Blocks, datastore, exact FAISS index and BM25 index of ``lines`` under ``root/name``."""
    return build_tiny_corpus(root / name, str(root / "model"), lines)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny random BERT and two small corpora (news paragraphs), each a datastore + Flat FAISS + BM25 index."""
    root = tmp_path_factory.mktemp("eval_world")
    save_tiny_bert(root / "model", seed=0)
    lines = lee_corpus_lines()[:8]
    lines[1] = "Thessaloniki is the second largest city in Greece, a great place for a review."
    return {"root": root, "model": str(root / "model"), "a": _corpus(root, "a", lines[:4]),
            "b": _corpus(root, "b", lines[4:])}


def run_evaluation(task, system, checkpoint, datastores, tasks_root="data/tasks", faiss=(), bm25=(), k=K, **kw):
    """The harness with the paths of one run (as `npm-repro evaluate` passes them)."""
    settings = Settings(k=k, **{n: kw.pop(n) for n in list(kw) if n in Settings.__dataclass_fields__})
    inputs = Inputs(checkpoint=checkpoint, datastore=list(datastores), faiss=list(faiss), bm25=list(bm25),
                    tasks_root=str(tasks_root), control=kw.pop("control", None))
    return evaluate(task, system, inputs, settings, **kw)


def _predictor(world, name, model="npm"):
    c = world[name]
    return Predictor(world["model"], c["ds"], model, Settings(k=K), faiss=c["faiss"], bm25=c["bm25"])


@pytest.fixture(scope="module")
def predictors(world):
    return {(model, name): _predictor(world, name, model) for model in ("npm", "npm_single") for name in ("a", "b")}


@pytest.mark.parametrize("model", ["npm", "npm_single"])
@pytest.mark.parametrize("tau_twice", [False, True])
def test_union_is_one_softmax_over_the_concatenated_neighbours(predictors, model, tau_twice):
    pa, pb = predictors[model, "a"], predictors[model, "b"]
    text = "Thessaloniki is a great city. It was <mask>."
    (ia, sa), (ib, sb) = pa.knn(text), pb.knn(text)
    assert len(ia) == (2 * K if model == "npm" else K)  # start + end neighbours for NPM
    verb = [np.unique(ia[:5]), np.unique(ib[:5]), np.array([0])]  # tokens the neighbours really vote for
    expected = label_scores(np.concatenate([ia, ib]), np.concatenate([sa, sb]), verb, tau=5.0,
                            tau_twice=tau_twice and model == "npm")
    got = closed_set_scores([pa, pb], [text], verb, tau=5.0, tau_twice=tau_twice)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert got[:2].sum() > 0 and got[2] == 0  # [PAD] is never stored
    # One softmax over the union, not the mean of the per-datastore distributions.
    mean = (pa.label_scores(text, verb, tau=5.0, tau_twice=tau_twice)
            + pb.label_scores(text, verb, tau=5.0, tau_twice=tau_twice)) / 2
    assert not np.allclose(got, mean)
    single = closed_set_scores([pa], [text], verb, tau=5.0, tau_twice=tau_twice)[0]
    np.testing.assert_allclose(single, pa.label_scores(text, verb, tau=5.0, tau_twice=tau_twice), rtol=1e-12)
    if tau_twice and model == "npm":  # s / 25 differs from s / 5
        assert not np.allclose(got, closed_set_scores([pa, pb], [text], verb, tau=5.0)[0])


def test_verbalizers_fuzzy_file_or_label_words(wordpiece_tokenizer, tmp_path):
    tok = wordpiece_tokenizer
    single = label_verbalizers("sst2", tok, tmp_path)  # no fuzzy file: the label words
    words = resolve_task("sst2").label_words
    assert [v.tolist() for v in single] == [tok(w, add_special_tokens=False)["input_ids"] for w in words]
    (tmp_path / "fuzzy_verbalizers").mkdir()
    (tmp_path / "fuzzy_verbalizers" / "sst2.txt").write_text("terrible, bad, awful\ngreat, good\n")
    fuzzy = label_verbalizers("sst2", tok, tmp_path)
    assert [len(v) for v in fuzzy] == [2, 2]  # truncated to the shortest list
    assert fuzzy[1].tolist() == tok(" great good", add_special_tokens=False)["input_ids"]
    assert [v.tolist() for v in label_verbalizers("sst2", tok, tmp_path, fuzzy=False)] == \
        [v.tolist() for v in single]
    assert len(label_verbalizers("rte", tok, tmp_path)) == 2  # no fuzzy verbalizer in the registry
    (tmp_path / "fuzzy_verbalizers" / "sst2.txt").write_text("terrible, thessalonikian\ngreat, good\n")
    with pytest.raises(ValueError, match="exactly one token"):
        label_verbalizers("sst2", tok, tmp_path)
    bad = dataclasses.replace(resolve_task("subj"), template="sst2", fuzzy=None)
    assert len(label_verbalizers(bad, tok, tmp_path)) == 2
    with pytest.raises(ValueError, match="open-set"):
        label_verbalizers("nq", tok, tmp_path)


def test_closed_set_run_writes_predictions_and_accuracy(world, predictors, tmp_path):
    rows = ["__label__5\tThessaloniki is a great city", "__label__1\tthe plot is dull", "__label__4\ta fine film",
            "__label__3\tneutral, dropped", "__label__2\tan awful waste of time", "__label__5\tshe meets her brother",
            "__label__1\the goes to Greece"]
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "test.tsv").write_text("\n".join(rows) + "\n")
    (tmp_path / "fuzzy_verbalizers").mkdir()  # frequent words, so that the neighbours vote for them
    (tmp_path / "fuzzy_verbalizers" / "sst2.txt").write_text("the, of, is\nand, in, to\n")
    pred_path, metrics_path = tmp_path / "out" / "p.jsonl", tmp_path / "out" / "m.json"
    metrics = run_evaluation("sst2", "npm_single", world["model"], [world["a"]["ds"], world["b"]["ds"]],
                             tasks_root=tmp_path, faiss=[world["a"]["faiss"], world["b"]["faiss"]],
                             predictions_path=pred_path, metrics_path=metrics_path, k=K)
    preds = list(read_jsonl(pred_path))
    assert len(preds) == 6 == metrics["n"] and {p["label"] for p in preds} == {0, 1}
    pa, pb = predictors["npm_single", "a"], predictors["npm_single", "b"]
    verb = label_verbalizers("sst2", pa.tokenizer, tmp_path)
    assert [len(v) for v in verb] == [3, 3]
    correct = []
    for p in preds:
        assert p["input"].endswith(" It was<mask>.")
        scores = closed_set_scores([pa, pb], [p["input"]], verb, tau=5.0)[0]
        assert scores.sum() > 0
        np.testing.assert_allclose(p["scores"], scores, rtol=1e-6)
        assert p["prediction"] == int(np.argmax(scores)) and p["correct"] == (p["prediction"] == p["label"])
        correct.append(int(np.argmax(scores)) == p["label"])
    assert metrics["score"] == pytest.approx(100.0 * np.mean(correct))
    saved = json.loads(metrics_path.read_text())
    assert saved["score"] == pytest.approx(metrics["score"]) and saved["metric"] == "accuracy"
    assert saved["average"] == "micro" and "provenance" in saved and saved["queries_per_s"] > 0
    assert saved["provenance"]["config"]["sampling_seed"] == 0 and saved["provenance"]["git_commit"]
    assert "groups" not in saved and "subsets" not in saved


def test_open_set_run_exact_match_from_predictions(world, tmp_path):
    recs = [{"id": "q1", "input": "Thessaloniki is the second largest city in <mask>.", "answers": ["Greece"]},
            {"id": "q2", "input": "Thessaloniki is a great place for a <mask>.", "answers": ["review"]},
            {"id": "q3", "input": "The capital of Greece is <mask>.", "answers": ["Athens"]},
            {"id": "q4", "input": "Thessaloniki is the second largest <mask> in Greece.", "answers": ["city"]}]
    write_jsonl(tmp_path / "templama_changed" / "test.jsonl", recs)
    metrics = run_evaluation("templama_changed", "npm", world["model"], [world["a"]["ds"]], tasks_root=tmp_path,
                             bm25=[world["a"]["bm25"]], predictions_path=tmp_path / "p.jsonl",
                             metrics_path=tmp_path / "m.json", k=K)
    preds = list(read_jsonl(tmp_path / "p.jsonl"))
    assert len(preds) == 4 and all(isinstance(p["prediction"], str) for p in preds)
    em = [exact_match(p["prediction"], p["answers"]) for p in preds]
    assert [p["correct"] for p in preds] == em
    assert metrics["score"] == pytest.approx(100.0 * np.mean(em)) and metrics["metric"] == "em"
    assert metrics["tau"] == 1.0 and json.loads((tmp_path / "m.json").read_text())["n"] == 4


def test_one_run_of_several_tasks_equals_one_run_per_task(world, tmp_path):
    """Rule evaluate_{group} answers every task of a system and corpus in one process: each task's predictions and
    score are those of its own run, each file written, and the metrics say which tasks shared the run."""
    recs = {"templama_changed": [{"id": "q1", "input": "Thessaloniki is the second largest city in <mask>.",
                                  "answers": ["Greece"]},
                                 {"id": "q2", "input": "The capital of Greece is <mask>.", "answers": ["Athens"]}],
            "templama_unchanged": [{"id": "u1", "input": "Thessaloniki is a great place for a <mask>.",
                                    "answers": ["review"]}]}
    for task, rows in recs.items():
        write_jsonl(tmp_path / task / "test.jsonl", rows)
    inputs = Inputs(checkpoint=world["model"], datastore=[world["a"]["ds"]], bm25=[world["a"]["bm25"]],
                    tasks_root=str(tmp_path))
    tasks = list(recs)
    together = evaluate_tasks(tasks, "npm", inputs, Settings(k=K),
                              predictions_paths=[tmp_path / f"{t}.jsonl" for t in tasks],
                              metrics_paths=[tmp_path / f"{t}.json" for t in tasks])
    for task, metrics in zip(tasks, together, strict=True):
        alone = evaluate(task, "npm", inputs, Settings(k=K), predictions_path=tmp_path / f"{task}.alone.jsonl")
        assert metrics["task"] == task and metrics["score"] == alone["score"] and metrics["n"] == len(recs[task])
        assert [r["prediction"] for r in read_jsonl(tmp_path / f"{task}.jsonl")] == \
            [r["prediction"] for r in read_jsonl(tmp_path / f"{task}.alone.jsonl")]
        saved = json.loads((tmp_path / f"{task}.json").read_text())
        assert saved["provenance"]["config"]["tasks_in_run"] == tasks and saved["load_seconds"] > 0
    twice = evaluate_tasks(["templama_unchanged", "templama_unchanged"], "npm", inputs, Settings(k=K),
                           metrics_paths=[tmp_path / "u1.json", tmp_path / "u2.json"])
    assert twice[0]["score"] == twice[1]["score"] == together[1]["score"]
    assert json.loads((tmp_path / "u2.json").read_text())["provenance"]["config"]["metrics_path"].endswith("u2.json")
    with pytest.raises(ValueError, match="one of each per task"):
        evaluate_tasks(tasks, "npm", inputs, Settings(k=K), metrics_paths=[tmp_path / "only_one.json"])
    with pytest.raises(ValueError, match="read different artefacts"):  # closed set reads FAISS, open set BM25
        evaluate_tasks(["templama_changed", "sst2"], "npm", dataclasses.replace(inputs, faiss=[world["a"]["faiss"]]),
                       Settings(k=K))


def _open(task, examples, answers):
    """Predictions records and metrics of fixed open-set answers, through the harness's scoring."""
    task = resolve_task(task)
    records, correct = score_examples(task, examples, Output(answers=answers))
    return records, correct


def test_lama_macro_over_buckets_differs_from_micro_on_an_unbalanced_set():
    ex = [{"id": str(i), "input": f"q{i} <mask>.", "answers": ["Paris"], "bucket": b, "group": b,
           "is_uhn": i in (0, 3), "is_hard": None} for i, b in enumerate([1, 1, 1, 2])]
    preds, correct = _open("lama_trex", ex, ["Paris", "the Paris.", "paris", "Lyon"])
    assert [p["correct"] for p in preds] == [True, True, True, False]
    macro = task_metrics("lama_trex", "npm", ex, correct)
    assert macro["average"] == "macro" and macro["score"] == pytest.approx(50.0)  # (100 + 0) / 2
    assert macro["groups"] == {"1": 100.0, "2": 0.0}
    assert macro["subsets"]["uhn"] == pytest.approx(50.0) and macro["subsets"]["hard"] is None
    micro = task_metrics("lama_trex", "npm", ex, correct, average="micro")
    assert micro["score"] == pytest.approx(75.0) and micro["subsets"]["uhn"] == pytest.approx(50.0)
    task = dataclasses.replace(resolve_task("lama_trex"), average="micro")
    assert task_metrics(task, "npm", ex, correct)["score"] == pytest.approx(75.0)


def test_entity_translation_cuts_at_punctuation():
    ex = [{"id": "0", "input": "a <mask>.", "answers": ["Αθήνα"], "lang": "el", "group": "el"},
          {"id": "1", "input": "b <mask>.", "answers": ["Москва"], "lang": "ru", "group": "ru"}]
    preds, correct = _open("entity_translation", ex, ["Αθήνα, Greece", ""])
    m = task_metrics("entity_translation", "npm", ex, correct)
    assert preds[0]["prediction"] == "Αθήνα" and preds[0]["raw_prediction"] == "Αθήνα, Greece"
    assert preds[1]["prediction"] == "" and m["groups"] == {"el": 100.0, "ru": 0.0} and m["score"] == 50.0


def test_translation_cut_decoders_keeps_npms_phrase_whole_as_the_original(world, tmp_path):
    """inference.translation_cut: all (every system's answer cut at its first punctuation) or decoders (the original
    code: only the decoder baselines' answers; NPM's phrase is scored whole)."""
    write_jsonl(tmp_path / "entity_translation" / "test.jsonl",
                [{"id": f"t{i}", "input": f"The Greek translation of {w} is: <mask>.", "answers": [w], "lang": "el"}
                 for i, w in enumerate(["Thessaloniki", "Greece", "review", "city"])])
    runs = {}
    for cut in ("all", "decoders"):
        run_evaluation("entity_translation", "npm", world["model"], [world["a"]["ds"]], tasks_root=tmp_path,
                       bm25=[world["a"]["bm25"]], n_samples=0, translation_cut=cut,
                       predictions_path=tmp_path / f"{cut}.jsonl")
        runs[cut] = list(read_jsonl(tmp_path / f"{cut}.jsonl"))
    for cut_all, whole in zip(runs["all"], runs["decoders"], strict=True):
        raw = cut_all.get("raw_prediction", cut_all["prediction"])
        assert cut_all["prediction"] == translation_prediction(raw)
        assert whole["prediction"] == raw and "raw_prediction" not in whole
    assert score_examples(resolve_task("entity_translation"), [{"id": "0", "input": "a <mask>.", "answers": ["x"]}],
                          Output(answers=["x, y"]), cut_translation=False)[0][0]["prediction"] == "x, y"


def test_lama_average_setting_reaches_the_metrics(world, tmp_path):
    """inference.lama_average: macro (Table 8 caption, the code) or micro (paper 6.3 text), the same predictions."""
    folder = tmp_path / "lama_trex"
    write_jsonl(folder / "relations.jsonl", [{"relation": "P17", "template": "[X] is located in [Y] ."}])
    subjects = [("Thessaloniki", "Greece"), ("Athens", "Greece"), ("Brooklyn", "New York City"), ("Lyon", "France")]
    write_jsonl(folder / "TREx" / "P17.jsonl", [{"uuid": f"u{i}", "sub_label": sub, "obj_label": obj}
                                                 for i, (sub, obj) in enumerate(subjects)])
    (folder / "uhn.txt").write_text("u0\n")
    (folder / "hard.txt").write_text("u2\n")
    kw = {"tasks_root": tmp_path, "bm25": [world["a"]["bm25"]], "n_samples": 0}
    macro = run_evaluation("lama_trex", "npm", world["model"], [world["a"]["ds"]], lama_average="macro", **kw)
    micro = run_evaluation("lama_trex", "npm", world["model"], [world["a"]["ds"]], lama_average="micro", **kw)
    assert macro["average"] == "macro" and micro["average"] == "micro"
    assert set(macro["groups"]) == {"1", "3"}  # "New York City" is a 3-gram bucket
    per_bucket = list(macro["groups"].values())
    assert macro["score"] == pytest.approx(np.mean(per_bucket))
    assert micro["score"] == pytest.approx((3 * macro["groups"]["1"] + macro["groups"]["3"]) / 4)


def test_errors_are_clear(world, tmp_path):
    ds, faiss = [world["a"]["ds"]], [world["a"]["faiss"]]
    with pytest.raises(KeyError, match="unknown task"):
        run_evaluation("nope", "npm", world["model"], ds, faiss=faiss)
    with pytest.raises(ValueError, match="unknown system"):
        run_evaluation("subj", "npm_multi", world["model"], ds, faiss=faiss)
    subj = tmp_path / "tasks" / "subj"
    subj.mkdir(parents=True)
    (subj / "test.csv").write_text('0,"a fine, moving film ."\n1,"the plot follows two brothers ."\n')
    with pytest.raises(ValueError, match="no trained MLM head"):  # mlm needs a masked-LM checkpoint
        run_evaluation("subj", "mlm", world["model"], [], tasks_root=tmp_path / "tasks")
    with pytest.raises(ValueError, match="does not apply to open-set"):
        run_evaluation("nq", "mlm", world["model"], [])
    with pytest.raises(ValueError, match="does not apply to closed-set"):
        run_evaluation("subj", "npm_faiss", world["model"], ds, faiss=faiss)
    with pytest.raises(FileNotFoundError, match="datastore"):
        run_evaluation("subj", "npm", world["model"], [str(tmp_path / "absent")], faiss=faiss)
    with pytest.raises(ValueError, match="one per datastore"):
        run_evaluation("subj", "npm", world["model"], [world["a"]["ds"], world["b"]["ds"]], faiss=faiss)
    with pytest.raises(ValueError, match="needs --faiss"):
        run_evaluation("subj", "npm", world["model"], ds)
    with pytest.raises(ValueError, match="needs --bm25"):
        run_evaluation("nq", "npm", world["model"], ds)
    with pytest.raises(ValueError, match="one datastore"):
        run_evaluation("nq", "npm", world["model"], [world["a"]["ds"], world["b"]["ds"]],
                       bm25=[world["a"]["bm25"], world["b"]["bm25"]])
    with pytest.raises(FileNotFoundError, match="task folder"):
        run_evaluation("subj", "npm", world["model"], ds, faiss=faiss, tasks_root=tmp_path)
    with pytest.raises(ValueError, match="answered 1 of 2"):
        score_examples(resolve_task("nq"), [{"id": "0", "input": "x", "answers": ["y"]}] * 2, Output(answers=["y"]))
    with pytest.raises(ValueError, match="non-finite"):
        score_examples(resolve_task("subj"), [{"id": "0", "input": "x", "label": 0}],
                       Output(scores=np.array([[np.nan, 1.0]])))


def test_negative_control_decouples_vectors_from_tokens(world, tmp_path):
    """--negative-control shuffled_vectors: FAISS finds the same nearest vectors (same scores), but each now sits on
    the row of a random token, so the neighbours vote for other tokens; a system without a datastore refuses it."""
    plain, shuffled = _predictor(world, "a"), _predictor(world, "a")
    shuffled.ds.shuffle_vectors(seed=0)
    q = plain.encode(["Thessaloniki is the second largest city in <mask>."])
    (ids0, sims0), = plain.knn_vectors(q)
    (ids1, sims1), = shuffled.knn_vectors(q)
    np.testing.assert_allclose(np.sort(sims0), np.sort(sims1), rtol=1e-6)
    assert not np.array_equal(ids0, ids1)
    rows = np.arange(shuffled.ds.n_rows)
    assert np.array_equal(shuffled.ds.vectors(shuffled.ds.index_rows(rows)), plain.ds.vectors(rows))
    with pytest.raises(ValueError, match="reads no datastore"):
        run_evaluation("sst2", "mlm", world["model"], [], tasks_root=tmp_path, control="shuffled_vectors")


def test_subsets_and_groups_carry_their_bootstrap_standard_error():
    """Every mean over examples a table shows has its ±: UHN / Hard (``subsets_stderr``) and each LAMA bucket /
    language (``groups_stderr``), from the same seeded bootstrap as the task's ``stderr``."""
    from npm.tasks.metrics import bootstrap

    ex = [{"id": str(i), "input": f"q{i} <mask>.", "answers": ["Paris"], "bucket": b, "group": b,
           "is_uhn": i in (0, 1, 3), "is_hard": None} for i, b in enumerate([1, 1, 1, 2, 2])]
    correct = [1.0, 0.0, 1.0, 0.0, 1.0]
    m = task_metrics("lama_trex", "npm", ex, correct)
    assert m["groups_stderr"]["1"] == pytest.approx(100.0 * bootstrap([1.0, 0.0, 1.0])["stderr"])
    assert m["groups_stderr"]["2"] == pytest.approx(100.0 * bootstrap([0.0, 1.0])["stderr"])
    uhn = bootstrap([1.0, 0.0, 0.0], [1, 1, 2], "macro")["stderr"]
    assert m["subsets_stderr"] == {"uhn": pytest.approx(100.0 * uhn), "hard": None}
