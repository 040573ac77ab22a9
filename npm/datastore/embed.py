"""Embed a reference corpus into a datastore: streaming fp16 vectors, sharded and resumable (paper-map §3.3).

``embed_corpus`` reads blocks files (docs/data-contracts.md), decides the stored positions with
``npm.datastore.store.stored_mask`` (the rule the loader re-applies), and runs the encoder over batches of blocks
padded with id 0 / attention 0 (``npm.data.blocks.pad_blocks``). The vector of a position is the encoder's final
hidden layer (paper-map §3.3: ``hidden_states[-1]``, not the LM head), cast to fp16 and written straight into the
shard's raw file at its rows (positioned writes, ``_write_rows``): nothing is accumulated in RAM (paper-map §3.3's
"RAM trap").

Three steps, which the workflow runs as separate jobs (one per shard, so a cluster embeds shards in parallel and a
failed job loses only its own shard) and ``embed_corpus`` runs in one process:

1. ``plan_datastore``: checks the model and the blocks, writes ``tokens.npz``, ``stopword_ids.npy`` and
   ``plan.json`` (the plan hash over the token arrays, the stop list, the model fingerprint and the settings, the
   ``stopwords`` switch included (paper-map §3.4: ``original`` or ``derived``); ``shards`` contiguous block ranges
   of nearly equal size). Nothing is touched when the plan is unchanged; when it changes, ``meta.json``
   is removed first, so a datastore is never half old and half new.
2. ``embed_shard``: shard k's vectors into ``embeddings/shard{k}.f16`` (space reserved up front, so a full disk is
   an error, not a SIGBUS), then its marker ``embeddings/shard{k}.done.json`` with the plan hash. A shard whose
   marker matches the plan is kept; any other is redone from scratch.
3. ``finish_datastore``: checks every shard against the plan and writes ``meta.json`` last, atomically; its presence
   means the datastore is complete. The layout is in ``npm.datastore.store``.

Two writers never interleave: plan, finish and ``embed_corpus`` hold the datastore folder's lock, a shard's vectors
its own lock (``.shard{k}.lock``); a second writer fails at once naming the first (``_locked``).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import npm.checksums as checksums
from npm.data.blocks import check_vocabulary, load_blocks, pad_blocks
from npm.datastore.store import (
    EMBEDDINGS,
    FORMAT_VERSION,
    META,
    PLAN,
    STOPWORDS,
    STOPWORDS_DEFAULT,
    STORED,
    TOKENS,
    VECTOR_DTYPE,
    done_path,
    load_datastore,
    read_plan,
    shard_path,
    stopword_ids_for,
    stored_mask,
)
from npm.fingerprint import CorpusHasher, model_fingerprint, model_folder
from npm.io import (
    atomic_path,
    folder_lock,
    load_npz,
    preallocate,
    provenance,
    remove_lock_leftovers,
    save_npz,
    write_json,
)
from npm.model import autocast, effective_precision, encode, load_encoder, load_tokenizer, max_input_length
from npm.progress import bar as progress_bar
from npm.settings import DatastoreSettings
from npm.threads import cpu_count

PIPELINE_BATCHES = 4  # batches prepared ahead, and batches on their way to the shard file (``_embed_rows``)
SYNC_BYTES = 1 << 26  # the writer flushes the shard file to disk after every this many bytes of vectors
WRITE_THREADS = 8  # at most: the writer's pool (hashing, positioned writes, flushes; at least 2, half the job's CPUs)


def write_threads() -> int:
    """The size of the embedding writer's pool: ``WRITE_THREADS`` at most, half the job's CPUs, 2 at least."""
    return min(WRITE_THREADS, max(2, cpu_count() // 2))


# ------------------------------------------------------------------------------------------ token arrays


def gather_tokens(blocks_paths: Sequence[str | Path], stopword_ids: np.ndarray | None,
                  vocab_size: int | None = None, corpus: CorpusHasher | None = None) -> dict[str, np.ndarray]:
    """The datastore's token arrays (``tokens.npz`` of ``npm.datastore.store``) over ``blocks_paths`` in order.

    Each blocks file is loaded in turn (checked, its token spans too: ``load_blocks(text=True)``) and fed to
    ``corpus`` when given; ``stored_mask`` is applied to it (the rule is block-local) and its STORED bit is set in
    ``flags``. Ids are kept as uint16 when the vocabulary has at most 65536 ids, else int32.
    """
    if not blocks_paths:
        raise ValueError("no blocks files to embed")
    ids_parts, flag_parts, offset_parts, row_parts, src_offsets = [], [], [], [], [0]
    n_tokens = n_rows = 0
    small = vocab_size is not None and vocab_size <= 1 << 16
    for path in blocks_paths:
        blocks = load_blocks(path, text=True)
        ids, flags, bo = blocks["input_ids"], blocks["flags"].astype(np.uint8), blocks["block_offsets"]
        if len(bo) < 2 or bo[0] != 0 or bo[-1] != len(ids) or np.any(np.diff(bo) < 0):
            raise ValueError(f"{path}: block_offsets do not cover input_ids; rebuild the blocks file")
        if corpus is not None:
            corpus.update(ids, bo, blocks["token_spans"])
        if vocab_size is not None:
            check_vocabulary(path, ids, vocab_size)
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


def plan_batches(lengths: np.ndarray, first: int, last: int, batch_blocks: int) -> list[np.ndarray]:
    """Global block indices of each batch over blocks [first, last): the blocks sorted by length (longest first,
    stable), cut into batches of ``batch_blocks``, so that a batch pads to similar lengths. Sorting the whole range
    (a shard) rather than windows of 16 batches cut the padding of 4,096 Wikipedia-lead blocks at 64 blocks per
    batch from 6.7 % to 1.7 % (benchmarks/embed.py). Rows stay in corpus order because each block's vectors are
    written at its own rows, whatever the processing order."""
    idx = np.arange(first, last, dtype=np.int64)
    idx = idx[np.argsort(-lengths[idx], kind="stable")]
    return [idx[i:i + batch_blocks] for i in range(0, len(idx), batch_blocks)]


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


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """int64: the concatenation of ``arange(starts[i], ends[i])``."""
    lengths = (ends - starts).astype(np.int64)
    return np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))


def _destination(row_offsets: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Global rows of the stored positions of ``batch``'s blocks, in (batch item, position) order."""
    return _ranges(row_offsets[batch], row_offsets[batch + 1])


