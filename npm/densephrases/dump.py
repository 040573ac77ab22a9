"""The phrase dump and its index (Lee et al. 2021, sections 5-7.1 and appendix E; docs/paper-map.md §D1.4-§D1.5).

:func:`dump_shard`: every block of one blocks file (a shard of the corpus) goes through the phrase encoder, or each
of its text units alone in the original code's windows (:class:`DumpPassages`); the vectors of its tokens are kept
as fp16 rows laid end to end, the layout of NPM's datastore. A token is kept when it is not special and, with a
``filter_threshold``, when its start- or its end-filter logit exceeds it (the original code; at least the
best-filtered token of a passage stays); ``None`` keeps every non-special token. The shard folder holds
``vectors.f16`` (raw fp16 [rows, d]), one ``.npy`` per column of its part of the token table (per kept row:
``token``, its position in the blocks file, and the :class:`~npm.densephrases.search.PhraseTokens` fields, passage
and segment ids counted within the file, segments from the full token table so that no phrase crosses a dropped
special token) and ``meta.json`` (written last). The vectors go through a memmap on disk, never all in memory; a
corpus is dumped by one job per shard (rule densephrases_dump).

:func:`combine_shards`: the dump's ``meta.json``, written last, after its shards: their folders, rows and the
offsets that turn a shard's token, passage and segment ids into the corpus's (global block order), the phrase
encoder's and the corpus's fingerprints, hidden size, row counts, the filter. :class:`PhraseDump` reads a dump as one
table over its shards' memmaps (:class:`Concat`: nothing is joined, nothing per token in Python).
:func:`dump_phrases` makes a whole dump in one process (every shard, then the meta). :func:`trim_dump` writes the dump
of the rows that can begin or end a phrase (the compressed index's filter: no phrase is lost).

:func:`build_index`: the rows in a FAISS index from a factory string (``Flat``; the paper's ``IVF{n},SQ4``; the
code's ``OPQ{M},IVF{n},PQ{M}``), inner product, through ``npm.datastore.faiss_index.build_faiss_index`` over the
shards' fp16 files (the datastore's checks: a dump too small for the PQ or the lists asked for is a clear error naming
it; with ``mem_mb``, an index that does not fit is refused before training, with its size and a smaller choice;
trained on a seeded sample drawn across the shards, filled shard by shard in chunks, on a GPU when there is one),
written with a sidecar that records the dump it indexes. :func:`load_index` refuses an index of another dump or
another phrase encoder.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from npm.boundaries import SPECIAL
from npm.data.blocks import check_vocabulary, load_blocks, pad_blocks
from npm.datastore.faiss_index import build_faiss_index
from npm.densephrases.features import max_context, windows
from npm.densephrases.model import DensePhrases, load_filter_head, require_trained_filter
from npm.densephrases.search import PhraseTokens
from npm.fingerprint import corpus_fingerprint, file_fingerprint, model_fingerprint
from npm.io import atomic_dir, atomic_path, read_json, write_json
from npm.model import autocast, effective_precision, torch_device
from npm.progress import bar as progress_bar
from npm.settings import DUMP_PASSAGES, DensePhrasesSettings

COLUMNS = ("token", *(f.name for f in fields(PhraseTokens)))  # one .npy per column of a shard's token table
OFFSETS = {"token": "token_offset", "passage": "passage_offset", "segment": "segment_offset"}  # local -> global ids
WRITE_CHUNK = 1 << 16  # rows copied at a time from the encoded vectors to the shard's file
# the meta keys every shard of a dump agrees on
SHARD_KEYS = ("phrase_side", "hidden_size", "filter_threshold", "precision", "token_filter", "dump_passages")


@dataclass(frozen=True)
class DumpPassages:
    """What the phrase encoder reads when it dumps a token (config ``densephrases.dump_passages``): ``blocks``, the
    blocks file's blocks as they are (NPM's: text units packed into 256 tokens, a long unit cut without overlap); or
    ``units``, each text unit alone, as the original code reads each paragraph (``generate_phrase_vecs.py
    --max_seq_length 512 --doc_stride 500``): ``[begin] tokens [end]`` in windows of ``max_tokens`` starting every
    ``stride`` tokens (:func:`unit_windows`). Either way a token keeps its one row, its passage (block) and its
    segment in the dump's table: only its vector changes (the code's dump stores a token of two windows twice; here
    it has the vector of the window where it has the most context)."""

    form: str = DensePhrasesSettings.dump_passages
    max_tokens: int = DensePhrasesSettings.dump_max_tokens
    stride: int = DensePhrasesSettings.dump_stride

    def __post_init__(self):
        if self.form not in DUMP_PASSAGES:
            raise ValueError(f"dump passages must be one of {DUMP_PASSAGES}, got {self.form!r}")
        if self.form == "units" and not 1 <= self.stride <= self.max_tokens - 2:
            raise ValueError(f"a units window of {self.max_tokens} tokens holds {self.max_tokens - 2} of a unit; "
                             f"its stride must be 1 to {self.max_tokens - 2}, got {self.stride}")

    def record(self) -> dict:
        """The shard meta's ``dump_passages`` entry (none for blocks, so that earlier dumps read as blocks)."""
        if self.form == "blocks":
            return {}
        return {"dump_passages": {"form": self.form, "max_tokens": self.max_tokens, "stride": self.stride}}

    def check_model(self, config) -> None:
        """A ValueError when a units window is longer than the encoder's positions (``config``, a transformers
        config; RoBERTa-like position ids start after the padding id)."""
        limit = config.max_position_embeddings
        if "roberta" in getattr(config, "model_type", ""):
            limit -= (config.pad_token_id or 0) + 1
        if self.form == "units" and self.max_tokens > limit:
            raise ValueError(f"dump_max_tokens {self.max_tokens} exceeds the phrase encoder's {limit} positions; "
                             f"set densephrases.dump_max_tokens <= {limit}")

    def windows(self, arrays: dict, path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids [I], offsets int64 [n+1], rows int64 [I]) of a blocks file's ``arrays``: window w is the encoder input
        ``ids[offsets[w]:offsets[w+1]]`` (the blocks as they are, or each unit window wrapped in its unit's begin
        and end ids), and the vector at each of its positions goes to the file's token ``rows`` (-1: nowhere)."""
        if self.form == "blocks":
            n = len(arrays["input_ids"])
            return arrays["input_ids"], arrays["block_offsets"], np.arange(n, dtype=np.int64)
        positions, offsets, owner, unit = unit_windows(arrays["flags"], self.max_tokens, self.stride)
        ids, special = arrays["input_ids"], (arrays["flags"] & SPECIAL) != 0
        before, after = unit[:, 0] - 1, unit[:, 1] + 1
        if len(unit) and (before.min() < 0 or after.max() >= len(ids) or not special[before].all()
                          or not special[after].all()):
            raise ValueError(f"{path}: a text unit is not wrapped in begin and end tokens; rebuild the blocks "
                             "(rule tokenize_blocks)")
        wrapped = offsets + 2 * np.arange(len(offsets))  # each window gains its begin and end token
        inner = np.arange(len(positions)) + np.repeat(wrapped[:-1] + 1 - offsets[:-1], np.diff(offsets))
        out_ids = np.empty(int(wrapped[-1]), dtype=ids.dtype)
        out_ids[wrapped[:-1]], out_ids[wrapped[1:] - 1], out_ids[inner] = ids[before], ids[after], ids[positions]
        rows = np.full(len(out_ids), -1, dtype=np.int64)
        rows[inner] = np.where(owner, positions, -1)
        return out_ids, wrapped, rows


