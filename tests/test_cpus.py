"""tests/cpus.py: a `make test` worker on its share of the CPUs, a workflow it runs on the whole machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cpus import MACHINE_CPUS_ENV, machine_cpus

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, os, subprocess, sys
from tests.cpus import on_whole_machine, pin_xdist_worker
pin_xdist_worker()
seen = {"pinned": sorted(os.sched_getaffinity(0))}
child = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
with on_whole_machine():
    seen["inside"] = sorted(os.sched_getaffinity(0))
    seen["child"] = json.loads(subprocess.run(child, capture_output=True, text=True).stdout)
seen["after"] = sorted(os.sched_getaffinity(0))
print(json.dumps(seen))
"""


def test_a_pinned_worker_runs_what_it_starts_on_the_whole_machine_inside_on_whole_machine():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity here")
    cpus = sorted(machine_cpus() or os.sched_getaffinity(0))  # this worker's own share under `make test`
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}
    env.pop(MACHINE_CPUS_ENV, None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    seen = json.loads(out.stdout)
    assert seen["pinned"] == cpus[1::2] == seen["after"]
    assert seen["inside"] == cpus == seen["child"]
