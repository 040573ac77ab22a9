"""What DensePhrases' passage-windows switch does to the embedded world's reading comprehension (docs/paper-map.md
§D1.7, config ``densephrases.doc_stride``).

On a finished ``make demo`` folder (or one that ran the DensePhrases targets), the phrase model is trained on the
demo's RC training set with the demo's own settings (its ``train_summary.json``) and evaluated on its RC test split
(EM / F1, Table 2's setting), its passages read

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


def measure(root: Path, work: Path, lengths: list[int] | None, progress: bool) -> dict:
    summary = json.loads((root / "results/densephrases/model_pre_batch/train_summary.json").read_text())
    settings = {k: v for k, v in summary["settings"].items() if k in PhraseTrainConfig.__dataclass_fields__}
    train, test = read_squad(settings["train"]), read_squad(root / "data/densephrases/rc/test.json")
    tokenizer = load_tokenizer(settings["encoder"])
    own = settings["max_passage_tokens"]
    out = {"examples": {"train": len(train), "test": len(test)}, "passage_tokens": passage_lengths(train, tokenizer),
           "runs": []}
    for tokens in lengths or (own, 64):
        for stride in (None, max(1, tokens // 3)):
            cfg = PhraseTrainConfig(**{**settings, "max_passage_tokens": tokens, "doc_stride": stride,
                                       "init": None, "out_dir": str(work / f"{tokens}-{stride}"),
                                       "checkpoint_dir": str(work / "checkpoints")})
            feats = rc_features(train, tokenizer, tokens, cfg.max_question_tokens, stride)
            t0 = time.perf_counter()
            trained = train_densephrases(cfg, progress=progress)
            seconds = time.perf_counter() - t0
            result = rc_evaluate(DensePhrases.load(cfg.out_dir), test, tokens, cfg.max_question_tokens,
                                 precision=cfg.precision, doc_stride=stride)
            out["runs"].append({"max_passage_tokens": tokens, "doc_stride": stride, "rows": len(feats["start"]),
                                "no_answer_rows": int((~feats["answerable"]).sum()), "dropped": feats["dropped"],
                                "steps": trained["steps"], "em": round(result["em"], 1), "f1": round(result["f1"], 1),
                                "test_n": result["n"], "test_windows": result["windows"],
                                "train_seconds": round(seconds, 1)})
    return out


def markdown(result: dict) -> str:
    rows = ["| passages | training rows | of them no answer | answers left out | steps | test questions read "
            "(windows) | RC test EM | F1 |", "|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        form = (f"cut at {r['max_passage_tokens']}" if r["doc_stride"] is None else
                f"windows of {r['max_passage_tokens']} every {r['doc_stride']}")
        rows.append(f"| {form} | {r['rows']} | {r['no_answer_rows']} | {r['dropped']} | {r['steps']} | "
                    f"{r['test_n']} ({r['test_windows']}) | {r['em']:.1f} | {r['f1']:.1f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="a finished `make demo` folder")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="max_passage_tokens values to compare at (default: the demo's own and 64)")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/densephrases_windows.json"))
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    root, args.out = args.root.resolve(), args.out.resolve()
    os.chdir(root)  # the demo's settings name their inputs relative to the workflow's working directory
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        result = {"root": str(root), **measure(root, Path(work), args.lengths, not args.no_progress)}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_summary(args.out, result, config=vars(args))
    print(markdown(result))
    print(json.dumps({"examples": result["examples"], "passage_tokens": result["passage_tokens"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