def unit_windows(flags: np.ndarray, max_tokens: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                           np.ndarray]:
    """The original code's dump windows over the text units of a blocks file (``flags`` uint8 [T]; a unit is a
    maximal run of non-special tokens, across block boundaries): a unit of n tokens is read in the code's
    ``npm.densephrases.features.windows`` of at most W = ``max_tokens`` - 2 of its tokens. A token in two windows
    belongs to the one where it has the most context (``npm.densephrases.features.max_context``). Returns (positions
    int64 [P], offsets int64 [n_windows+1], owner bool [P], unit int64 [n_windows, 2]: the first and last token of
    each window's unit)."""
    idx = np.flatnonzero((np.asarray(flags) & SPECIAL) == 0)
    opens = np.r_[True, np.diff(idx) > 1] if len(idx) else np.zeros(0, bool)
    starts = idx[opens]
    lengths = np.diff(np.r_[np.flatnonzero(opens), len(idx)])
    unit, begin, size = windows(lengths, max_tokens - 2, stride)  # begin: within its unit
    offsets = np.r_[0, np.cumsum(size)].astype(np.int64)
    inside = np.arange(offsets[-1]) - np.repeat(offsets[:-1], size)
    positions = (np.repeat(starts[unit] + begin, size) + inside).astype(np.int64)
    owner = max_context(positions, size)
    return positions, offsets, owner, np.stack([starts, starts + lengths - 1], 1)[unit].reshape(-1, 2)


