"""The thread policy (npm.threads): one CPU count, from --threads, SLURM_CPUS_PER_TASK or the CPUs this process may
use, applied to torch, FAISS (OpenMP and its BLAS) and numpy's BLAS (one thread), and passed by the workflow."""

import os

import pytest

from npm.threads import cpu_count, describe, set_threads


def test_cpu_count_prefers_the_option_then_slurm_then_the_affinity(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert cpu_count() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert cpu_count() == 3
    assert cpu_count(5) == 5
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "lots")
    assert cpu_count() == len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="positive"):
        cpu_count(0)


def test_set_threads_reaches_torch_faiss_and_blas():
    import torch

    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1
        now = describe()
        assert now["policy"] == now["torch"] == now["faiss_openmp"] == 1
        assert all(v == 1 for k, v in now.items() if k.startswith("blas:"))
        set_threads(2)
        now = describe()
        assert now["torch"] == now["faiss_openmp"] == 2
        faiss_blas = [v for k, v in now.items() if k.startswith("blas:") and "faiss" in k]
        other_blas = [v for k, v in now.items() if k.startswith("blas:") and "faiss" not in k]
        assert all(v == 2 for v in faiss_blas) and all(v == 1 for v in other_blas)
    finally:
        set_threads(before)
