"""The original's released, pre-tokenised reference corpora -> our blocks files (paper-map §3.1, §3.2; `format:
npm_corpus` in config `sources`, docs/paper-scale.md section 1.2).

The released corpora (Wikipedia 2019 in 20 shards, Wikipedia 2022, and the closed-set corpora of Shi et al.) hold no
raw text, only roberta-large token ids. Per shard ``X`` of a corpus folder:

* ``X.npy``: the token ids of every block laid end to end (each text unit wrapped in ``<s> ... </s>``);
* ``X_blocks.npy``: the start offset of each block in ``X.npy`` (a block ends where the next one starts);
* ``X_valid.pkl`` (optional): one ``(valid_starts, valid_ends)`` pair of local positions per block, the word
  boundaries the original's datastore keeps (paper-map §3.2);
* ``X.jsonl`` (Wikipedia only, for BM25): not read, since the text is recovered from the ids themselves.

``import_shard`` writes one blocks file (docs/data-contracts.md) with the released ids and blocks unchanged:

* **Surface text, exactly.** Byte-level BPE is lossless: each token id stands for a fixed byte string (the
  tokenizer's vocabulary through GPT-2's byte-to-unicode table), so a unit's text is its tokens' bytes joined, and a
  block's text is its units joined by "\\n", as ``npm.data.blocks`` lays them out. Token spans are those bytes with
  the leading/trailing spaces trimmed, as the fast tokenizer's ``trim_offsets`` reports them (a token of spaces
  only gets the empty span at its end).
* **Word boundaries.** The boundary bits (``npm.boundaries``) are computed by the rule ``word_boundaries`` as for any
  corpus (``code``, the paper routes': from each id decoded on its own, as the original; ``text``: from the recovered
  text). Where ``X_valid.pkl`` is given, the released positions are kept: at every boundary between two tokens where
  our rule and the released file disagree, the bits of those two tokens that the valid-start/-end rule reads
  (``SPACE_BEFORE`` of the right token, ``PUNCT_END`` of the left, ``PUNCT_START`` of the right) are set so that
  ``valid_starts``/``valid_ends`` give the released positions exactly. The summary reports how often the two rules
  disagree (``valid_disagreement_rate``) and any released position that no bits can express (a special token, or a
  block's first/last token left out), which keeps our rule.
* **Documents.** A released block has no document id: each block is its own document, ``{shard}/{block}``.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npm.boundaries import (
    PUNCT_END,
    PUNCT_START,
    SPACE_BEFORE,
    SPECIAL,
    utf8_offsets,
    valid_ends,
    valid_starts,
    word_flags,
)
from npm.checksums import write_sidecar
from npm.data.blocks import block_texts
from npm.edge_errors import first_line
from npm.io import save_npz
from npm.model import load_tokenizer
from npm.settings import DataSettings

SPACE = 0x20


# ------------------------------------------------------------------------------------------------ reading


class _ValidUnpickler(pickle.Unpickler):
    """Unpickles lists/tuples/sets of ints and numpy arrays only: a downloaded pickle must not run code."""

    ALLOWED = {("builtins", "set"), ("builtins", "frozenset"), ("builtins", "list"), ("builtins", "tuple"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
               ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a valid-positions file holds only "
                                         "lists of (starts, ends) integer positions")
        return super().find_class(module, name)


def locate_shard(folder: str | Path, stem: str) -> Path:
    """``folder/stem`` (without ``.npy``), or the one ``.../stem`` below ``folder`` (an archive may wrap the corpus
    in a top folder such as ``corpus/``)."""
    folder = Path(folder)
    if (folder / f"{stem}.npy").exists():
        return folder / stem
    found = sorted(p for p in folder.rglob(f"{Path(stem).name}.npy") if p.as_posix().endswith(f"/{stem}.npy"))
    if len(found) == 1:
        return found[0].with_suffix("")
    listed = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.npy"))[:20]
    why = f"several matches {[str(p) for p in found]}" if found else f".npy files there: {listed or 'none'}"
    raise FileNotFoundError(f"no released corpus shard {stem}.npy under {folder} ({why}); set the source's `stem`")


def _load_npy(path: Path, mmap: bool = False) -> np.ndarray:
    """The array of a released ``.npy`` (memory-mapped with ``mmap``), never unpickled: an object array (read only by
    unpickling, which can run code), a file cut short or another kind of file is a ValueError naming the file and the
    cause (numpy's own messages name neither the file nor what to do)."""
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        text = str(e)
        if "Python objects" in text or "Object arrays" in text:
            why = "it holds Python objects (an object array), not integers; numpy reads one only by unpickling it"
        elif "EOF" in text or "mmap length" in text or "not fully written" in text:
            why = f"it is cut short ({path.stat().st_size} bytes; {first_line(e)})"
        else:
            why = f"not a numpy .npy array ({first_line(e) or type(e).__name__})"
        raise ValueError(f"{path}: {why}; nothing was imported. Get the file again from the corpus's published "
                         "archive") from None


def read_shard(folder: str | Path, stem: str) -> dict:
    """``ids`` int64 [T], ``block_offsets`` int64 [n_blocks+1] and ``valid`` (a list of (starts, ends) per block, or
    None) of shard ``stem`` (path relative to ``folder`` without the ``.npy``), checked."""
    base = locate_shard(folder, stem)
    ids_path, blocks_path, valid_path = (base.with_name(base.name + suffix)
                                         for suffix in (".npy", "_blocks.npy", "_valid.pkl"))
    if not blocks_path.exists():
        raise FileNotFoundError(f"{blocks_path} does not exist: shard {ids_path} has no block offsets")
    ids = _load_npy(ids_path, mmap=True)
    starts = _load_npy(blocks_path).astype(np.int64).ravel()
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{ids_path}: expected a flat array of token ids, got {ids.dtype} {ids.shape}")
    offsets = np.concatenate([starts, [len(ids)]])
    if len(starts) == 0 or starts[0] != 0 or np.any(np.diff(offsets) <= 0):
        raise ValueError(f"{blocks_path}: block offsets must start at 0 and increase strictly up to "
                         f"len({ids_path.name}) = {len(ids)}")
    valid = None
    if valid_path.exists():
        with open(valid_path, "rb") as f:
            try:
                valid = _ValidUnpickler(f).load()
            except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as e:  # refused, cut short, foreign
                raise ValueError(f"{valid_path}: not read ({e or type(e).__name__}); nothing was imported. Get the "
                                 "file again from the corpus's published archive") from None
        if not isinstance(valid, (list, tuple)) or len(valid) != len(starts):
            got = f"{type(valid).__name__} of {len(valid) if hasattr(valid, '__len__') else '?'}"
            raise ValueError(f"{valid_path}: expected one (valid_starts, valid_ends) pair per block ({len(starts)} "
                             f"blocks), got {got}")
    return {"ids": np.asarray(ids, dtype=np.int64), "block_offsets": offsets, "valid": valid}


def valid_masks(valid: Sequence, block_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bool [T] masks of the released valid starts and ends (local positions per block -> flat positions)."""
    n = int(block_offsets[-1])
    masks = []
    for side in (0, 1):
        local = [np.asarray(sorted(pair[side]) if isinstance(pair[side], (set, frozenset)) else pair[side],
                            dtype=np.int64).ravel() for pair in valid]
        lengths = np.diff(block_offsets)
        for b, pos in enumerate(local):
            if len(pos) and (pos.min() < 0 or pos.max() >= lengths[b]):
                raise ValueError(f"valid positions of block {b} fall outside its {lengths[b]} tokens")
        flat = np.concatenate([pos + block_offsets[b] for b, pos in enumerate(local)] or [np.zeros(0, np.int64)])
        mask = np.zeros(n, dtype=bool)
        mask[flat] = True
        masks.append(mask)
    return masks[0], masks[1]


# ------------------------------------------------------------------------------------------------ ids -> text


def vocab_bytes(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(``flat`` uint8, ``offsets`` int64 [V+1]): the byte string of every token id of a byte-level BPE tokenizer
    (special tokens: empty)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    special = set(tokenizer.all_special_ids)
    parts = []
    for i, tok in enumerate(tokens):
        if i in special or tok is None:
            parts.append(b"")
            continue
        try:
            parts.append(bytes(byte_of[c] for c in tok))
        except KeyError:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} is not a byte-level BPE (token {i} {tok!r} has "
                             "characters outside the byte alphabet); the released corpora use roberta-large's"
                             ) from None
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=size)
    return np.frombuffer(b"".join(parts), dtype=np.uint8), np.concatenate([[0], np.cumsum(lengths)])


def _run_index(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, within) of every element of runs of ``lengths``: which run it belongs to and its place in it."""
    owner = np.repeat(np.arange(len(lengths)), lengths)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return owner, within


def ids_to_text(ids: np.ndarray, special: np.ndarray, unit_starts: np.ndarray, flat: np.ndarray,
                vocab_offsets: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The units' text joined by "\\n" (UTF-8 bytes) and the byte span [T, 2] of every token in it, spaces trimmed
    at both ends as ``trim_offsets`` does (special tokens: empty spans)."""
    n = np.diff(vocab_offsets)[ids]
    n[special] = 0
    sep = np.zeros(len(ids), dtype=np.int64)
    sep[unit_starts[unit_starts > 0]] = 1  # "\n" before every unit but the first
    ends = np.cumsum(n + sep)
    begin = ends - n  # where the token's own bytes start
    buf = np.full(int(ends[-1]) if len(ends) else 0, ord("\n"), dtype=np.uint8)
    owner, within = _run_index(n)
    src = vocab_offsets[ids][owner] + within
    buf[begin[owner] + within] = flat[src]
    # Leading / trailing spaces of each token trimmed as the fast tokenizer's trim_offsets does: a token of spaces
    # only ("Ġ") becomes the empty span at its end.
    is_space = (flat[src] == SPACE).astype(np.int64)
    lead = _prefix_run(is_space, np.cumsum(n) - n, n)
    trail = _prefix_run(is_space[::-1], np.cumsum(n[::-1]) - n[::-1], n[::-1])[::-1]
    start = begin + lead
    spans = np.stack([start, np.maximum(begin + n - trail, start)], axis=1)
    spans[special] = 0
    return buf.tobytes(), spans


def _prefix_run(bits: np.ndarray, run_start: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per run of ``bits`` (runs laid end to end), the number of leading ones."""
    zeros = np.append(np.flatnonzero(bits == 0), len(bits))
    first_zero = zeros[np.searchsorted(zeros, run_start)]  # the first zero at or after each run's start
    return np.minimum(first_zero, run_start + lengths) - run_start


def char_spans(joined: str, byte_spans: np.ndarray) -> np.ndarray:
    """Character spans of byte spans in ``joined`` (a span cutting a character covers the whole character, as a
    fast tokenizer's offsets do)."""
    char_byte = utf8_offsets(joined)
    start = np.searchsorted(char_byte, byte_spans[:, 0], side="right") - 1
    end = np.searchsorted(char_byte, byte_spans[:, 1], side="left")
    return np.stack([start, np.maximum(end, start)], axis=1)


# ------------------------------------------------------------------------------------------------ boundaries


def keep_released_valid(flags: np.ndarray, block_offsets: np.ndarray, starts: np.ndarray,
                        ends: np.ndarray) -> tuple[np.ndarray, dict]:
    """``flags`` with the bits of the valid-start/-end rule set so that ``valid_starts``/``valid_ends`` give the
    released ``starts``/``ends`` (bool [T]) wherever bits can express them; and the counts of the comparison."""
    ours_s, ours_e = valid_starts(flags, block_offsets), valid_ends(flags, block_offsets)
    special = (flags & SPECIAL) != 0
    counts = {"tokens_compared": int((~special).sum()), "valid_starts_released": int(starts.sum()),
              "valid_ends_released": int(ends.sum()), "start_disagreements": int((ours_s != starts).sum()),
              "end_disagreements": int((ours_e != ends).sum())}
    counts["valid_disagreement_rate"] = round(
        (counts["start_disagreements"] + counts["end_disagreements"]) / max(2 * counts["tokens_compared"], 1), 6)
    # Boundary between i-1 and i inside a block: start(i) = SB(i) | PE(i-1); end(i-1) = SB(i) | PS(i).
    out = flags.copy()
    i = np.arange(1, len(flags))
    inside = np.ones(len(i), dtype=bool)
    inside[block_offsets[1:-1] - 1] = False  # i is the first position of a block
    differ = inside & ((ours_s[i] != starts[i]) | (ours_e[i - 1] != ends[i - 1]))
    r, left = i[differ], i[differ] - 1
    s_r, e_l = starts[r], ends[left]
    out[r] = ((out[r] & ~np.uint8(SPACE_BEFORE | PUNCT_START)) | np.where(s_r & e_l, SPACE_BEFORE, 0)
              | np.where(e_l, PUNCT_START, 0)).astype(np.uint8)
    out[left] = ((out[left] & ~np.uint8(PUNCT_END)) | np.where(s_r, PUNCT_END, 0)).astype(np.uint8)
    kept_s, kept_e = valid_starts(out, block_offsets), valid_ends(out, block_offsets)
    counts["unrepresentable"] = int((kept_s != starts).sum() + (kept_e != ends).sum())
    return out, counts


# ------------------------------------------------------------------------------------------------ the stage


def released_blocks(ids: np.ndarray, block_offsets: np.ndarray, valid: Sequence | None, tokenizer,
                    name: str, word_boundaries: str = DataSettings.word_boundaries
                    ) -> tuple[dict[str, np.ndarray], dict]:
    """The blocks arrays (docs/data-contracts.md) of one released shard, its flags by the rule ``word_boundaries``
    where no released valid positions replace them, and its summary counts."""
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= len(tokenizer)):
        raise ValueError(f"{name}: token ids span [{ids.min()}, {ids.max()}], outside the {len(tokenizer)} ids of "
                         f"tokenizer {tokenizer.name_or_path!r}: the released corpora use roberta-large's")
    flat, vocab_offsets = vocab_bytes(tokenizer)
    special = np.isin(ids, tokenizer.all_special_ids)
    unit_starts = np.union1d([0], np.flatnonzero(ids == tokenizer.cls_token_id)) if len(ids) else np.zeros(0, int)
    raw, byte_spans = ids_to_text(ids, special, unit_starts, flat, vocab_offsets)
    try:
        joined = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        block = int(np.searchsorted(block_offsets, np.searchsorted(byte_spans[:, 1], e.start), side="right") - 1)
        raise ValueError(f"{name}: the ids of block {block} decode to invalid UTF-8 ({e.reason}); is the tokenizer "
                         f"{tokenizer.name_or_path!r} the one the corpus was made with?") from None
    unit_offsets = np.concatenate([unit_starts, [len(ids)]])
    flags = word_flags(word_boundaries, tokenizer, ids, joined, char_spans(joined, byte_spans), special, unit_offsets)
    summary = {"blocks": len(block_offsets) - 1, "tokens": len(ids), "tokenizer": tokenizer.name_or_path,
               "word_boundaries": word_boundaries}
    if valid is not None:
        starts, ends = valid_masks(valid, block_offsets)
        flags, counts = keep_released_valid(flags, block_offsets, starts, ends)
        summary.update(counts, valid="released")
    else:
        summary["valid"] = f"npm.boundaries rule {word_boundaries!r} (no _valid.pkl)"
    text, text_offsets, token_spans = block_texts(joined, byte_spans, special, block_offsets)
    n_blocks = len(block_offsets) - 1
    arrays = {"input_ids": ids.astype(np.int32), "flags": flags.astype(np.uint8), "block_offsets": block_offsets,
              "block_doc": np.arange(n_blocks, dtype=np.int32),
              "doc_ids": np.array([f"{name}/{b}" for b in range(n_blocks)], dtype=str),
              "text": text, "text_offsets": text_offsets, "token_spans": token_spans}
    return arrays, summary


def import_shard(folder: str | Path, stem: str, tokenizer_name: str, out: str | Path,
                 word_boundaries: str = DataSettings.word_boundaries) -> dict:
    """Released shard ``stem`` of ``folder`` -> the blocks file ``out`` (written atomically); returns its summary."""
    shard = read_shard(folder, stem)
    tokenizer = load_tokenizer(tokenizer_name)
    arrays, summary = released_blocks(shard["ids"], shard["block_offsets"], shard["valid"], tokenizer, stem,
                                      word_boundaries)
    save_npz(out, **arrays)
    write_sidecar(out, "import_blocks", f"npm-repro import-corpus --folder {folder} --stem {stem} --tokenizer "
                  f"{tokenizer_name} --word-boundaries {word_boundaries} --out {out}")
    return {"source": str(Path(folder) / stem), **summary}


__all__ = ["import_shard", "keep_released_valid", "locate_shard", "read_shard", "released_blocks", "valid_masks",
           "vocab_bytes"]
