"""Word boundaries and token classes, from a fast tokenizer's character offsets (paper-map §2.2, §3.2).

The original code decodes every token on its own and looks at the characters of the decoded string
(RoBERTa's leading "Ġ" space, trailing punctuation). Here the same facts come from where each token sits in the
source text, so one definition serves every tokenizer family (byte-level BPE with trimmed or untrimmed offsets,
BERT WordPiece, ...). Per token, ``flags`` (uint8) holds these bits:

* ``SPACE_BEFORE``: word-initial. The token is the first non-special token of its text unit, or the source
  character just before its (whitespace-stripped) span is whitespace. This is "the decoded string starts with a
  space" of paper-map §3.2. Byte-level BPE with ``trim_offsets`` leaves the space out of the span; without it the
  span starts with the space. Both cases are handled. A piece right after a whitespace-only token ("Ġ" "il" for
  " illegal" when the vocabulary has no "Ġil") is word-initial too: the word starts there, although the
  original's decoded-string rule would call "il" a continuation.
* ``PUNCT_START`` / ``PUNCT_END``: the first / last character of the surface text is in ``string.punctuation``.
  Special tokens get both, because their strings ("<s>", "</s>", "[CLS]") start and end with punctuation
  (paper-map §3.2: the token after ``<s>`` is a valid start, the token before ``</s>`` a valid end).
* ``SPECIAL``: a special token (``special_tokens_mask`` or an id in ``all_special_ids``: ``<s>``, ``</s>``,
  ``<pad>``, ``<mask>``, ``<unk>``, ``[CLS]``, ``[SEP]``, ``[UNK]``, ...).
* ``PUNCT_TOKEN``: the surface text is exactly one of ``! , . : ?`` ("punctuation" of paper-map §2.2).
* ``PUNCT_PIECE``: the surface text is non-empty and a substring of ``string.punctuation``. Paper-map §2.2's
  substring quirk: single punctuation characters are not subwords, but "..." or "--" are, because they are not
  substrings of ``string.punctuation``.

Derived rules, on flat arrays:

* ``is_subword``: ``SPECIAL`` or neither ``SPACE_BEFORE`` nor ``PUNCT_PIECE`` (paper-map §2.2; special tokens
  count as subwords).
* ``valid_starts`` / ``valid_ends``: the paper-map §3.2 rule inside each block. Special tokens are never valid
  (paper-map §3.2 and §9 item 20: the one shared function for the embedder and the loader).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from itertools import chain

import numpy as np

SPACE_BEFORE = 1
PUNCT_START = 2
PUNCT_END = 4
SPECIAL = 8
PUNCT_TOKEN = 16
PUNCT_PIECE = 32

PUNCTUATION_TOKENS = "!,.:?"  # paper-map §2.2: decoded string exactly one of these

_MAX_SPACE = 0x3000  # the largest code point for which str.isspace() is true
_IS_SPACE = np.array([chr(c).isspace() for c in range(_MAX_SPACE + 1)])
_IS_PUNCT = np.array([chr(c) in string.punctuation for c in range(128)])
_IS_PUNCT_TOKEN = np.array([chr(c) in PUNCTUATION_TOKENS for c in range(128)])


def _lookup(table: np.ndarray, cp: np.ndarray) -> np.ndarray:
    return (cp < len(table)) & table[np.minimum(cp, len(table) - 1)]


def token_flags(text: str, offsets: np.ndarray, special: np.ndarray,
                unit_offsets: np.ndarray | None = None) -> np.ndarray:
    """The flags of tokens whose character spans ``offsets`` [T, 2] index ``text``.

    ``special`` [T] marks special tokens (their offsets are ignored). ``unit_offsets`` [n_units+1] splits the
    tokens into text units (default: one unit); the first non-special token of each unit is word-initial.
    """
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    special = np.asarray(special, dtype=bool)
    n = len(offsets)
    if unit_offsets is None:
        unit_offsets = np.array([0, n])
    # One code point per character; a separator on each side keeps every index below inside the array.
    cp = np.frombuffer(("\n" + text + "\n").encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    space, punct = _lookup(_IS_SPACE, cp), _lookup(_IS_PUNCT, cp)
    start, end = offsets[:, 0] + 1, offsets[:, 1] + 1
    lead_space = (end > start) & space[start]  # an untrimmed byte-level span " word" starts with its space
    start = start + lead_space
    length = end - start
    first, last = cp[start], cp[np.maximum(end - 1, 0)]

    flags = np.zeros(n, dtype=np.uint8)
    flags[space[start - 1] | lead_space] |= SPACE_BEFORE
    flags[(length > 0) & punct[start]] |= PUNCT_START
    flags[(length > 0) & punct[np.maximum(end - 1, 0)]] |= PUNCT_END
    flags[(length == 1) & _lookup(_IS_PUNCT_TOKEN, first)] |= PUNCT_TOKEN
    flags[(length == 1) & punct[start]] |= PUNCT_PIECE
    # Longer all-punctuation spans ("...", "--", "'s" is not one) are rare: check them as strings.
    longer = np.flatnonzero((length > 1) & punct[start] & _lookup(_IS_PUNCT, last))
    for i in longer:
        if text[start[i] - 1:end[i] - 1] in string.punctuation:
            flags[i] |= PUNCT_PIECE

    # The first non-special token of each unit is word-initial.
    nonspecial = np.flatnonzero(~special)
    unit = np.searchsorted(unit_offsets, nonspecial, side="right") - 1
    firsts = nonspecial[np.r_[True, unit[1:] != unit[:-1]]] if len(nonspecial) else nonspecial
    flags[firsts] |= SPACE_BEFORE

    flags[special] = SPECIAL | PUNCT_START | PUNCT_END
    return flags


def encode_units(tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Encode each text unit with the tokenizer's own special tokens (``<s> ... </s>``, ``[CLS] ... [SEP]``).

    Returns flat ``input_ids`` int32 [T], ``flags`` uint8 [T] and ``unit_offsets`` int64 [n_units+1]. The
    tokenizer is called once for all units (the Rust backend encodes them in parallel), without truncation and
    without the "longer than the model's maximum length" warning (units are split into blocks later).
    """
    return encode_units_with_offsets(tokenizer, texts)[:3]


