"""Offline masking of batch lines: co-occurrence span masking (NPM) and uniform masking (NPM-single).

Paper section 3.2.1 and appendix A.2; paper-map §2.2 (span masking, "exact algorithm") and §2.3
(NPM-single "uniform" with ``enforce_masking_positives``); paper-map §9 items 5-11. A clean-room
re-implementation from that description: no code of the original (CC-BY-NC) is used.

**The unit of work is one batch line** (B blocks). A span can only be masked if its exact token sequence occurs in
a *different* sequence of the same line: those other sequences are where the training loss finds its positives.

Token classes come from the per-token ``flags`` of ``npm.boundaries`` instead of RoBERTa ids, so the same code
serves every tokenizer family:

* the original's "ids 0 and 2" (``<s>``, ``</s>``) are the tokens with the ``SPECIAL`` flag (``[CLS]``/``[SEP]``
  for WordPiece);
* "subword" is ``is_subword(flags)`` (special tokens count as subwords); a subword may still start a span right after
  a special token of its sequence, the original's "unless it directly follows ``<s>``" (it checks for id 0 itself;
  a begin token is the only special token that precedes a non-special one, unless special tokens are typed in the
  text);
* "punctuation" is the ``PUNCT_TOKEN`` flag (a token that is exactly one of ``! , . : ?``).

**Span candidates** (``span_candidates``): (b, j, L) with L = 1 .. ``max_span_length`` such that token j of
sequence b is not special, and not a subword unless token j-1 of b is special (``span_starts``); a punctuation
start is kept with probability ``punct_keep_prob`` (one draw per such position, in line order) and only for L = 1;
the window [j, j+L) lies inside the block and has no special token; the token right after the window, if any, is
not a subword (so spans never end mid-word nor right before ``</s>``); and the window's token ids occur in another
sequence of the line (anywhere, in a window with no special token; ids only). Every condition but the "next
token" one is monotone in L, so the original's per-position loop over L ("stop" / "skip this L") reduces to this
conjunction. Detection is vectorised: per L, every window of the line gets an exact dense key (``np.unique`` on
``key(L-1) * V + next id``), windows whose key is seen in only one sequence are pruned (their extensions cannot
co-occur either), and a Python loop runs only over L.

**Sampling** (``sample_spans`` / ``take_spans``): candidates are grouped by length and each group is permuted;
``budget = int(ratio * tokens of the line)`` lengths are drawn from Geometric(p) and processed in order: a draw
above ``max_span_length`` is skipped; while group n is empty n is decremented, and at n = 0 masking stops
altogether; the last span of group n is popped and rejected if its sequence already has ``max_spans_per_sequence``
spans, if it overlaps a masked token, or if its n-gram was already masked ``max_ngram_repeats`` times in the line
(then another is popped, falling back to shorter groups the same way); masking stops as soon as the masked tokens
reach the budget (the last span may overshoot). A line with fewer than ``min_masked_ratio`` of its tokens masked
(or none) is dropped.

**CODE!=PAPER**: ``max_spans_per_sequence`` is 128 in the paper (A.2) and 64 in the original code; the default
here follows the paper and the switch is a parameter (config ``masking.max_spans_per_sequence``).

**Uniform** (``uniform_mask_line``, NPM-single): the eligible tokens are the non-special tokens whose id also
occurs in a different sequence of the line; each is masked independently with probability
``min(1, ratio * N_tokens / N_eligible)``, so 15% of all tokens are masked in expectation; no 80/10/10
replacement. The original masks on the fly in the collate function, so every epoch sees a new draw; here the line
is masked **once, offline** (deterministic under the seed), and a line with no masked token is dropped because it
cannot train. Each masked token is written as a span of length 1.

**Determinism**: one ``numpy.random.Generator`` per file (``np.random.default_rng(seed)``), lines in file order:
the same inputs and seed give the same output. Per line the draws are: the punctuation keep draws, one permutation
per length group (n = 1 .. max), then the ``budget`` geometric draws (span mode); one uniform draw per eligible
token (uniform mode). The numbers differ from the original's ``np.random.seed(2022)`` stream; the distribution is
the same.

Output (docs/data-contracts.md, masked batches): ``batches`` int64 [n_kept, B] (kept lines only),
``span_offsets`` int64 [n_kept+1] and ``spans`` int32 [n_spans, 3] = (sequence within the line, start within its
block, length), sorted by (line, sequence, start).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from npm.boundaries import PUNCT_TOKEN, SPECIAL, is_subword
from npm.io import load_npz, save_npz
from npm.settings import MaskingSettings

MODES = ("span", "uniform")


def _flat(sequences: Sequence[np.ndarray], flags_per_seq: Sequence[np.ndarray]):
    """Concatenate the B sequences of a line: ids int64 [T], flags uint8 [T], lengths int64 [B]."""
    if len(sequences) != len(flags_per_seq):
        raise ValueError(f"{len(sequences)} sequences but {len(flags_per_seq)} flag arrays")
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    if any(len(f) != n for f, n in zip(flags_per_seq, lengths.tolist(), strict=True)):
        raise ValueError("each sequence needs one flag per token")
    if not len(sequences):
        return np.zeros(0, np.int64), np.zeros(0, np.uint8), lengths
    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences])
    flags = np.concatenate([np.asarray(f, dtype=np.uint8) for f in flags_per_seq])
    return ids, flags, lengths


def span_starts(flags: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Bool [T]: the tokens of sequences of ``lengths`` laid end to end that may start a span, before the draw on
    punctuation: not special, and not a subword unless token j-1 of the same sequence is special."""
    flags = np.asarray(flags)
    special = (flags & SPECIAL) != 0
    after_special = np.zeros(len(flags), dtype=bool)
    after_special[1:] = special[:-1]
    firsts = np.cumsum(lengths)[:-1]
    after_special[firsts[firsts < len(flags)]] = False  # a sequence's first token follows nothing of its sequence
    return ~special & (~is_subword(flags) | after_special)


