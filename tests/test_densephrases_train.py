"""DensePhrases' reading-comprehension data and training (npm.densephrases.rc, .features, .train, .evaluate;
paper-map §D1.3): SQuAD files read with clear errors, answers mapped to tokens, the teacher aligned with the student,
a training run that learns, resumes only itself, and uses pre-batch negatives only in its last epochs."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from npm.densephrases.evaluate import best_spans, rc_scores, span_text
from npm.densephrases.features import rc_features, teacher_inputs
from npm.densephrases.rc import read_squad, write_squad
from npm.model import load_tokenizer
from npm.tasks.metrics import f1_score
from tests.conftest import WORDPIECE, code_max_context, code_windows, save_tiny_bert

FACTS = [("Greece", "Athens"), ("France", "Paris"), ("Norway", "Oslo"), ("Peru", "Lima"), ("Kenya", "Nairobi"),
         ("Chile", "Santiago"), ("Egypt", "Cairo"), ("Japan", "Tokyo")]


def _examples():
    out = []
    for n, (country, city) in enumerate(FACTS):
        context = f"{country} is a country. Its capital and largest city is {city}, home to many people."
        out.append({"id": f"q{n}", "title": country, "context": context,
                    "question": f"What is the capital of {country}?", "answers": [city],
                    "answer_start": [context.index(city)], "question_generated": True})
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    write_squad(root / "train.json", _examples(), "test")
    return {"root": root, "train": str(root / "train.json"), "encoder": save_tiny_bert(root / "encoder")}


def test_squad_files_round_trip_and_malformed_records_name_file_and_question(world, tmp_path):
    back = read_squad(world["train"])
    assert [(e["id"], e["answers"], e["answer_start"], e["question_generated"]) for e in back] == \
        [(e["id"], e["answers"], e["answer_start"], True) for e in _examples()]
    data = json.loads(open(world["train"]).read())
    data["data"][1]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 1
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"bad.json: article 1 .*question 'q1'.*not at answer_start"):
        read_squad(tmp_path / "bad.json")
    data["data"][1]["paragraphs"][0]["qas"][0]["question"] = " "
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="non-empty 'question'"):
        read_squad(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable SQuAD JSON"):
        read_squad(tmp_path / "bad.json")


def test_answers_become_token_spans_and_the_teacher_sees_the_same_tokens():
    tok = load_tokenizer(WORDPIECE)
    examples = _examples()
    feats = rc_features(examples, tok, max_passage_tokens=64)
    assert feats["dropped"] == 0 and len(feats["start"]) == len(examples)
    assert (feats["support"] == feats["valid"]).all() and feats["answerable"].all()  # no windows: as before
    enc = tok([e["context"] for e in examples], truncation=True, max_length=64, return_offsets_mapping=True)
    for r, n in enumerate(feats["example"]):
        text = span_text(examples[n]["context"], enc["offset_mapping"][n], feats["start"][r], feats["end"][r])
        assert text == examples[n]["answers"][0]
    ids, mask, types, offset = teacher_inputs(feats)
    for r in range(len(ids)):
        pn = int(feats["passage_mask"][r].sum())
        assert ids[r, offset[r] + np.arange(1, pn)].tolist() == feats["passage_ids"][r, 1:pn].tolist()
        assert types[r, offset[r] + 1] == 1 and types[r, offset[r]] == 0
    with pytest.raises(ValueError, match="every answer lies beyond"):
        rc_features(examples, tok, max_passage_tokens=8)
    mixed = examples[:3] + [{**examples[3], "context": "x " * 80 + examples[3]["context"],
                             "answer_start": [160 + examples[3]["answer_start"][0]]}]
    cut = rc_features(mixed, tok, max_passage_tokens=64)
    assert cut["dropped"] == 1 and cut["example"].tolist() == [0, 1, 2]  # left out, never mislabelled


def _long_examples():
    """The examples with filler before and after their sentence: passages of 30-60 tokens, answers at varied places."""
    out = []
    for n, ex in enumerate(_examples()):
        before, after = "some filler words here. " * n, " and more text follows after it." * (len(FACTS) - n)
        out.append({**ex, "context": before + ex["context"] + after,
                    "answer_start": [len(before) + ex["answer_start"][0]]})
    return out


@pytest.mark.parametrize("max_tokens,stride", [(16, 4), (24, 10), (32, 30)])
def test_rc_windows_are_the_codes_and_a_window_without_the_answer_labels_its_cls(max_tokens, stride):
    """``doc_stride``: a passage becomes the code's windows (its reader's loop and max-context rule, restated in
    tests.conftest), ``[CLS] window [SEP]``; a window holding the whole answer labels it, any other labels its [CLS]
    (start = end = 0, not answerable), and every row's softmax support adds the [CLS]."""
    tok = load_tokenizer(WORDPIECE)
    examples = _long_examples()
    feats = rc_features(examples, tok, max_tokens, 24, stride=stride)
    enc = tok([e["context"] for e in examples], add_special_tokens=False, return_offsets_mapping=True)
    assert feats["dropped"] == 0 and not feats["answerable"].all()
    for n, ex in enumerate(examples):
        rows, offsets = np.flatnonzero(feats["example"] == n), enc["offset_mapping"][n]
        spans = code_windows(len(offsets), max_tokens, stride)
        assert len(rows) == len(spans) and feats["answerable"][rows].any()
        a, b = ex["answer_start"][0], ex["answer_start"][0] + len(ex["answers"][0])
        for k, (r, (begin, size)) in enumerate(zip(rows, spans, strict=True)):
            pn = int(feats["passage_mask"][r].sum())
            assert feats["passage_ids"][r, :pn].tolist() == [tok.cls_token_id, *enc["input_ids"][n][begin:begin + size],
                                                             tok.sep_token_id]
            assert feats["valid"][r, :pn].tolist() == [False] + [True] * size + [False]
            assert feats["support"][r].tolist() == [True, *feats["valid"][r, 1:].tolist()]
            assert feats["question_ids"][r].tolist() == feats["question_ids"][rows[0]].tolist()
            owned = [code_max_context(spans, begin + t) == k for t in range(size)]
            assert feats["max_context"][r, :pn].tolist() == [False, *owned, False]
            window = [(0, 0), *offsets[begin:begin + size]]
            assert feats["offsets"][r, :pn].tolist() == [[0, 0], *map(list, window[1:]), [0, 0]]
            holds = window[1][0] <= a and b <= window[-1][1]
            assert bool(feats["answerable"][r]) == holds
            if holds:
                assert span_text(ex["context"], window, feats["start"][r], feats["end"][r]) == ex["answers"][0]
            else:
                assert feats["start"][r] == feats["end"][r] == 0
    with pytest.raises(ValueError, match="its stride must be 1 to 14"):
        rc_features(examples, tok, 16, 24, stride=15)


