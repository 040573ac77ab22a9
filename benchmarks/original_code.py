"""What each paper-vs-code switch does to the embedded world's numbers (docs/paper-map.md, "The paper routes compute as
the original code").

The paper routes (config/released.yaml, config/paper.yaml) set every switch to the original code's value, because the
published cells came from that code; the embedded default keeps the paper's form (or its own documented value). On a
finished ``make demo`` folder this re-evaluates every cell a switch touches twice, with exactly the demo's inputs,
settings and samples as each metrics file records them (``provenance.config``): once as the demo ran it and once with
the switch at its other value, one switch at a time. Per cell it reports both scores, the examples whose prediction
changed, and whether the other score is still inside the cell's band of npm/report/expected/embedded.yaml.

Also measured:

* ``faiss_metric`` and ``faiss_train_draw``: the demo's closed-set index is exact (``Flat``); these switches matter
  for the original's IVF-PQ, so ``IVF4096,PQ64`` indexes (nlist reduced to the datastore, as the build does) are
  built per NPM datastore, one with the demo's values (``metric="ip"``, ``train_draw="sorted"``) and one per switch
  with that switch at the paper routes' value (``"l2"``; ``"code"``: the original's sample in its drawn order), and
  NPM's closed-set cells are evaluated with each.
* ``sample_order``: the original's LAMA and KAMEL loaders read their relation files in an unsorted ``os.listdir``
  order, so its samples cannot be recovered. Each task is answered once in full; then ``--orders`` random orders of
  its relation files go through the sampling procedure (seed 0, ``npm.tasks.registry.task_examples``), and the spread
  of the resulting scores is set beside the binomial standard error at the same n.
* ``lama_input``: the examples whose input differs between the old replacement order and the original's.

Writes results/benchmarks/original_code.json (and prints a Markdown table). It measures; it asserts nothing.

    .venv/bin/python benchmarks/original_code.py --root /path/to/finished/demo [--skip faiss_metric ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from npm.datastore.faiss_index import build_faiss_index
from npm.datastore.store import load_datastore
from npm.evaluation.harness import evaluate_tasks
from npm.evaluation.systems import Inputs
from npm.io import read_yaml, write_summary
from npm.model import load_tokenizer
from npm.settings import Settings
from npm.tasks.loaders import _lama_relations
from npm.tasks.metrics import SAMPLING_SEED, aggregate, sample_by_group, sample_indices
from npm.tasks.registry import load_task_records, resolve_task, task_examples
from npm.tasks.templates import MASK_PLACEHOLDER, lama_input

# switch -> (the demo's value is compared with this other value, the systems whose cells it can move, task filter)
SWITCHES = {
    "tau_twice": (True, {"npm"}, "closed"),
    "span_score": ("code", {"npm", "npm_faiss", "npm_single"}, "open"),
    "span_walk": ("code", {"npm_faiss"}, "open"),  # restricted mode walks from every stored row: no cell can move
    "translation_cut": ("decoders", {"npm", "npm_faiss", "npm_single", "densephrases"}, {"entity_translation"}),
    "mlm_max_length": (256, {"mlm"}, "closed"),
    "kamel_prompt": ("code", {"lm", "bm25_lm"}, {"kamel"}),
    "passages": (5, {"bm25_lm"}, "open"),
    "passage_text": ("contents", {"bm25_lm"}, "open"),
}
TABLE8 = {"lama_trex", "lama_google_re", "kamel", "nq", "triviaqa"}
SAMPLE_ORDER_TASKS = ("lama_trex", "lama_google_re", "kamel")


def demo_cells(root: Path) -> list[dict]:
    """Every metrics file of the demo with what made it (its provenance config)."""
    cells = []
    for path in sorted((root / "results" / "metrics").glob("*/*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        config = rec["provenance"]["config"]
        cells.append({"task": rec["task"], "run": path.stem, "system": rec["system"], "score": rec["score"],
                      "n": rec["n"], "inputs": config["inputs"], "settings": config["settings"],
                      "n_samples": config["n_samples"], "tokenizer": config["tokenizer"]})
    return cells


def wanted(task: str, which) -> bool:
    if which == "closed":
        return resolve_task(task).closed
    if which == "open":
        return not resolve_task(task).closed
    if which == "table8":
        return task in TABLE8
    return task in which


def run(cells: list[dict], root: Path, settings: dict, inputs: dict | None = None) -> dict:
    """Scores and predictions records of ``cells`` (one system, one set of inputs) under ``settings``: task ->
    (score, records)."""
    first = cells[0]
    given = Inputs(**{**first["inputs"], **(inputs or {})})
    given = dataclasses.replace(given, **{k: [str(root / p) if not Path(p).is_absolute() else p for p in v]
                                          for k, v in dataclasses.asdict(given).items()
                                          if isinstance(v, list)})
    given.tasks_root = str(root / given.tasks_root) if not Path(given.tasks_root).is_absolute() else given.tasks_root
    for key in ("checkpoint", "encoder"):
        value = getattr(given, key)
        if value and (root / value).exists():
            setattr(given, key, str(root / value))
    tokenizer = first["tokenizer"]
    if tokenizer and (root / tokenizer).exists():
        tokenizer = str(root / tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / f"{c['task']}.jsonl" for c in cells]
        metrics = evaluate_tasks([c["task"] for c in cells], first["system"], given, Settings(**settings),
                                 n_samples=first["n_samples"], tokenizer=tokenizer, predictions_paths=paths)
        records = [[json.loads(line) for line in p.read_text().splitlines()] for p in paths]
    return {c["task"]: (m["score"], r) for c, m, r in zip(cells, metrics, records, strict=True)}


def groups_of(cells: list[dict]) -> dict:
    """Cells answered by one scorer: same run and same inputs."""
    out = defaultdict(list)
    for c in cells:
        out[(c["run"], json.dumps(c["inputs"], sort_keys=True), json.dumps(c["settings"], sort_keys=True))].append(c)
    return out


def compare(base: dict, other: dict, cells: list[dict], bands: dict, switch: str, value) -> list[dict]:
    rows = []
    for c in cells:
        (a, pa), (b, pb) = base[c["task"]], other[c["task"]]
        band = (bands.get(f"{c['task']}/{c['run']}") or {}).get("band")
        rows.append({"switch": switch, "value": value, "cell": f"{c['task']}/{c['run']}", "demo_value":
                     c["settings"].get(switch), "score": a, "score_other": b, "delta": round(b - a, 4),
                     "changed_predictions": int(sum(x["prediction"] != y["prediction"]
                                                    for x, y in zip(pa, pb, strict=True))), "n": len(pa),
                     "band": band, "other_in_band": None if band is None else band[0] <= b <= band[1]})
    return rows


def measure_switches(root: Path, cells: list[dict], bands: dict, only: set[str]) -> list[dict]:
    rows = []
    for (run_name, _, _), group in groups_of(cells).items():
        system = group[0]["system"]
        touched = {name: [c for c in group if wanted(c["task"], which)]
                   for name, (_, systems, which) in SWITCHES.items() if name in only and system in systems}
        touched = {k: v for k, v in touched.items() if v}
        if not touched:
            continue
        needed = [c for c in group if any(c in v for v in touched.values())]
        t0 = time.perf_counter()
        base = run(needed, root, group[0]["settings"])
        print(f"{run_name}: base run of {len(needed)} tasks in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        for name, these in touched.items():
            value = SWITCHES[name][0]
            if group[0]["settings"].get(name) == value:
                value = Settings.__dataclass_fields__[name].default  # the demo already runs the code's value
            t0 = time.perf_counter()
            other = run(these, root, {**group[0]["settings"], name: value})
            rows += compare(base, other, these, bands, name, value)
            print(f"  {name} = {value!r}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rows


# index switch -> (build_faiss_index's argument, the demo's value, the paper routes' value)
INDEX_SWITCHES = {"faiss_metric": ("metric", "ip", "l2"), "faiss_train_draw": ("train_draw", "sorted", "code")}


def measure_index_switches(root: Path, cells: list[dict], bands: dict, factory: str, names: list[str]) -> list[dict]:
    """NPM's closed-set cells over IVF-PQ indexes of each of its datastores: one built with the demo's values, and one
    per switch of ``names`` with that switch alone at the paper routes' value."""
    rows = []
    closed = [c for c in cells if c["system"] == "npm" and c["run"] == "npm" and resolve_task(c["task"]).closed]
    variants = {"demo": {}} | {name: {INDEX_SWITCHES[name][0]: INDEX_SWITCHES[name][2]} for name in names}
    base = {arg: value for arg, value, _ in INDEX_SWITCHES.values()}
    with tempfile.TemporaryDirectory() as tmp:
        built: dict[tuple[str, str], str] = {}
        for store in sorted({d for c in closed for d in c["inputs"]["datastore"]}):
            ds = load_datastore(root / store)
            for variant, change in variants.items():
                out = Path(tmp) / f"{Path(store).name}.{variant}.faiss"
                t0 = time.perf_counter()
                build_faiss_index(ds.vector_shards(), ds.hidden_size, out, factory=factory, datastore=ds,
                                  **(base | change))
                built[(store, variant)] = str(out)
                print(f"{store}: {factory} {variant} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        for (_, _, _), group in groups_of(closed).items():
            scores = {variant: run(group, root, group[0]["settings"],
                                   {"faiss": [built[(d, variant)] for d in group[0]["inputs"]["datastore"]]})
                      for variant in variants}
            for name in names:
                rows += compare(scores["demo"], scores[name], group, bands, name, INDEX_SWITCHES[name][2])
    for r in rows:
        r["demo_value"] = INDEX_SWITCHES[r["switch"]][1]
        r["note"] = f"both {factory}; the demo's own index is Flat"
    return rows


def measure_precision(root: Path, cells: list[dict], bands: dict, corpora: list[str]) -> list[dict]:
    """NPM's cells on ``corpora`` with their datastore embedded again under fp16 autocast, against the demo's (fp32 on
    a CPU without native bf16, the original's arithmetic). fp16 autocast is a GPU feature: it is forced on the CPU here
    (5x slower than fp32), so only small corpora are re-embedded."""
    import npm.datastore.embed as embed
    import npm.model

    forced = lambda device, precision: precision  # noqa: E731 - fp16 on the CPU, for this measurement only
    embed.effective_precision = npm.model.effective_precision = forced
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for corpus in corpora:
            these = [c for c in cells if c["run"] == "npm" and Path(c["inputs"]["datastore"][0]).name == corpus
                     and len(c["inputs"]["datastore"]) == 1]
            if not these:
                continue
            store = root / these[0]["inputs"]["datastore"][0]
            ds = load_datastore(store)
            plan = json.loads((store / "plan.json").read_text(encoding="utf-8"))
            blocks = [str(root / b) if not Path(b).is_absolute() else b for b in plan["sources"]]
            t0 = time.perf_counter()
            embed.embed_corpus(str(root / these[0]["inputs"]["checkpoint"]), blocks, Path(tmp) / corpus,
                               drop_stopwords=plan["drop_stopwords"], shards=1, precision="fp16", device="cpu",
                               tokenizer_name=plan.get("tokenizer"), stopwords=plan["stopwords"], progress=False)
            print(f"{corpus}: fp16 datastore ({ds.n_tokens} tokens) in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr)
            for group in groups_of(these).values():
                base = run(group, root, group[0]["settings"])
                other = run(group, root, group[0]["settings"], {"datastore": [str(Path(tmp) / corpus)]})
                rows += compare(base, other, group, bands, "precision", "fp16")
    for r in rows:
        r["note"] = "the demo's datastore: fp32 (no native bf16 here); other: fp16 autocast, forced on the CPU"
    return rows


def measure_sample_order(root: Path, cells: list[dict], orders: int) -> list[dict]:
    """The spread of LAMA / KAMEL scores over random orders of their relation files."""
    rows = []
    for c in cells:
        if c["task"] not in SAMPLE_ORDER_TASKS or c["run"] != "npm":
            continue
        task = resolve_task(c["task"])
        tokenizer = load_tokenizer(str(root / c["tokenizer"]) if (root / c["tokenizer"]).exists() else c["tokenizer"])
        folder = root / c["inputs"]["tasks_root"] / c["task"]
        everything = task_examples(c["task"], folder, tokenizer, n_samples=0)
        whole = run([dict(c, n_samples=0)], root, c["settings"])[c["task"]][1]
        full = {r["id"]: float(r["correct"]) for r in whole}
        relations = list(dict.fromkeys(ex["relation"] for ex in everything))
        n = c["n_samples"] or task.n_samples
        scores = []
        rng = np.random.default_rng(0)
        for _ in range(orders):
            order = rng.permutation(len(relations))
            rank = {relations[i]: k for k, i in enumerate(order)}
            shuffled = sorted(everything, key=lambda ex: rank[ex["relation"]])  # stable: file order inside a file
            if task.group_by is None:
                idx = sample_indices(len(shuffled), n, seed=SAMPLING_SEED)
            else:
                idx = sample_by_group([ex["group"] for ex in shuffled], max(1, n // 3), seed=SAMPLING_SEED)
            picked = [shuffled[i] for i in idx.tolist()]
            groups = [ex.get("group") for ex in picked] if task.average == "macro" else None
            scores.append(100.0 * aggregate([full[ex["id"]] for ex in picked], groups, task.average))
        p = np.mean(scores) / 100.0
        size = len(idx)
        rows.append({"cell": f"{c['task']}/{c['run']}", "relations": len(relations), "population": len(everything),
                     "n": size, "orders": orders, "demo_score": c["score"], "mean": float(np.mean(scores)),
                     "sd": float(np.std(scores)), "min": float(np.min(scores)), "max": float(np.max(scores)),
                     "binomial_se": float(100.0 * np.sqrt(p * (1 - p) / size)), "full_population_score":
                     100.0 * float(np.mean(list(full.values())))})
    return rows


def measure_lama_input(root: Path, cells: list[dict]) -> list[dict]:
    rows = []
    for name in ("lama_trex", "lama_google_re"):
        c = next((c for c in cells if c["task"] == name), None)
        if c is None:
            continue
        folder = root / c["inputs"]["tasks_root"] / name
        task = resolve_task(name)
        templates = _lama_relations(folder / task.files[1])
        records = load_task_records(task, folder)
        differ = sum(templates[r["relation"]].replace("[X]", r["sub_label"]).replace("[Y]", MASK_PLACEHOLDER)
                     .replace(" .", ".") != lama_input(templates[r["relation"]], r["sub_label"]) for r in records)
        rows.append({"task": name, "records": len(records), "inputs_that_differ": int(differ)})
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| switch (other value) | cell | demo | other | Δ | predictions changed | other in band |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        band = "-" if r["other_in_band"] is None else ("yes" if r["other_in_band"] else "**no**")
        out.append(f"| {r['switch']} ({r['value']}) | {r['cell']} | {r['score']:.1f} | {r['score_other']:.1f} | "
                   f"{r['delta']:+.1f} | {r['changed_predictions']} / {r['n']} | {band} |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="a finished `make demo` folder")
    parser.add_argument("--expected", type=Path, default=Path(__file__).resolve().parents[1] / "npm" / "report"
                        / "expected" / "embedded.yaml", help="the embedded bands")
    parser.add_argument("--skip", nargs="*", default=[], help="switches (or faiss_metric, faiss_train_draw, precision, "
                        "sample_order) to skip")
    parser.add_argument("--orders", type=int, default=1000, help="random relation-file orders (sample_order)")
    parser.add_argument("--factory", default="IVF4096,PQ64",
                        help="the IVF-PQ index of faiss_metric and faiss_train_draw")
    parser.add_argument("--precision-corpora", nargs="*", default=["translation_passages"],
                        help="small corpora whose NPM datastore is embedded again in fp16 (precision)")
    parser.add_argument("--tasks", nargs="*", default=None, help="only these tasks' cells (default: all)")
    parser.add_argument("--only", nargs="*", default=None, help="only these switches (default: all but --skip)")
    parser.add_argument("--n-samples", type=int, default=None, help="examples per task instead of the demo's (a "
                        "smaller sample for the slow decoder runs; the bands then do not apply)")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/original_code.json"))
    args = parser.parse_args(argv)
    root = args.root.resolve()
    args.out = args.out.resolve()
    os.chdir(root)  # the datastores name their blocks files relative to the workflow's working directory
    cells = [c for c in demo_cells(root) if ("@" not in c["run"] or c["task"].startswith("templama"))
             and (args.tasks is None or c["task"] in args.tasks)]
    if args.n_samples:
        cells = [dict(c, n_samples=args.n_samples) for c in cells]
    if args.only is not None:
        measured = [*SWITCHES, *INDEX_SWITCHES, "precision", "sample_order"]
        args.skip = [name for name in measured if name not in args.only]
    bands = read_yaml(args.expected)["cells"]
    t0 = time.perf_counter()
    result = {"root": str(root), "switches": measure_switches(root, cells, bands, set(SWITCHES) - set(args.skip))}
    index_switches = [name for name in INDEX_SWITCHES if name not in args.skip]
    if index_switches:
        result["index_switches"] = measure_index_switches(root, cells, bands, args.factory, index_switches)
    if "precision" not in args.skip:
        result["precision"] = measure_precision(root, cells, bands, args.precision_corpora)
    if "sample_order" not in args.skip:
        result["sample_order"] = measure_sample_order(root, cells, args.orders)
    result["lama_input"] = measure_lama_input(root, cells)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_summary(args.out, result, config=vars(args))
    print(markdown(result["switches"] + result.get("index_switches", []) + result.get("precision", [])))
    print(json.dumps({k: result[k] for k in ("sample_order", "lama_input") if k in result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