# ----------------------------------------------------------------------------------------------- helpers


def plan_hash(arrays: dict[str, np.ndarray], stopword_ids: np.ndarray, settings: dict) -> str:
    """What the vectors of a shard depend on: settings (model fingerprint, sharding, ...) and the token arrays."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for key in ("input_ids", "flags", "block_offsets", "row_offsets"):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).view(np.uint8).data)
    h.update(np.ascontiguousarray(stopword_ids, dtype=np.int64).view(np.uint8).data)
    return h.hexdigest()


def shard_ranges(n_blocks: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous block ranges [b0, b1) covering ``n_blocks`` blocks, of sizes differing by at most one."""
    bounds = [n_blocks * k // shards for k in range(shards + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _read_done(root: Path, k: int) -> dict | None:
    try:
        return json.loads(done_path(root, k).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def _shard_is_done(root: Path, k: int, plan: str, rows: int, hidden: int) -> bool:
    done = _read_done(root, k)
    f = shard_path(root, k)
    return (done is not None and done.get("plan") == plan and done.get("n_rows") == rows and f.exists()
            and f.stat().st_size == rows * hidden * np.dtype(VECTOR_DTYPE).itemsize)


def _missing_shards(root: Path, plan: dict) -> list[int]:
    """The shards of ``plan`` not (yet) embedded for it, in order."""
    return [k for k, sh in enumerate(plan["shards"])
            if not _shard_is_done(root, k, plan["plan"], sh["rows"][1] - sh["rows"][0], plan["hidden_size"])]


def _non_vector_bytes(plan: dict) -> int:
    """RAM bytes of the token arrays and stop list of a planned datastore (``tokens.npz`` without ``sources``),
    from the plan's counts."""
    n_tokens, n_blocks, n_sources = plan["n_tokens"], plan["n_blocks"], len(plan["sources"])
    return (n_tokens * (np.dtype(plan["input_ids_dtype"]).itemsize + 1)  # input_ids + flags (uint8)
            + 8 * (2 * (n_blocks + 1) + n_sources + 1)  # block_offsets, row_offsets, source_block_offsets (int64)
            + 8 * plan["n_stopword_ids"])


def _remove_stale(root: Path, n_shards: int) -> None:
    """Delete shard files and markers of shards >= n_shards (left by an earlier run with other sharding)."""
    folder = root / EMBEDDINGS
    for f in folder.glob("shard*"):
        num = f.name[len("shard"):].split(".")[0]
        if num.isdigit() and int(num) >= n_shards:
            f.unlink()


# ------------------------------------------------------------------------------------------------- steps


def _locked(folder: str, shard: str | None = None):
    """Decorator: the step runs holding the lock of its datastore folder (its argument named ``folder``), or, given
    ``shard`` (the argument holding the shard number), of that one shard, so that shards of one datastore still run
    as parallel jobs. A second writer of the same folder or shard fails at once with one line naming the first
    (pid, host, start time; ``npm.io.folder_lock``)."""
    def wrap(step):
        signature = inspect.signature(step)

        @functools.wraps(step)
        def locked(*args, **kwargs):
            given = signature.bind(*args, **kwargs).arguments
            root = Path(given[folder])
            lock = (folder_lock(root, "embedding", reentrant=True) if shard is None
                    else folder_lock(root, f"embedding of shard {given[shard]}", name=f".shard{given[shard]}.lock",
                                     reentrant=True))
            existed = root.exists()
            try:
                with lock:
                    return step(*args, **kwargs)
            except BaseException:
                if not existed:  # a step that failed its checks leaves no folder behind, not even its lock file
                    remove_lock_leftovers(root)
                raise
        return locked
    return wrap


@_locked("out_dir")
def plan_datastore(model_name: str, blocks_paths: Sequence[str | Path], out_dir: str | Path,
                   drop_stopwords: bool = DatastoreSettings.drop_stopwords, shards: int = 1,
                   max_length: int | None = None,
                   precision: str = DatastoreSettings.precision, tokenizer_name: str | None = None,
                   stopwords: str = STOPWORDS_DEFAULT) -> dict:
    """Step 1: check the model and the blocks, and write the datastore's token arrays and ``plan.json``.

    ``stopwords``: the stop list (``npm.datastore.store.STOPWORD_LISTS``, paper-map §3.4): ``original`` (the
    original's 211 roberta-large ids; any other vocabulary is an error) or ``derived`` (from the tokenizer).

    Everything is checked before anything is written: a missing model, foreign blocks or an empty corpus leaves an
    existing datastore untouched. An unchanged plan writes nothing (a complete datastore stays complete). Returns
    the plan record (``plan.json``)."""
    return _plan(model_name, blocks_paths, out_dir, drop_stopwords, shards, max_length, precision, tokenizer_name,
                 stopwords)[0]


def _plan(model_name, blocks_paths, out_dir, drop_stopwords, shards, max_length, precision, tokenizer_name,
          stopwords) -> tuple[dict, dict[str, np.ndarray]]:
    """``plan_datastore``, also returning the token arrays (``tokens.npz``) it gathered."""
    from transformers import AutoConfig

    if precision not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"precision must be fp16, bf16 or fp32, not {precision!r}")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    root = Path(out_dir)
    fingerprint = model_fingerprint(model_name)
    config = AutoConfig.from_pretrained(model_folder(model_name))
    hidden = int(config.hidden_size)
    tokenizer_name = tokenizer_name or model_name
    tokenizer = load_tokenizer(tokenizer_name)
    stopword_ids = stopword_ids_for(tokenizer, stopwords)
    corpus = CorpusHasher()
    arrays = gather_tokens(blocks_paths, stopword_ids if drop_stopwords else None, getattr(config, "vocab_size", None),
                           corpus)
    _check_positions(arrays, blocks_paths, max_input_length(SimpleNamespace(config=config), tokenizer), model_name)
    bo, ro = arrays["block_offsets"], arrays["row_offsets"]
    n_blocks, n_tokens, n_rows = len(bo) - 1, int(bo[-1]), int(ro[-1])
    if n_rows == 0:
        raise ValueError(f"the corpus ({n_blocks} blocks, {n_tokens} tokens) has no position to store: no valid "
                         "start/end that is not special" + (" or a stop word" if drop_stopwords else ""))
    lengths = np.diff(bo)
    if max_length is not None and lengths.max() > max_length:
        raise ValueError(f"a block has {int(lengths.max())} tokens, more than max_length={max_length}")
    settings = {"format_version": FORMAT_VERSION, "model_fingerprint": fingerprint, "hidden_size": hidden,
                "drop_stopwords": bool(drop_stopwords), "stopwords": stopwords, "shards": int(shards),
                "max_length": max_length, "precision": precision}
    record = {
        "format_version": FORMAT_VERSION, "plan": plan_hash(arrays, stopword_ids, settings), "model": model_name,
        "model_fingerprint": fingerprint, "tokenizer": tokenizer_name, "hidden_size": hidden, "dtype": "float16",
        "input_ids_dtype": str(arrays["input_ids"].dtype), "n_tokens": n_tokens, "n_blocks": n_blocks,
        "n_rows": n_rows, "corpus_fingerprint": corpus.hexdigest(), "drop_stopwords": bool(drop_stopwords),
        "stopwords": stopwords, "n_stopword_ids": len(stopword_ids), "sources": [str(p) for p in blocks_paths],
        "max_length": max_length, "precision": precision,
        "stored_rule": "npm.boundaries valid_start | valid_end, not special" + (", not a stop word"
                                                                                if drop_stopwords else ""),
        "shards": [{"file": f"{EMBEDDINGS}/{shard_path(root, k).name}", "rows": [int(ro[b0]), int(ro[b1])],
                    "blocks": [b0, b1]} for k, (b0, b1) in enumerate(shard_ranges(n_blocks, shards))],
    }
    try:
        old = read_plan(root)
        unchanged = (old["plan"], old.get("corpus_fingerprint")) == (record["plan"], record["corpus_fingerprint"])
        states = [state for _, state, _ in checksums.status(root, old.get("checksums"))]
        unchanged = unchanged and len(states) == 2 and set(states) == {"ok"}
    except (FileNotFoundError, ValueError):
        unchanged = False
    if unchanged:  # the same token arrays, written and still intact: nothing to do
        return {**record, "checksums": old["checksums"]}, arrays
    (root / META).unlink(missing_ok=True)  # the datastore changes: incomplete until finish_datastore
    (root / EMBEDDINGS).mkdir(parents=True, exist_ok=True)
    save_npz(root / TOKENS, **arrays)
    with atomic_path(root / STOPWORDS) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, stopword_ids)
    _remove_stale(root, shards)
    command = (f"npm-repro embed --step plan --checkpoint {model_name} --blocks {' '.join(map(str, blocks_paths))} "
               f"--out {root}")
    record["checksums"] = {name: checksums.entry(root / name, "plan_datastore", command)
                           for name in (TOKENS, STOPWORDS)}
    write_json(root / PLAN, record)
    return record, arrays