def test_an_rc_evaluation_in_windows_answers_with_the_best_max_context_span_over_the_windows(world):
    """``rc_evaluate(doc_stride=...)``, the code's prediction: every example is read, whatever its answer's place, and
    answered with the best span (start + end score) over its windows whose start is a max-context token of its
    window, the earlier window on ties; without windows an answer beyond the cut leaves its example out."""
    from npm.densephrases.evaluate import rc_evaluate, rc_vectors
    from npm.densephrases.model import DensePhrases

    torch.manual_seed(0)
    model = DensePhrases.from_encoder(world["encoder"]).eval()
    examples = _long_examples()
    cut = rc_evaluate(model, examples, 16, 24)
    assert cut["n"] < len(examples) and cut["dropped"] == len(examples) - cut["n"]
    got = rc_evaluate(model, examples, 16, 24, doc_stride=4)
    assert (got["n"], got["dropped"]) == (len(examples), 0) and got["windows"] > 2 * len(examples)
    feats = rc_features(examples, model.tokenizer, 16, 24, stride=4)
    z_s, z_e = np.zeros(feats["passage_ids"].shape), np.zeros(feats["passage_ids"].shape)
    for rows, h, q_s, q_e in rc_vectors(model, feats):
        z_s[rows], z_e[rows] = np.einsum("bmd,bd->bm", h, q_s), np.einsum("bmd,bd->bm", h, q_e)
    for n, ex in enumerate(examples):
        best = None
        for r in np.flatnonzero(feats["example"] == n):
            tokens = np.flatnonzero(feats["valid"][r])
            for i in tokens[feats["max_context"][r, tokens]]:
                for j in tokens[(tokens >= i) & (tokens < i + 30)]:
                    if best is None or z_s[r, i] + z_e[r, j] > best[0]:
                        best = (z_s[r, i] + z_e[r, j], r, i, j)
        _, r, i, j = best
        text = ex["context"][feats["offsets"][r, i, 0]:feats["offsets"][r, j, 1]]
        assert got["predictions"][n]["id"] == ex["id"] and got["predictions"][n]["prediction"] == text


def _code_prediction(feats: dict, z_s, z_e, f, example: int, max_answer_length: int, threshold: float):
    """The code's phrase-model prediction (train_rc.py's compute_predictions_logits), restated: per window, every
    start in its context that is a max-context token and every end in range(start, start + max_answer_length - 1),
    a span dropped when its start's start-filter or its end's end-filter logit is below the threshold; the best by
    start + end logit, the first found among ties (a stable sort); none left: the nonce answer "empty"."""
    best = None
    for r in np.flatnonzero(feats["example"] == example):
        context = np.flatnonzero(feats["valid"][r])
        for i in context:
            for j in range(i, min(feats["valid"].shape[1], i + max_answer_length - 1)):
                if not (feats["valid"][r, j] and feats["max_context"][r, i]):
                    continue
                if f[r, i, 0] < threshold or f[r, j, 1] < threshold:
                    continue
                if best is None or z_s[r, i] + z_e[r, j] > best[0]:
                    best = (z_s[r, i] + z_e[r, j], r, i, j)
    return best and best[1:]


