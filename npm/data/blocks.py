"""Documents -> token blocks of at most 256 tokens (paper section 4.1; paper-map §2.1, §9 items 1-3).

The original ``create_blocks_from_plain_text``: every text unit of a document is encoded with the tokenizer's
own special tokens (``<s> ... </s>`` for RoBERTa, ``[CLS] ... [SEP]`` for BERT); a unit that contains the mask
token is dropped; the remaining units are packed in order (``pack_blocks``). Blocks never cross documents and are
stored unpadded (docs/data-contracts.md); ``pad_blocks`` pads with id 0 and attention 0 when a model reads them.

* ``tokenize_documents(docs, tokenizer)``: the block arrays of a list of documents, in memory.
* ``build_blocks(docs_path, out_path, tokenizer_name)``: the stage, streaming a documents file into one ``.npz``.

Every blocks file gets a checksum sidecar ``X.npz.sha256.json`` from the code that writes it, and ``load_blocks``
verifies it (``npm.checksums``) and checks the surface-text arrays against each other (``check_token_spans``).
"""

from __future__ import annotations

import logging
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from npm.boundaries import SPECIAL, encode_units_with_offsets, utf8_offsets
from npm.checksums import verify_sidecar, write_sidecar
from npm.io import load_npz, read_jsonl, save_npz
from npm.model import load_tokenizer
from npm.settings import DataSettings

logger = logging.getLogger(__name__)

MAX_SEQ_LENGTH = 256
CHUNK_UNITS = 8192  # text units per tokenizer call


def units_containing(input_ids: np.ndarray, unit_offsets: np.ndarray, token_id: int) -> np.ndarray:
    """Bool [n_units]: whether each unit (``unit_offsets`` [n_units+1] into ``input_ids``) contains ``token_id``."""
    hits = np.flatnonzero(np.asarray(input_ids) == token_id)
    out = np.zeros(len(unit_offsets) - 1, dtype=bool)
    out[np.searchsorted(unit_offsets, hits, side="right") - 1] = True
    return out


