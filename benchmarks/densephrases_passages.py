"""What the dump's passages do to the embedded world's open-domain EM (docs/paper-map.md §D1.7, config
``densephrases.dump_passages``).

On a finished ``make demo`` folder (or one that ran the DensePhrases targets): the demo's phrase dump reads NPM's
blocks (text units packed into 256 tokens); this dumps the same corpus again with the demo's model, each text unit
alone in the code's windows (``units``, 512 tokens every 500), builds its Flat index, and answers every open-domain
evaluation of the demo (``results/densephrases/eval/{variant}/Flat.json``: the base and the query-side fine-tuned
model, which share the phrase side) over both dumps, with the demo's own search settings. Also: how the corpus's
units lie in its blocks (units per block, units longer than a block or a window) and the time of each dump.

Writes results/benchmarks/densephrases_passages.json (and prints a Markdown table). It measures; it asserts nothing.

    .venv/bin/python benchmarks/densephrases_passages.py --root /path/to/finished/demo
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

from npm.data.blocks import load_blocks
from npm.densephrases.dump import DumpPassages, build_index, dump_phrases, unit_windows
from npm.densephrases.evaluate import open_domain, task_questions
from npm.densephrases.searcher import PhraseSearcher
from npm.io import write_summary


def corpus_units(blocks_paths: list[str], passages: DumpPassages) -> dict:
    """How the text units lie in the blocks: counts, units per block, units cut by a block end, units of 2+ windows."""
    units = windows = blocks = cut = long_units = 0
    per_block = []
    for path in blocks_paths:
        arrays = load_blocks(path)
        _, offsets, _, unit = unit_windows(arrays["flags"], passages.max_tokens, passages.stride)
        first = np.unique(unit[:, 0])
        last = np.unique(unit[:, 1])
        bo = arrays["block_offsets"]
        block_of_first = np.searchsorted(bo, first, side="right") - 1
        block_of_last = np.searchsorted(bo, last, side="right") - 1
        units += len(first)
        windows += len(offsets) - 1
        blocks += len(bo) - 1
        cut += int((block_of_first != block_of_last).sum())
        long_units += int((np.bincount(np.searchsorted(first, unit[:, 0])) > 1).sum())
        per_block.append(np.bincount(block_of_first, minlength=len(bo) - 1))
    per_block = np.concatenate(per_block)
    return {"blocks": blocks, "units": units, "windows": windows,
            "units_per_block_mean": round(float(per_block.mean()), 2),
            "blocks_with_2plus_units": int((per_block > 1).sum()), "units_cut_by_a_block_end": cut,
            "units_of_2plus_windows": long_units}


def answer(config: dict, dump: Path, index: Path) -> dict:
    """{task: open_domain result} of an evaluation's recorded ``config`` over ``dump`` and ``index``."""
    searcher = PhraseSearcher(config["checkpoint"], dump, index, precision=config["precision"],
                              vectors=config["vectors"])
    out = {}
    for task in config["task"]:
        questions = task_questions(task, config["tasks_root"], searcher.model.tokenizer)
        out[task] = open_domain(searcher, questions, config["k"], config["max_words"], 1,
                                config.get("search_form", "paper"))
    return out


def measure(root: Path, work: Path, passages: DumpPassages) -> dict:
    evals = sorted((root / "results/densephrases/eval").glob("*/Flat.json"))
    base = json.loads(evals[0].read_text())["provenance"]["config"]
    meta = json.loads((Path(base["dump"]) / "meta.json").read_text())
    t0 = time.perf_counter()
    units_meta = dump_phrases(meta["model"], meta["blocks"], work / "dump", meta["filter_threshold"],
                              precision=base["precision"], dump_passages=passages, progress=False)
    dump_seconds = time.perf_counter() - t0
    build_index(work / "dump", work / "Flat.faiss")
    rows = []
    for path in evals:
        config = json.loads(path.read_text())["provenance"]["config"]
        blocks, units = answer(config, Path(config["dump"]), Path(config["index"])), answer(
            config, work / "dump", work / "Flat.faiss")
        for task, b in blocks.items():
            u = units[task]
            rows.append({"variant": path.parent.name, "task": task, "n": b["n"], "em_blocks": round(b["em"], 1),
                         "em_units": round(u["em"], 1),
                         "changed_predictions": sum(x["prediction"] != y["prediction"] for x, y in
                                                    zip(b["predictions"], u["predictions"], strict=True))})
    return {"rows": rows, "corpus": corpus_units(meta["blocks"], passages),
            "dump_seconds": {"blocks": meta["seconds"], "units": round(dump_seconds, 1)},
            "dump_rows": {"blocks": meta["rows"], "units": units_meta["rows"]}, "passages": passages.record()}


def markdown(rows: list[dict]) -> str:
    out = ["| variant | task | n | EM blocks | EM units | predictions changed |", "|---|---|---|---|---|---|"]
    out += [f"| {r['variant']} | {r['task']} | {r['n']} | {r['em_blocks']:.1f} | {r['em_units']:.1f} | "
            f"{r['changed_predictions']} |" for r in rows]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="a finished `make demo` folder")
    parser.add_argument("--max-tokens", type=int, default=DumpPassages.max_tokens, help="units window (code: 512)")
    parser.add_argument("--stride", type=int, default=DumpPassages.stride, help="units stride (code: 500)")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/densephrases_passages.json"))
    args = parser.parse_args(argv)
    root, args.out = args.root.resolve(), args.out.resolve()
    os.chdir(root)  # the results name their inputs relative to the workflow's working directory
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        result = measure(root, Path(work), DumpPassages("units", args.max_tokens, args.stride))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_summary(args.out, result, config=vars(args))
    print(markdown(result["rows"]))
    print(json.dumps({k: result[k] for k in ("corpus", "dump_seconds", "dump_rows")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