def _answer_text(example: dict, feats: dict, best) -> str:
    """The text of a restated prediction's (window, start, end), or "empty" for none (the code's nonce answer)."""
    if best is None:
        return "empty"
    r, i, j = best
    return example["context"][feats["offsets"][r, i, 0]:feats["offsets"][r, j, 1]]


@pytest.mark.parametrize("quantile", [0.0, 0.5, 0.99])
def test_the_rc_prediction_reads_the_codes_span_length_and_only_the_spans_its_filter_keeps(world, quantile):
    """``rc_answer_tokens`` 9 and ``rc_filter_threshold``: the code's prediction (``--max_answer_length 10``, whose
    loop stops one token short, and ``--filter_threshold``), in windows; an example that the filter leaves without a
    span answers "empty". A filter head never trained, or a threshold on the teacher, is refused."""
    from npm.densephrases.evaluate import rc_evaluate, rc_vectors
    from npm.densephrases.model import DensePhrases

    torch.manual_seed(0)
    model = DensePhrases.from_encoder(world["encoder"]).eval()
    examples = _long_examples()
    with pytest.raises(ValueError, match="filter head was never trained"):
        rc_evaluate(model, examples, 16, 24, 9, doc_stride=4, filter_threshold=0.0)
    with pytest.raises(ValueError, match="teacher has no filter head"):
        rc_evaluate(None, examples, 16, 24, teacher=object(), tokenizer=model.tokenizer, filter_threshold=0.0)
    model.filter_trained = True
    feats = rc_features(examples, model.tokenizer, 16, 24, stride=4)
    z_s, z_e = np.zeros(feats["passage_ids"].shape), np.zeros(feats["passage_ids"].shape)
    f = np.zeros((*z_s.shape, 2))
    for rows, h, q_s, q_e in rc_vectors(model, feats):
        z_s[rows], z_e[rows] = np.einsum("bmd,bd->bm", h, q_s), np.einsum("bmd,bd->bm", h, q_e)
        with torch.no_grad():
            f[rows] = model.filter_logits(torch.as_tensor(h)).numpy()
    threshold = float(np.quantile(f[feats["valid"]], quantile))
    got = rc_evaluate(model, examples, 16, 24, 9, doc_stride=4, filter_threshold=threshold)
    assert (got["max_answer_tokens"], got["filter_threshold"], got["n"]) == (9, threshold, len(examples))
    empty = 0
    for n, ex in enumerate(examples):
        best = _code_prediction(feats, z_s, z_e, f, n, 10, threshold)
        empty += best is None
        assert got["predictions"][n]["prediction"] == _answer_text(ex, feats, best), (quantile, n)
    assert got["no_span"] == empty
    if quantile == 0.5:  # the filter decides answers here
        kept_all = rc_evaluate(model, examples, 16, 24, 9, doc_stride=4)["predictions"]
        assert [p["prediction"] for p in got["predictions"]] != [p["prediction"] for p in kept_all]
    none = rc_evaluate(model, examples, 16, 24, 9, doc_stride=4, filter_threshold=float(f.max()) + 1)
    assert {p["prediction"] for p in none["predictions"]} == {"empty"} and none["no_span"] == len(examples)


def _reader_prediction(feats: dict, z_s: list, z_e: list, offset: np.ndarray, example: int, n_best: int):
    """The code's cross-encoder prediction (transformers' SQuAD reader, ``compute_predictions_logits`` with
    ``--n_best_size`` and ``--max_answer_length 30``), restated: per window, the ``n_best`` best starts and ends over
    its whole input (a stable sort); a pair kept if both are context tokens, the start a max-context token, the end not
    before it and the span at most 30 tokens; the best by start + end logit, the first found among ties."""
    best = None
    for r in np.flatnonzero(feats["example"] == example):
        ranked = [sorted(range(len(z)), key=lambda x, z=z: z[x], reverse=True)[:n_best] for z in (z_s[r], z_e[r])]
        for a in ranked[0]:
            for b in ranked[1]:
                i, j = a - offset[r], b - offset[r]
                if min(i, j) < 1 or max(i, j) >= feats["valid"].shape[1] or not (feats["valid"][r, i]
                                                                                 and feats["valid"][r, j]):
                    continue
                if not feats["max_context"][r, i] or j < i or j - i + 1 > 30:
                    continue
                if best is None or z_s[r][a] + z_e[r][b] > best[0]:
                    best = (z_s[r][a] + z_e[r][b], r, i, j)
    return best and best[1:]


