"""One thread policy for torch, FAISS, BLAS and Lucene: every CPU-parallel library of a job gets its thread count
from one place, the job's CPU count.

A job's CPU count is, in order: the ``--threads`` option of its command (the workflow passes Snakemake's
``{threads}``, which the SLURM profile sets to the rule's ``cpus_per_task``), ``SLURM_CPUS_PER_TASK`` when the
job runs under SLURM, and otherwise the CPUs this process may run on (``os.sched_getaffinity``), never
``os.cpu_count()`` (a container or a cgroup may allow fewer).

A process loads four thread pools: torch's OpenMP (the encoder), FAISS's OpenMP and its OpenBLAS (the kNN
search), and numpy's OpenBLAS (the exact scores of the candidates). Left alone, each starts one thread per
core of the machine and keeps its idle threads spinning for a while after every call; when the calls alternate
(encode a batch, search it, score it) the spinning threads of one library take the cores another one needs, and
two threads ran slower than one (closed-set kNN scoring: 7.6 queries/s on one thread, 5.8 on two). The policy:

* torch and FAISS (OpenMP and BLAS): ``n`` threads each; they run one after the other, never at once;
* numpy's BLAS: one thread. Its products here are matrix-vector products of a few thousand rows, where a second
  thread costs more in wake-up and spinning than it saves;
* Lucene's batch search: ``n`` threads (``threads()`` read by ``npm.inference.predictor``);
* torch inter-op parallelism: one thread (the models here run one operator at a time).

``set_threads`` applies it; ``npm-repro`` commands that compute call it once, before any work. Measured effect:
benchmarks/predict.py (results/benchmarks/predict-*.json).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("npm-repro.threads")
HELP = ("CPU threads of torch, FAISS and Lucene (npm.threads); default: SLURM_CPUS_PER_TASK, else the CPUs this "
        "process may use")  # the --threads option of every command that applies the policy

_applied: int | None = None


def cpu_count(explicit: int | None = None) -> int:
    """The job's CPU count: ``explicit`` if given, else ``SLURM_CPUS_PER_TASK``, else the CPUs this process may run
    on. A SLURM value that is not a positive integer is ignored with a warning."""
    if explicit is not None:
        if int(explicit) < 1:
            raise ValueError(f"threads must be a positive integer, got {explicit}")
        return int(explicit)
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm:
        try:
            n = int(slurm)
            if n >= 1:
                return n
        except ValueError:
            pass
        log.warning("SLURM_CPUS_PER_TASK=%r is not a positive integer; using the CPUs this process may run on", slurm)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_threads(n: int | None = None) -> int:
    """Apply the policy (module docstring) for ``cpu_count(n)`` threads to every library loaded now or later in
    this process; returns that count. Importing torch and FAISS here is intended: their pools exist from then on."""
    global _applied
    n = cpu_count(n)
    import faiss
    import torch

    # BLAS libraries loaded later (scipy's OpenBLAS, through pyserini or transformers) read this when they load.
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only settable before the first inter-op parallel work; keep what is there
        pass
    faiss.omp_set_num_threads(n)
    for lib in _blas():
        lib.set_num_threads(n if "faiss" in lib.filepath else 1)
    _applied = n
    return n


def threads() -> int:
    """The thread count the policy was applied with (``cpu_count()`` when ``set_threads`` has not run)."""
    return _applied if _applied is not None else cpu_count()


def _blas() -> list:
    """threadpoolctl's controller of every BLAS library loaded in this process."""
    from threadpoolctl import ThreadpoolController

    return [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]


def describe() -> dict:
    """Thread counts now in force per library (recorded with benchmark and evaluation results)."""
    import sys

    out: dict = {"policy": _applied}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.get_num_threads()
    faiss = sys.modules.get("faiss")
    if faiss is not None:
        out["faiss_openmp"] = faiss.omp_get_max_threads()
    for lib in _blas():
        folder, name = os.path.split(lib.filepath)
        out[f"blas:{os.path.basename(folder)}/{name}"] = lib.num_threads
    return out
