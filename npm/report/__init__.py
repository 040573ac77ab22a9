"""The paper's tables (1, 2, 3, 4, 8) and figures (6, 7, 8) from our metrics and prediction files, each with the
paper's numbers beside ours (paper 5-6; paper-map §7). Entry point: ``npm-repro report WHAT``
(:mod:`npm.report.cli`)."""

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
           "table1", "table2", "table3", "table4", "table8", "write_table"]
