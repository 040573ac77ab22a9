"""The paper's tables (1, 2, 3, 4, 8) and figures (6, 7, 8) from our metrics and prediction files, each with the
paper's numbers beside ours (paper 5-6; paper-map §7). Entry point: ``npm-repro report WHAT``
(:mod:`npm.report.cli`).
``npm.report.results(root)``: every number the workflow wrote as one tidy pandas DataFrame (:mod:`npm.report.collect`),
imported on first use (pandas is not in every env that runs ``npm-repro``)."""

from npm.report.figures import em_by_splits, figure6, figure7, figure8
from npm.report.tables import (
    Arrow,
    Table,
    load_metrics,
    load_paper_values,
    table1,
    table2,
    table3,
    table4,
    table8,
    write_table,
)

__all__ = ["Arrow", "Table", "em_by_splits", "figure6", "figure7", "figure8", "load_metrics", "load_paper_values",
           "results", "table1", "table2", "table3", "table4", "table8", "write_table"]


def __getattr__(name):
    """``npm.report.results`` (:func:`npm.report.collect.results`), imported on first use: pandas loads only then."""
    if name == "results":
        from npm.report.collect import results  # deferred: loads pandas

        return results
    raise AttributeError(f"module 'npm.report' has no attribute {name!r}")