def encode_units_with_offsets(tokenizer, texts: Sequence[str]):
    """``encode_units`` plus where each token sits in the text: ``(input_ids, flags, unit_offsets, offsets,
    joined)`` with ``offsets`` int64 [T, 2] character spans into ``joined``, the units joined with "\\n"
    (special tokens carry the empty span at the start of their unit)."""
    texts = list(texts)
    if not texts:
        return np.zeros(0, np.int32), np.zeros(0, np.uint8), np.zeros(1, np.int64), np.zeros((0, 2), np.int64), ""
    enc = tokenizer(texts, add_special_tokens=True, return_offsets_mapping=True, return_special_tokens_mask=True,
                    return_attention_mask=False, return_token_type_ids=False, verbose=False)
    lengths = np.fromiter(map(len, enc["input_ids"]), dtype=np.int64, count=len(texts))
    unit_offsets = np.concatenate([[0], np.cumsum(lengths)])
    total = int(unit_offsets[-1])
    ids = np.fromiter(chain.from_iterable(enc["input_ids"]), dtype=np.int64, count=total)
    special = np.fromiter(chain.from_iterable(enc["special_tokens_mask"]), dtype=bool, count=total)
    special |= np.isin(ids, tokenizer.all_special_ids)
    offsets = np.fromiter(chain.from_iterable(chain.from_iterable(enc["offset_mapping"])), dtype=np.int64,
                          count=2 * total).reshape(-1, 2)
    offsets[special] = 0
    # Offsets are per unit; shift them into the units joined with one separator character each.
    text_starts = np.concatenate([[0], np.cumsum([len(t) + 1 for t in texts])[:-1]])
    offsets += np.repeat(text_starts, lengths)[:, None]
    joined = "\n".join(texts)
    flags = token_flags(joined, offsets, special, unit_offsets)
    return ids.astype(np.int32), flags, unit_offsets, offsets, joined


def utf8_offsets(text: str) -> np.ndarray:
    """int64 [len(text)+1]: the UTF-8 byte offset of every character position of ``text``."""
    cp = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    nbytes = 1 + (cp >= 0x80).astype(np.int64) + (cp >= 0x800) + (cp >= 0x10000)
    return np.concatenate([[0], np.cumsum(nbytes)])


def is_subword(flags: np.ndarray) -> np.ndarray:
    """Continuation tokens of paper-map §2.2: special, or neither word-initial nor a punctuation piece."""
    flags = np.asarray(flags)
    return ((flags & SPECIAL) != 0) | ((flags & (SPACE_BEFORE | PUNCT_PIECE)) == 0)


def _block_edges(n: int, block_offsets: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """First and last positions of the non-empty blocks (the whole array is one block by default)."""
    if block_offsets is None:
        block_offsets = np.array([0, n])
    block_offsets = np.asarray(block_offsets, dtype=np.int64)
    nonempty = block_offsets[1:] > block_offsets[:-1]
    return block_offsets[:-1][nonempty], block_offsets[1:][nonempty] - 1


def valid_starts(flags: np.ndarray, block_offsets: np.ndarray | None = None) -> np.ndarray:
    """Paper-map §3.2: position i of a block is a valid start iff it is the block's first position, or token i is
    word-initial, or token i-1 ends with punctuation; special tokens never are. Bool [T] over the flat blocks."""
    flags = np.asarray(flags)
    ok = np.zeros(len(flags), dtype=bool)
    ok[1:] = ((flags[1:] & SPACE_BEFORE) != 0) | ((flags[:-1] & PUNCT_END) != 0)
    ok[_block_edges(len(flags), block_offsets)[0]] = True
    return ok & ((flags & SPECIAL) == 0)


def valid_ends(flags: np.ndarray, block_offsets: np.ndarray | None = None) -> np.ndarray:
    """Paper-map §3.2: position i of a block is a valid end iff it is the block's last position, or token i+1 is
    word-initial or starts with punctuation; special tokens never are. Bool [T] over the flat blocks."""
    flags = np.asarray(flags)
    ok = np.zeros(len(flags), dtype=bool)
    ok[:-1] = (flags[1:] & (SPACE_BEFORE | PUNCT_START)) != 0
    ok[_block_edges(len(flags), block_offsets)[1]] = True
    return ok & ((flags & SPECIAL) == 0)