def _candidates_flat(ids: np.ndarray, flags: np.ndarray, lengths: np.ndarray, rng: np.random.Generator,
                     max_span_length: int, punct_keep_prob: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Span candidates of a flat line: (flat start position, length, n-gram key), sorted by (length, position).

    The key identifies the window's token sequence among the windows of the same length of this line.
    """
    n = len(ids)
    empty = np.zeros(0, np.int64)
    if n == 0:
        return empty, empty, empty
    seq = np.repeat(np.arange(len(lengths)), lengths)
    seq_end = np.repeat(np.cumsum(lengths), lengths)  # flat end (exclusive) of each token's sequence
    special = (flags & SPECIAL) != 0
    subword = is_subword(flags)
    punct = (flags & PUNCT_TOKEN) != 0

    start_ok = span_starts(flags, lengths)
    drawn = np.flatnonzero(start_ok & punct)  # as in the original: each punctuation start is kept with prob 0.1
    start_ok[drawn[rng.random(len(drawn)) >= punct_keep_prob]] = False
    # has_next_subword[j]: token j+1 exists in the same sequence and is a subword (the window ending at j may not)
    has_next_subword = np.zeros(n, dtype=bool)
    has_next_subword[:-1] = subword[1:] & (np.arange(1, n) < seq_end[:-1])

    _, tok = np.unique(ids, return_inverse=True)
    tok = tok.reshape(-1).astype(np.int64)
    vocab = int(tok.max()) + 1
    n_seq = max(len(lengths), 1)

    active = np.flatnonzero(~special)  # windows of the current length without a special token
    key = tok[active]
    pos_parts, len_parts, key_parts = [], [], []
    for length in range(1, max_span_length + 1):
        if length > 1:
            last = active + length - 1
            inside = last < seq_end[active]
            inside[inside] = ~special[last[inside]]
            active, key, last = active[inside], key[inside], last[inside]
            _, key = np.unique(key * vocab + tok[last], return_inverse=True)
            key = key.reshape(-1).astype(np.int64)
        if len(active) == 0:
            break
        # Windows whose token sequence is seen in at least two distinct sequences of the line.
        pairs = np.unique(key * n_seq + seq[active])
        n_seqs_of_key = np.bincount(pairs // n_seq, minlength=int(key.max()) + 1)
        shared = n_seqs_of_key[key] >= 2
        active, key = active[shared], key[shared]
        ok = start_ok[active] & ~has_next_subword[active + length - 1]
        if length > 1:
            ok &= ~punct[active]
        pos_parts.append(active[ok])
        len_parts.append(np.full(int(ok.sum()), length, dtype=np.int64))
        key_parts.append(key[ok])
    if not pos_parts:
        return empty, empty, empty
    return np.concatenate(pos_parts), np.concatenate(len_parts), np.concatenate(key_parts)


def span_candidates(sequences: Sequence[np.ndarray], flags_per_seq: Sequence[np.ndarray], rng: np.random.Generator,
                    max_span_length: int = MaskingSettings.max_span_length,
                    punct_keep_prob: float = MaskingSettings.punct_keep_prob) -> np.ndarray:
    """All span candidates of one line (paper-map §2.2 ``find_mapping``) as int64 [n, 3] = (sequence, start, length),
    sorted by (sequence, start, length). ``rng`` gives the punctuation keep draws."""
    ids, flags, lengths = _flat(sequences, flags_per_seq)
    pos, length, _ = _candidates_flat(ids, flags, lengths, rng, max_span_length, punct_keep_prob)
    return _to_spans(pos, length, lengths, sort=True)


def _to_spans(pos: np.ndarray, length: np.ndarray, lengths: np.ndarray, sort: bool) -> np.ndarray:
    """Flat (position, length) -> int64 [n, 3] (sequence, start within the sequence, length)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    seq = np.searchsorted(np.cumsum(lengths), pos, side="right")
    spans = np.stack([seq, pos - starts[seq] if len(pos) else pos, length], axis=1).astype(np.int64)
    if sort and len(spans):
        spans = spans[np.lexsort((spans[:, 2], spans[:, 1], spans[:, 0]))]
    return spans.reshape(-1, 3)


def take_spans(groups: dict[int, list[tuple[int, int, int]]], draws: Sequence[int], budget: int, n_tokens: int,
               max_span_length: int = MaskingSettings.max_span_length,
               max_spans_per_sequence: int = MaskingSettings.max_spans_per_sequence,
               max_ngram_repeats: int = MaskingSettings.max_ngram_repeats) -> list[tuple[int, int, int]]:
    """The deterministic part of paper-map §2.2 ``mask_spans``: pick spans for the drawn lengths.

    ``groups[n]`` is a list of candidates (flat position, sequence, n-gram key) of length n, popped from the end
    (it is consumed). ``draws`` are the sampled lengths in order. Returns the accepted spans as
    (flat position, sequence, length) in acceptance order.
    """
    masked = bytearray(n_tokens)
    per_seq: dict[int, int] = {}
    per_ngram: dict[tuple[int, int], int] = {}
    accepted: list[tuple[int, int, int]] = []
    total = 0
    if budget <= 0:
        return accepted
    for n in draws:
        if n > max_span_length:
            continue  # as in the original: draws above the maximum length are skipped
        while True:
            while n > 0 and not groups.get(n):
                n -= 1  # exhausted length: fall back to shorter spans
            if n == 0:
                return accepted  # no candidate of this length or shorter: stop masking the line
            pos, seq, key = groups[n].pop()
            if per_seq.get(seq, 0) >= max_spans_per_sequence:
                continue
            if 1 in masked[pos:pos + n]:
                continue
            if per_ngram.get((n, key), 0) >= max_ngram_repeats:
                continue
            masked[pos:pos + n] = b"\x01" * n
            per_seq[seq] = per_seq.get(seq, 0) + 1
            per_ngram[(n, key)] = per_ngram.get((n, key), 0) + 1
            accepted.append((pos, seq, n))
            total += n
            break
        if total >= budget:
            break
    return accepted


def sample_spans(candidates: np.ndarray, n_tokens: int, rng: np.random.Generator, ngram_keys: np.ndarray | None = None,
                 ratio: float = MaskingSettings.ratio, p: float = MaskingSettings.p,
                 max_span_length: int = MaskingSettings.max_span_length,
                 max_spans_per_sequence: int = MaskingSettings.max_spans_per_sequence,
                 max_ngram_repeats: int = MaskingSettings.max_ngram_repeats) -> np.ndarray:
    """Paper-map §2.2 ``mask_spans`` on given candidates [n, 3] (flat position, sequence, length): permute each length
    group, draw ``int(ratio * n_tokens)`` Geometric(p) lengths and ``take_spans``. ``ngram_keys`` [n] identify
    equal n-grams (default: every candidate distinct). Returns the accepted (flat position, sequence, length)
    in acceptance order, int64 [m, 3]."""
    candidates = np.asarray(candidates, dtype=np.int64).reshape(-1, 3)
    keys = np.arange(len(candidates)) if ngram_keys is None else np.asarray(ngram_keys, dtype=np.int64)
    groups = {}
    for n in range(1, max_span_length + 1):
        idx = np.flatnonzero(candidates[:, 2] == n)
        idx = idx[rng.permutation(len(idx))]
        groups[n] = list(zip(candidates[idx, 0].tolist(), candidates[idx, 1].tolist(), keys[idx].tolist(),
                             strict=True))
    budget = int(ratio * n_tokens)
    draws = rng.geometric(p, size=budget).tolist() if budget > 0 else []
    accepted = take_spans(groups, draws, budget, n_tokens, max_span_length, max_spans_per_sequence,
                          max_ngram_repeats)
    return np.array(accepted, dtype=np.int64).reshape(-1, 3)


def _mask_flat(ids: np.ndarray, flags: np.ndarray, lengths: np.ndarray, rng: np.random.Generator, ratio: float,
               p: float, max_span_length: int, max_spans_per_sequence: int, max_ngram_repeats: int,
               min_masked_ratio: float, punct_keep_prob: float) -> np.ndarray | None:
    pos, length, key = _candidates_flat(ids, flags, lengths, rng, max_span_length, punct_keep_prob)
    seq = np.searchsorted(np.cumsum(lengths), pos, side="right")
    n_tokens = len(ids)
    accepted = sample_spans(np.stack([pos, seq, length], axis=1), n_tokens, rng, key, ratio, p, max_span_length,
                            max_spans_per_sequence, max_ngram_repeats)
    masked = int(accepted[:, 2].sum())
    if masked == 0 or masked < min_masked_ratio * n_tokens:
        return None
    acc = accepted[np.argsort(accepted[:, 0], kind="stable")]
    return _to_spans(acc[:, 0], acc[:, 2], lengths, sort=False)


def mask_line(sequences: Sequence[np.ndarray], flags_per_seq: Sequence[np.ndarray], rng: np.random.Generator,
              ratio: float = MaskingSettings.ratio, p: float = MaskingSettings.p,
              max_span_length: int = MaskingSettings.max_span_length,
              max_spans_per_sequence: int = MaskingSettings.max_spans_per_sequence,
              max_ngram_repeats: int = MaskingSettings.max_ngram_repeats,
              min_masked_ratio: float = MaskingSettings.min_masked_ratio,
              punct_keep_prob: float = MaskingSettings.punct_keep_prob) -> np.ndarray | None:
    """Span-mask one line (paper-map §2.2): int64 [n, 3] (sequence, start, length) sorted by (sequence, start), or
    None when the line is dropped (fewer than ``min_masked_ratio`` of its tokens masked, or none)."""
    ids, flags, lengths = _flat(sequences, flags_per_seq)
    return _mask_flat(ids, flags, lengths, rng, ratio, p, max_span_length, max_spans_per_sequence,
                      max_ngram_repeats, min_masked_ratio, punct_keep_prob)


def _uniform_flat(ids: np.ndarray, flags: np.ndarray, lengths: np.ndarray, rng: np.random.Generator,
                  ratio: float) -> np.ndarray | None:
    n = len(ids)
    if n == 0:
        return None
    seq = np.repeat(np.arange(len(lengths)), lengths)
    ok = (flags & SPECIAL) == 0
    _, tok = np.unique(ids, return_inverse=True)
    tok = tok.reshape(-1).astype(np.int64)
    n_seq = max(len(lengths), 1)
    pairs = np.unique(tok[ok] * n_seq + seq[ok])
    n_seqs_of_tok = np.bincount(pairs // n_seq, minlength=int(tok.max()) + 1)
    eligible = np.flatnonzero(ok & (n_seqs_of_tok[tok] >= 2))
    if len(eligible) == 0:
        return None
    prob = min(1.0, ratio * n / len(eligible))
    pos = eligible[rng.random(len(eligible)) < prob]
    if len(pos) == 0:
        return None
    return _to_spans(pos, np.ones(len(pos), np.int64), lengths, sort=False)


def uniform_mask_line(sequences: Sequence[np.ndarray], flags_per_seq: Sequence[np.ndarray],
                      rng: np.random.Generator, ratio: float = MaskingSettings.ratio) -> np.ndarray | None:
    """NPM-single uniform masking of one line (paper-map §2.3, ``enforce_masking_positives``): int64 [m, 3] spans of
    length 1 sorted by (sequence, start), or None when nothing is masked (the line is dropped)."""
    ids, flags, lengths = _flat(sequences, flags_per_seq)
    return _uniform_flat(ids, flags, lengths, rng, ratio)


def _load_inputs(blocks_path, batches_path):
    blocks = load_npz(blocks_path)
    missing = {"input_ids", "flags", "block_offsets"} - set(blocks)
    if missing:
        raise ValueError(f"{blocks_path}: not a blocks file (missing {sorted(missing)}); rebuild it with build_blocks")
    ids, flags, offsets = blocks["input_ids"], blocks["flags"], blocks["block_offsets"].astype(np.int64)
    if len(flags) != len(ids) or len(offsets) < 1 or offsets[-1] != len(ids):
        raise ValueError(f"{blocks_path}: inconsistent blocks file ({len(ids)} input_ids, {len(flags)} flags, "
                         f"block_offsets ending at {offsets[-1] if len(offsets) else None})")
    batches = load_npz(batches_path)
    if "batches" not in batches:
        raise ValueError(f"{batches_path}: not a batches file (no 'batches' array); rebuild it with build_batches")
    lines = batches["batches"]
    if lines.ndim != 2 or lines.shape[0] == 0 or lines.shape[1] == 0:
        raise ValueError(f"{batches_path}: holds no batch line (shape {lines.shape}); check the rule that made it")
    n_blocks = len(offsets) - 1
    bad = (lines < 0) | (lines >= n_blocks)
    if bad.any():
        row = int(np.flatnonzero(bad.any(axis=1))[0])
        raise ValueError(f"{batches_path}: line {row} refers to block {int(lines[bad][0])}, but {blocks_path} has "
                         f"{n_blocks} blocks; were the batches made from another blocks file?")
    return ids, flags, offsets, lines.astype(np.int64)


def mask_shard(blocks_path: str | Path, batches_path: str | Path, out_path: str | Path, mode: str = "span",
               masking: MaskingSettings | None = None) -> dict:
    """Mask every batch line of a shard and write the masked batches file atomically; returns a summary.

    ``mode`` "span" (NPM, paper-map §2.2) or "uniform" (NPM-single, paper-map §2.3); ``masking`` the config's
    ``masking:`` section (npm.settings.MaskingSettings; None = the paper's setting). Lines that are dropped
    (span: fewer than ``min_masked_ratio`` of the tokens masked; uniform: none masked) are left out of ``batches``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r} (masking {batches_path} into {out_path})")
    masking = masking or MaskingSettings()
    seed, ratio, p, max_span_length = masking.seed, masking.ratio, masking.p, masking.max_span_length
    max_spans_per_sequence, max_ngram_repeats = masking.max_spans_per_sequence, masking.max_ngram_repeats
    min_masked_ratio, punct_keep_prob = masking.min_masked_ratio, masking.punct_keep_prob
    ids, flags, offsets, lines = _load_inputs(blocks_path, batches_path)
    rng = np.random.default_rng(seed)
    kept, span_parts, n_spans = [], [], [0]
    tokens = masked_tokens = 0
    hist = np.zeros(max_span_length + 1, dtype=np.int64)
    bar = tqdm(lines, desc=f"mask {mode} {Path(batches_path).name}", unit=" batches", mininterval=10)
    for row, line in enumerate(bar):
        starts, ends = offsets[line], offsets[line + 1]
        lengths = ends - starts
        n_line = int(lengths.sum())
        index = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(n_line)
        line_ids, line_flags = ids[index].astype(np.int64), flags[index]
        if mode == "span":
            spans = _mask_flat(line_ids, line_flags, lengths, rng, ratio, p, max_span_length,
                               max_spans_per_sequence, max_ngram_repeats, min_masked_ratio, punct_keep_prob)
        else:
            spans = _uniform_flat(line_ids, line_flags, lengths, rng, ratio)
        if spans is None:
            continue
        kept.append(row)
        span_parts.append(spans)
        n_spans.append(len(spans))
        tokens += len(index)
        masked_tokens += int(spans[:, 2].sum())
        hist += np.bincount(spans[:, 2], minlength=max_span_length + 1)[: max_span_length + 1]
    spans_all = (np.concatenate(span_parts) if span_parts else np.zeros((0, 3), np.int64)).astype(np.int32)
    save_npz(out_path, batches=lines[kept].reshape(len(kept), lines.shape[1]),
             span_offsets=np.cumsum(n_spans).astype(np.int64), spans=spans_all)
    return {
        "mode": mode,
        "seed": seed,
        "batches_in": len(lines),
        "batches_kept": len(kept),
        "batches_dropped_low_mask": len(lines) - len(kept),
        "spans": len(spans_all),
        "tokens": tokens,
        "masked_tokens": masked_tokens,
        "masked_ratio": masked_tokens / tokens if tokens else 0.0,
        "spans_per_batch": len(spans_all) / len(kept) if kept else 0.0,
        "span_length_histogram": {str(n): int(hist[n]) for n in range(1, max_span_length + 1) if hist[n]},
        "params": {"ratio": ratio, "p": p, "max_span_length": max_span_length,
                   "max_spans_per_sequence": max_spans_per_sequence, "max_ngram_repeats": max_ngram_repeats,
                   "min_masked_ratio": min_masked_ratio, "punct_keep_prob": punct_keep_prob},
    }
