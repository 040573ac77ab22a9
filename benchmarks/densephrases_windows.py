"""What DensePhrases' passage-windows switch does to the embedded world's reading comprehension (docs/paper-map.md
§D1.7, config ``densephrases.doc_stride``).

On a finished ``make demo`` folder (or one that ran the DensePhrases targets), the demo's phrase model reads the
demo's RC test split (EM / F1, Table 2's setting), and a phrase model is trained on the demo's RC training set with
the demo's own settings (its ``train_summary.json``; not with ``--no-train``) and reads it, their passages read

* ``cut``: each cut at ``max_passage_tokens``, an example whose answer lies beyond the cut left out (the default);
* ``windows``: in the original code's windows of ``max_passage_tokens`` every ``doc_stride`` tokens: in training a
  window without the answer labels its [CLS] as "no answer", in the evaluation the best span over the windows
  starting in a max-context token answers (the code: 384 tokens every 128);

at each of ``--lengths`` (default: the demo's own ``max_passage_tokens`` and 64; the stride a third of it, the
code's ratio), where a shorter window splits more of the demo's passages. One seed; the test split has a few dozen
questions, so one question moves EM by more than a point. Writes results/benchmarks/densephrases_windows.json (and
prints a Markdown table). It measures; it asserts nothing.

    .venv/bin/python benchmarks/densephrases_windows.py --root /path/to/finished/demo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from npm.densephrases.evaluate import rc_evaluate
from npm.densephrases.features import rc_features
from npm.densephrases.model import DensePhrases
from npm.densephrases.rc import read_squad
from npm.densephrases.train import PhraseTrainConfig, train_densephrases
from npm.io import write_summary
from npm.model import load_tokenizer


def passage_lengths(examples: list[dict], tokenizer) -> dict:
    """Token counts of the training passages (begin and end tokens included)."""
    n = np.array([len(ids) for ids in tokenizer([ex["context"] for ex in examples])["input_ids"]])
    return {"median": int(np.median(n)), "p90": int(np.percentile(n, 90)), "max": int(n.max())}


def _reading(model, test: list[dict], tokens: int, stride: int | None, cfg: PhraseTrainConfig) -> dict:
    result = rc_evaluate(model, test, tokens, cfg.max_question_tokens, precision=cfg.precision, doc_stride=stride)
    return {"em": round(result["em"], 1), "f1": round(result["f1"], 1), "n": result["n"], "windows": result["windows"]}


def measure(root: Path, work: Path, lengths: list[int] | None, train_too: bool, progress: bool) -> dict:
    model_dir = root / "results/densephrases/model_pre_batch"
    summary = json.loads((model_dir / "train_summary.json").read_text())
    settings = {k: v for k, v in summary["settings"].items() if k in PhraseTrainConfig.__dataclass_fields__}
    train, test = read_squad(settings["train"]), read_squad(root / "data/densephrases/rc/test.json")
    tokenizer, demo_model = load_tokenizer(settings["encoder"]), DensePhrases.load(model_dir)
    out = {"examples": {"train": len(train), "test": len(test)}, "passage_tokens": passage_lengths(train, tokenizer),
           "runs": []}
    for tokens in lengths or (settings["max_passage_tokens"], 64):
        for stride in (None, max(1, tokens // 3)):
            cfg = PhraseTrainConfig(**{**settings, "max_passage_tokens": tokens, "doc_stride": stride,
                                       "init": None, "out_dir": str(work / f"{tokens}-{stride}"),
                                       "checkpoint_dir": str(work / "checkpoints")})
            feats = rc_features(train, tokenizer, tokens, cfg.max_question_tokens, stride)
            run = {"max_passage_tokens": tokens, "doc_stride": stride, "rows": len(feats["start"]),
                   "no_answer_rows": int((~feats["answerable"]).sum()), "dropped": feats["dropped"],
                   "demo_model": _reading(demo_model, test, tokens, stride, cfg)}
            if train_too:
                t0 = time.perf_counter()
                trained = train_densephrases(cfg, progress=progress)
                run["trained"] = {"steps": trained["steps"], "train_seconds": round(time.perf_counter() - t0, 1),
                                  **_reading(DensePhrases.load(cfg.out_dir), test, tokens, stride, cfg)}
            out["runs"].append(run)
    return out


def markdown(result: dict) -> str:
    rows = ["| passages | training rows | of them no answer | answers left out | test questions read (windows) | "
            "demo model EM / F1 | trained so: steps, EM / F1 |", "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        form = (f"cut at {r['max_passage_tokens']}" if r["doc_stride"] is None else
                f"windows of {r['max_passage_tokens']} every {r['doc_stride']}")
        demo, trained = r["demo_model"], r.get("trained")
        rows.append(f"| {form} | {r['rows']} | {r['no_answer_rows']} | {r['dropped']} | {demo['n']} "
                    f"({demo['windows']}) | {demo['em']:.1f} / {demo['f1']:.1f} | "
                    + (f"{trained['steps']}, {trained['em']:.1f} / {trained['f1']:.1f} |" if trained else "- |"))
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="a finished `make demo` folder")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="max_passage_tokens values to compare at (default: the demo's own and 64)")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/densephrases_windows.json"))
    parser.add_argument("--no-train", action="store_true",
                        help="only read the test split with the demo's model, train nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    root, args.out = args.root.resolve(), args.out.resolve()
    os.chdir(root)  # the demo's settings name their inputs relative to the workflow's working directory
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        result = {"root": str(root), **measure(root, Path(work), args.lengths, not args.no_train, not args.no_progress)}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_summary(args.out, result, config=vars(args))
    print(markdown(result))
    print(json.dumps({"examples": result["examples"], "passage_tokens": result["passage_tokens"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