def _check_positions(arrays: dict[str, np.ndarray], blocks_paths: Sequence[str | Path], limit: int,
                     model_name: str) -> None:
    """A ValueError naming the blocks file, the block and its length when a block is longer than the encoder's
    ``limit`` positions (``npm.model.max_input_length``): refused at the plan, not by the encoder mid-shard."""
    lengths = np.diff(arrays["block_offsets"])
    if not len(lengths) or lengths.max() <= limit:
        return
    b = int(np.argmax(lengths > limit))
    src = int(np.searchsorted(arrays["source_block_offsets"], b, side="right")) - 1
    raise ValueError(f"{blocks_paths[src]}: block {b - int(arrays['source_block_offsets'][src])} has "
                     f"{int(lengths[b])} tokens, more than the {limit} positions of encoder {model_name!r} "
                     f"({int((lengths > limit).sum())} such blocks); re-tokenize the blocks with --max-seq-length "
                     f"{limit} (config data.max_seq_length) or use an encoder with more positions")


class _Encoder:
    """The encoder of a plan, loaded once, checked against the plan's fingerprint."""

    def __init__(self, plan: dict, device: str | None, precision: str | None):
        import torch

        if model_fingerprint(plan["model"]) != plan["model_fingerprint"]:
            raise ValueError(f"model {plan['model']!r} has changed since the datastore was planned (fingerprint "
                             f"{plan['model_fingerprint'][:12]}); plan it again (npm-repro embed --step plan), or, if "
                             "the model changed by accident, rebuild the model (retrain it or download it again)")
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = load_encoder(plan["model"]).to(self.device).eval()
        if int(self.model.config.hidden_size) != plan["hidden_size"]:
            raise ValueError(f"model {plan['model']!r} has hidden size {self.model.config.hidden_size}, the plan "
                             f"{plan['hidden_size']}")
        requested = precision or plan["precision"]
        self.precision = effective_precision(self.device, requested)