@pytest.mark.parametrize("n_best", [2, 20])
def test_the_teacher_answers_among_its_windows_n_best_starts_and_ends_as_transformers_reader(world, n_best):
    """The cross-attention teacher answers as the code's cross-encoder, transformers' SQuAD reader: the best span of at
    most 30 tokens whose start and end are among the ``n_best`` best of their window's whole input (question and
    special tokens too), over the windows; ``n_best`` None searches every span."""
    from npm.densephrases.evaluate import TEACHER_N_BEST, rc_evaluate
    from npm.densephrases.train import load_teacher

    teacher, tok = load_teacher(world["encoder"]).eval(), load_tokenizer(world["encoder"])
    examples = _long_examples()
    feats = rc_features(examples, tok, 16, 24, stride=4)
    z_s, z_e, offset = [], [], np.zeros(len(feats["example"]), np.int64)
    for r in range(len(feats["example"])):
        ids, mask, types, offset[r:r + 1] = teacher_inputs(feats, [r])
        with torch.no_grad():
            out = teacher(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                          token_type_ids=torch.as_tensor(types))
        z_s.append(out.start_logits[0].tolist()), z_e.append(out.end_logits[0].tolist())
    got = rc_evaluate(None, examples, 16, 24, 30, teacher=teacher, tokenizer=tok, doc_stride=4, teacher_n_best=n_best)
    assert got["n_best"] == n_best and TEACHER_N_BEST == 20
    for n, ex in enumerate(examples):
        best = _reader_prediction(feats, z_s, z_e, offset, n, n_best)
        assert got["predictions"][n]["prediction"] == _answer_text(ex, feats, best), (n_best, n)
    every = rc_evaluate(None, examples, 16, 24, 30, teacher=teacher, tokenizer=tok, doc_stride=4, teacher_n_best=None)
    changed = [p["prediction"] for p in got["predictions"]] != [p["prediction"] for p in every["predictions"]]
    assert changed == (n_best == 2)  # the 2 best restrict the answers here; the 20 best, most of a window, do not


def test_a_window_without_the_answer_trains_its_cls_and_no_filter_term(world):
    """The code's loss on a window without the answer: single-passage and distillation softmax over the passage and
    the [CLS], the [CLS] the target and the in-batch gold vector; the filter term only over the rows with an answer.
    The teacher's logits at the student's [CLS] are the teacher's own [CLS] logits."""
    from npm.densephrases.losses import filter_loss, in_batch_loss
    from npm.densephrases.model import DensePhrases
    from npm.densephrases.train import PhraseTrainConfig, load_teacher, step_loss, teacher_logits

    torch.manual_seed(0)
    model = DensePhrases.from_encoder(world["encoder"]).eval()
    feats = rc_features(_long_examples(), load_tokenizer(world["encoder"]), 16, 24, stride=4)
    rows = np.r_[np.flatnonzero(feats["answerable"])[:2], np.flatnonzero(~feats["answerable"])[:2]]
    cfg = PhraseTrainConfig(encoder=world["encoder"], train=world["train"], out_dir="-", checkpoint_dir="-",
                            negatives="in_batch", lambda_filter=1.0)
    with torch.no_grad():
        loss, parts = step_loss(model, feats, rows, cfg, None)
        h = model.phrase_vectors(torch.as_tensor(feats["passage_ids"][rows]),
                                 torch.as_tensor(feats["passage_mask"][rows]))
        q_start, q_end = model.query_vectors(torch.as_tensor(feats["question_ids"][rows]),
                                             torch.as_tensor(feats["question_mask"][rows]))
    support, valid = torch.as_tensor(feats["support"][rows]), torch.as_tensor(feats["valid"][rows])
    start, end = torch.as_tensor(feats["start"][rows]), torch.as_tensor(feats["end"][rows])
    assert start[2:].tolist() == end[2:].tolist() == [0, 0]
    single = 0.0
    for q, gold in ((q_start, start), (q_end, end)):
        z = (h.float() @ q.float()[:, :, None])[..., 0].masked_fill(~support, float("-inf"))
        single -= torch.log_softmax(z, -1)[torch.arange(4), gold].mean() / 2
    assert parts["single"] == pytest.approx(float(single), abs=1e-5)
    ans = torch.arange(4) < 2
    with torch.no_grad():
        assert parts["filter"] == pytest.approx(float(filter_loss(model.filter_logits(h[ans]), valid[ans], start[ans],
                                                                  end[ans])), abs=1e-6)
    gold = h[torch.arange(4), start]
    assert gold[2:].tolist() == h[2:, 0].tolist()
    assert parts["neg"] == pytest.approx(float(in_batch_loss(q_start, q_end, gold, h[torch.arange(4), end])), abs=1e-5)
    teacher = load_teacher(world["encoder"]).eval()  # a reader with a random span head: the alignment is the point
    got_s, _ = teacher_logits(teacher, feats)
    ids, mask, types, offset = teacher_inputs(feats, rows[2:3])
    with torch.no_grad():
        own = teacher(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                      token_type_ids=torch.as_tensor(types)).start_logits[0]
    assert got_s[rows[2], 0] == pytest.approx(float(own[0]), abs=1e-5)
    assert got_s[rows[2], 1] == pytest.approx(float(own[offset[0] + 1]), abs=1e-5)
    cut = rc_features(_long_examples(), load_tokenizer(world["encoder"]), 64, 24)
    assert np.isneginf(teacher_logits(teacher, cut)[0][:, 0]).all()  # without windows the [CLS] is never a target


