"""Reading-comprehension data of DensePhrases (Lee et al. 2021, section 4 and appendix C; docs/paper-map.md §D1.3).

The format is SQuAD v1.1 JSON, which the original trains on (SQuAD, and NQ's reading-comprehension version in the
same layout): ``{"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers":
[{"text", "answer_start"}]}]}]}]}``. :func:`read_squad` reads a real SQuAD / NQ-RC file into flat examples ``{id,
title, context, question, answers: [text], answer_start: [char offset]}``, checking every record: a missing key, an
empty question, or an answer whose text is not at its ``answer_start`` is a ValueError naming the file and the
question id.

The embedded default's reading-comprehension set, built by distant supervision from real facts with GENERATED
questions, and its cloze questions for query-side fine-tuning are demo data: ``npm.embedded.rc`` builds them and
writes them with :func:`write_squad`, which marks generated questions ``"question_generated": true``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from npm.io import atomic_path


def read_squad(path: str | os.PathLike) -> list[dict]:
    """Flat examples of a SQuAD v1.1 JSON file (every question with at least one answer)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable SQuAD JSON file ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f"{path}: a SQuAD file is an object with a 'data' list of articles")
    out = []
    for a, article in enumerate(data["data"]):
        for p, para in enumerate(article.get("paragraphs") or []):
            where = f"{path}: article {a} ({article.get('title', '?')!r}), paragraph {p}"
            context = para.get("context")
            if not isinstance(context, str) or not context:
                raise ValueError(f"{where}: no 'context' text")
            for qa in para.get("qas") or []:
                qid = qa.get("id")
                if not qid or not isinstance(qa.get("question"), str) or not qa["question"].strip():
                    raise ValueError(f"{where}, question {qid!r}: a question needs an 'id' and a non-empty "
                                     "'question'")
                answers = qa.get("answers") or []
                if not answers:
                    raise ValueError(f"{where}, question {qid!r}: no answer (SQuAD v1.1 has one or more)")
                texts, starts = [], []
                for ans in answers:
                    text, start = ans.get("text"), ans.get("answer_start")
                    if not isinstance(text, str) or not text or not isinstance(start, int) or \
                            context[start:start + len(text)] != text:
                        raise ValueError(f"{where}, question {qid!r}: answer {text!r} is not at answer_start "
                                         f"{start!r} of the context")
                    texts.append(text)
                    starts.append(start)
                out.append({"id": str(qid), "title": article.get("title", ""), "context": context,
                            "question": qa["question"], "answers": texts, "answer_start": starts,
                            "question_generated": bool(qa.get("question_generated", False))})
    if not out:
        raise ValueError(f"{path}: no question in the file")
    return out


def write_squad(path: str | os.PathLike, examples: list[dict], version: str) -> int:
    """Write flat examples as SQuAD v1.1 JSON (one paragraph per example's context, grouped by title), atomically."""
    articles: dict[str, dict[str, list]] = {}
    for ex in examples:
        qa = {"id": ex["id"], "question": ex["question"],
              "answers": [{"text": t, "answer_start": s} for t, s in zip(ex["answers"], ex["answer_start"],
                                                                          strict=True)]}
        if ex.get("question_generated"):
            qa["question_generated"] = True
        articles.setdefault(ex["title"], {}).setdefault(ex["context"], []).append(qa)
    data = {"version": version, "data": [
        {"title": t, "paragraphs": [{"context": c, "qas": qas} for c, qas in paras.items()]}
        for t, paras in articles.items()]}
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return len(examples)

