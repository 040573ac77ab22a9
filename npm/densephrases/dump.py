"""The phrase dump and its index (Lee et al. 2021, sections 5-7.1 and appendix E; docs/paper-map.md §D1.4-§D1.5).

:func:`dump_phrases`: every passage (a block of NPM's blocks files, in global block order) goes through the phrase
encoder; the vectors of its tokens are kept as fp16 rows laid end to end, the layout of NPM's datastore. A token is
kept when it is not special and, with a ``filter_threshold``, when its start- or its end-filter logit exceeds it (the
original code; at least the best-filtered token of a passage stays); ``None`` keeps every non-special token. The
folder holds ``vectors.f16`` (raw fp16 [n, d]), ``tokens.npz`` (per kept row: ``token``, its global token position,
and the :class:`~npm.densephrases.search.PhraseTokens` fields, whose segments come from the full token table so that
no phrase crosses a dropped special token) and ``meta.json`` (the phrase encoder's and the corpus's fingerprints,
the blocks files, hidden size, row counts, the filter). It is written atomically.

:func:`build_index`: the rows in a FAISS index from a factory string (``Flat``; the paper's ``IVF{n},SQ4``; the
code's ``OPQ{M},IVF{n},PQ{M}``), inner product, through ``npm.datastore.faiss_index.build_faiss_index`` over the
dump's fp16 file (the datastore's checks: a dump too small for the PQ or the lists asked for is a clear error naming
it; trained on a sample, filled in chunks, on a GPU when there is one), written with a sidecar that records the dump
it indexes. The dump holds one blocks file's vectors in memory at a time. :func:`load_index` refuses an index of
another dump or another phrase encoder.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from npm.densephrases.search import PhraseTokens
from npm.io import atomic_dir, atomic_path, read_json, write_json


def dump_record(model_dir: str | os.PathLike) -> str:
    """The fingerprint of a DensePhrases model's phrase side (its phrase encoder and filter head)."""
    from npm.fingerprint import file_fingerprint, model_fingerprint

    phrase = model_fingerprint(str(Path(model_dir) / "phrase"))
    return file_fingerprint(Path(model_dir) / "filter_head.pt") + ":" + phrase


def dump_phrases(model_dir: str | os.PathLike, blocks_paths: list[str], out_dir: str | os.PathLike,
                 filter_threshold: float | None = None, batch_blocks: int = 32, progress: bool = True,
                 precision: str = "fp32", device: str | None = None) -> dict:
    """Encode every block with the phrase encoder of ``model_dir`` (on ``device``, default CUDA when available, under
    ``precision``'s autocast, ``npm.model.autocast``) and write the dump folder ``out_dir``."""
    from npm.data.blocks import check_vocabulary, load_blocks
    from npm.densephrases.model import DensePhrases
    from npm.fingerprint import corpus_fingerprint
    from npm.model import effective_precision, torch_device

    t0 = time.perf_counter()
    dev = torch_device(device)
    model = DensePhrases.load(model_dir).eval().to(dev)
    d = model.hidden_size
    if not blocks_paths:
        raise ValueError("no blocks files to dump")
    tables, tokens_seen, blocks_seen, segments_seen, n_tokens, n_rows = [], 0, 0, 0, 0, 0
    with atomic_dir(out_dir) as tmp:
        tmp.mkdir()
        with open(tmp / "vectors.f16", "wb") as out:  # one blocks file's vectors in memory at a time
            for path in blocks_paths:
                arrays = load_blocks(path)
                check_vocabulary(path, arrays["input_ids"], model.phrase.config.vocab_size)
                table = PhraseTokens.from_flags(arrays["flags"], arrays["block_offsets"], blocks_seen, segments_seen)
                vecs, keep = _encode_file(model, dev, precision, arrays, table, filter_threshold, batch_blocks,
                                          f"phrase dump {Path(path).name}", progress)
                rows = np.flatnonzero(keep)
                vecs[rows].tofile(out)
                tables.append((rows + tokens_seen, table.subset(rows)))
                n_rows += len(rows)
                tokens_seen += len(arrays["input_ids"])
                blocks_seen += len(arrays["block_offsets"]) - 1
                segments_seen = int(table.segment.max(initial=segments_seen - 1)) + 1
                n_tokens += int((table.word >= 0).sum())
                del vecs
        token = np.concatenate([t for t, _ in tables])
        fields = {k: np.concatenate([tab.arrays()[k] for _, tab in tables]) for k in tables[0][1].arrays()}
        np.savez(tmp / "tokens.npz", token=token, **fields)
        meta = {"model": str(model_dir), "phrase_side": dump_record(model_dir),
                "corpus_fingerprint": corpus_fingerprint(blocks_paths), "blocks": [str(p) for p in blocks_paths],
                "hidden_size": d, "rows": n_rows, "tokens": n_tokens, "filter_threshold": filter_threshold,
                "kept_share": round(n_rows / max(1, n_tokens), 4), "bytes": n_rows * d * 2,
                "precision": effective_precision(dev, precision), "seconds": round(time.perf_counter() - t0, 2)}
        write_json(tmp / "meta.json", meta)
    return meta


