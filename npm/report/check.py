"""Expected numbers: is every score inside its band? (docs/expected-numbers.md)

As pyserini's reproduction pages keep expected scores, ``npm/report/expected/*.yaml`` holds, per evaluation cell
(``{task}/{run}``, the metrics file ``results/metrics/{task}/{run}.json``), the number expected there and a band
``[low, high]`` around it. ``npm-repro check`` reads a metrics folder against one such file and prints one line per
cell, OK or FAIL (a missing or unreadable metrics file is a FAIL), and exits 1 when any cell fails.

* ``npm/report/expected/embedded.yaml``: the embedded default (``make demo``), written by ``npm-repro check --record``
  from a demo's metrics: each cell's band is its bootstrap 95 % interval (metrics ``ci95``,
  ``npm.tasks.metrics.bootstrap``) widened by one example (100 / n points) on each side, so that a run on another
  machine, whose floating point may flip an example near a tie, passes, while an implementation that scores like
  chance where ours does not fails.
* A negative control (``npm-repro evaluate --negative-control shuffled_vectors``) must FAIL its NPM cells.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from npm.io import atomic_path, read_yaml

EXPECTED_DIR = Path(__file__).resolve().parent / "expected"


@dataclass(frozen=True)
class Verdict:
    cell: str
    score: float | None
    low: float
    high: float
    expected: float
    problem: str | None = None  # why there is no score

    @property
    def ok(self) -> bool:
        return self.problem is None and self.low <= self.score <= self.high

    def line(self) -> str:
        found = f"{self.score:6.2f}" if self.score is not None else "     -"
        status = "OK  " if self.ok else "FAIL"
        why = f"  ({self.problem})" if self.problem else ""
        return (f"{status} {self.cell:<40} {found}  in [{self.low:6.2f}, {self.high:6.2f}]  "
                f"(expected {self.expected:.2f}){why}")


def load_expected(path: str | os.PathLike) -> dict[str, dict]:
    """``{cell: {"expected", "band": [low, high], ...}}`` of an expected-numbers file, checked."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"expected-numbers file {path} does not exist (packaged ones: {EXPECTED_DIR})")
    data = read_yaml(path)
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, dict) or not cells:
        raise ValueError(f"expected-numbers file {path}: needs a non-empty mapping `cells: {{task/run: ...}}`")
    for cell, spec in cells.items():
        band = spec.get("band") if isinstance(spec, dict) else None
        if (not isinstance(band, list) or len(band) != 2 or not all(isinstance(x, (int, float)) for x in band)
                or band[0] > band[1] or not isinstance(spec.get("expected"), (int, float))):
            raise ValueError(f"expected-numbers file {path}, cell {cell}: needs `expected: NUMBER` and "
                             f"`band: [LOW, HIGH]` with LOW <= HIGH, got {spec!r}")
        if cell.count("/") != 1:
            raise ValueError(f"expected-numbers file {path}: cell {cell!r} must be TASK/RUN (metrics file "
                             "results/metrics/TASK/RUN.json)")
    return cells


def _score(metrics_root: Path, cell: str) -> tuple[float | None, str | None]:
    path = metrics_root / f"{cell}.json"
    if not path.exists():
        return None, f"no metrics file {path}"
    try:
        score = json.loads(path.read_text(encoding="utf-8"))["score"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        return None, f"unreadable metrics file {path}: {e}"
    if not isinstance(score, (int, float)):
        return None, f"metrics file {path}: score {score!r} is not a number"
    return float(score), None


def check(expected: dict[str, dict], metrics_root: str | os.PathLike) -> list[Verdict]:
    """One verdict per cell of ``expected`` (file order) for the metrics files under ``metrics_root``."""
    root = Path(metrics_root)
    verdicts = []
    for cell, spec in expected.items():
        score, problem = _score(root, cell)
        low, high = (float(x) for x in spec["band"])
        verdicts.append(Verdict(cell, score, low, high, float(spec["expected"]), problem))
    return verdicts


def band(metrics: dict) -> list[float]:
    """The band of one measured cell: its bootstrap 95 % interval widened by one example each side, in [0, 100]."""
    if "ci95" not in metrics:
        raise ValueError(f"metrics of {metrics.get('task')}/{metrics.get('system')} lack `ci95`: re-run the "
                         "evaluation (files written before the bootstrap interval existed have none)")
    one = 100.0 / max(int(metrics["n"]), 1)
    low, high = metrics["ci95"]
    return [round(max(0.0, low - one), 2), round(min(100.0, high + one), 2)]


def record(metrics_files: Iterable[str | os.PathLike], out: str | os.PathLike, header: str) -> dict[str, dict]:
    """Write an expected-numbers file from measured metrics files (``results/metrics/{task}/{run}.json``): each
    cell's score and its :func:`band`. Returns the cells."""
    cells = {}
    for f in sorted(Path(p) for p in metrics_files):
        metrics = json.loads(f.read_text(encoding="utf-8"))
        cells[f"{f.parent.name}/{f.stem}"] = {"expected": round(float(metrics["score"]), 2), "band": band(metrics),
                                              "n": int(metrics["n"])}
    if not cells:
        raise ValueError("no metrics files to record")
    lines = [f"# {line}".rstrip() for line in header.strip().splitlines()]
    lines += ["cells:"]
    lines += [f"  {cell}: {{expected: {c['expected']}, band: [{c['band'][0]}, {c['band'][1]}], n: {c['n']}}}"
              for cell, c in cells.items()]
    with atomic_path(Path(out)) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return cells


__all__ = ["EXPECTED_DIR", "Verdict", "band", "check", "load_expected", "record"]
