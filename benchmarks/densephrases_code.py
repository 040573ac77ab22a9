"""What DensePhrases' paper-vs-code switches do to the embedded world's numbers (docs/paper-map.md §D1.6, §D1.7).

On a finished ``make demo`` folder (or one that ran the DensePhrases targets), with the demo's own model, dump, Flat
index, tasks and settings as its results record them (``provenance.config``):

* ``search_form``: every open-domain evaluation (``results/densephrases/eval/{variant}/Flat.json``) answered again
  with eq. 10 (``paper``) and with the original's search_phrase groups (``code``), both without re-ranking (the code
  has none; over a Flat index re-ranking by the dump changes nothing beyond rounding); per task the EM of each and the
  predictions that changed.
* query-side fine-tuning as config/paper.yaml runs it (``search_form: code``, ``dev_k: 10``; the demo's other
  settings, from its summary's provenance), its dev EM per epoch beside the demo's, and the fine-tuned model over the
  tasks with the code's search.
* ``truecase``: the tasks' questions that have a capital letter, lowercased and truecased with the truecase
  package's statistics: how many come back exactly (the embedded encoder is uncased, so no EM can move here).

Writes results/benchmarks/densephrases_code.json (and prints a Markdown table). It measures; it asserts nothing.

    .venv/bin/python benchmarks/densephrases_code.py --root /path/to/finished/demo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from npm.densephrases.cli import _questions
from npm.densephrases.evaluate import open_domain, task_questions
from npm.densephrases.model import DensePhrases
from npm.densephrases.query_ft import query_finetune
from npm.densephrases.searcher import PhraseSearcher
from npm.densephrases.truecase import load_truecaser, truecase_question
from npm.io import write_summary
from npm.tasks.metrics import normalize_answer


def answer_tasks(checkpoint, config: dict, forms=("paper", "code")) -> dict:
    """{form: {task: open_domain result}} of ``checkpoint`` over the dump, index and tasks of an evaluation's
    recorded settings ``config``, without re-ranking."""
    searcher = PhraseSearcher(checkpoint, config["dump"], config["index"], precision=config["precision"],
                              vectors=config["vectors"])
    out = {form: {} for form in forms}
    for task in config["task"]:
        questions = task_questions(task, config["tasks_root"], searcher.model.tokenizer)
        for form in forms:
            out[form][task] = open_domain(searcher, questions, config["k"], config["max_words"], 1, form)
    return out


def rows(variant: str, answers: dict) -> list[dict]:
    """One row per task: EM with each search form, the predictions that changed, and those that changed after
    SQuAD normalisation (a whole-word answer often differs only by the punctuation it carries)."""
    out = []
    for task, paper in answers["paper"].items():
        code = answers["code"][task]
        pairs = [(a["prediction"], b["prediction"]) for a, b in
                 zip(paper["predictions"], code["predictions"], strict=True)]
        out.append({"variant": variant, "task": task, "n": paper["n"], "em_paper": round(paper["em"], 1),
                    "em_code": round(code["em"], 1), "changed_predictions": sum(a != b for a, b in pairs),
                    "changed_normalised": sum(normalize_answer(a) != normalize_answer(b) for a, b in pairs)})
    return out


def measure_search_form(root: Path) -> list[dict]:
    found = []
    for path in sorted((root / "results/densephrases/eval").glob("*/Flat.json")):
        config = json.loads(path.read_text())["provenance"]["config"]
        found += rows(path.parent.name, answer_tasks(config["checkpoint"], config))
    return found


def measure_query_ft(root: Path, work: Path) -> dict:
    """The paper route's query-side fine-tuning (code search, dev EM at top_k 10) from the demo's base model."""
    summary = json.loads((root / "results/densephrases/model_pre_batch_qft/query_ft_summary.json").read_text())
    c = summary["provenance"]["config"]
    t0 = time.perf_counter()
    code = query_finetune(c["checkpoint"], c["dump"], c["index"], _questions(Path(c["train"])), work / "qft",
                          dev=_questions(Path(c["dev"])), k=c["k"], max_words=c["max_words"], epochs=c["epochs"],
                          batch_size=c["batch_size"], lr=c["lr"], objective=c["objective"], dev_k=10, seed=c["seed"],
                          progress=False, precision=c["precision"], vectors=c["vectors"], search_form="code")
    evaluation = json.loads((root / "results/densephrases/eval/pre_batch_qft/Flat.json").read_text())
    answers = answer_tasks(work / "qft", evaluation["provenance"]["config"], forms=("code",))
    return {"demo": {"dev_em": [e["dev_em"] for e in summary["epochs"]], "dev_em_best": summary["dev_em_best"],
                     "search_form": summary["search_form"], "dev_k": summary["dev_k"]},
            "code": {"dev_em": [e["dev_em"] for e in code["epochs"]], "dev_em_best": code["dev_em_best"],
                     "skipped": [e["skipped"] for e in code["epochs"]], "dev_k": 10,
                     "tasks_em": {t: round(r["em"], 1) for t, r in answers["code"].items()}},
            "seconds": round(time.perf_counter() - t0, 1)}


def measure_truecase(root: Path) -> dict:
    """Questions with a capital letter, lowercased, truecased with the truecase package's statistics."""
    config = json.loads((root / "results/densephrases/eval/pre_batch/Flat.json").read_text())["provenance"]["config"]
    caser, tokenizer = load_truecaser("package"), DensePhrases.load(config["checkpoint"]).tokenizer
    out = {}
    for task in config["task"]:
        questions = [q["question"] for q in task_questions(task, config["tasks_root"], tokenizer)]
        cased = [q for q in questions if q != q.lower()]
        back = [truecase_question(caser, q.lower()) for q in cased]
        out[task] = {"questions": len(cased), "restored": sum(a == b for a, b in zip(back, cased, strict=True)),
                     "examples": [[a, b] for a, b in zip(cased, back, strict=True) if a != b][:3]}
    return out


def markdown(found: list[dict]) -> str:
    out = ["| variant | task | n | EM paper search | EM code search | predictions changed (after normalisation) |",
           "|---|---|---|---|---|---|"]
    out += [f"| {r['variant']} | {r['task']} | {r['n']} | {r['em_paper']:.1f} | {r['em_code']:.1f} | "
            f"{r['changed_predictions']} ({r['changed_normalised']}) |" for r in found]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="a finished `make demo` folder")
    parser.add_argument("--skip", nargs="*", default=[], choices=("search_form", "query_ft", "truecase"),
                        help="measurements to skip")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/densephrases_code.json"))
    args = parser.parse_args(argv)
    root, args.out = args.root.resolve(), args.out.resolve()
    os.chdir(root)  # the results name their inputs relative to the workflow's working directory
    t0 = time.perf_counter()
    result = {"root": str(root)}
    if "search_form" not in args.skip:
        result["search_form"] = measure_search_form(root)
    if "query_ft" not in args.skip:
        with tempfile.TemporaryDirectory() as work:
            result["query_ft"] = measure_query_ft(root, Path(work))
    if "truecase" not in args.skip:
        result["truecase"] = measure_truecase(root)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_summary(args.out, result, config=vars(args))
    print(markdown(result.get("search_form", [])))
    print(json.dumps({k: result[k] for k in ("query_ft", "truecase") if k in result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