def test_best_span_is_the_brute_force_argmax_and_scores_are_squad_em_f1():
    rng = np.random.default_rng(0)
    s, e = rng.standard_normal((5, 12)), rng.standard_normal((5, 12))
    valid = rng.random((5, 12)) > 0.3
    valid[:, 0] = True
    got = best_spans(s, e, valid, max_tokens=4)
    for b in range(5):
        pairs = [(i, j) for i in range(12) for j in range(i, min(12, i + 4)) if valid[b, i] and valid[b, j]]
        assert tuple(got[b]) == max(pairs, key=lambda p: s[b, p[0]] + e[b, p[1]])
    assert f1_score("the capital Athens", ["Athens"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    scores = rc_scores(["Athens", "Paris city"], [["Athens"], ["Paris"]])
    assert scores["em"] == 50.0 and scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)


def test_training_learns_resumes_only_itself_and_uses_pre_batch_in_the_last_epochs(world, tmp_path):
    from npm.densephrases.model import DensePhrases
    from npm.densephrases.train import PhraseTrainConfig, TeacherConfig, train_densephrases, train_teacher

    teacher = train_teacher(TeacherConfig(encoder=world["encoder"], train=world["train"],
                                          out_dir=str(tmp_path / "teacher"), checkpoint_dir=str(tmp_path / "ck_t"),
                                          epochs=2, batch_size=4, lr=1e-3, max_passage_tokens=64,
                                          max_question_tokens=24), progress=False)
    assert teacher["steps"] == 4 and (tmp_path / "teacher" / "config.json").exists()
    cfg = dict(encoder=world["encoder"], train=world["train"], out_dir=str(tmp_path / "model"),
               checkpoint_dir=str(tmp_path / "ck"), teacher=str(tmp_path / "teacher"), epochs=6, pre_batch_epochs=2,
               pre_batch=2, batch_size=2, lr=2e-3, max_passage_tokens=64, max_question_tokens=24, lambda_filter=1.0)
    summary = train_densephrases(PhraseTrainConfig(**cfg), progress=False)
    rows = list(csv.DictReader(open(tmp_path / "model" / "train_log.csv")))
    assert summary["steps"] == len(rows) == 6 * 4
    assert all(r["pre_batch"] == "0" for r in rows if int(r["epoch"]) <= 4)
    assert max(int(r["pre_batch"]) for r in rows if int(r["epoch"]) > 4) == 2  # C = 2 batches, from an empty queue
    assert [r["pre_batch"] for r in rows if r["epoch"] == "5"] == ["0", "1", "2", "2"]
    first = np.mean([float(r["loss_single"]) for r in rows[:4]])
    last = np.mean([float(r["loss_single"]) for r in rows[-4:]])
    assert last < 0.5 * first  # it learns to read the training passages
    model = DensePhrases.load(tmp_path / "model")
    assert model.hidden_size == 32 and model.filter_trained  # lambda_filter > 0: the dump may filter by its head
    again = train_densephrases(PhraseTrainConfig(**cfg), progress=False)  # the same run: resumes after its last epoch
    assert again["run_folder"] == summary["run_folder"] and again["steps"] == summary["steps"]
    other = train_densephrases(PhraseTrainConfig(**{**cfg, "epochs": 1, "pre_batch_epochs": 0, "lambda_filter": 0.0,
                                                    "out_dir": str(tmp_path / "unfiltered")}), progress=False)
    assert other["run_folder"] != summary["run_folder"] and other["steps"] == 4
    assert not DensePhrases.load(tmp_path / "unfiltered").filter_trained
    with pytest.raises(ValueError, match="negatives must be one of"):
        train_densephrases(PhraseTrainConfig(**{**cfg, "negatives": "hard"}), progress=False)
    # parts of the model are three separate encoders: a query-side change leaves the phrase encoder alone
    before = {k: v.clone() for k, v in model.phrase.state_dict().items()}
    with torch.no_grad():
        next(model.query_start.parameters()).add_(1.0)
    assert all(torch.equal(v, before[k]) for k, v in model.phrase.state_dict().items())


def test_training_in_windows_trains_the_teacher_and_the_model_on_every_window_as_runs_of_their_own(world, tmp_path):
    from npm.densephrases.train import PhraseTrainConfig, TeacherConfig, train_densephrases, train_teacher

    write_squad(tmp_path / "long.json", _long_examples(), "test")
    common = dict(encoder=world["encoder"], train=str(tmp_path / "long.json"), max_passage_tokens=16,
                  max_question_tokens=24, batch_size=8, lr=1e-3)
    windows = rc_features(_long_examples(), load_tokenizer(world["encoder"]), 16, 24, stride=4)
    teacher = train_teacher(TeacherConfig(**common, out_dir=str(tmp_path / "teacher"),
                                          checkpoint_dir=str(tmp_path / "ck_t"), epochs=1, doc_stride=4),
                            progress=False)
    assert teacher["rows"] == len(windows["start"]) > 2 * len(FACTS) and teacher["examples"] == len(FACTS)
    cfg = dict(common, teacher=str(tmp_path / "teacher"), checkpoint_dir=str(tmp_path / "ck"), epochs=1,
               pre_batch_epochs=0, negatives="in_batch", lambda_filter=1.0)
    windowed = train_densephrases(PhraseTrainConfig(**cfg, doc_stride=4, out_dir=str(tmp_path / "w")),
                                  progress=False)
    cut = train_densephrases(PhraseTrainConfig(**cfg, out_dir=str(tmp_path / "cut")), progress=False)
    assert (windowed["examples"], windowed["rows"]) == (len(FACTS), len(windows["start"]))
    assert 0 < cut["examples"] == cut["rows"] < len(FACTS)
    assert windowed["run_folder"] != cut["run_folder"]
    rows = list(csv.DictReader(open(tmp_path / "w" / "train_log.csv")))
    parts = ("single", "distill", "neg", "filter")
    assert rows and all(np.isfinite(float(r[f"loss_{k}"])) for r in rows for k in parts)


GENERATED = [("Italy", "Rome"), ("Spain", "Madrid"), ("Ghana", "Accra"), ("Nepal", "Kathmandu"), ("Cuba", "Havana"),
             ("Iran", "Tehran")]


def test_generated_questions_join_the_training_set_or_train_first_as_the_codes_two_stages(world, tmp_path):
    """Paper 4.1: generated questions are added to the training set; the code's run-rc trains on them alone first
    (in-batch negatives), then on the RC set from those encoders with pre-batch negatives from its first epoch, each
    stage with a new optimiser and schedule (paper-map §D1.7)."""
    from npm.densephrases.train import PhraseTrainConfig, stages, train_densephrases

    generated = [{"id": f"g{n}", "title": c, "context": f"The capital of {c} is {city}.",
                  "question": f"Which city is the capital of {c}?", "answers": [city],
                  "answer_start": [len(f"The capital of {c} is ")]} for n, (c, city) in enumerate(GENERATED)]
    write_squad(tmp_path / "generated.json", generated, "test")
    cfg = dict(encoder=world["encoder"], train=world["train"], generated=str(tmp_path / "generated.json"),
               checkpoint_dir=str(tmp_path / "ck"), epochs=3, pre_batch_epochs=1, pre_batch=2, batch_size=2, lr=2e-3,
               max_passage_tokens=64, max_question_tokens=24, lambda_distill=0.0)
    joint = train_densephrases(PhraseTrainConfig(**cfg, out_dir=str(tmp_path / "joint")), progress=False)
    assert joint["examples"] == 8 + 6 and joint["steps"] == 3 * 7 and len(joint["stages"]) == 1

    two_cfg = PhraseTrainConfig(**cfg, generated_first=True, out_dir=str(tmp_path / "two"))
    two = train_densephrases(two_cfg, progress=False)
    first, second = two["stages"]
    assert (first["examples"], first["steps"]) == (6, 2 * 3) and (second["examples"], second["steps"]) == (8, 4)
    rows = list(csv.DictReader(open(tmp_path / "two" / "train_log.csv")))
    assert [int(r["step"]) for r in rows] == list(range(1, 11)) and [r["stage"] for r in rows] == ["1"] * 6 + ["2"] * 4
    assert all(r["pre_batch"] == "0" and r["loss_neg"] != "nan" for r in rows[:6])  # in-batch negatives only
    assert [r["pre_batch"] for r in rows[6:]] == ["0", "1", "2", "2"]  # pre-batch from the RC stage's first epoch
    summary = json.loads((tmp_path / "two" / "train_summary.json").read_text())
    assert summary["settings"]["generated_first"] and len(summary["stages"]) == 2

    # each stage is an ordinary run: the first is the run of the generated questions alone, the second the RC set's
    # run from the first one's last epoch, so either resumes from (and only from) its own checkpoints
    plan = stages(two_cfg)
    assert plan[0].train == cfg["generated"] and plan[0].negatives == "in_batch" and plan[0].pre_batch_epochs == 0
    alone = train_densephrases(replace(plan[0], out_dir=str(tmp_path / "alone")), progress=False)
    assert alone["run_folder"] == first["run_folder"] and alone["steps"] == first["steps"]
    init = str(Path(first["run_folder"]) / "epoch-2")
    rc_stage = train_densephrases(replace(plan[1], init=init, out_dir=str(tmp_path / "rc")), progress=False)
    assert rc_stage["run_folder"] == second["run_folder"] and rc_stage["steps"] == 4
    assert second["run_folder"] != joint["run_folder"] != first["run_folder"]
    again = train_densephrases(two_cfg, progress=False)
    assert again["stages"] == two["stages"]

    with pytest.raises(ValueError, match="give their file"):
        train_densephrases(PhraseTrainConfig(**{**cfg, "generated": None}, generated_first=True, out_dir="-"))
    with pytest.raises(ValueError, match="both must be at least 1"):
        train_densephrases(PhraseTrainConfig(**{**cfg, "pre_batch_epochs": 0}, generated_first=True, out_dir="-"))


def test_a_batch_loss_ignores_padding_beyond_its_longest_sequence(world):
    """The features are padded to the longest passage of the whole set; each step cuts its batch to its own longest,
    which changes no loss (only the time)."""
    from npm.densephrases.model import DensePhrases
    from npm.densephrases.train import PhraseTrainConfig, step_loss

    torch.manual_seed(0)
    model = DensePhrases.from_encoder(world["encoder"]).eval()
    feats = rc_features(read_squad(world["train"]), load_tokenizer(world["encoder"]), 64, 24)
    wide = dict(feats)
    for key, extra in (("passage_ids", 30), ("passage_mask", 30), ("valid", 30), ("question_ids", 9),
                       ("question_mask", 9)):
        wide[key] = np.pad(feats[key], ((0, 0), (0, extra)))
    teacher = np.random.default_rng(0).normal(size=feats["passage_ids"].shape).astype(np.float32)
    wide_teacher = np.pad(teacher, ((0, 0), (0, 30)), constant_values=-np.inf)
    cfg = PhraseTrainConfig(encoder=world["encoder"], train=world["train"], out_dir="-", checkpoint_dir="-",
                            negatives="in_batch", lambda_filter=1.0)
    rows = np.array([0, 3, 5])
    with torch.no_grad():
        loss, parts = step_loss(model, feats, rows, cfg, None, teacher, teacher)
        wide_loss, wide_parts = step_loss(model, wide, rows, cfg, None, wide_teacher, wide_teacher)
    assert set(parts) == {"single", "distill", "neg", "filter"}
    assert torch.allclose(loss, wide_loss, atol=1e-5)
    assert parts == pytest.approx(wide_parts, abs=1e-5)


def test_open_set_inputs_become_questions_and_facts_become_cloze_questions():
    from npm.densephrases.evaluate import task_question
    from npm.embedded.rc import cloze_questions

    assert task_question("nq", "what is the capital of peru? The answer is: <mask>.") == "what is the capital of peru?"
    assert task_question("kamel", "What is the capital of Peru? Answer: <mask>.") == "What is the capital of Peru?"
    assert task_question("lama_trex", "The capital of Peru is <mask> .") == "The capital of Peru is"
    assert task_question("templama_changed", "<mask> is the capital of Peru.") == "is the capital of Peru"
    examples = [dict(ex, relation=rel) for ex, rel in zip(_examples()[:3], ["P36", "P38", "P1376"], strict=True)]
    assert cloze_questions(examples) == [
        {"id": "q0", "question": "The capital of Greece is", "answers": ["Athens"], "question_generated": True},
        {"id": "q2", "question": "Norway is the capital of", "answers": ["Oslo"], "question_generated": True}]


def test_the_teacher_filter_keeps_generated_questions_it_answers_and_every_other(world):
    """Paper 4.1: a generated question is kept only if the cross-attention teacher reads its answer exactly."""
    from npm.densephrases.evaluate import rc_evaluate, teacher_filter
    from npm.densephrases.train import load_teacher

    teacher = load_teacher(world["encoder"]).eval()
    tok = load_tokenizer(world["encoder"])
    examples = _examples()
    examples[0]["question_generated"] = False  # a human question: kept whatever the teacher reads
    truth = rc_evaluate(None, examples[1:], 64, 24, teacher=teacher, tokenizer=tok)["predictions"]
    kept, counts = teacher_filter(examples, teacher, tok, 64, 24)
    assert [ex["id"] for ex in kept] == ["q0"] + [p["id"] for p in truth if p["em"]]
    assert counts == {"generated": len(examples) - 1, "kept": len(kept) - 1, "total": len(kept)}
    human = [dict(ex, question_generated=False) for ex in examples]
    assert teacher_filter(human, teacher, tok, 64, 24)[0] == human


def test_an_rc_set_without_held_out_leads_is_a_clear_error_not_an_argparse_one(tmp_path):
    """Fault: rule densephrases_rc passes embedded.max_articles null as `--max-articles 0` (the CLI's "all"), which the
    option refused (exit 2), and with every lead in the corpus no subject is left to train on. Expected: 0 parses as
    "all", and building the set says why it cannot, naming the settings to change."""
    from npm.cli import build_parser
    from npm.embedded.corpora import load_leads
    from npm.embedded.rc import embedded_rc

    assert build_parser().parse_args(["densephrases", "rc", "--max-articles", "0", "--out-dir", "x"]).max_articles == 0
    leads = load_leads()
    with pytest.raises(ValueError, match="embedded.max_articles"):
        embedded_rc(leads, sorted(leads), seed=0)


def test_the_rc_set_of_max_subjects_keeps_their_facts_whole_and_splits_them_by_subject():
    """embedded.max_rc_subjects (`--max-subjects`): the facts of the seeded permutation's first N subjects, each
    example as the whole set has it, the subjects split 80/10/10 with no subject in two splits; 0 on the command line
    is all, as `--max-articles` is."""
    from npm.cli import build_parser
    from npm.embedded.corpora import corpus_titles, load_leads
    from npm.embedded.rc import SPLITS, embedded_rc

    leads = load_leads()
    titles = corpus_titles(leads, 300)
    whole = embedded_rc(leads, titles, seed=0)
    capped = embedded_rc(leads, titles, seed=0, max_subjects=50)
    by_id = {ex["id"]: ex for split in SPLITS for ex in whole[split]}
    subjects = {split: {ex["title"] for ex in capped[split]} for split in SPLITS}
    assert 0 < len(subjects["train"]) <= 40 and 0 < len(subjects["dev"]) <= 5 and 0 < len(subjects["test"]) <= 5
    assert not (subjects["train"] & subjects["dev"] or subjects["train"] & subjects["test"]
                or subjects["dev"] & subjects["test"])
    assert all(by_id[ex["id"]] == ex for split in SPLITS for ex in capped[split])
    assert len(by_id) > 5 * sum(len(capped[split]) for split in SPLITS)
    assert embedded_rc(leads, titles, seed=0, max_subjects=None) == whole
    args = build_parser().parse_args(["densephrases", "rc", "--out-dir", "x"])
    assert args.max_subjects == 0 and build_parser().parse_args(
        ["densephrases", "rc", "--max-subjects", "50", "--out-dir", "x"]).max_subjects == 50


def test_d_small_answers_each_question_with_the_best_span_of_every_pooled_passage(world):
    """Table 6's D_small: the questions' passages and a pool of others, every question over all of them. Against
    brute force over every (passage, start, end) of the tiny model; with one passage it is the {p} setting."""
    from npm.densephrases.evaluate import d_small_evaluate, rc_evaluate
    from npm.densephrases.model import DensePhrases

    torch.manual_seed(0)
    model = DensePhrases.from_encoder(world["encoder"]).eval()
    examples = _examples()[:4]
    pool = [{**_examples()[5], "context": "Lima lies on the coast; Cairo on the Nile."}]
    got = d_small_evaluate(model, examples, 64, 24, max_answer_tokens=6, pool=pool)
    contexts = [ex["context"] for ex in examples] + [pool[0]["context"]]
    assert got["passages"] == 5 and got["n"] == 4
    tok = model.tokenizer
    enc = tok(contexts, padding=True, return_offsets_mapping=True, return_special_tokens_mask=True,
              return_tensors="pt")
    with torch.inference_mode():
        h = model.phrase_vectors(enc["input_ids"], enc["attention_mask"])
        q = tok([ex["question"] for ex in examples], padding=True, return_tensors="pt")
        q_s, q_e = model.query_vectors(q["input_ids"], q["attention_mask"])
    valid = (enc["attention_mask"] == 1) & (enc["special_tokens_mask"] == 0)
    for n, record in enumerate(got["predictions"]):
        best, text, where = -np.inf, None, None
        for p in range(len(contexts)):
            for i in np.flatnonzero(valid[p]):
                for j in np.flatnonzero(valid[p]):
                    score = float(h[p, i] @ q_s[n] + h[p, j] @ q_e[n])
                    if i <= j < i + 6 and score > best:
                        best, where = score, p
                        text = contexts[p][enc["offset_mapping"][p][i][0]:enc["offset_mapping"][p][j][1]]
        assert record["prediction"] == text and record["own_passage"] == (where == n)
    shared = [{**ex, "context": examples[0]["context"], "answers": ["Athens"],
               "answer_start": [examples[0]["context"].index("Athens")]} for ex in examples]
    one = d_small_evaluate(model, shared, 64, 24)
    assert one["passages"] == 1 and one["own_passage"] == 100.0
    assert one["em"] == rc_evaluate(model, shared, 64, 24)["em"]
