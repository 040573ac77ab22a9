"""Token arrays of reading-comprehension examples for DensePhrases (docs/paper-map.md §D1.3).

Passages and questions are encoded **separately** (query-agnostic phrases): the passage as ``[CLS] passage [SEP]``
(cut to ``max_passage_tokens``), the question as ``[CLS] question [SEP]`` for the two query encoders. The gold
answer's character span becomes the first and last passage token it overlaps. An example whose first answer lies
beyond the cut is dropped (the count comes back), never silently mislabelled.

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


def rc_features(examples: list[dict], tokenizer, max_passage_tokens: int = DensePhrasesSettings.max_passage_tokens,
                max_question_tokens: int = DensePhrasesSettings.max_question_tokens) -> dict:
    """Arrays of the examples that keep their answer: ``passage_ids``/``passage_mask`` [n, Lp],
    ``question_ids``/``question_mask`` [n, Lq], ``valid`` [n, Lp] (non-special passage tokens), ``start``/``end``
    [n] (token positions of the first answer), ``example`` [n] (index into ``examples``), and ``dropped`` (answers
    cut off)."""
    if not examples:
        raise ValueError("no reading-comprehension example to encode")
    enc = tokenizer([ex["context"] for ex in examples], truncation=True, max_length=max_passage_tokens,
                    return_offsets_mapping=True, return_special_tokens_mask=True)
    q = tokenizer([ex["question"] for ex in examples], truncation=True, max_length=max_question_tokens)
    passages, questions, valids, starts, ends, kept = [], [], [], [], [], []
    for n, ex in enumerate(examples):
        a = int(ex["answer_start"][0])
        b = a + len(ex["answers"][0])
        offsets = np.asarray(enc["offset_mapping"][n])
        special = np.asarray(enc["special_tokens_mask"][n], dtype=bool)
        inside = np.flatnonzero(~special & (offsets[:, 1] > a) & (offsets[:, 0] < b))
        if not len(inside) or offsets[inside[-1], 1] < b:  # the answer is (partly) beyond the cut
            continue
        passages.append(enc["input_ids"][n])
        questions.append(q["input_ids"][n])
        valids.append((~special).astype(np.int64).tolist())
        starts.append(int(inside[0]))
        ends.append(int(inside[-1]))
        kept.append(n)
    if not kept:
        raise ValueError(f"every answer lies beyond max_passage_tokens = {max_passage_tokens}")
    passage_ids, passage_mask = _pad(passages)
    question_ids, question_mask = _pad(questions)
    valid, _ = _pad(valids)
    return {"passage_ids": passage_ids, "passage_mask": passage_mask, "question_ids": question_ids,
            "question_mask": question_mask, "valid": valid.astype(bool), "start": np.asarray(starts, np.int64),
            "end": np.asarray(ends, np.int64), "example": np.asarray(kept, np.int64),
            "dropped": len(examples) - len(kept)}


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
