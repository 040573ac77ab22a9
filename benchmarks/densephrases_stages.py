"""What DensePhrases' training-stages switch does to the embedded world's reading comprehension (docs/paper-map.md
§D1.7, config ``densephrases.train.generated_first``).

On a finished ``make demo`` folder (or one that ran the DensePhrases targets): its RC training set is split by
subject into two halves, one standing for the generated questions (``rc.generated``) and one for the RC training set
(SQuAD at paper scale), and the phrase model is trained with the demo's own settings (its ``train_summary.json``)

* ``paper``: the generated questions joined to the training set, ``epochs`` epochs, pre-batch negatives in the last
  ``pre_batch_epochs`` (paper 4.1);
* ``code``: the original's run-rc, ``epochs - pre_batch_epochs`` epochs on the generated half alone with in-batch
  negatives, then ``pre_batch_epochs`` on the RC half from them with pre-batch negatives, each with a new schedule;

then each reads the demo's RC test split (EM / F1, Table 2's setting). One seed; the test split has a few dozen
questions, so one question moves EM by more than a point. Writes results/benchmarks/densephrases_stages.json (and
prints a Markdown table). It measures; it asserts nothing.

    .venv/bin/python benchmarks/densephrases_stages.py --root /path/to/finished/demo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from npm.densephrases.evaluate import rc_evaluate
from npm.densephrases.model import DensePhrases
from npm.densephrases.rc import read_squad, write_squad
from npm.densephrases.train import PhraseTrainConfig, train_densephrases
from npm.io import write_summary

FORMS = {"paper": False, "code": True}  # form: generated_first


def split_by_subject(examples: list[dict]) -> tuple[list[dict], list[dict]]:
    """(generated half, RC half): the examples of every other subject (title, sorted), so no subject is in both."""
    titles = sorted({ex["title"] for ex in examples})
    generated = set(titles[::2])
    return [ex for ex in examples if ex["title"] in generated], [ex for ex in examples if ex["title"] not in generated]


def measure(root: Path, work: Path, progress: bool) -> dict:
    summary = json.loads((root / "results/densephrases/model_pre_batch/train_summary.json").read_text())
    settings = {k: v for k, v in summary["settings"].items() if k in PhraseTrainConfig.__dataclass_fields__}
    generated, rc = split_by_subject(read_squad(settings["train"]))
    write_squad(work / "generated.json", generated, "generated half")
    write_squad(work / "rc.json", rc, "RC half")
    test = read_squad(root / "data/densephrases/rc/test.json")
    out = {"examples": {"generated": len(generated), "rc": len(rc), "test": len(test)}, "forms": {}}
    for form, first in FORMS.items():
        cfg = PhraseTrainConfig(**{**settings, "train": str(work / "rc.json"),
                                   "generated": str(work / "generated.json"), "generated_first": first, "init": None,
                                   "out_dir": str(work / form), "checkpoint_dir": str(work / "checkpoints")})
        t0 = time.perf_counter()
        trained = train_densephrases(cfg, progress=progress)
        seconds = time.perf_counter() - t0
        result = rc_evaluate(DensePhrases.load(work / form), test, cfg.max_passage_tokens, cfg.max_question_tokens,
                             precision=cfg.precision)
        out["forms"][form] = {"em": round(result["em"], 1), "f1": round(result["f1"], 1), "steps": trained["steps"],
                              "train_seconds": round(seconds, 1)}
    return out


def markdown(result: dict) -> str:
    rows = ["| training | RC test EM | F1 | steps | training seconds |", "|---|---|---|---|---|"]
    rows += [f"| {form} | {r['em']:.1f} | {r['f1']:.1f} | {r['steps']} | {r['train_seconds']:.0f} |"
             for form, r in result["forms"].items()]
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="a finished `make demo` folder")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/densephrases_stages.json"))
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    root, args.out = args.root.resolve(), args.out.resolve()
    os.chdir(root)  # the demo's settings name their inputs relative to the workflow's working directory
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        result = {"root": str(root), **measure(root, Path(work), not args.no_progress)}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_summary(args.out, result, config=vars(args))
    print(markdown(result))
    print(json.dumps(result["examples"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