def shard_dir(dump_dir: str | os.PathLike, shard: int) -> Path:
    """The folder of shard ``shard`` (the corpus's ``shard``-th blocks file) inside the dump folder."""
    return Path(dump_dir) / f"shard{shard}"


def dump_record(model_dir: str | os.PathLike) -> str:
    """The fingerprint of a DensePhrases model's phrase side (its phrase encoder and filter head)."""
    phrase = model_fingerprint(str(Path(model_dir) / "phrase"))
    return file_fingerprint(Path(model_dir) / "filter_head.pt") + ":" + phrase


def dump_shard(model_dir: str | os.PathLike, blocks_path: str | os.PathLike, out_dir: str | os.PathLike,
               filter_threshold: float | None = None, batch_blocks: int = 32, progress: bool = True,
               precision: str = "fp32", device: str | None = None, model=None,
               dump_passages: DumpPassages | None = None) -> dict:
    """Encode every block of ``blocks_path`` with the phrase encoder of ``model_dir`` (on ``device``, default CUDA
    when available, under ``precision``'s autocast, ``npm.model.autocast``) and write the shard folder ``out_dir``
    atomically. ``model``: the loaded ``DensePhrases`` of ``model_dir`` (loaded here when None). ``dump_passages``:
    what the encoder reads (:class:`DumpPassages`; None: the blocks as they are)."""
    t0 = time.perf_counter()
    passages = dump_passages or DumpPassages()
    dev = torch_device(device)
    if model is None:
        model = DensePhrases.load(model_dir).eval().to(dev)
    if filter_threshold is not None:
        require_trained_filter(model.filter_trained, model_dir)
    arrays = load_blocks(blocks_path)
    check_vocabulary(blocks_path, arrays["input_ids"], model.phrase.config.vocab_size)
    passages.check_model(model.phrase.config)
    table = PhraseTokens.from_flags(arrays["flags"], arrays["block_offsets"])
    n_tokens = int((table.word >= 0).sum())
    with atomic_dir(out_dir) as tmp:
        tmp.mkdir()
        vecs = np.lib.format.open_memmap(tmp / "all.npy", "w+", np.float16, (len(table), model.hidden_size))
        logits = _encode_file(model, dev, precision, passages.windows(arrays, blocks_path),
                              filter_threshold is not None, batch_blocks, vecs,
                              f"phrase dump {Path(blocks_path).name}", progress)
        rows = np.flatnonzero(table.word >= 0)
        if filter_threshold is not None:
            rows = _filtered(rows, logits[rows], table.passage, filter_threshold)
        with open(tmp / "vectors.f16", "wb") as out:  # the kept rows, in order, a chunk at a time
            for a in range(0, len(rows), WRITE_CHUNK):
                vecs[rows[a:a + WRITE_CHUNK]].tofile(out)
        del vecs
        (tmp / "all.npy").unlink()
        for name, values in {"token": rows.astype(np.int64), **table.subset(rows).arrays()}.items():
            np.save(tmp / f"{name}.npy", values)
        meta = {"model": str(model_dir), "phrase_side": dump_record(model_dir), "blocks": str(blocks_path),
                "corpus_fingerprint": corpus_fingerprint([blocks_path]), "hidden_size": model.hidden_size,
                "rows": len(rows), "tokens": n_tokens, "file_tokens": len(arrays["input_ids"]),
                "passages": len(arrays["block_offsets"]) - 1,
                "segments": int(table.segment.max(initial=-1)) + 1, "filter_threshold": filter_threshold,
                "precision": effective_precision(dev, precision), **passages.record(),
                "seconds": round(time.perf_counter() - t0, 2)}
        write_json(tmp / "meta.json", meta)  # last: a shard with meta.json is complete
    return meta