def _encode_file(model, dev, precision, arrays, table, filter_threshold, batch_blocks, desc, progress):
    """(fp16 vectors [tokens, d] of one blocks file, bool keep [tokens]): every block through the phrase encoder,
    shortest first; special tokens dropped, and with ``filter_threshold`` the tokens whose best filter logit does not
    exceed it (at least the best of each passage stays)."""
    from npm.data.blocks import pad_blocks
    from npm.model import autocast

    offsets = arrays["block_offsets"]
    lengths = np.diff(offsets)
    order = np.argsort(lengths, kind="stable")
    vecs = np.zeros((len(arrays["input_ids"]), model.hidden_size), dtype=np.float16)
    keep = table.word >= 0
    with torch.inference_mode(), autocast(dev, precision):
        for a in tqdm(range(0, len(order), batch_blocks), desc=desc, disable=not progress or None):
            batch = order[a:a + batch_blocks]
            ids, att = pad_blocks(arrays["input_ids"], offsets, batch, int(max(1, lengths[batch].max())))
            h = model.phrase_vectors(torch.as_tensor(ids, device=dev), torch.as_tensor(att, device=dev))
            logits = model.filter_logits(h).max(-1).values.float().cpu() if filter_threshold is not None else None
            h = h.float().cpu()
            for k, b in enumerate(batch):
                rows = np.arange(offsets[b], offsets[b + 1])
                vecs[rows] = h[k, :len(rows)].numpy().astype(np.float16)
                if logits is not None and len(rows):
                    score = logits[k, :len(rows)].numpy()
                    ok = keep[rows] & (score > filter_threshold)
                    if not ok.any() and keep[rows].any():  # at least one token of a passage
                        cand = np.flatnonzero(keep[rows])
                        ok[cand[np.argmax(score[cand])]] = True
                    keep[rows] = ok
    return vecs, keep


class PhraseDump:
    """A dump folder, read back: ``meta``, ``vectors`` (fp16 memmap [rows, d]), ``token`` and ``tokens``."""

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        if not (path / "meta.json").is_file():
            raise FileNotFoundError(f"{path} is not a phrase dump (no meta.json); make one with "
                                    "`npm-repro densephrases dump`")
        self.path, self.meta = path, read_json(path / "meta.json", "rebuild the dump")
        self.vectors = np.memmap(path / "vectors.f16", dtype=np.float16, mode="r",
                                 shape=(self.meta["rows"], self.meta["hidden_size"]))
        arrays = np.load(path / "tokens.npz")
        self.token = arrays["token"]
        self.tokens = PhraseTokens.from_arrays(arrays)


def build_index(dump_dir: str | os.PathLike, out_path: str | os.PathLike, factory: str = "Flat",
                nprobe: int = 256, seed: int = 1, train_sample: int = 1_000_000, use_gpu: bool | None = None) -> dict:
    """A FAISS index (inner product) over the dump's rows, written atomically with a sidecar ``<out>.json`` that
    names the dump: ``npm.datastore.faiss_index.build_faiss_index`` over the dump's fp16 file (trained on a seeded
    sample of ``train_sample`` rows, filled in chunks, on a GPU when there is one unless ``use_gpu`` is False)."""
    from npm.datastore.faiss_index import build_faiss_index

    dump = PhraseDump(dump_dir)
    try:
        record = build_faiss_index([(Path(dump_dir) / "vectors.f16", dump.meta["rows"])], dump.meta["hidden_size"],
                                   out_path, factory, "ip", train_sample, seed, nprobe=nprobe, use_gpu=use_gpu)
    except ValueError as e:
        raise ValueError(f"phrase dump {dump_dir} ({dump.meta['rows']} vectors): {e}") from None
    index_bytes = os.path.getsize(out_path)
    record.update(dump=str(dump_dir), phrase_side=dump.meta["phrase_side"],
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
    for key in ("phrase_side", "corpus_fingerprint", "rows"):
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
