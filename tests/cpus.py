"""The CPUs of the tests under pytest-xdist (`make test`: two workers on a two-core machine).

Each worker, and every process it starts, runs on its own share of the machine's CPUs (:func:`pin_xdist_worker`, from
tests/conftest.py before anything imports torch), so that torch, FAISS and the JVM size their thread pools to it
(npm.threads counts the CPUs a process may use). Left on both cores, a worker's two-thread torch ran beside the other
worker's jobs and its idle OpenMP threads spun on the cores they needed: tests/test_batching.py's closed-set tests
beside two busy processes took 57 s of CPU on two threads, 41 s on one pinned core.

A workflow run is different: Snakemake runs its jobs side by side, each with the threads its rule gives it, and a run
of minutes on one core became the suite's tail once the other worker had nothing left (the .test run took 28 minutes
pinned). So a test's workflow, and the test's own SLURM node, get the whole machine back (:func:`whole_machine`,
:func:`on_whole_machine`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

MACHINE_CPUS_ENV = "NPM_TESTS_MACHINE_CPUS"  # the machine's CPUs, set when a worker is pinned to its share


def pin_xdist_worker() -> None:
    """This pytest-xdist worker (gw{i} of n) on CPUs ``cpus[i::n]``; nothing outside xdist or with fewer CPUs than
    workers."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit() and hasattr(os, "sched_setaffinity")):
        return
    cpus, n, i = sorted(os.sched_getaffinity(0)), int(count), int(worker.removeprefix("gw"))
    if len(cpus) >= n > 1:
        os.environ[MACHINE_CPUS_ENV] = ",".join(map(str, cpus))
        os.sched_setaffinity(0, cpus[i::n])


def machine_cpus() -> set[int] | None:
    """The machine's CPUs when this worker is pinned to its share, else None."""
    cpus = os.environ.get(MACHINE_CPUS_ENV)
    return {int(c) for c in cpus.split(",")} if cpus and hasattr(os, "sched_setaffinity") else None


def whole_machine() -> None:
    """This process (thread) on every CPU of the machine; a ``preexec_fn`` for the processes that run jobs."""
    cpus = machine_cpus()
    if cpus:
        os.sched_setaffinity(0, cpus)


@contextmanager
def on_whole_machine():
    """The calling thread, and the processes and threads it starts meanwhile, on the whole machine; its own share
    again afterwards."""
    share = os.sched_getaffinity(0) if machine_cpus() else None
    whole_machine()
    try:
        yield
    finally:
        if share:
            os.sched_setaffinity(0, share)