def combine_shards(dump_dir: str | os.PathLike, n_shards: int) -> dict:
    """Write the dump's ``meta.json`` over its shards ``shard0`` ... ``shard{n_shards - 1}`` (in corpus order), after
    checking that one phrase encoder, filter and hidden size made them all. Returns the meta."""
    dump_dir = Path(dump_dir)
    if n_shards < 1:
        raise ValueError(f"a phrase dump needs at least one shard, got {n_shards}")
    shards, metas = [], []
    first = {"token_offset": 0, "passage_offset": 0, "segment_offset": 0}
    for k in range(n_shards):
        path = shard_dir(dump_dir, k)
        if not (path / "meta.json").is_file():
            raise FileNotFoundError(f"{path}: shard {k} of the phrase dump {dump_dir} is missing or unfinished (no "
                                    f"meta.json); dump it with `npm-repro densephrases dump --shard {k}`")
        meta = read_json(path / "meta.json", "dump the shard again")
        for key in SHARD_KEYS:
            if meta.get(key) != (metas[0].get(key) if metas else meta.get(key)):
                raise ValueError(f"{path}: its {key} ({meta.get(key)!r}) differs from shard0's "
                                 f"({metas[0].get(key)!r}): the "
                                 "shards of one dump come from one model and one setting; dump it again")
        metas.append(meta)
        shards.append({"path": path.name, "rows": meta["rows"], "blocks": meta["blocks"], **first})
        first = {"token_offset": first["token_offset"] + meta["file_tokens"],
                 "passage_offset": first["passage_offset"] + meta["passages"],
                 "segment_offset": first["segment_offset"] + meta["segments"]}
    rows, tokens, d = sum(m["rows"] for m in metas), sum(m["tokens"] for m in metas), metas[0]["hidden_size"]
    fingerprint = hashlib.sha256(":".join(m["corpus_fingerprint"] for m in metas).encode()).hexdigest()
    meta = {"model": metas[0]["model"], "phrase_side": metas[0]["phrase_side"], "corpus_fingerprint": fingerprint,
            "blocks": [m["blocks"] for m in metas], "shards": shards, "hidden_size": d, "rows": rows,
            "tokens": tokens, "filter_threshold": metas[0]["filter_threshold"],
            **{key: metas[0][key] for key in ("token_filter", "dump_passages") if metas[0].get(key)},
            "kept_share": round(rows / max(1, tokens), 4), "bytes": rows * d * 2, "precision": metas[0]["precision"],
            "seconds": round(sum(m["seconds"] for m in metas), 2)}
    write_json(dump_dir / "meta.json", meta)
    return meta


def dump_phrases(model_dir: str | os.PathLike, blocks_paths: list[str], out_dir: str | os.PathLike,
                 filter_threshold: float | None = None, batch_blocks: int = 32, progress: bool = True,
                 precision: str = "fp32", device: str | None = None, model=None,
                 dump_passages: DumpPassages | None = None) -> dict:
    """The whole dump of the blocks files ``blocks_paths`` (in corpus order) in one process: shard ``k`` from the
    ``k``-th file (:func:`dump_shard`), then the meta (:func:`combine_shards`); ``out_dir`` is written atomically.
    ``model``: the ``DensePhrases`` of ``model_dir`` already loaded (None: loaded here)."""
    if not blocks_paths:
        raise ValueError("no blocks files to dump")
    model = (DensePhrases.load(model_dir) if model is None else model).eval().to(torch_device(device))
    with atomic_dir(out_dir) as tmp:
        for k, path in enumerate(blocks_paths):
            dump_shard(model_dir, path, shard_dir(tmp, k), filter_threshold, batch_blocks, progress, precision,
                       device, model, dump_passages)
        meta = combine_shards(tmp, len(blocks_paths))
    return meta