def pack_blocks(unit_lengths: np.ndarray, unit_doc: np.ndarray | None = None,
                max_len: int = MAX_SEQ_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """Greedy block packing of paper-map §2.1 over units laid end to end; returns (block_offsets, block_doc).

    In order, per document (``unit_doc``, default: one document): a unit that fits in the room left in the
    current block is appended; otherwise a unit of at most ``max_len`` tokens opens a new block; a longer unit
    fills the current block with its prefix and spills over into new blocks. ``block_offsets`` [n_blocks+1]
    index the concatenated units; ``block_doc`` [n_blocks] is the document of each block.
    """
    unit_lengths = np.asarray(unit_lengths, dtype=np.int64)
    if unit_doc is None:
        unit_doc = np.zeros(len(unit_lengths), dtype=np.int64)
    starts, docs = [], []
    pos, cur, prev_doc = 0, 0, None  # cur: tokens in the open block (0: no open block)
    for n, d in zip(unit_lengths.tolist(), np.asarray(unit_doc).tolist(), strict=True):
        if d != prev_doc:
            cur, prev_doc = 0, d  # blocks never cross documents
        if n == 0:
            continue
        if cur and cur + n <= max_len:
            cur += n
        elif n <= max_len:
            starts.append(pos)
            docs.append(d)
            cur = n
        else:
            cut = pos + (max_len - cur if cur else 0)  # the open block takes the unit's prefix
            while cut < pos + n:
                starts.append(cut)
                docs.append(d)
                cut += max_len
            cur = pos + n - starts[-1]
        pos += n
    block_offsets = np.array(starts + [pos], dtype=np.int64)
    return block_offsets, np.array(docs, dtype=np.int64)


def pad_blocks(input_ids: np.ndarray, block_offsets: np.ndarray, block_indices: np.ndarray,
               length: int = MAX_SEQ_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """Blocks ``block_indices`` as rows of ``length``: ids int64 padded with **0** and attention 0 on the padding
    (paper-map §2.1 and §9 item 3: the pad id is 0, the ``<s>`` id, not RoBERTa's ``<pad>`` = 1)."""
    block_indices = np.asarray(block_indices, dtype=np.int64)
    starts, ends = block_offsets[block_indices], block_offsets[block_indices + 1]
    if len(block_indices) and (ends - starts).max() > length:
        k = int(block_indices[np.argmax(ends - starts)])
        raise ValueError(f"block {k} has {int(block_offsets[k + 1] - block_offsets[k])} tokens, more than the "
                         f"padded length {length}; rebuild the blocks with max_seq_length <= {length}")
    attention = np.arange(length) < (ends - starts)[:, None]
    ids = np.zeros((len(block_indices), length), dtype=np.int64)
    ids[attention] = input_ids[(starts[:, None] + np.arange(length))[attention]]
    return ids, attention.astype(np.int64)


def block_texts(joined: str, byte_spans: np.ndarray, special: np.ndarray,
                block_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The surface text of every block and where each token sits in it (exact surface strings, paper-map §3.7).

    ``byte_spans`` int64 [T, 2] are UTF-8 byte spans of the tokens in ``joined``; a block's text runs from its
    first to its last non-special token (the units of a block stay joined by "\\n"). Returns ``text`` uint8 (the
    blocks' texts laid end to end), ``text_offsets`` int64 [n_blocks+1] and ``token_spans`` uint16 [T, 2] (byte
    span of each token inside its block's text; special tokens get the empty span (0, 0)).
    """
    n_blocks = len(block_offsets) - 1
    raw = joined.encode("utf-8", "surrogatepass")
    block = np.repeat(np.arange(n_blocks), np.diff(block_offsets))
    big = np.iinfo(np.int64).max
    first = np.full(n_blocks, big)
    last = np.full(n_blocks, -1)
    np.minimum.at(first, block[~special], byte_spans[~special, 0])
    np.maximum.at(last, block[~special], byte_spans[~special, 1])
    empty = last < 0
    first[empty], last[empty] = 0, 0
    spans = byte_spans - first[block][:, None]
    spans[special] = 0
    if len(spans) and spans.max() > np.iinfo(np.uint16).max:
        b = int(block[np.argmax(spans.max(1))])
        raise ValueError(f"block {b} has {int(last[b] - first[b])} bytes of text, more than 65535; "
                         "use a smaller max_seq_length")
    text = b"".join(raw[a:e] for a, e in zip(first.tolist(), last.tolist(), strict=True))
    text_offsets = np.concatenate([[0], np.cumsum(last - first)])
    return np.frombuffer(text, dtype=np.uint8), text_offsets, spans.astype(np.uint16)


def block_text(blocks: dict[str, np.ndarray], b: int) -> str:
    """The surface text of block ``b`` of a blocks file's arrays."""
    a, e = blocks["text_offsets"][b], blocks["text_offsets"][b + 1]
    return blocks["text"][a:e].tobytes().decode("utf-8", "surrogatepass")


def _chunks(docs: Iterable[dict], max_units: int) -> Iterator[list[dict]]:
    """Whole documents, grouped so that a group has about ``max_units`` text units."""
    chunk, n = [], 0
    for doc in docs:
        chunk.append(doc)
        n += len(doc.get("units") or ())
        if n >= max_units:
            yield chunk
            chunk, n = [], 0
    if chunk:
        yield chunk


def _check(doc: dict, k: int) -> list[str]:
    units = doc.get("units") if isinstance(doc, dict) else None
    if not isinstance(units, list) or not all(isinstance(u, str) for u in units) or "id" not in doc:
        rid = doc.get("id") if isinstance(doc, dict) else None
        raise ValueError(f"document {k} (id {rid!r}) is not a documents record: it needs 'id' and 'units' "
                         "(a list of strings); see docs/data-contracts.md")
    return units


def tokenize_documents(docs: Iterable[dict], tokenizer, max_seq_length: int = MAX_SEQ_LENGTH,
                       stats: Counter | None = None, where=None,
                       word_boundaries: str = DataSettings.word_boundaries) -> dict[str, np.ndarray]:
    """The blocks arrays of ``docs`` (docs/data-contracts.md): ``input_ids`` int32, ``flags`` uint8,
    ``block_offsets`` int64 [n_blocks+1], ``block_doc`` int32 (index into ``doc_ids``), ``doc_ids`` str, and the
    surface text: ``text`` uint8, ``text_offsets`` int64 [n_blocks+1], ``token_spans`` uint16 [T, 2]
    (``block_texts``).

    Documents are encoded in chunks of whole documents; only flat arrays are kept per chunk. A document left with
    no token but the begin/end tokens (no units, empty units, only units with the mask token) gets no block: it is
    logged as ``where(k)`` (default "document k") and counted as ``documents_empty``. ``stats``, if given, is
    increased by the counts of ``documents``, ``units``, ``units_dropped_mask`` and ``documents_empty``.
    """
    where = where or (lambda k: f"document {k}")
    stats = Counter() if stats is None else stats
    mask_id = tokenizer.mask_token_id
    ids_parts, flag_parts, offset_parts, doc_parts, doc_ids = [], [], [], [], []
    text_parts, text_offset_parts, span_parts = [], [], []
    n_tokens = n_bytes = 0
    for chunk in _chunks(docs, CHUNK_UNITS):
        first_doc = len(doc_ids)
        texts, unit_doc = [], []
        for k, doc in enumerate(chunk, first_doc):
            units = _check(doc, k)
            doc_ids.append(str(doc["id"]))
            texts.extend(units)
            unit_doc.extend([k] * len(units))
        ids, flags, unit_offsets, offsets, joined = encode_units_with_offsets(tokenizer, texts, word_boundaries)
        masked = units_containing(ids, unit_offsets, mask_id)
        unit_doc = np.asarray(unit_doc, dtype=np.int64)
        unit_of_token = np.repeat(np.arange(len(texts)), np.diff(unit_offsets))
        words = np.bincount(unit_of_token[(flags & SPECIAL) == 0], minlength=len(texts))  # non-special tokens
        words[masked] = 0
        doc_words = np.bincount(unit_doc - first_doc, weights=words, minlength=len(chunk))
        for k in np.flatnonzero(doc_words == 0).tolist():
            logger.warning("%s: skipped document %r: no token besides the begin/end tokens (%d units, %d with the "
                           "mask token); it makes no block", where(first_doc + k), doc_ids[first_doc + k],
                           int((unit_doc == first_doc + k).sum()), int(masked[unit_doc == first_doc + k].sum()))
        drop = masked | (doc_words[unit_doc - first_doc] == 0)
        keep_tokens = np.repeat(~drop, np.diff(unit_offsets))
        block_offsets, block_doc = pack_blocks(np.diff(unit_offsets)[~drop], unit_doc[~drop],
                                               max_seq_length)
        ids_parts.append(ids[keep_tokens])
        flag_parts.append(flags[keep_tokens])
        offset_parts.append(block_offsets[:-1] + n_tokens)
        doc_parts.append(block_doc)
        byte_spans = utf8_offsets(joined)[offsets[keep_tokens]]
        text, text_offsets, token_spans = block_texts(joined, byte_spans, (flags[keep_tokens] & SPECIAL) != 0,
                                                      block_offsets)
        text_parts.append(text)
        text_offset_parts.append(text_offsets[:-1] + n_bytes)
        span_parts.append(token_spans)
        n_tokens += int(block_offsets[-1])
        n_bytes += int(text_offsets[-1])
        stats.update(documents=len(chunk), units=len(texts), units_dropped_mask=int(masked.sum()),
                     documents_empty=int((doc_words == 0).sum()))
    return {
        "input_ids": np.concatenate(ids_parts or [np.zeros(0)]).astype(np.int32),
        "flags": np.concatenate(flag_parts or [np.zeros(0)]).astype(np.uint8),
        "block_offsets": np.concatenate(offset_parts + [[n_tokens]]).astype(np.int64),
        "block_doc": np.concatenate(doc_parts or [np.zeros(0)]).astype(np.int32),
        "doc_ids": np.array(doc_ids, dtype=str),
        "text": np.concatenate(text_parts or [np.zeros(0)]).astype(np.uint8),
        "text_offsets": np.concatenate(text_offset_parts + [[n_bytes]]).astype(np.int64),
        "token_spans": np.concatenate(span_parts or [np.zeros((0, 2))]).astype(np.uint16),
    }


def build_blocks(docs_path: str | Path, out_path: str | Path, tokenizer_name: str,
                 max_seq_length: int = MAX_SEQ_LENGTH, word_boundaries: str = DataSettings.word_boundaries) -> dict:
    """Stream a documents file (``.jsonl[.gz]``) into a blocks ``.npz`` (written atomically) whose flags follow the
    rule ``word_boundaries`` (npm.boundaries); returns counts."""
    tokenizer = load_tokenizer(tokenizer_name)
    stats = Counter(documents_empty=0)
    lines = array("q")  # the line of each document, for warnings

    def docs():
        for lineno, doc in read_jsonl(docs_path, numbered=True):
            lines.append(lineno)
            yield doc

    bar = tqdm(docs(), desc=f"blocks {Path(docs_path).name}", unit=" docs", mininterval=10)
    try:
        arrays = tokenize_documents(bar, tokenizer, max_seq_length, stats, where=lambda k: f"{docs_path}:{lines[k]}",
                                    word_boundaries=word_boundaries)
    except ValueError as e:  # read_jsonl's errors already name the file
        raise ValueError(str(e) if str(e).startswith(str(docs_path)) else f"{docs_path}: {e}") from None
    if stats["documents"] == 0:
        raise ValueError(f"{docs_path} holds no documents; check the rule that made it (empty shard?)")
    n_blocks = len(arrays["block_doc"])
    if n_blocks == 0:
        raise ValueError(f"{docs_path}: {stats['documents']} documents with {stats['units']} text units gave no "
                         f"block ({stats['units_dropped_mask']} units dropped for containing the mask token, "
                         f"{stats['documents_empty']} documents without a token)")
    save_npz(out_path, **arrays)
    write_sidecar(out_path, "tokenize_blocks", f"npm-repro tokenize-blocks --docs {docs_path} --tokenizer "
                  f"{tokenizer_name} --max-seq-length {max_seq_length} --word-boundaries {word_boundaries} "
                  f"--out {out_path}")
    return {"documents": stats["documents"], "units": stats["units"],
            "units_dropped_mask": stats["units_dropped_mask"], "documents_empty": stats["documents_empty"],
            "blocks": n_blocks, "tokens": int(len(arrays["input_ids"])), "tokenizer": tokenizer_name,
            "word_boundaries": word_boundaries}


def load_blocks(path: str | Path, text: bool = False) -> dict[str, np.ndarray]:
    """Read a blocks ``.npz``, verify it against its checksum sidecar (when it has one) and check that it has the
    arrays of the contract (``text``: the surface-text arrays too, which only the datastore and BM25 stages read,
    checked by ``check_token_spans``)."""
    verify_sidecar(path)
    arrays = load_npz(path)
    need = {"input_ids", "flags", "block_offsets", "block_doc", "doc_ids"}
    if text:
        need |= {"text", "text_offsets", "token_spans"}
    missing = need - set(arrays)
    if missing:
        raise ValueError(f"{path}: not a blocks file (missing {sorted(missing)}); rebuild it with build_blocks")
    if text:
        check_token_spans(path, arrays)
    return arrays


def check_token_spans(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """A ValueError naming ``path``, the block and the token when the surface-text arrays disagree
    (docs/data-contracts.md): ``text_offsets`` must cut ``text`` into one run per block, and every token's span must
    lie inside its block's text (start <= end <= the text's length), the spans of a block's non-special tokens with
    non-decreasing starts."""
    bo, to = arrays["block_offsets"].astype(np.int64), arrays["text_offsets"].astype(np.int64)
    spans = arrays["token_spans"].astype(np.int64)
    fix = "the file is damaged or was not written by this code; rebuild it (rule tokenize_blocks)"
    if (len(to) != len(bo) or (len(to) and (to[0] != 0 or to[-1] != len(arrays["text"])))
            or np.any(np.diff(to) < 0)):
        raise ValueError(f"{path}: text_offsets ({len(to)} values, ending at {int(to[-1]) if len(to) else None}) do "
                         f"not cut text ({len(arrays['text'])} bytes) into its {len(bo) - 1} blocks; {fix}")
    if spans.shape != (len(arrays["input_ids"]), 2):
        raise ValueError(f"{path}: token_spans has shape {spans.shape}, expected ({len(arrays['input_ids'])}, 2); "
                         f"{fix}")
    block = np.repeat(np.arange(len(bo) - 1), np.diff(bo))
    words = np.flatnonzero((arrays["flags"] & SPECIAL) == 0)
    outside = (spans[:, 0] > spans[:, 1]) | (spans[:, 1] > np.diff(to)[block])
    back = np.zeros(len(spans), dtype=bool)
    back[words[1:]] = (block[words[1:]] == block[words[:-1]]) & (spans[words[1:], 0] < spans[words[:-1], 0])
    bad = np.flatnonzero(outside | back)
    if len(bad):
        t = int(bad[0])
        b = int(block[t])
        raise ValueError(f"{path}: block {b}, token {t - int(bo[b])}: token_spans ({spans[t, 0]}, {spans[t, 1]}) "
                         + ("start before the previous token's" if back[t] and not outside[t] else
                            f"lie outside the block's {int(to[b + 1] - to[b])} bytes of text")
                         + f" ({len(bad)} such tokens); {fix}")


def check_vocabulary(path: str | Path, input_ids: np.ndarray, vocab_size: int) -> None:
    """A ValueError naming ``path`` when its blocks hold a token id outside an encoder's ``vocab_size`` ids."""
    max_id = int(input_ids.max()) if len(input_ids) else -1
    if max_id >= vocab_size:
        raise ValueError(f"{path} holds token id {max_id}, but the encoder's vocabulary has {vocab_size} ids: "
                         "the blocks were made with another tokenizer")


def _take_ranges(values: np.ndarray, offsets: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``offsets[b]:offsets[b+1]`` of ``values`` for every ``b`` in ``keep`` (in order), and new offsets."""
    lengths = offsets[keep + 1] - offsets[keep]
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    starts = np.repeat(offsets[keep] - new_offsets[:-1], lengths)
    index = np.arange(int(new_offsets[-1]), dtype=np.int64) + starts
    return values[index], new_offsets


def subsample_blocks(paths: list[str | Path], fraction: float, out_path: str | Path, seed: int) -> dict:
    """A seeded random ``fraction`` of the blocks of a corpus (its shard files, in order), as one blocks file with
    the blocks kept in corpus order (paper 6.4, Figure 7: the reference corpus subsampled from 5% to 100%).

    Blocks are the unit (every block keeps its tokens, flags, text and document), so a subsampled corpus's
    datastore and BM25 index are exactly those of its blocks in the full corpus; ``source_blocks`` int64 [n_keep]
    records the global block id of each kept block in the corpus (its datastore's vectors are copied from the full
    datastore's rows, npm.datastore.embed.slice_shard). ``fraction`` in (0, 1]."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if not paths:
        raise ValueError("no blocks file to subsample")
    shards = [load_blocks(p, text=True) for p in paths]
    doc_base = np.cumsum([0] + [len(s["doc_ids"]) for s in shards])
    cat = {
        "input_ids": np.concatenate([s["input_ids"] for s in shards]),
        "flags": np.concatenate([s["flags"] for s in shards]),
        "token_spans": np.concatenate([s["token_spans"] for s in shards]),
        "text": np.concatenate([s["text"] for s in shards]),
        "block_doc": np.concatenate([s["block_doc"] + b for s, b in zip(shards, doc_base[:-1], strict=True)]),
        "doc_ids": np.concatenate([s["doc_ids"] for s in shards]),
    }
    tok_base = np.cumsum([0] + [int(s["block_offsets"][-1]) for s in shards])
    txt_base = np.cumsum([0] + [int(s["text_offsets"][-1]) for s in shards])
    block_offsets = np.concatenate([s["block_offsets"][:-1] + b for s, b in zip(shards, tok_base, strict=False)]
                                   + [[tok_base[-1]]])
    text_offsets = np.concatenate([s["text_offsets"][:-1] + b for s, b in zip(shards, txt_base, strict=False)]
                                  + [[txt_base[-1]]])
    n_blocks = len(cat["block_doc"])
    n_keep = max(1, round(fraction * n_blocks))
    keep = np.sort(np.random.default_rng(seed).choice(n_blocks, size=n_keep, replace=False))
    out = {}
    for name in ("input_ids", "flags", "token_spans"):
        out[name], new_block_offsets = _take_ranges(cat[name], block_offsets, keep)
    out["text"], out["text_offsets"] = _take_ranges(cat["text"], text_offsets, keep)
    out["block_offsets"] = new_block_offsets
    docs, out["block_doc"] = np.unique(cat["block_doc"][keep], return_inverse=True)
    out["block_doc"] = out["block_doc"].astype(np.int32)
    out["doc_ids"] = cat["doc_ids"][docs]
    out["source_blocks"] = keep.astype(np.int64)  # the corpus block each block is (its datastore rows are copied)
    save_npz(out_path, **out)
    write_sidecar(out_path, "subsample_corpus", f"npm-repro subsample-blocks --blocks {' '.join(map(str, paths))} "
                  f"--percent {fraction * 100:g} --seed {seed} --out {out_path}")
    return {"fraction": fraction, "seed": seed, "blocks": int(n_keep), "of_blocks": int(n_blocks),
            "tokens": int(new_block_offsets[-1]), "of_tokens": int(block_offsets[-1]), "documents": int(len(docs)),
            "sources": [str(p) for p in paths]}