class _Threads:
    """The helper threads of ``_embed_rows`` and their bounded queues. The first exception of any thread stops the
    others (a blocked ``put`` / ``get`` gives up) and ``join`` re-raises it, with its traceback, in the caller."""

    def __init__(self):
        self.failed = threading.Event()
        self.error: BaseException | None = None
        self.threads: list[threading.Thread] = []

    def start(self, fn: Callable[[], None]) -> None:
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller by join
                self.fail(e)

        self.threads.append(threading.Thread(target=run, daemon=True, name=f"embed-{fn.__name__}"))
        self.threads[-1].start()

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.failed.set()

    def put(self, q: queue.Queue, item) -> None:
        while True:
            if self.failed.is_set():
                raise _Stopped
            try:
                return q.put(item, timeout=0.1)
            except queue.Full:
                pass

    def get(self, q: queue.Queue):
        while True:
            if self.failed.is_set():
                raise _Stopped
            try:
                return q.get(timeout=0.1)
            except queue.Empty:
                pass

    def join(self) -> None:
        for t in self.threads:
            t.join()
        if self.error is not None:
            raise self.error


def _write_rows(fd: int, values: np.ndarray, dest: np.ndarray, digest: checksums.WriteDigest,
                pool: ThreadPoolExecutor | None = None) -> None:
    """Write row i of ``values`` at row ``dest[i]`` of the raw file ``fd``, one positioned write per run of
    consecutive rows (a block's rows are one run), and feed the runs to the file's ``digest`` (its checksum, taken
    from these bytes, not by reading the file back). With ``pool``, the writes run in one of its threads while the
    others hash (``WriteDigest.update_many``); returns when both are done, so ``values`` may be reused. Measured on a
    fresh preallocated file: 3.1 GB/s, against 0.33-0.47 GB/s for the same rows assigned into an np.memmap of it
    (its page faults)."""
    if not len(dest):
        return
    row_bytes = values.shape[1] * values.itemsize
    cuts = np.flatnonzero(np.diff(dest) != 1) + 1
    runs = [(int(dest[a]) * row_bytes, memoryview(np.ascontiguousarray(values[a:b])).cast("B"))
            for a, b in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(dest)]]).tolist(),
                            strict=True)]
    written = pool.submit(_pwrite_runs, fd, runs) if pool is not None else None
    digest.update_many(runs, pool)
    if written is None:
        _pwrite_runs(fd, runs)
    else:
        written.result()


def _pwrite_runs(fd: int, runs: list[tuple[int, memoryview]]) -> None:
    """Each (offset, bytes) of ``runs`` written at its offset of ``fd``."""
    for offset, view in runs:
        while view:  # a write may be short
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n


class _Stopped(Exception):
    """Another thread of ``_Threads`` failed: this one stops; ``_Threads.join`` raises that thread's error."""