def trim_dump(dump_dir: str | os.PathLike, out_dir: str | os.PathLike, filter_threshold: float | None = None,
              model_dir: str | os.PathLike | None = None) -> dict:
    """The dump of the rows of ``dump_dir`` that can begin or end a phrase (``PhraseTokens.word_start | word_end``),
    shard by shard, written atomically; returns its meta (``token_filter``: ``edges``). A token that is neither is
    never a phrase's start or end (``npm.densephrases.search.candidates``), so no phrase and no phrase score is lost:
    only the index rows that a search would spend on tokens that yield none. With ``filter_threshold`` (the
    compressed index's learned filter, appendix E), only the edges whose best filter logit exceeds it, and the best
    edge of a passage where none does (the dump's rule, ``_encode_file``): the logits of the filter head of
    ``model_dir``, which must have made the dump and have trained its head (``train.lambda_filter`` > 0), over the
    dump's fp16 vectors (``token_filter``: ``edges, filter > t``)."""
    src = PhraseDump(dump_dir)
    d = src.meta["hidden_size"]
    head = None if filter_threshold is None else _trained_filter_head(model_dir, src)
    with atomic_dir(out_dir) as tmp:
        for k, shard in enumerate(src.meta["shards"]):
            path, out = Path(dump_dir) / shard["path"], shard_dir(tmp, k)
            out.mkdir(parents=True)
            rows = np.flatnonzero(_load(path / "word_start.npy", shard["rows"])
                                  | _load(path / "word_end.npy", shard["rows"]))
            vectors = _load(path / "vectors.f16", shard["rows"], (d,))
            if head is not None:
                rows = _filtered(rows, best_filter_logits(vectors, rows, *head),
                                 _load(path / "passage.npy", shard["rows"]), filter_threshold)
            with open(out / "vectors.f16", "wb") as f:
                for a in range(0, len(rows), WRITE_CHUNK):
                    np.asarray(vectors[rows[a:a + WRITE_CHUNK]]).tofile(f)
            for name in COLUMNS:
                np.save(out / f"{name}.npy", _load(path / f"{name}.npy", shard["rows"])[rows])
            meta = read_json(path / "meta.json", "dump the shard again")
            token_filter = "edges" if head is None else f"edges, filter > {filter_threshold:g}"
            write_json(out / "meta.json", {**meta, "rows": len(rows), "token_filter": token_filter})
        meta = combine_shards(tmp, len(src.meta["shards"]))
    return meta


def _trained_filter_head(model_dir, dump: PhraseDump) -> tuple[np.ndarray, np.ndarray]:
    """(weight [2, d], bias [2]) of the filter head of ``model_dir`` as fp32 arrays, once it is checked that this
    model's phrase side made ``dump`` and that a training with the filter loss updated the head."""
    if model_dir is None:
        raise ValueError("a filtered trim reads the filter head of the dump's model: give its model folder")
    if dump_record(model_dir) != dump.meta["phrase_side"]:
        raise ValueError(f"{model_dir} did not make the phrase dump {dump.path} (another phrase encoder or filter "
                         "head): trim with the model that dumped it")
    weight, bias, trained = load_filter_head(model_dir)
    require_trained_filter(trained, model_dir)
    return weight.float().numpy(), bias.float().numpy()


