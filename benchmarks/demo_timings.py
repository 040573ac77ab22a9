"""Benchmark: where a finished `make demo`'s time went, per job, from Snakemake's own logs (`.snakemake/log/*.log`:
each job's start and finish lines, one-second resolution), for every job, with or without a `benchmark:` file.

Writes results/benchmarks/demo-timings.json (each job's rule, wildcards, start and seconds; the workflow's wall time;
the commit) and prints the job-time table of docs/demo-timings.md, grouped into the parts below. That table is this
output: `tests/test_docs_numbers.py` renders it again from the measurement kept in docs/demo-timings.json. It
measures; it asserts nothing.

    .venv/bin/python benchmarks/demo_timings.py [--root .] [--out results/benchmarks/demo-timings.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

# (part of the demo, rules in it): the first part whose prefixes match a job's rule holds it; the last holds the rest.
PARTS = (
    ("pretraining: NPM, NPM-single, MLM baseline", ("pretrain",)),
    ("embedding the datastores", ("embed_shard",)),
    ("NPM, NPM-single and MLM evaluations (one job per system and corpus)",
     ("evaluate_npm", "evaluate_mlm", "evaluate_negative_control")),
    ("decoder baselines (SmolLM2-135M: LM, + PMI, BM25 + LM, REPLUG)",
     ("convert_smollm2", "evaluate_lm", "evaluate_bm25_lm", "evaluate_replug")),
    ("REPLUG's own system: LSR training, language-modelling evaluation", ("replug_train_lsr", "replug_eval_lm")),
    ("DensePhrases: training, teacher, query-side fine-tuning, dumps, indexes, its own evaluations",
     ("densephrases", "evaluate_densephrases")),
    ("FAISS and BM25 indexes", ("build_faiss_index", "build_bm25_index")),
    ("data stages, datastore plans, reports and the rest", ("",)),
)
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?rule (\w+):$")
FINISH = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


def parse_log(text: str) -> list[dict]:
    """The finished jobs of one Snakemake log: ``{"rule", "wildcards", "start", "seconds"}`` each."""
    jobs, open_jobs, now, current = [], {}, None, None
    for line in text.splitlines():
        if m := STAMP.match(line):
            now, current = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y"), None
        elif m := START.match(line):
            current = {"rule": m.group(1), "wildcards": "", "start": now}
        elif current is not None and line.startswith("    wildcards: "):
            current["wildcards"] = line.split(": ", 1)[1]
        elif current is not None and (m := re.match(r"^    jobid: (\d+)$", line)):
            open_jobs[m.group(1)] = current
        elif (m := FINISH.match(line)) and m.group(1) in open_jobs:
            job = open_jobs.pop(m.group(1))
            jobs.append({**job, "start": job["start"].isoformat(), "seconds": (now - job["start"]).total_seconds()})
    return jobs


def part_of(rule: str) -> str:
    return next(name for name, prefixes in PARTS if any(rule.startswith(p) for p in prefixes))


def table(measured: dict) -> str:
    """The markdown job-time table: per part, its jobs and their summed minutes (each job's when there are 1-3)."""
    rows = ["| part | jobs | job time |", "|---|---|---|"]
    for name, _ in PARTS:
        minutes = sorted((j["seconds"] / 60 for j in measured["jobs"] if part_of(j["rule"]) == name), reverse=True)
        if not minutes:
            continue
        each = f" ({', '.join(f'{m:.1f}' for m in minutes)})" if len(minutes) <= 3 else ""
        rows.append(f"| {name} | {len(minutes)} | {sum(minutes):.1f} min{each} |")
    total = sum(j["seconds"] for j in measured["jobs"]) / 60
    rows.append(f"| all jobs | {len(measured['jobs'])} | {total:.1f} min |")
    return "\n".join(rows)


def measure(root: Path) -> dict:
    logs = sorted((root / ".snakemake" / "log").glob("*.snakemake.log"))
    per_log = [(log.name, parse_log(log.read_text(encoding="utf-8", errors="replace"))) for log in logs]
    jobs = [job for _, found in per_log for job in found]
    if not jobs:
        raise SystemExit(f"no finished Snakemake job in {root / '.snakemake' / 'log'}: run `make demo` first")
    starts = [datetime.fromisoformat(j["start"]) for j in jobs]
    ends = [s.timestamp() + j["seconds"] for s, j in zip(starts, jobs, strict=True)]
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {"commit": commit.stdout.strip() or None, "logs": [name for name, found in per_log if found],
            "workflow_wall_seconds": max(ends) - min(starts).timestamp(), "jobs": jobs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("."), help="the folder `make demo` ran in (default: .)")
    ap.add_argument("--out", type=Path, default=None,
                    help="where to write the measurement (default: ROOT/results/benchmarks/demo-timings.json)")
    args = ap.parse_args(argv)
    measured = measure(args.root)
    out = args.out or args.root / "results" / "benchmarks" / "demo-timings.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(measured, indent=1) + "\n", encoding="utf-8")
    print(table(measured))
    print(f"workflow wall time (first job start to last job end, every snakemake run): "
          f"{measured['workflow_wall_seconds'] / 60:.1f} min; written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
