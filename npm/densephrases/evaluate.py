"""Evaluation of DensePhrases (Lee et al. 2021, section 7.1 and Table 2; docs/paper-map.md §D1.5).

* :func:`best_spans`: the reading-comprehension answer of a passage from start and end logits: argmax over
  i <= j < i + max_tokens of z_start[i] + z_end[j] over valid tokens (both the query-agnostic model, with
  z = h . q, and the cross-attention teacher read answers this way).
* :func:`rc_scores`: SQuAD exact match and token F1 (``npm.tasks.metrics``) of span predictions, in percent.
* :func:`rc_evaluate`: reading comprehension, each question over its own passage (Table 2, and Table 6's D = {p});
  :func:`d_small_evaluate`: each question over all the passages of the set pooled (Table 6's D_small).
* :func:`teacher_filter`: the filter of generated questions (paper 4.1): a generated question is kept only if the
  cross-attention teacher reads its answer exactly; questions that are not generated are always kept.
* :func:`open_domain`: EM@1 of the top phrase over the index (``npm.densephrases.searcher``) and questions/s.
* :func:`task_question` (``npm.densephrases.questions``): the question DensePhrases encodes for an NPM-style
  open-set input (its "<mask>" form): NQ, TriviaQA and KAMEL keep their question; a cloze (LAMA, TempLAMA) or
  translation input is its text with the mask removed ("The capital of Greece is"), a format that phrase training
  never sees and that query-side fine-tuning can learn (paper 7.2, slot filling). :func:`task_questions` turns a task
  of the registry into such records.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

# torch, and npm.densephrases.train which imports it, are imported inside the functions that run a model: the
# question and scoring helpers here serve callers that load none (the question files of npm.densephrases.cli).
from npm.densephrases.features import rc_features
from npm.densephrases.questions import task_question
from npm.io import save_npz
from npm.model import autocast, load_tokenizer
from npm.settings import DensePhrasesSettings
from npm.tasks.metrics import exact_match, f1_score
from npm.tasks.registry import resolve_task, task_examples

# How the cross-attention teacher answers: the code's cross-encoder, transformers' SQuAD reader, keeps its defaults,
# spans of at most 30 tokens (--max_answer_length) among the 20 best starts and the 20 best ends of a window
# (--n_best_size).
TEACHER_ANSWER_TOKENS = 30
TEACHER_N_BEST = 20


def best_spans(start_logits: np.ndarray, end_logits: np.ndarray, valid: np.ndarray,
               max_tokens: int = DensePhrasesSettings.rc_answer_tokens, starts: np.ndarray | None = None,
               ends: np.ndarray | None = None) -> np.ndarray:
    """(i, j) int64 [B, 2]: the best span of each row, i <= j < i + ``max_tokens``, both valid tokens, i one of
    ``starts`` [B, m] and j one of ``ends`` [B, m] where given (a window's max-context tokens and the spans the
    filter keeps, as the code's predictions); (-1, -1) for a row without such a span."""
    s = np.where(valid if starts is None else valid & starts, np.asarray(start_logits, dtype=np.float64), -np.inf)
    e = np.where(valid if ends is None else valid & ends, np.asarray(end_logits, dtype=np.float64), -np.inf)
    m = s.shape[1]
    i, j = np.triu_indices(m)
    keep = j - i < max_tokens
    i, j = i[keep], j[keep]
    scores = s[:, i] + e[:, j]
    best = scores.argmax(axis=1)
    spans = np.stack([i[best], j[best]], 1).astype(np.int64)
    spans[~np.isfinite(scores[np.arange(len(s)), best])] = -1
    return spans


def span_scores(start_logits: np.ndarray, end_logits: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """float64 [B]: z_start[i] + z_end[j] of each row's span (``best_spans``), -inf for a row without one."""
    rows = np.arange(len(spans))
    score = (np.asarray(start_logits, np.float64)[rows, spans[:, 0]]
             + np.asarray(end_logits, np.float64)[rows, spans[:, 1]])
    return np.where(spans[:, 0] >= 0, score, -np.inf)


def span_text(context: str, offsets: np.ndarray, i: int, j: int) -> str:
    """The context characters from token i's start to token j's end (``offsets`` [m, 2] of the passage)."""
    return context[int(offsets[i][0]):int(offsets[j][1])]


def rc_scores(predictions: list[str], answers: list[list[str]]) -> dict:
    """EM and F1 in percent over the examples, with the per-example values."""
    em = [float(exact_match(p, a)) for p, a in zip(predictions, answers, strict=True)]
    f1 = [f1_score(p, a) for p, a in zip(predictions, answers, strict=True)]
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1)), "n": len(em),
            "em_each": em, "f1_each": f1}