def best_filter_logits(vectors, rows: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """float32 [len(rows)]: the larger of the start- and end-filter logits of each of the stored fp16 ``vectors``
    at ``rows`` under the filter head (``weight`` [2, d], ``bias`` [2]), read a chunk of rows at a time."""
    parts = [np.asarray(vectors[rows[a:a + WRITE_CHUNK]], np.float32) @ weight.T + bias
             for a in range(0, len(rows), WRITE_CHUNK)]
    return np.concatenate(parts or [np.empty((0, 2), np.float32)]).max(1)


def _filtered(rows: np.ndarray, best: np.ndarray, passage: np.ndarray, threshold: float) -> np.ndarray:
    """The ``rows`` (ascending) whose best filter logit (``best``, one per row) exceeds ``threshold``, and the best
    row of each passage where none does (ties to the lower row)."""
    keep = best > threshold
    owner = passage[rows]
    order = np.lexsort((-best, owner))  # per passage, best logit first (stable: the lower row among ties)
    first = order[np.r_[True, owner[order][1:] != owner[order][:-1]]] if len(order) else order
    has = np.zeros(int(owner.max(initial=-1)) + 1, bool)
    has[owner[keep]] = True
    keep[first[~has[owner[first]]]] = True
    return rows[keep]


def _encode_file(model, dev, precision, windows, want_logits, batch_blocks, vecs, desc, progress):
    """The best filter logit of every token of one blocks file (float32 [tokens]; None without ``want_logits``), with
    the fp16 vectors of its tokens written into ``vecs`` [tokens, d] (a memmap on disk: a shard's vectors are never
    all in memory): every window of ``windows`` (:meth:`DumpPassages.windows`) through the phrase encoder, shortest
    first, each vector written to the token its window's row map names."""
    ids, offsets, rows = windows
    lengths = np.diff(offsets)
    order = np.argsort(lengths, kind="stable")
    logits = np.full(len(vecs), -np.inf, np.float32) if want_logits else None
    with torch.inference_mode(), autocast(dev, precision):
        for a in progress_bar(range(0, len(order), batch_blocks), desc=desc, unit="batch", show=progress):
            batch = order[a:a + batch_blocks]
            padded, att = pad_blocks(ids, offsets, batch, int(max(1, lengths[batch].max())))
            h = model.phrase_vectors(torch.as_tensor(padded, device=dev), torch.as_tensor(att, device=dev))
            best = model.filter_logits(h).max(-1).values.float().cpu().numpy() if want_logits else None
            h = h.float().cpu().numpy()
            for k, w in enumerate(batch):
                target = rows[offsets[w]:offsets[w + 1]]
                own = target >= 0
                vecs[target[own]] = h[k, :len(target)][own].astype(np.float16)
                if want_logits:
                    logits[target[own]] = best[k, :len(target)][own]
    return logits


class Concat:
    """Arrays (the shards' memmaps) laid end to end along their first axis, read without joining them: ``c[key]``
    for an int, a slice or an int array of any shape gives what indexing their concatenation would, with each part's
    ``add`` (its first global id) added to its values."""

    def __init__(self, parts: list, add: list[int] | None = None):
        self.parts, self.add = parts, add or [0] * len(parts)
        self.starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
        self.shape = (int(self.starts[-1]), *parts[0].shape[1:])
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            key = np.arange(*key.indices(len(self)))
        rows = np.asarray(key)
        if rows.dtype.kind not in "iu":
            raise TypeError(f"a phrase dump is indexed by row numbers, not {rows.dtype}")
        flat = rows.reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            bad = flat[(flat < 0) | (flat >= len(self))][0]
            raise IndexError(f"phrase dump row {bad} out of range [0, {len(self)})")
        out = np.empty((flat.size, *self.shape[1:]), dtype=self.dtype)
        part = np.searchsorted(self.starts, flat, side="right") - 1
        for p in np.unique(part):
            sel = np.flatnonzero(part == p)
            values = self.parts[p][flat[sel] - self.starts[p]]
            out[sel] = values + self.add[p] if self.add[p] else values
        return out.reshape(rows.shape + self.shape[1:])


def _load(path: Path, rows: int, shape: tuple = ()) -> np.ndarray:
    """A shard's column ``path`` (``.npy``) or vectors (``.f16``, ``shape`` = (d,)), memory-mapped."""
    if path.suffix == ".f16":
        if rows == 0:
            return np.empty((0, *shape), dtype=np.float16)
        return np.memmap(path, dtype=np.float16, mode="r", shape=(rows, *shape))
    values = np.load(path, mmap_mode="r") if rows else np.load(path)
    if len(values) != rows:
        raise ValueError(f"{path}: {len(values)} rows, its shard's meta.json says {rows}; dump the shard again")
    return values


class PhraseDump:
    """A dump folder, read back: ``meta``, ``vectors`` (fp16 [rows, d]; None with ``vectors=False``: a search that
    scores from its index's codes never reads the dump's vectors, which need not be on disk), ``token`` (global token
    positions) and ``tokens`` (:class:`PhraseTokens`), each a :class:`Concat` over the shards' memmaps."""

    def __init__(self, path: str | os.PathLike, vectors: bool = True):
        path = Path(path)
        if not (path / "meta.json").is_file():
            raise FileNotFoundError(f"{path} is not a phrase dump (no meta.json); make one with "
                                    "`npm-repro densephrases dump`")
        self.path, self.meta = path, read_json(path / "meta.json", "rebuild the dump")
        if "shards" not in self.meta:
            raise ValueError(f"{path}: a phrase dump of the earlier one-file layout (no 'shards' in meta.json); "
                             "dump it again with `npm-repro densephrases dump`")
        shards, d = self.meta["shards"], self.meta["hidden_size"]
        self.vectors = Concat([_load(path / s["path"] / "vectors.f16", s["rows"], (d,)) for s in shards]) \
            if vectors else None
        columns = {name: Concat([_load(path / s["path"] / f"{name}.npy", s["rows"]) for s in shards],
                                [s[OFFSETS[name]] if name in OFFSETS else 0 for s in shards]) for name in COLUMNS}
        self.token = columns.pop("token")
        self.tokens = PhraseTokens(**columns)


def build_index(dump_dir: str | os.PathLike, out_path: str | os.PathLike, factory: str = "Flat",
                nprobe: int = DensePhrasesSettings.nprobe, seed: int = 1, train_sample: int = 1_000_000,
                use_gpu: bool | None = None, mem_mb: int | None = None) -> dict:
    """A FAISS index (inner product) over the dump's rows, written atomically with a sidecar ``<out>.json`` that
    names the dump: ``npm.datastore.faiss_index.build_faiss_index`` over the shards' fp16 files (trained on a seeded
    sample of ``train_sample`` rows drawn across them, filled shard by shard in chunks, on a GPU when there is one
    unless ``use_gpu`` is False). ``mem_mb``: the job's memory; an index that would not fit is refused before
    training (``npm.datastore.faiss_index.check_memory``)."""
    dump = PhraseDump(dump_dir)
    shards = [(Path(dump_dir) / s["path"] / "vectors.f16", s["rows"]) for s in dump.meta["shards"]]
    try:
        record = build_faiss_index(shards, dump.meta["hidden_size"], out_path, factory, "ip", train_sample, seed,
                                   nprobe=nprobe, use_gpu=use_gpu, mem_mb=mem_mb,
                                   where=("densephrases_index", "densephrases.index"))
    except ValueError as e:
        raise ValueError(f"phrase dump {dump_dir} ({dump.meta['rows']} vectors): {e}") from None
    index_bytes = os.path.getsize(out_path)
    record.update(dump=str(dump_dir), phrase_side=dump.meta["phrase_side"],
                  dump_passages=dump.meta.get("dump_passages"),
                  corpus_fingerprint=dump.meta["corpus_fingerprint"], rows=dump.meta["rows"], index_bytes=index_bytes,
                  bytes_per_vector=round(index_bytes / max(1, dump.meta["rows"]), 2))
    with atomic_path(str(out_path) + ".json") as tmp_json:  # the same sidecar, now naming the dump
        Path(tmp_json).write_text(json.dumps(record, indent=1) + "\n")
    return record


def load_index(index_path: str | os.PathLike, dump: PhraseDump, model_dir: str | os.PathLike | None = None):
    """The FAISS index at ``index_path``, after checking that its sidecar names this dump (same rows, corpus and
    phrase encoder) and, with ``model_dir``, that the query model is the one whose phrase side made the dump."""
    import faiss

    sidecar = Path(str(index_path) + ".json")
    if not sidecar.is_file():
        raise FileNotFoundError(f"{index_path}: no sidecar {sidecar.name}; rebuild it with `npm-repro densephrases "
                                "index`")
    record = json.loads(sidecar.read_text())
    for key in ("phrase_side", "corpus_fingerprint", "rows", "dump_passages"):
        if record.get(key) != dump.meta.get(key):
            raise ValueError(f"index {index_path} was built from another phrase dump ({key} differs from "
                             f"{dump.path}): rebuild the index from this dump")
    if model_dir is not None and dump_record(model_dir) != dump.meta["phrase_side"]:
        raise ValueError(f"the dump {dump.path} was made by another phrase encoder than {model_dir}'s: its "
                         "questions would be searched in a foreign vector space (dump again with this model)")
    index = faiss.read_index(str(index_path))
    if index.ntotal != dump.meta["rows"]:
        raise ValueError(f"index {index_path} holds {index.ntotal} vectors, the dump {dump.meta['rows']}")
    return index
