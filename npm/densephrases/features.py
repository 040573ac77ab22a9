"""Token arrays of reading-comprehension examples for DensePhrases (docs/paper-map.md §D1.3).

Passages and questions are encoded **separately** (query-agnostic phrases): the passage as ``[CLS] passage [SEP]``
(cut to ``max_passage_tokens``), the question as ``[CLS] question [SEP]`` for the two query encoders. The gold
answer's character span becomes the first and last passage token it overlaps. An example whose first answer lies
beyond the cut is dropped (the count comes back), never silently mislabelled.

With a ``stride`` (config ``densephrases.doc_stride``; the code's ``--doc_stride`` 128), a passage is read as the
original code's SQuAD reader reads it: in :func:`windows` of ``max_passage_tokens`` (its begin and end tokens
included) starting every ``stride`` tokens, one feature row per window, each token marked in the window where it has
the most context (:func:`max_context`, ``max_context``). For training, a window that holds the whole answer labels
it; a window without it labels its ``[CLS]`` (position 0) as the start and the end, "no answer", as the code's
features do (start and end -1, clamped to 0 by its loss), and is marked not ``answerable``: its single-passage and
distillation softmax include ``[CLS]`` (``support``), its filter loss is left out, and its [CLS] vector is its gold
vector for the in-batch negatives, all as the code. An evaluation answers with the best span over an example's
windows that starts in a token's max-context window (``npm.densephrases.evaluate.rc_evaluate``).

:func:`teacher_inputs` lays the same ids out for the cross-attention teacher, ``[CLS] question [SEP] passage [SEP]``,
so that the teacher's logit at position ``offset + t`` belongs to passage token t of the student: its start/end
distributions align token by token with the student's (distillation, eq. 7).
"""

from __future__ import annotations

import numpy as np

from npm.settings import DensePhrasesSettings