def _embed_rows(encoder: _Encoder, arrays: dict, lengths: np.ndarray, blocks: tuple[int, int],
                rows: tuple[int, int], fd: int, digest: checksums.WriteDigest, batch_blocks: int,
                max_length: int | None, bar) -> int:
    """Encode blocks [b0, b1) and write their stored rows [r0, r1) into the shard file open as ``fd`` (its row 0 is
    row r0 of the datastore), feeding them to its ``digest``; tokens seen.

    A pipeline that keeps the encoder busy: a producer thread pads the next batches (``batch_inputs``; into pinned
    host memory on CUDA) while the encoder runs; inputs go to the device without waiting; the stored rows are picked
    on the device by index (no host sync), cast to fp16 and copied back without waiting into one of
    ``PIPELINE_BATCHES`` reused pinned buffers, with a CUDA event; a writer thread waits for the event and writes
    the rows into the file (``_write_rows``), flushing it to disk every ``SYNC_BYTES``. Nothing here makes the main
    thread wait for the device (the encoder's own code may). On CPU the same threads run with plain tensors (torch
    releases the GIL). At most ``PIPELINE_BATCHES`` batches wait on each side (bounded memory); an error in any
    thread is raised here."""
    import torch

    cuda = torch.device(encoder.device).type == "cuda"
    hidden = int(encoder.model.config.hidden_size)
    threads = _Threads()
    ready: queue.Queue = queue.Queue(PIPELINE_BATCHES)  # padded inputs of the next batches
    written: queue.Queue = queue.Queue(PIPELINE_BATCHES)  # rows on their way into the file
    free: queue.Queue = queue.Queue()  # CUDA: pinned output buffers the writer is done with
    for slot in range(PIPELINE_BATCHES):
        free.put(slot)
    pool = ThreadPoolExecutor(write_threads(), thread_name_prefix="embed-write-pool")

    def produce():  # the threads' names (embed-produce, embed-write) are these functions'
        _produce_batches(threads, ready, arrays, lengths, blocks, rows, batch_blocks, max_length, cuda)

    def write():
        _write_batches(threads, written, free, fd, digest, hidden, pool)

    tokens = 0
    threads.start(produce)
    threads.start(write)
    try:
        tokens = _encode_batches(encoder, threads, ready, written, free, hidden, cuda, bar)
    except _Stopped:
        pass
    except BaseException as e:
        threads.fail(e)
    try:
        threads.join()
    finally:
        pool.shutdown()
    return tokens


def _produce_batches(threads: _Threads, ready: queue.Queue, arrays: dict, lengths: np.ndarray,
                     blocks: tuple[int, int], rows: tuple[int, int], batch_blocks: int, max_length: int | None,
                     cuda: bool) -> None:
    """The producer thread of ``_embed_rows``: the padded inputs of each batch of blocks (pinned on CUDA), their
    stored rows' destinations in the shard file and their token count onto ``ready``; None after the last."""
    import torch

    (b0, b1), (r0, r1) = blocks, rows
    ro = arrays["row_offsets"]
    for batch in plan_batches(lengths, b0, b1, batch_blocks):
        ids, attention, stored = batch_inputs(arrays, batch, max_length)
        flat, dest = np.flatnonzero(stored), _destination(ro, batch) - r0
        if len(flat) != len(dest) or (len(dest) and (dest.min() < 0 or dest.max() >= r1 - r0)):
            raise ValueError(f"tokens.npz: blocks {batch.min()}..{batch.max()} have {len(flat)} STORED positions "
                             f"but row_offsets give them {len(dest)} rows (rows {r0}..{r1} in this shard): the "
                             "token arrays are corrupt; plan the datastore again (npm-repro embed --step plan)")
        host = [torch.from_numpy(a) for a in (ids, attention, flat)]
        threads.put(ready, ([t.pin_memory() for t in host] if cuda else host, dest, int(attention.sum())))
    threads.put(ready, None)


def _write_batches(threads: _Threads, written: queue.Queue, free: queue.Queue, fd: int,
                   digest: checksums.WriteDigest, hidden: int, pool: ThreadPoolExecutor) -> None:
    """The writer thread of ``_embed_rows``: each batch's rows from ``written`` into the file (after their copy's
    CUDA event; written and hashed by ``pool``'s threads, ``_write_rows``), its pinned buffer back to ``free``, and
    every ``SYNC_BYTES`` a flush to disk in a thread of ``pool`` (one at a time: the writes go on meanwhile); until
    None."""
    unsynced, flushing = 0, None
    while (item := threads.get(written)) is not None:
        values, dest, event, slot = item
        if event is not None:
            event.synchronize()
        _write_rows(fd, values.numpy(), dest, digest, pool)
        if slot is not None:
            free.put(slot)
        unsynced += len(dest) * hidden * 2
        # write back while the encoder runs: the shard's final fsync finds little left
        if unsynced >= SYNC_BYTES and (flushing is None or flushing.done()):
            if flushing is not None:
                flushing.result()  # raises its error, if it failed
            flushing, unsynced = pool.submit(os.fdatasync, fd), 0
    if flushing is not None:
        flushing.result()


