"""Embed a reference corpus into a datastore: streaming fp16 vectors, sharded and resumable (paper-map §3.3).

``embed_corpus`` reads blocks files (docs/data-contracts.md), decides the stored positions with
``npm.datastore.store.stored_mask`` (the rule the loader re-applies), and runs the encoder over batches of blocks
padded with id 0 / attention 0 (``npm.data.blocks.pad_blocks``). The vector of a position is the encoder's final
hidden layer (paper-map §3.3: ``hidden_states[-1]``, not the LM head), cast to fp16 and written straight into the
shard's raw memmap at its row: nothing is accumulated in RAM (paper-map §3.3's "RAM trap").

Shards cover ``shard_blocks`` consecutive blocks. A finished shard is marked by an atomically written
``embeddings/shard{k}.done.json``; a re-run keeps every shard whose marker matches the plan (same model, tokens,
stop words and sharding) and redoes the others from scratch, so a killed job loses at most one shard.
``meta.json`` is written last, atomically; its presence means the datastore is complete. The layout is in
``npm.datastore.store``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from npm.data.blocks import load_blocks, pad_blocks
from npm.datastore.store import (
    EMBEDDINGS,
    FORMAT_VERSION,
    META,
    STOPWORDS,
    STORED,
    TOKENS,
    VECTOR_DTYPE,
    derive_stopword_ids,
    done_path,
    model_fingerprint,
    shard_path,
    stored_mask,
)
from npm.io import atomic_path, provenance, save_npz
from npm.model import encode, load_encoder, load_tokenizer

SORT_WINDOW_BATCHES = 16  # blocks are sorted by length inside windows of this many batches (less padding)


# ------------------------------------------------------------------------------------------ token arrays


def gather_tokens(blocks_paths: Sequence[str | Path], stopword_ids: np.ndarray | None,
                  vocab_size: int | None = None) -> dict[str, np.ndarray]:
    """The datastore's token arrays (``tokens.npz`` of ``npm.datastore.store``) over ``blocks_paths`` in order.

    Each blocks file is loaded in turn; ``stored_mask`` is applied to it (the rule is block-local) and its
    STORED bit is set in ``flags``. Ids are kept as uint16 when the vocabulary has at most 65536 ids, else int32.
    """
    if not blocks_paths:
        raise ValueError("no blocks files to embed")
    ids_parts, flag_parts, offset_parts, row_parts, src_offsets = [], [], [], [], [0]
    n_tokens = n_rows = 0
    small = vocab_size is not None and vocab_size <= 1 << 16
    for path in blocks_paths:
        blocks = load_blocks(path)
        ids, flags, bo = blocks["input_ids"], blocks["flags"].astype(np.uint8), blocks["block_offsets"]
        if len(bo) < 2 or bo[0] != 0 or bo[-1] != len(ids) or np.any(np.diff(bo) < 0):
            raise ValueError(f"{path}: block_offsets do not cover input_ids; rebuild the blocks file")
        max_id = int(ids.max()) if len(ids) else -1
        if vocab_size is not None and max_id >= vocab_size:
            raise ValueError(f"{path} holds token id {max_id}, but the encoder's vocabulary has {vocab_size} ids: "
                             "the blocks were made with another tokenizer")
        mask = stored_mask(ids, flags, bo, stopword_ids)
        flags = flags | (mask.astype(np.uint8) * np.uint8(STORED))
        counts = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])[bo]
        ids_parts.append(ids.astype(np.uint16 if small else np.int32))
        flag_parts.append(flags)
        offset_parts.append(bo[:-1] + n_tokens)
        row_parts.append(counts[:-1] + n_rows)
        n_tokens += len(ids)
        n_rows += int(counts[-1])
        src_offsets.append(src_offsets[-1] + len(bo) - 1)
    return {
        "input_ids": np.concatenate(ids_parts),
        "flags": np.concatenate(flag_parts),
        "block_offsets": np.concatenate(offset_parts + [[n_tokens]]).astype(np.int64),
        "row_offsets": np.concatenate(row_parts + [[n_rows]]).astype(np.int64),
        "source_block_offsets": np.array(src_offsets, dtype=np.int64),
        "sources": np.array([str(p) for p in blocks_paths], dtype=str),
    }


def plan_batches(lengths: np.ndarray, first: int, last: int, batch_blocks: int,
                 window_batches: int = SORT_WINDOW_BATCHES) -> list[np.ndarray]:
    """Global block indices of each batch over blocks [first, last).

    Inside windows of ``window_batches * batch_blocks`` consecutive blocks, blocks are sorted by length (longest
    first, stable) so that a batch pads to similar lengths. Rows stay in corpus order because each block's vectors
    are written at its own rows, whatever the processing order.
    """
    batches = []
    window = max(1, window_batches) * batch_blocks
    for a in range(first, last, window):
        idx = np.arange(a, min(a + window, last), dtype=np.int64)
        idx = idx[np.argsort(-lengths[idx], kind="stable")]
        batches.extend(idx[i:i + batch_blocks] for i in range(0, len(idx), batch_blocks))
    return batches


def batch_inputs(arrays: dict[str, np.ndarray], batch: np.ndarray, length: int | None = None):
    """(ids int64 [B, L], attention int64 [B, L], stored bool [B, L]) of the blocks ``batch``, padded with id 0 and
    attention 0 to ``length`` (default: the batch's longest block)."""
    bo = arrays["block_offsets"]
    lengths = bo[batch + 1] - bo[batch]
    ids, attention = pad_blocks(arrays["input_ids"], bo, batch, int(lengths.max()) if length is None else length)
    att = attention.astype(bool)
    stored = np.zeros_like(att)
    stored[att] = (arrays["flags"][(bo[batch][:, None] + np.arange(att.shape[1]))[att]] & STORED) != 0
    return ids, attention, stored


def _destination(row_offsets: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Global rows of the stored positions of ``batch``'s blocks, in (batch item, position) order."""
    counts = row_offsets[batch + 1] - row_offsets[batch]
    total = int(counts.sum())
    shift = np.repeat(row_offsets[batch] - (np.cumsum(counts) - counts), counts)
    return shift + np.arange(total, dtype=np.int64)


# ----------------------------------------------------------------------------------------------- helpers


def plan_hash(arrays: dict[str, np.ndarray], stopword_ids: np.ndarray, settings: dict) -> str:
    """What the vectors of a shard depend on: settings (model fingerprint, sharding, ...) and the token arrays."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for key in ("input_ids", "flags", "block_offsets", "row_offsets"):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).view(np.uint8).data)
    h.update(np.ascontiguousarray(stopword_ids, dtype=np.int64).view(np.uint8).data)
    return h.hexdigest()


def _write_json(path: Path, record: dict) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _shard_is_done(root: Path, k: int, plan: str, rows: int, hidden: int) -> bool:
    marker = done_path(root, k)
    if not marker.exists():
        return False
    try:
        done = json.loads(marker.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    f = shard_path(root, k)
    return (done.get("plan") == plan and done.get("n_rows") == rows and f.exists()
            and f.stat().st_size == rows * hidden * np.dtype(VECTOR_DTYPE).itemsize)


def _remove_stale(root: Path, n_shards: int) -> None:
    """Delete shard files and markers of shards >= n_shards (left by an earlier run with other sharding)."""
    folder = root / EMBEDDINGS
    for f in folder.glob("shard*"):
        num = f.name[len("shard"):].split(".")[0]
        if num.isdigit() and int(num) >= n_shards:
            f.unlink()


def _autocast(device: str, precision: str):
    import torch

    if device.startswith("cuda") and precision in ("fp16", "bf16"):
        return torch.autocast("cuda", dtype=torch.float16 if precision == "fp16" else torch.bfloat16)
    return contextlib.nullcontext()


# -------------------------------------------------------------------------------------------------- main


def embed_corpus(model_name: str, blocks_paths: Sequence[str | Path], out_dir: str | Path,
                 drop_stopwords: bool = False, batch_blocks: int = 64, shard_blocks: int = 50_000,
                 max_length: int | None = None, device: str | None = None, precision: str = "fp16",
                 tokenizer_name: str | None = None, on_shard_done: Callable[[int, dict], None] | None = None,
                 progress: bool = True) -> dict:
    """Embed the blocks files ``blocks_paths`` (in order) with encoder ``model_name`` into the datastore ``out_dir``.

    ``drop_stopwords``: leave stop-word ids out of the rows (open-set corpora, paper-map §3.3-§3.4).
    ``batch_blocks`` blocks per encoder pass; ``shard_blocks`` blocks per vector shard (the unit of resumption).
    ``max_length``: pad every batch to this length (the original pads to 256); default: the batch's longest block.
    ``device``: default ``cuda`` when available. ``precision``: ``fp16`` / ``bf16`` autocast on CUDA, or ``fp32``;
    CPU always runs fp32. ``tokenizer_name`` (default ``model_name``) gives the stop list. ``on_shard_done(k,
    info)`` is called after shard k is marked done. Returns counts, seconds and tokens/s.
    """
    import torch
    from tqdm import tqdm

    if precision not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"precision must be fp16, bf16 or fp32, not {precision!r}")
    if batch_blocks < 1 or shard_blocks < 1:
        raise ValueError("batch_blocks and shard_blocks must be >= 1")
    t_start = time.perf_counter()
    root = Path(out_dir)
    (root / META).unlink(missing_ok=True)  # the datastore is incomplete from here until meta.json is rewritten
    (root / EMBEDDINGS).mkdir(parents=True, exist_ok=True)

    fingerprint = model_fingerprint(model_name)
    tokenizer_name = tokenizer_name or model_name
    tokenizer = load_tokenizer(tokenizer_name)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_encoder(model_name).to(device).eval()
    hidden = int(model.config.hidden_size)
    effective_precision = precision if device.startswith("cuda") else "fp32"

    stopword_ids = derive_stopword_ids(tokenizer)
    arrays = gather_tokens(blocks_paths, stopword_ids if drop_stopwords else None,
                           getattr(model.config, "vocab_size", None))
    bo, ro = arrays["block_offsets"], arrays["row_offsets"]
    n_blocks, n_tokens, n_rows = len(bo) - 1, int(bo[-1]), int(ro[-1])
    if n_rows == 0:
        raise ValueError(f"the corpus ({n_blocks} blocks, {n_tokens} tokens) has no position to store: no valid "
                         "start/end that is not special" + (" or a stop word" if drop_stopwords else ""))
    lengths = np.diff(bo)
    if max_length is not None and lengths.max() > max_length:
        raise ValueError(f"a block has {int(lengths.max())} tokens, more than max_length={max_length}")
    settings = {"format_version": FORMAT_VERSION, "model_fingerprint": fingerprint, "hidden_size": hidden,
                "drop_stopwords": bool(drop_stopwords), "shard_blocks": int(shard_blocks),
                "max_length": max_length, "precision": effective_precision}
    plan = plan_hash(arrays, stopword_ids, settings)
    save_npz(root / TOKENS, **arrays)
    with atomic_path(root / STOPWORDS) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, stopword_ids)

    n_shards = -(-n_blocks // shard_blocks)
    _remove_stale(root, n_shards)
    shards, todo = [], []
    for k in range(n_shards):
        b0, b1 = k * shard_blocks, min(n_blocks, (k + 1) * shard_blocks)
        r0, r1 = int(ro[b0]), int(ro[b1])
        shards.append({"file": f"{EMBEDDINGS}/{shard_path(root, k).name}", "rows": [r0, r1], "blocks": [b0, b1]})
        if not _shard_is_done(root, k, plan, r1 - r0, hidden):
            todo.append(k)
    tokens_todo = int(sum(bo[shards[k]["blocks"][1]] - bo[shards[k]["blocks"][0]] for k in todo))

    bar = tqdm(total=tokens_todo, unit="tok", unit_scale=True, desc=f"embed {root.name}", disable=not progress,
               mininterval=5, smoothing=0.1)
    t_embed = time.perf_counter()
    tokens_done = 0
    try:
        for k in todo:
            t_shard = time.perf_counter()
            (b0, b1), (r0, r1) = shards[k]["blocks"], shards[k]["rows"]
            done_path(root, k).unlink(missing_ok=True)
            f = shard_path(root, k)
            f.unlink(missing_ok=True)  # redo from scratch, in a new file
            if r1 == r0:
                f.touch()
            else:
                out = np.memmap(f, dtype=VECTOR_DTYPE, mode="w+", shape=(r1 - r0, hidden))
                with torch.inference_mode(), _autocast(device, effective_precision):
                    for batch in plan_batches(lengths, b0, b1, batch_blocks):
                        ids, attention, stored = batch_inputs(arrays, batch, max_length)
                        states = encode(model, torch.from_numpy(ids).to(device),
                                        torch.from_numpy(attention).to(device))
                        values = states[torch.from_numpy(stored).to(device)].to(torch.float16).cpu().numpy()
                        dest = _destination(ro, batch) - r0
                        if len(dest) and dest[-1] - dest[0] == len(dest) - 1:
                            out[dest[0]:dest[-1] + 1] = values
                        else:
                            out[dest] = values
                        n = int(attention.sum())
                        tokens_done += n
                        bar.update(n)
                        bar.set_postfix(tokens_per_s=f"{tokens_done / (time.perf_counter() - t_embed):.0f}",
                                        refresh=False)
                out.flush()
                del out
            info = {"shard": k, "n_rows": r1 - r0, "rows": [r0, r1], "blocks": [b0, b1],
                    "tokens": int(bo[b1] - bo[b0]), "seconds": round(time.perf_counter() - t_shard, 3),
                    "plan": plan}
            _write_json(done_path(root, k), info)
            if on_shard_done is not None:
                on_shard_done(k, info)
    finally:
        bar.close()
    seconds_embed = time.perf_counter() - t_embed

    non_vector = sum(a.nbytes for a in arrays.values() if a.dtype.kind != "U") + stopword_ids.nbytes
    summary = {
        "n_tokens": n_tokens, "n_blocks": n_blocks, "n_rows": n_rows, "hidden_size": hidden,
        "shards": n_shards, "shards_embedded": len(todo), "shards_reused": n_shards - len(todo),
        "tokens_embedded": tokens_done, "seconds": round(time.perf_counter() - t_start, 3),
        "seconds_embedding": round(seconds_embed, 3),
        "tokens_per_s": round(tokens_done / seconds_embed, 1) if tokens_done else None,
        "rows_per_token": round(n_rows / max(n_tokens, 1), 4),
        "bytes_per_token_vectors": round(n_rows * hidden * np.dtype(VECTOR_DTYPE).itemsize / max(n_tokens, 1), 3),
        "bytes_per_token_non_vector": round(non_vector / max(n_tokens, 1), 3),
        "disk_bytes_per_token_non_vector": round(((root / TOKENS).stat().st_size + (root / STOPWORDS).stat().st_size)
                                                 / max(n_tokens, 1), 3),
        "device": device, "precision": effective_precision,
    }
    meta = {
        "format_version": FORMAT_VERSION, "model": model_name, "model_fingerprint": fingerprint,
        "tokenizer": tokenizer_name, "hidden_size": hidden, "dtype": "float16", "input_ids_dtype":
        str(arrays["input_ids"].dtype), "n_tokens": n_tokens, "n_blocks": n_blocks, "n_rows": n_rows,
        "shards": shards, "shard_blocks": shard_blocks, "drop_stopwords": bool(drop_stopwords),
        "n_stopword_ids": len(stopword_ids), "sources": [str(p) for p in blocks_paths], "max_length": max_length,
        "precision": effective_precision, "plan": plan,
        "stored_rule": "npm.boundaries valid_start | valid_end, not special" + (", not a stop word"
                                                                                if drop_stopwords else ""),
        "bytes_per_token_non_vector": summary["bytes_per_token_non_vector"],
        "disk_bytes_per_token_non_vector": summary["disk_bytes_per_token_non_vector"],
        "bytes_per_token_vectors": summary["bytes_per_token_vectors"],
        "provenance": provenance({"model": model_name, "blocks": [str(p) for p in blocks_paths],
                                  "drop_stopwords": drop_stopwords, "batch_blocks": batch_blocks,
                                  "shard_blocks": shard_blocks, "max_length": max_length, "device": device,
                                  "precision": precision}),
    }
    _write_json(root / META, meta)
    return summary