def _pad(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    width = max(1, max(len(r) for r in rows))
    ids = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return ids, mask


def windows(lengths, width: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The original code's windows over items of ``lengths`` tokens (its SQuAD reader: training ``--doc_stride``,
    the dump's 500): an item of n tokens is read in windows of at most ``width`` tokens starting at 0, ``stride``,
    2 ``stride``, ..., the last the first to reach its end. Returns (item, begin, size) int64 [windows], in item
    order."""
    lengths = np.asarray(lengths, dtype=np.int64)
    count = 1 + -(-np.maximum(lengths - width, 0) // stride)
    item = np.repeat(np.arange(len(lengths), dtype=np.int64), count)
    begin = (np.arange(len(item)) - np.repeat(np.cumsum(count) - count, count)) * stride
    return item, begin, np.minimum(width, lengths[item] - begin)


def _answer_tokens(offsets: np.ndarray, candidates: np.ndarray, example: dict) -> tuple[int, int] | None:
    """(first, last) of the tokens ``candidates`` (indexes into ``offsets``) that the first answer's characters
    overlap, or None when they do not hold it whole."""
    a = int(example["answer_start"][0])
    b = a + len(example["answers"][0])
    inside = candidates[(offsets[candidates, 1] > a) & (offsets[candidates, 0] < b)]
    if not len(inside) or offsets[inside[-1], 1] < b:
        return None
    return int(inside[0]), int(inside[-1])


def max_context(positions: np.ndarray, size: np.ndarray) -> np.ndarray:
    """owner bool [P] of tokens read window by window (``positions`` int64 [P], each window's tokens in turn, the
    windows ``size`` [W] long): True in the window where the token has the most context, min(left, right) + 0.01 x
    the window's length, ties to the earlier window (the code's SQuAD reader, ``_check_is_max_context``)."""
    size = np.asarray(size, dtype=np.int64)
    inside = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
    score = 100 * np.minimum(inside, np.repeat(size, size) - 1 - inside) + np.repeat(size, size)  # 100 x the code's
    order = np.lexsort((np.repeat(np.arange(len(size)), size), -score, positions))
    owner = np.zeros(len(positions), bool)
    owner[order[np.r_[True, positions[order][1:] != positions[order][:-1]]] if len(order) else order] = True
    return owner


def _window_rows(examples: list[dict], tokenizer, max_passage_tokens: int, stride: int) -> tuple[dict, int]:
    """The examples' passages in :func:`windows` (module docstring): per window row, lists of its ids, example,
    start, end, answerable, character offsets and max-context flags; and how many answers no window holds whole."""
    width = max_passage_tokens - 2
    if not 1 <= stride <= width:
        raise ValueError(f"a window of {max_passage_tokens} tokens holds {width} of a passage; its stride must be 1 to "
                         f"{width}, got {stride}")
    enc = tokenizer([ex["context"] for ex in examples], return_offsets_mapping=True, return_special_tokens_mask=True)
    special = [np.asarray(m, bool) for m in enc["special_tokens_mask"]]
    if any(len(m) < 2 or not (m[0] and m[-1]) or m.sum() != 2 for m in special):
        raise ValueError(f"passage windows need a tokenizer that wraps a passage in one begin and one end token; "
                         f"{type(tokenizer).__name__} does not")
    lengths = np.array([len(m) - 2 for m in special], dtype=np.int64)
    item, begin, size = windows(lengths, width, stride)
    ends = np.cumsum(size)
    owner = max_context(np.repeat(np.cumsum(lengths)[item] - lengths[item] + begin, size)
                        + np.arange(int(ends[-1])) - np.repeat(ends - size, size), size)
    rows = {key: [] for key in ("ids", "example", "start", "end", "answerable", "offsets", "max_context")}
    answers = {}
    for w, (n, b0, k) in enumerate(zip(item.tolist(), begin.tolist(), size.tolist(), strict=True)):
        ids, offsets = enc["input_ids"][n], [tuple(o) for o in enc["offset_mapping"][n]]
        if n not in answers:
            answers[n] = _answer_tokens(np.asarray(offsets).reshape(-1, 2), np.arange(1, len(ids) - 1), examples[n])
        if answers[n] is None:  # the answer is not in the passage's tokens: no row, as the code skips it
            continue
        first, last = answers[n]  # positions in the wrapped passage: its tokens are 1 .. len - 2
        held = b0 < first and last <= b0 + k
        for key, value in (("ids", [ids[0], *ids[1 + b0:1 + b0 + k], ids[-1]]), ("example", n),
                           ("start", first - b0 if held else 0), ("end", last - b0 if held else 0),
                           ("answerable", held), ("offsets", [(0, 0), *offsets[1 + b0:1 + b0 + k], (0, 0)]),
                           ("max_context", [0, *owner[ends[w] - k:ends[w]].astype(int).tolist(), 0])):
            rows[key].append(value)
    return rows, len(examples) - len({n for n, held in zip(rows["example"], rows["answerable"], strict=True) if held})


def rc_features(examples: list[dict], tokenizer, max_passage_tokens: int = DensePhrasesSettings.max_passage_tokens,
                max_question_tokens: int = DensePhrasesSettings.max_question_tokens,
                stride: int | None = None) -> dict:
    """Arrays of the examples that keep their answer, a row each (with ``stride``, a row per window of their
    passages, module docstring; without, each passage cut at ``max_passage_tokens``):
    ``passage_ids``/``passage_mask`` [n, Lp], ``question_ids``/``question_mask`` [n, Lq], ``valid`` [n, Lp]
    (non-special passage tokens), ``support`` [n, Lp] (the positions the start and end softmax range over:
    ``valid``, and with ``stride`` the [CLS]), ``start``/``end`` [n] (token positions of the first answer; 0 in a
    window without it), ``answerable`` [n], ``example`` [n] (index into ``examples``), ``offsets`` int32 [n, Lp, 2]
    (each token's characters in its context), ``max_context`` [n, Lp] (the valid tokens whose max-context window
    this row is; without ``stride``, ``valid``), and ``dropped`` (answers cut off, or held whole by no window)."""
    if not examples:
        raise ValueError("no reading-comprehension example to encode")
    if stride is not None:
        return _windowed(examples, tokenizer, max_passage_tokens, max_question_tokens, stride)
    enc = tokenizer([ex["context"] for ex in examples], truncation=True, max_length=max_passage_tokens,
                    return_offsets_mapping=True, return_special_tokens_mask=True)
    q = tokenizer([ex["question"] for ex in examples], truncation=True, max_length=max_question_tokens)
    passages, questions, valids, starts, ends, kept = [], [], [], [], [], []
    for n, ex in enumerate(examples):
        special = np.asarray(enc["special_tokens_mask"][n], dtype=bool)
        found = _answer_tokens(np.asarray(enc["offset_mapping"][n]), np.flatnonzero(~special), ex)
        if found is None:  # the answer is (partly) beyond the cut
            continue
        passages.append(enc["input_ids"][n])
        questions.append(q["input_ids"][n])
        valids.append((~special).astype(np.int64).tolist())
        starts.append(found[0])
        ends.append(found[1])
        kept.append(n)
    if not kept:
        raise ValueError(f"every answer lies beyond max_passage_tokens = {max_passage_tokens}")
    return _arrays(passages, questions, valids, starts, ends, kept, np.ones(len(kept), bool), len(examples) - len(kept),
                   [enc["offset_mapping"][n] for n in kept], valids, cls=False)


def _windowed(examples: list[dict], tokenizer, max_passage_tokens: int, max_question_tokens: int,
              stride: int) -> dict:
    rows, dropped = _window_rows(examples, tokenizer, max_passage_tokens, stride)
    if not any(rows["answerable"]):
        raise ValueError(f"no window of max_passage_tokens = {max_passage_tokens} holds a whole answer")
    q = tokenizer([ex["question"] for ex in examples], truncation=True, max_length=max_question_tokens)
    return _arrays(rows["ids"], [q["input_ids"][n] for n in rows["example"]],
                   [[0] + [1] * (len(p) - 2) + [0] for p in rows["ids"]], rows["start"], rows["end"],
                   rows["example"], np.asarray(rows["answerable"], bool), dropped, rows["offsets"],
                   rows["max_context"], cls=True)


def _arrays(passages, questions, valids, starts, ends, kept, answerable, dropped: int, offsets, owned,
            cls: bool) -> dict:
    """The feature arrays of rc_features (``cls``: the [CLS] joins the softmax support)."""
    passage_ids, passage_mask = _pad(passages)
    question_ids, question_mask = _pad(questions)
    valid = _pad(valids)[0].astype(bool)
    support = valid.copy()
    support[:, 0] |= cls
    chars = np.zeros((*passage_ids.shape, 2), dtype=np.int32)  # int32: the features' largest array, halved
    for r, row in enumerate(offsets):
        chars[r, :len(row)] = row
    return {"passage_ids": passage_ids, "passage_mask": passage_mask, "question_ids": question_ids,
            "question_mask": question_mask, "valid": valid, "support": support, "start": np.asarray(starts, np.int64),
            "end": np.asarray(ends, np.int64), "answerable": answerable, "example": np.asarray(kept, np.int64),
            "offsets": chars, "max_context": _pad(owned)[0].astype(bool), "dropped": dropped}


def teacher_inputs(features: dict, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                           np.ndarray]:
    """(input_ids, attention_mask, token_type_ids [n, L], offset [n]) of ``[CLS] question [SEP] passage [SEP]``:
    passage token t (t >= 1) of the student sits at position offset + t."""
    rows = np.arange(len(features["start"])) if rows is None else np.asarray(rows)
    seqs, types, offsets = [], [], []
    for r in rows:
        qn = int(features["question_mask"][r].sum())
        pn = int(features["passage_mask"][r].sum())
        question = features["question_ids"][r, :qn].tolist()
        passage = features["passage_ids"][r, 1:pn].tolist()  # without its [CLS]; ends with [SEP]
        seqs.append(question + passage)
        types.append([0] * qn + [1] * len(passage))
        offsets.append(qn - 1)
    ids, mask = _pad(seqs)
    type_ids, _ = _pad(types)
    return ids, mask, type_ids, np.asarray(offsets, np.int64)