def _texts(examples: list[dict], feats: dict, spans: np.ndarray, rows: np.ndarray) -> list[str]:
    """The text of ``spans`` [len(rows), 2] of the feature ``rows``; a row without a span (-1) answers "empty", the
    code's prediction when no span is left to it."""
    return [span_text(examples[feats["example"][r]]["context"], feats["offsets"][r], *span) if span[0] >= 0
            else "empty" for r, span in zip(rows, spans, strict=True)]


def _best_rows(example: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Per example, in order, the feature row of the highest ``score`` (ties to the earlier window)."""
    order = np.lexsort((np.arange(len(example)), -score, example))
    return order[np.r_[True, example[order][1:] != example[order][:-1]]]


def rc_evaluate(model, examples: list[dict], max_passage_tokens: int = DensePhrasesSettings.max_passage_tokens,
                max_question_tokens: int = DensePhrasesSettings.max_question_tokens,
                max_answer_tokens: int = DensePhrasesSettings.rc_answer_tokens, batch_size: int = 32, teacher=None,
                tokenizer=None, precision: str = "fp32", doc_stride: int | None = DensePhrasesSettings.doc_stride,
                filter_threshold: float | None = DensePhrasesSettings.rc_filter_threshold,
                teacher_n_best: int | None = TEACHER_N_BEST) -> dict:
    """Reading comprehension of the query-agnostic model (z = h . q over its own passage) or, with ``teacher``, of the
    cross-attention reader, on SQuAD-style ``examples``: EM / F1 and the predictions (Table 2's setting), computed
    on the model's device under ``precision``'s autocast. ``tokenizer`` (default: the model's) lays out the passages;
    the teacher alone needs no ``model``. With ``doc_stride`` the passages are read in the code's windows
    (``npm.densephrases.features``) and an example's answer is its best span over them that starts in a token's
    max-context window; without, each is cut at ``max_passage_tokens``. With ``filter_threshold`` (the model's
    filter head, trained) a span answers only if its start's start-filter logit and its end's end-filter logit are
    both at least it, and an example left without a span answers "empty" (the code's prediction); ``no_span``
    counts those. The teacher answers with a span whose start and end are among its window's ``teacher_n_best``
    (none: every span; recorded as ``n_best``)."""
    from npm.densephrases.train import teacher_logits  # deferred: npm.densephrases.train loads torch

    tok = tokenizer or model.tokenizer
    feats = rc_features(examples, tok, max_passage_tokens, max_question_tokens, doc_stride)
    starts, ends = feats["max_context"], None
    if teacher is not None:
        if filter_threshold is not None:
            raise ValueError("the cross-attention teacher has no filter head: evaluate it without a filter threshold")
        z_start, z_end = teacher_logits(teacher, feats, batch_size, precision, teacher_n_best)
    else:
        z_start, z_end, filters = _rc_logits(model, feats, batch_size, precision, filter_threshold is not None)
        if filter_threshold is not None:
            starts, ends = starts & (filters[..., 0] >= filter_threshold), filters[..., 1] >= filter_threshold
    spans = best_spans(z_start, z_end, feats["valid"], max_answer_tokens, starts, ends)
    rows = _best_rows(feats["example"], span_scores(z_start, z_end, spans))
    predictions = _texts(examples, feats, spans[rows], rows)
    kept = feats["example"][rows]
    answers = [examples[n]["answers"] for n in kept]
    scores = rc_scores(predictions, answers)
    return {"em": scores["em"], "f1": scores["f1"], "n": scores["n"], "dropped": feats["dropped"],
            "windows": len(spans), "max_answer_tokens": max_answer_tokens, "filter_threshold": filter_threshold,
            "n_best": None if teacher is None else teacher_n_best,
            "no_span": int((spans[rows, 0] < 0).sum()),
            "predictions": [{"id": examples[n]["id"], "prediction": p, "answers": a, "em": e}
                            for n, p, a, e in zip(kept, predictions, answers, scores["em_each"], strict=True)]}


def _rc_logits(model, feats: dict, batch_size: int, precision: str, filters: bool):
    """float32 z_start, z_end [rows, Lp] of the phrase model over ``rc_features`` rows, and with ``filters`` its
    filter head's start- and end-filter logits [rows, Lp, 2] (else None), once the head is checked trained."""
    from npm.densephrases.model import require_trained_filter  # deferred: loads torch

    z_start = np.zeros(feats["passage_ids"].shape, np.float32)
    z_end = np.zeros_like(z_start)
    f = None
    if filters:
        require_trained_filter(model.filter_trained, "the evaluated model")
        f = np.zeros((*z_start.shape, 2), np.float32)
        weight, bias = (p.detach().float().cpu().numpy() for p in (model.filter_head.weight, model.filter_head.bias))
    for rows, h, q_s, q_e in rc_vectors(model, feats, batch_size, precision):
        z_start[rows], z_end[rows] = np.einsum("bmd,bd->bm", h, q_s), np.einsum("bmd,bd->bm", h, q_e)
        if filters:
            f[rows] = h @ weight.T + bias
    return z_start, z_end, f


def rc_vectors(model, feats: dict, batch_size: int = 32, precision: str = "fp32", passages: bool = True):
    """Per batch of ``rc_features`` rows: (rows slice, float32 h [b, Lp, d] zero at padding, or None without
    ``passages``, q_start [b, d], q_end [b, d]), computed on the model's device under ``precision``'s autocast."""
    import torch

    device = next(model.parameters()).device
    model.eval()
    for a in range(0, len(feats["passage_ids"]), batch_size):
        rows = slice(a, a + batch_size)
        t = {k: torch.as_tensor(feats[k][rows], device=device) for k in ("passage_ids", "passage_mask",
                                                                         "question_ids", "question_mask")}
        with torch.inference_mode(), autocast(device, precision):
            h = (model.phrase_vectors(t["passage_ids"], t["passage_mask"]).float() * t["passage_mask"][..., None]
                 if passages else None)
            qs, qe = model.query_vectors(t["question_ids"], t["question_mask"])
        yield rows, None if h is None else h.cpu().numpy(), qs.float().cpu().numpy(), qe.float().cpu().numpy()


def passage_vectors(model, contexts: list[str], max_passage_tokens: int = DensePhrasesSettings.max_passage_tokens,
                    batch_size: int = 32,
                    precision: str = "fp32") -> tuple[np.ndarray, np.ndarray, list]:
    """float32 h [P, Lp, d], valid bool [P, Lp] (non-special, non-padding tokens) and the tokens' character offsets
    of ``contexts`` under the phrase encoder (on the model's device, ``precision``'s autocast)."""
    import torch

    device = next(model.parameters()).device
    enc = model.tokenizer(contexts, truncation=True, max_length=max_passage_tokens, padding=True,
                          return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="np")
    mask = enc["attention_mask"].astype(np.int64)
    h = np.zeros((*mask.shape, model.hidden_size), np.float32)
    model.eval()
    for a in range(0, len(contexts), batch_size):
        rows = slice(a, a + batch_size)
        with torch.inference_mode(), autocast(device, precision):
            out = model.phrase_vectors(torch.as_tensor(enc["input_ids"][rows], device=device),
                                       torch.as_tensor(mask[rows], device=device))
        h[rows] = out.float().cpu().numpy()
    valid = mask.astype(bool) & ~enc["special_tokens_mask"].astype(bool)
    return h * valid[..., None], valid, list(enc["offset_mapping"])


def d_small_evaluate(model, examples: list[dict], max_passage_tokens: int = DensePhrasesSettings.max_passage_tokens,
                     max_question_tokens: int = DensePhrasesSettings.max_question_tokens,
                     max_answer_tokens: int = DensePhrasesSettings.rc_answer_tokens, batch_size: int = 32,
                     precision: str = "fp32", pool: list[dict] | None = None) -> dict:
    """The semi-open setting of the paper's Table 6 (D_small): the passages of ``examples`` and of ``pool`` (other
    SQuAD-style examples, say the training and dev splits) pooled, and each question of ``examples`` answered by the
    best span over every pooled passage (eq. 10, exactly: no index), not only over its own. EM / F1, the number of
    pooled passages and the share of questions answered from their own passage."""
    feats = rc_features(examples, model.tokenizer, max_passage_tokens, max_question_tokens)
    own_contexts = [examples[n]["context"] for n in feats["example"]]
    contexts = list(dict.fromkeys(own_contexts + [ex["context"] for ex in pool or []]))
    h, valid, offsets = passage_vectors(model, contexts, max_passage_tokens, batch_size, precision)
    q_s = np.zeros((len(own_contexts), model.hidden_size), np.float32)
    q_e = np.zeros_like(q_s)
    for rows, _, qs_b, qe_b in rc_vectors(model, feats, batch_size, precision, passages=False):
        q_s[rows], q_e[rows] = qs_b, qe_b
    predictions, own = [], []
    for r, context in enumerate(own_contexts):
        z_s, z_e = h @ q_s[r], h @ q_e[r]
        spans = best_spans(z_s, z_e, valid, max_answer_tokens)
        p = int(np.argmax(span_scores(z_s, z_e, spans)))  # its own passage always has a span
        predictions.append(span_text(contexts[p], offsets[p], *spans[p]))
        own.append(contexts[p] == context)
    answers = [examples[n]["answers"] for n in feats["example"]]
    scores = rc_scores(predictions, answers)
    return {"em": scores["em"], "f1": scores["f1"], "n": scores["n"], "passages": len(contexts),
            "own_passage": 100.0 * float(np.mean(own)),
            "predictions": [{"id": examples[n]["id"], "prediction": p, "answers": a, "em": e, "own_passage": o}
                            for n, p, a, e, o in zip(feats["example"], predictions, answers, scores["em_each"], own,
                                                     strict=True)]}


def d_small_blocks(contexts: list[str], tokenizer, max_passage_tokens: int, out_path) -> None:
    """A blocks file (docs/data-contracts.md) of ``contexts``, one document and one block each (a passage longer
    than ``max_passage_tokens`` is cut as the blocks of a corpus are): the D_small passages as a corpus to dump."""
    from npm.data.blocks import tokenize_documents  # deferred: only the D_small index needs corpus blocks

    docs = ({"id": f"passage{n}", "units": [c]} for n, c in enumerate(contexts))
    save_npz(out_path, **tokenize_documents(docs, tokenizer, max_passage_tokens))


def d_small_index(model_dir, examples: list[dict], factory: str, workdir, pool: list[dict] | None = None,
                  max_passage_tokens: int = DensePhrasesSettings.max_passage_tokens, k: int = 10,
                  max_words: int = 20, precision: str = "fp32", filter_threshold: float | None = None) -> dict:
    """D_small (:func:`d_small_evaluate`'s passages) through phrase indexes, as the open-domain search runs: the
    pooled passages (:func:`d_small_blocks`) dumped by the phrase encoder of ``model_dir`` into ``workdir``, and
    each question of ``examples`` answered by the top phrase (:func:`open_domain`) over (a) the Flat index of the
    whole dump, phrases scored from its fp16 vectors (the uncompressed reference), and (b) the ``factory`` index of
    its trimmed dump (``npm.densephrases.dump.trim_dump``, with the learned filter at ``filter_threshold``), phrases
    retrieved and scored from the index's codes alone (the compressed index, nothing else on disk). EM (percent) of
    each, the index's bytes and its ratio to the untrimmed fp16 dump."""
    from npm.densephrases.dump import build_index, dump_phrases, trim_dump  # deferred: torch, off the parser's path
    from npm.densephrases.model import DensePhrases  # deferred: torch, as above
    from npm.densephrases.searcher import PhraseSearcher  # deferred: torch and FAISS, as above

    workdir = Path(workdir)
    model = DensePhrases.load(model_dir)  # loaded once: the dump's phrase encoder and both searches' query encoders
    contexts = list(dict.fromkeys([ex["context"] for ex in examples] + [ex["context"] for ex in pool or []]))
    d_small_blocks(contexts, load_tokenizer(str(Path(model_dir) / "phrase")), max_passage_tokens,
                   workdir / "blocks.npz")
    meta = dump_phrases(model_dir, [str(workdir / "blocks.npz")], workdir / "dump", progress=False,
                        precision=precision, model=model)
    trimmed = trim_dump(workdir / "dump", workdir / "trimmed", filter_threshold, model_dir)
    build_index(workdir / "dump", workdir / "flat.faiss", "Flat")
    record = build_index(workdir / "trimmed", workdir / "compressed.faiss", factory)
    questions = [{"id": ex["id"], "question": ex["question"], "answers": ex["answers"]} for ex in examples]
    found = {}
    for name, dump, vectors in (("flat", "dump", "dump"), ("compressed", "trimmed", "index")):
        searcher = PhraseSearcher(model_dir, workdir / dump, workdir / f"{name}.faiss", precision=precision,
                                  vectors=vectors, model=model)
        found[name] = open_domain(searcher, questions, k, max_words, refine_factor=1)
    return {"factory": factory, "passages": len(contexts), "tokens": meta["rows"], "kept": trimmed["rows"],
            "index_bytes": record["index_bytes"], "ratio": round(meta["bytes"] / record["index_bytes"], 2),
            "em": found["compressed"]["em"], "n": found["compressed"]["n"], "flat_em": found["flat"]["em"],
            "predictions": found["compressed"]["predictions"]}


def teacher_filter(examples: list[dict], teacher, tokenizer,
                   max_passage_tokens: int = DensePhrasesSettings.max_passage_tokens,
                   max_question_tokens: int = DensePhrasesSettings.max_question_tokens,
                   precision: str = "fp32",
                   doc_stride: int | None = DensePhrasesSettings.doc_stride) -> tuple[list[dict], dict]:
    """(kept examples, counts): the generated questions whose answer the teacher reads exactly (``rc_evaluate``),
    and every question that is not generated (see the module docstring)."""
    generated = [ex for ex in examples if ex.get("question_generated")]
    if not generated:
        return list(examples), {"generated": 0, "kept": 0, "total": len(examples)}
    result = rc_evaluate(None, generated, max_passage_tokens, max_question_tokens, TEACHER_ANSWER_TOKENS,
                         teacher=teacher, tokenizer=tokenizer, precision=precision, doc_stride=doc_stride)
    answered = {p["id"] for p in result["predictions"] if p["em"]}
    kept = [ex for ex in examples if not ex.get("question_generated") or ex["id"] in answered]
    return kept, {"generated": len(generated), "kept": len(answered), "total": len(kept)}


def random_span_baseline(examples: list[dict], tokenizer,
                         max_passage_tokens: int = DensePhrasesSettings.max_passage_tokens,
                         max_answer_tokens: int = DensePhrasesSettings.rc_answer_tokens, span_seed: int = 0) -> dict:
    """EM / F1 of a uniformly random valid span per passage (at most ``max_answer_tokens``; the draws seeded with
    ``span_seed``): the floor RC EM must clear."""
    feats = rc_features(examples, tokenizer, max_passage_tokens)
    rng = np.random.default_rng(span_seed)
    spans = []
    for valid in feats["valid"]:
        tokens = np.flatnonzero(valid)
        pairs = [(i, j) for i in tokens for j in tokens if i <= j < i + max_answer_tokens]
        spans.append(pairs[int(rng.integers(len(pairs)))])
    spans = np.asarray(spans, dtype=np.int64)
    predictions = _texts(examples, feats, spans, np.arange(len(spans)))
    scores = rc_scores(predictions, [examples[n]["answers"] for n in feats["example"]])
    return {"em": scores["em"], "f1": scores["f1"], "n": scores["n"]}


def open_domain(searcher, questions: list[dict], k: int = 10, max_words: int = 20,
                refine_factor: int = DensePhrasesSettings.refine_factor,
                search_form: str = DensePhrasesSettings.search_form) -> dict:
    """EM@1 (percent) of the top phrase of each {id, question, answers} record, questions/s, and the predictions
    (``PhraseSearcher.search``)."""
    start = time.perf_counter()
    found = searcher.search([q["question"] for q in questions], k=k, max_words=max_words, top_n=1,
                            refine_factor=refine_factor, search_form=search_form)
    seconds = time.perf_counter() - start
    hits = [bool(f) and exact_match(f[0]["text"], q["answers"]) for f, q in zip(found, questions, strict=True)]
    return {"n": len(hits), "em": 100.0 * float(np.mean(hits)), "queries_per_s": round(len(hits) / seconds, 2),
            "predictions": [{"id": q.get("id"), "question": q["question"], "prediction": f[0]["text"] if f else "",
                             "answers": q["answers"], "em": h} for f, q, h in zip(found, questions, hits, strict=True)]}


def task_questions(task: str, tasks_root, tokenizer=None, n_samples: int = 0) -> list[dict]:
    """{id, question, answers} records of an open-set task of the registry read from ``tasks_root/task``
    (``n_samples`` = 0: all its examples; ``tokenizer``: LAMA's n-gram buckets)."""
    if resolve_task(task).closed:
        raise ValueError(f"task {task} is a closed-set task: DensePhrases answers open-set tasks")
    return [{"id": ex["id"], "question": task_question(task, ex["input"]), "answers": ex["answers"]}
            for ex in task_examples(task, Path(tasks_root) / task, tokenizer, n_samples=n_samples)]