def _encode_batches(encoder: _Encoder, threads: _Threads, ready: queue.Queue, written: queue.Queue,
                    free: queue.Queue, hidden: int, cuda: bool, bar) -> int:
    """The main thread of ``_embed_rows``: encode each batch from ``ready``, pick its stored rows on the device as
    fp16 and hand them to the writer (CUDA: copied without waiting into one of ``PIPELINE_BATCHES`` reused pinned
    buffers, with an event); None to the writer after the last batch. Returns the tokens seen."""
    import torch

    ring = [torch.empty(0, hidden, dtype=torch.float16) for _ in range(PIPELINE_BATCHES)]
    tokens = 0
    with torch.inference_mode(), autocast(encoder.device, encoder.precision):
        while (item := threads.get(ready)) is not None:
            (ids, attention, flat), dest, n = item
            ids, attention, flat = (t.to(encoder.device, non_blocking=True) for t in (ids, attention, flat))
            states = encode(encoder.model, ids, attention)
            values = states.reshape(-1, hidden).index_select(0, flat).to(torch.float16)
            if cuda:
                slot = threads.get(free)
                if len(ring[slot]) < len(dest):
                    ring[slot] = torch.empty(len(dest), hidden, dtype=torch.float16, pin_memory=True)
                host = ring[slot][:len(dest)]
                host.copy_(values, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                threads.put(written, (host, dest, event, slot))
            else:
                threads.put(written, (values, dest, None, None))
            tokens += n
            bar.update(n)
        threads.put(written, None)
    return tokens


@_locked("root", shard="k")
def _embed_one(root: Path, plan: dict, arrays: dict, k: int, encoder: _Encoder, batch_blocks: int, bar) -> dict:
    """Embed shard k from scratch into a fresh file, then mark it done."""
    t0 = time.perf_counter()
    sh = plan["shards"][k]
    (b0, b1), (r0, r1) = sh["blocks"], sh["rows"]
    hidden = plan["hidden_size"]
    done_path(root, k).unlink(missing_ok=True)
    f = shard_path(root, k)
    f.unlink(missing_ok=True)
    f.parent.mkdir(parents=True, exist_ok=True)
    tokens, digest = 0, checksums.WriteDigest()
    if r1 == r0:
        f.touch()
    else:
        nbytes = (r1 - r0) * hidden * np.dtype(VECTOR_DTYPE).itemsize
        with open(f, "wb") as handle:
            preallocate(handle.fileno(), nbytes)  # ENOSPC now, rather than in the middle of the shard
        fd = os.open(f, os.O_WRONLY)
        try:
            tokens = _embed_rows(encoder, arrays, np.diff(arrays["block_offsets"]), (b0, b1), (r0, r1), fd, digest,
                                 batch_blocks, plan["max_length"], bar)
            os.fsync(fd)  # on disk before the marker says so
        finally:
            os.close(fd)
    info = {"shard": k, "n_rows": r1 - r0, "rows": [r0, r1], "blocks": [b0, b1], "tokens": tokens,
            "seconds": round(time.perf_counter() - t0, 3), "device": encoder.device, "precision": encoder.precision,
            "plan": plan["plan"],
            "checksums": {f.name: checksums.entry(f, "embed_shard", f"npm-repro embed --step shard --shard {k} "
                                                                     f"--out {root}", written=digest)}}
    write_json(done_path(root, k), info)
    return info


def _progress(total: int, name: str, progress: bool):
    return progress_bar(total=total, unit="tok", unit_scale=True, desc=f"embed {name}", show=progress, disable=False,
                        mininterval=5, smoothing=0.1)


@_locked("out_dir", shard="k")  # before the encoder loads: a second job is refused at once
def embed_shard(out_dir: str | Path, k: int, batch_blocks: int = DatastoreSettings.batch_blocks,
                device: str | None = None,
                precision: str | None = None, progress: bool = True) -> dict:
    """Step 2: embed shard ``k`` of a planned datastore (kept when its marker matches the plan). Returns the
    shard's marker record, with ``reused`` telling whether it was already done."""
    if batch_blocks < 1:
        raise ValueError("batch_blocks must be >= 1")
    root = Path(out_dir)
    plan = read_plan(root)
    if not 0 <= k < len(plan["shards"]):
        raise ValueError(f"{root / PLAN} plans shards 0..{len(plan['shards']) - 1}, not shard {k}")
    rows = plan["shards"][k]["rows"]
    if _shard_is_done(root, k, plan["plan"], rows[1] - rows[0], plan["hidden_size"]):
        return {**_read_done(root, k), "reused": True}
    checksums.verify(root, plan.get("checksums"))
    arrays = load_npz(root / TOKENS)
    encoder = _Encoder(plan, device, precision)
    b0, b1 = plan["shards"][k]["blocks"]
    bar = _progress(int(arrays["block_offsets"][b1] - arrays["block_offsets"][b0]), f"{root.name} shard {k}",
                    progress)
    try:
        return {**_embed_one(root, plan, arrays, k, encoder, batch_blocks, bar), "reused": False}
    finally:
        bar.close()


@_locked("out_dir", shard="k")
def slice_shard(out_dir: str | Path, k: int, base_dir: str | Path, chunk_rows: int = 1 << 20) -> dict:
    """Step 2 for a datastore of a subsampled corpus (Figure 7, paper 6.4): shard ``k``'s vectors are copied from
    the datastore of the full corpus ``base_dir`` instead of being encoded again. Every block is encoded on its own
    (no attention crosses blocks), so a block's vectors are the same rows in both datastores; re-embedding would
    spend GPU time on vectors that exist. The subsampled blocks file records which base block each block is
    (``source_blocks``); the model, precision and stored-row rule must be the base's, and each block's token ids and
    stored-row count are checked against the base's before a row is copied."""
    root = Path(out_dir)
    plan = read_plan(root)
    if not 0 <= k < len(plan["shards"]):
        raise ValueError(f"{root / PLAN} plans shards 0..{len(plan['shards']) - 1}, not shard {k}")
    sh = plan["shards"][k]
    (b0, b1), (r0, r1) = sh["blocks"], sh["rows"]
    if _shard_is_done(root, k, plan["plan"], r1 - r0, plan["hidden_size"]):
        return {**_read_done(root, k), "reused": True}
    t0 = time.perf_counter()
    base = load_datastore(base_dir, verify=False)  # a finished datastore; the blocks copied are checked below
    base_plan = read_plan(base_dir)
    differ = {key: (plan[key], base_plan[key]) for key in ("model_fingerprint", "hidden_size", "drop_stopwords",
                                                          "max_length", "precision") if plan[key] != base_plan[key]}
    if differ:
        raise ValueError(f"datastore {root} cannot take its vectors from {base_dir}: they differ in {differ}")
    if len(plan["sources"]) != 1 or "source_blocks" not in load_npz(plan["sources"][0]):
        raise ValueError(f"datastore {root}: its blocks {plan['sources']} are not one subsampled blocks file (with "
                         "`source_blocks`, written by subsample-blocks); embed it with --step shard instead")
    source = load_npz(plan["sources"][0])["source_blocks"].astype(np.int64)[b0:b1]
    arrays = load_npz(root / TOKENS)
    bo, ro = arrays["block_offsets"], arrays["row_offsets"]
    if len(source) and source.max() >= len(base.block_offsets) - 1:
        raise ValueError(f"{plan['sources'][0]}: source block {int(source.max())} is outside {base_dir}'s "
                         f"{len(base.block_offsets) - 1} blocks: not a subsample of that corpus")
    ours = arrays["input_ids"][bo[b0]:bo[b1]]
    theirs = base.input_ids[_ranges(base.block_offsets[source], base.block_offsets[source + 1])]
    counts = base.row_offsets[source + 1] - base.row_offsets[source]
    if not np.array_equal(ours, theirs) or not np.array_equal(np.diff(ro[b0:b1 + 1]), counts):
        raise ValueError(f"datastore {root}: the blocks of shard {k} are not the blocks {base_dir} stores at their "
                         "source_blocks (other token ids or stored rows): not a subsample of that corpus")
    rows = _ranges(base.row_offsets[source], base.row_offsets[source + 1])
    done_path(root, k).unlink(missing_ok=True)
    f = shard_path(root, k)
    f.parent.mkdir(parents=True, exist_ok=True)
    digest = checksums.WriteDigest()
    with atomic_path(f) as tmp:
        with open(tmp, "wb") as handle:
            for a in range(0, len(rows), chunk_rows):
                data = base.vectors(rows[a:a + chunk_rows]).astype(VECTOR_DTYPE).tobytes()
                digest.update(handle.tell(), data)
                handle.write(data)
    info = {"shard": k, "n_rows": r1 - r0, "rows": [r0, r1], "blocks": [b0, b1], "tokens": 0,
            "seconds": round(time.perf_counter() - t0, 3), "device": f"rows of {base.root}",
            "precision": base.meta["precision"], "plan": plan["plan"], "sliced_from": base.meta["plan"],
            "checksums": {f.name: checksums.entry(f, "slice_shard", f"npm-repro embed --step slice --shard {k} "
                                                                     f"--out {root} --base {base_dir}",
                                                  written=digest)}}
    write_json(done_path(root, k), info)
    return {**info, "reused": False}


@_locked("out_dir")
def finish_datastore(out_dir: str | Path) -> dict:
    """Step 3: check that every shard is done for the current plan and write ``meta.json`` (last, atomically).
    Returns the meta record."""
    root = Path(out_dir)
    plan = read_plan(root)
    missing = _missing_shards(root, plan)
    if missing:
        raise FileNotFoundError(f"datastore {root}: shard(s) {missing} of {len(plan['shards'])} are not embedded for "
                                "the current plan; run `npm-repro embed --step shard --shard K` for each (rule "
                                "embed_shard), then finish again")
    done = [_read_done(root, k) for k in range(len(plan["shards"]))]
    n_tokens, n_rows = max(plan["n_tokens"], 1), plan["n_rows"]
    stop_bytes = (root / STOPWORDS).stat().st_size
    meta = {**plan,
            "precision": sorted({d["precision"] for d in done}) if len({d["precision"] for d in done}) > 1
            else done[0]["precision"],
            "devices": sorted({d["device"] for d in done}),
            "bytes_per_token_vectors": round(n_rows * plan["hidden_size"] * np.dtype(VECTOR_DTYPE).itemsize / n_tokens,
                                             3),
            "bytes_per_token_non_vector": round(_non_vector_bytes(plan) / n_tokens, 3),
            "disk_bytes_per_token_non_vector": round(((root / TOKENS).stat().st_size + stop_bytes) / n_tokens, 3),
            "seconds_embedding": round(sum(d["seconds"] for d in done), 3),
            "checksums": {**plan.get("checksums", {}), **{f"{EMBEDDINGS}/{name}": e for d in done
                                                          for name, e in d.get("checksums", {}).items()}},
            "provenance": provenance({"model": plan["model"], "blocks": plan["sources"],
                                      "drop_stopwords": plan["drop_stopwords"], "stopwords": plan.get("stopwords"),
                                      "shards": len(plan["shards"]),
                                      "max_length": plan["max_length"], "precision": plan["precision"]})}
    write_json(root / META, meta)
    return meta


# -------------------------------------------------------------------------------------------------- main


@_locked("out_dir")
def embed_corpus(model_name: str, blocks_paths: Sequence[str | Path], out_dir: str | Path,
                 drop_stopwords: bool = DatastoreSettings.drop_stopwords,
                 batch_blocks: int = DatastoreSettings.batch_blocks, shards: int = DatastoreSettings.shards,
                 max_length: int | None = None, device: str | None = None, precision: str = DatastoreSettings.precision,
                 tokenizer_name: str | None = None, on_shard_done: Callable[[int, dict], None] | None = None,
                 progress: bool = True, stopwords: str = STOPWORDS_DEFAULT) -> dict:
    """Embed the blocks files ``blocks_paths`` (in order) with encoder ``model_name`` into the datastore ``out_dir``:
    the three steps in one process, the encoder loaded once; resumable (finished shards of the same plan are kept).

    ``drop_stopwords``: leave stop-word ids out of the rows (open-set corpora, paper-map §3.3-§3.4).
    ``batch_blocks`` blocks per encoder pass; ``shards`` vector shards (the unit of resumption and of the workflow's
    jobs). ``max_length``: pad every batch to this length (the original pads to 256); default: the batch's longest
    block. ``device``: default ``cuda`` when available. ``precision``: ``fp16`` / ``bf16`` autocast on CUDA, or
    ``fp32`` (``npm.model.effective_precision``: on CPU bf16 where native, else fp32). ``tokenizer_name`` (default
    ``model_name``) gives the stop list ``stopwords`` (``original`` | ``derived``, as ``plan_datastore``).
    ``on_shard_done(k, info)`` is called after shard k is marked done. Returns counts, seconds and tokens/s.
    """
    if batch_blocks < 1:
        raise ValueError("batch_blocks must be >= 1")
    t_start = time.perf_counter()
    root = Path(out_dir)
    plan, arrays = _plan(model_name, blocks_paths, root, drop_stopwords, shards, max_length, precision,
                         tokenizer_name, stopwords)
    todo = _missing_shards(root, plan)
    tokens_done, t_embed = 0, time.perf_counter()
    encoder = None
    if todo:
        bo = arrays["block_offsets"]
        encoder = _Encoder(plan, device, precision)
        bar = _progress(int(sum(bo[plan["shards"][k]["blocks"][1]] - bo[plan["shards"][k]["blocks"][0]]
                                for k in todo)), root.name, progress)
        t_embed = time.perf_counter()
        try:
            for k in todo:
                info = _embed_one(root, plan, arrays, k, encoder, batch_blocks, bar)
                tokens_done += info["tokens"]
                if on_shard_done is not None:
                    on_shard_done(k, info)
        finally:
            bar.close()
    seconds_embed = time.perf_counter() - t_embed
    meta = finish_datastore(root)
    n_tokens, n_rows = plan["n_tokens"], plan["n_rows"]
    return {
        "n_tokens": n_tokens, "n_blocks": plan["n_blocks"], "n_rows": n_rows, "hidden_size": plan["hidden_size"],
        "shards": len(plan["shards"]), "shards_embedded": len(todo), "shards_reused": len(plan["shards"]) - len(todo),
        "tokens_embedded": tokens_done, "seconds": round(time.perf_counter() - t_start, 3),
        "seconds_embedding": round(seconds_embed, 3),
        "tokens_per_s": round(tokens_done / seconds_embed, 1) if tokens_done else None,
        "rows_per_token": round(n_rows / max(n_tokens, 1), 4),
        "bytes_per_token_vectors": meta["bytes_per_token_vectors"],
        "bytes_per_token_non_vector": meta["bytes_per_token_non_vector"],
        "disk_bytes_per_token_non_vector": meta["disk_bytes_per_token_non_vector"],
        "device": encoder.device if encoder else None, "precision": meta["precision"],
    }
