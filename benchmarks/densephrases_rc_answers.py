"""What the original code's reading-comprehension prediction does to the embedded world's RC numbers (docs/paper-map.md
§D1.7, config ``densephrases.rc_answer_tokens`` and ``rc_filter_threshold``).

On a finished ``make demo`` folder (or one that ran the DensePhrases targets), the demo's phrase model (trained with
the filter loss) reads the demo's RC test split (Table 2's setting) with its passages as the demo reads them, and
answers with

* spans of up to each of ``--answer-tokens`` tokens (default 30, SQuAD readers' usual length and the default here,
  and 9, the code's: ``--max_answer_length 10``, whose loop stops one token short);
* the spans whose start's start-filter logit and end's end-filter logit are both at least each of
  ``--thresholds`` (default: none, -2 as the code's training commands, and 0 and 1), an example left without a span
  answering "empty" as the code's;

and the demo's cross-attention teacher reads the same split with its span's start and end among its window's
``--teacher-n-best`` best (default: every span, 20 as the code's cross-encoder, transformers' reader, and 5 and 1).
Each reading gives EM / F1, the examples answered "empty", and the answers that differ from the first reading's
(30 tokens and no filter; the teacher over every span); the gold answers' lengths in tokens and the share of passage
tokens each threshold keeps as starts and as ends are given beside. One model, one seed; the test split has a few
dozen questions, so one question moves EM by more than a point. Writes results/benchmarks/densephrases_rc_answers.json
(and prints Markdown tables). It measures; it asserts nothing.

    .venv/bin/python benchmarks/densephrases_rc_answers.py --root /path/to/finished/demo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from npm.densephrases.evaluate import TEACHER_ANSWER_TOKENS, rc_evaluate, rc_vectors
from npm.densephrases.features import rc_features
from npm.densephrases.model import DensePhrases
from npm.densephrases.rc import read_squad
from npm.io import write_summary


def filter_shares(model, feats: dict, thresholds: list[float]) -> dict:
    """Per threshold, the share (percent) of passage tokens whose start-filter / end-filter logit is at least it."""
    logits = []
    for rows, h, _, _ in rc_vectors(model, feats):
        with torch.no_grad():
            logits.append(model.filter_logits(torch.as_tensor(h)).numpy()[feats["valid"][rows]])
    f = np.concatenate(logits)
    return {str(t): {"starts": round(100 * float((f[:, 0] >= t).mean()), 1),
                     "ends": round(100 * float((f[:, 1] >= t).mean()), 1)} for t in thresholds}


def teacher_readings(root: Path, test: list[dict], tokenizer, settings: dict, n_bests: list[int | None]) -> list:
    """The demo's cross-attention teacher on the RC test split at each ``n_best`` (None: every span)."""
    from npm.densephrases.train import load_teacher

    teacher, out, base = load_teacher(str(root / "results/densephrases/teacher")), [], None
    for n_best in n_bests:
        r = rc_evaluate(None, test, settings["max_passage_tokens"], settings["max_question_tokens"],
                        TEACHER_ANSWER_TOKENS, teacher=teacher, tokenizer=tokenizer,
                        precision=settings.get("precision", "fp32"), doc_stride=settings.get("doc_stride"),
                        teacher_n_best=n_best)
        answers = [p["prediction"] for p in r["predictions"]]
        base = base or answers
        out.append({"n_best": n_best, "em": round(r["em"], 1), "f1": round(r["f1"], 1), "n": r["n"],
                    "empty": r["no_span"], "changed": sum(a != b for a, b in zip(answers, base, strict=True))})
    return out


def measure(root: Path, answer_tokens: list[int], thresholds: list[float | None], n_bests: list[int | None]) -> dict:
    model_dir = root / "results/densephrases/model_pre_batch"
    settings = json.loads((model_dir / "train_summary.json").read_text())["settings"]
    lengths = (settings["max_passage_tokens"], settings["max_question_tokens"])
    stride = settings.get("doc_stride")
    test, model = read_squad(root / "data/densephrases/rc/test.json"), DensePhrases.load(model_dir).eval()
    gold = [len(model.tokenizer.tokenize(ex["answers"][0])) for ex in test]
    feats = rc_features(test, model.tokenizer, *lengths, stride)
    out = {"examples": len(test), "max_passage_tokens": lengths[0], "doc_stride": stride,
           "filter_trained": model.filter_trained,
           "gold_answer_tokens": {"median": int(np.median(gold)), "max": int(max(gold)),
                                  "over_9": int(sum(g > 9 for g in gold))},
           "filter_shares": filter_shares(model, feats, [t for t in thresholds if t is not None]), "readings": []}
    base = None
    for tokens in answer_tokens:
        for threshold in thresholds:
            r = rc_evaluate(model, test, *lengths, tokens, precision=settings.get("precision", "fp32"),
                            doc_stride=stride, filter_threshold=threshold)
            answers = [p["prediction"] for p in r["predictions"]]
            base = base or answers
            out["readings"].append({"answer_tokens": tokens, "filter_threshold": threshold,
                                    "em": round(r["em"], 1), "f1": round(r["f1"], 1), "n": r["n"],
                                    "empty": r["no_span"],
                                    "changed": sum(a != b for a, b in zip(answers, base, strict=True))})
    out["teacher"] = teacher_readings(root, test, model.tokenizer, settings, n_bests)
    return out


def markdown(result: dict) -> str:
    rows = ["| answer tokens | filter threshold | RC test EM / F1 | answered \"empty\" | answers changed |",
            "|---|---|---|---|---|"]
    for r in result["readings"]:
        threshold = "none" if r["filter_threshold"] is None else f"{r['filter_threshold']:g}"
        rows.append(f"| {r['answer_tokens']} | {threshold} | {r['em']:.1f} / {r['f1']:.1f} | {r['empty']} | "
                    f"{r['changed']} |")
    rows += ["", "| teacher's n best | RC test EM / F1 | answered \"empty\" | answers changed |", "|---|---|---|---|"]
    for r in result["teacher"]:
        rows.append(f"| {'every span' if r['n_best'] is None else r['n_best']} | {r['em']:.1f} / {r['f1']:.1f} | "
                    f"{r['empty']} | {r['changed']} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="a finished `make demo` folder")
    parser.add_argument("--answer-tokens", type=int, nargs="+", default=[30, 9],
                        help="longest answer spans compared, in tokens (the first is the reference reading's)")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[-2.0, 0.0, 1.0],
                        help="filter thresholds compared, beside no filter (the reference reading's)")
    parser.add_argument("--teacher-n-best", type=int, nargs="+", default=[20, 5, 1],
                        help="the teacher's n best starts and ends compared, beside every span (the reference reading)")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/densephrases_rc_answers.json"))
    args = parser.parse_args(argv)
    root, args.out = args.root.resolve(), args.out.resolve()
    os.chdir(root)  # the demo's settings name their inputs relative to the workflow's working directory
    t0 = time.perf_counter()
    readings = measure(root, args.answer_tokens, [None, *args.thresholds], [None, *args.teacher_n_best])
    result = {"root": str(root), **readings}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_summary(args.out, result, config=vars(args))
    print(markdown(result))
    print(json.dumps({k: result[k] for k in ("examples", "gold_answer_tokens", "filter_shares")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
