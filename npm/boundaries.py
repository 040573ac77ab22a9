"""Word boundaries and token classes (paper-map §2.2, §3.2), by one of two rules (config ``data.word_boundaries``).

* ``text`` (the default): read from where each token sits in the source text (a fast tokenizer's character offsets),
  so one definition serves every tokenizer family (byte-level BPE with trimmed or untrimmed offsets, BERT
  WordPiece, ...).
* ``code``: as the original code, which decodes every vocabulary id on its own and reads the decoded string
  (RoBERTa's leading "Ġ" space, its first and last characters): a table of flags per id (``decoded_flags``). The
  string is what the original's transformers 4.21 ``_decode(id)`` returned: the token's bytes as UTF-8 with errors
  replaced, then ``clean_up_tokenization``, on by default then (``"Ġ,"`` decodes to ``","``). The two rules differ on
  a space before punctuation, on non-ASCII spaces, on characters whose bytes are split across tokens (each piece
  decodes to U+FFFD) and after a whitespace-only token. Meaningful for byte-level BPE only: refused for a tokenizer
  none of whose tokens decodes with a leading space (WordPiece).

In both, special tokens get the flags below. Per token, ``flags`` (uint8) holds these bits:

* ``SPACE_BEFORE``: word-initial, "the decoded string starts with a space" of paper-map §3.2. ``code``: exactly
  that. ``text``: the token is the first non-special token of its text unit, or the source character just before
  its (whitespace-stripped) span is whitespace. Byte-level BPE with ``trim_offsets`` leaves the space out of the
  span; without it the span starts with the space. Both cases are handled. A piece right after a whitespace-only
  token ("Ġ" "il" for " illegal" when the vocabulary has no "Ġil") is word-initial too: the word starts there,
  although the original's decoded-string rule would call "il" a continuation.
* ``PUNCT_START`` / ``PUNCT_END``: the first / last character of the surface text (``code``: of the decoded string)
  is in ``string.punctuation``.
  Special tokens get both, because their strings ("<s>", "</s>", "[CLS]") start and end with punctuation
  (paper-map §3.2: the token after ``<s>`` is a valid start, the token before ``</s>`` a valid end).
* ``SPECIAL``: a special token (``special_tokens_mask`` or an id in ``all_special_ids``: ``<s>``, ``</s>``,
  ``<pad>``, ``<mask>``, ``<unk>``, ``[CLS]``, ``[SEP]``, ``[UNK]``, ...).
* ``PUNCT_TOKEN``: the surface text (decoded string) is exactly one of ``! , . : ?`` ("punctuation" of paper-map
  §2.2).
* ``PUNCT_PIECE``: the surface text (decoded string) is non-empty and a substring of ``string.punctuation``.
  Paper-map §2.2's substring quirk: single punctuation characters are not subwords, but "..." or "--" are, because
  they are not substrings of ``string.punctuation``.

Derived rules, on flat arrays:

* ``is_subword``: ``SPECIAL`` or neither ``SPACE_BEFORE`` nor ``PUNCT_PIECE`` (paper-map §2.2; special tokens
  count as subwords).
* ``valid_starts`` / ``valid_ends``: the paper-map §3.2 rule inside each block. Special tokens are never valid
  (paper-map §3.2 and §9 item 20: the one shared function for the embedder and the loader).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain

import numpy as np

from npm.settings import DataSettings

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

    return _units_and_specials(flags, special, unit_offsets)


def _units_and_specials(flags: np.ndarray, special: np.ndarray, unit_offsets: np.ndarray | None) -> np.ndarray:
    """``flags`` with the first non-special token of each unit word-initial and the special tokens' flags set."""
    if unit_offsets is None:
        unit_offsets = np.array([0, len(flags)])
    nonspecial = np.flatnonzero(~special)
    unit = np.searchsorted(unit_offsets, nonspecial, side="right") - 1
    firsts = nonspecial[np.r_[True, unit[1:] != unit[:-1]]] if len(nonspecial) else nonspecial
    flags[firsts] |= SPACE_BEFORE
    flags[special] = SPECIAL | PUNCT_START | PUNCT_END
    return flags


@lru_cache(maxsize=4)
def decoded_flags(tokenizer) -> np.ndarray:
    """uint8 [V]: the flags of every vocabulary id from its string decoded on its own, as the original code's
    ``_decode(id)`` (module docstring, rule ``code``); special ids get their special flags."""
    size = len(tokenizer)
    strings = [tokenizer.clean_up_tokenization(s) for s in
               tokenizer.batch_decode([[i] for i in range(size)], clean_up_tokenization_spaces=False)]
    if not any(s.startswith(" ") for s in strings):
        raise ValueError(f"data.word_boundaries 'code' reads the original's decoded strings, but no token decodes with "
                         f"a leading space in tokenizer {tokenizer.name_or_path!r} (not a byte-level BPE such as "
                         "roberta-large's); use 'text'")
    punct = set(string.punctuation)
    flags = np.zeros(size, dtype=np.uint8)
    for i, s in enumerate(strings):
        if s:
            flags[i] = ((SPACE_BEFORE if s[0] == " " else 0) | (PUNCT_START if s[0] in punct else 0)
                        | (PUNCT_END if s[-1] in punct else 0)
                        | (PUNCT_TOKEN if len(s) == 1 and s in PUNCTUATION_TOKENS else 0)
                        | (PUNCT_PIECE if s in string.punctuation else 0))
    flags[[i for i in tokenizer.all_special_ids if i < size]] = SPECIAL | PUNCT_START | PUNCT_END
    flags.setflags(write=False)
    return flags


def encode_units(tokenizer, texts: Sequence[str], word_boundaries: str = DataSettings.word_boundaries
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Encode each text unit with the tokenizer's own special tokens (``<s> ... </s>``, ``[CLS] ... [SEP]``).

    Returns flat ``input_ids`` int32 [T], ``flags`` uint8 [T] and ``unit_offsets`` int64 [n_units+1]. The
    tokenizer is called once for all units (the Rust backend encodes them in parallel), without truncation and
    without the "longer than the model's maximum length" warning (units are split into blocks later).
    """
    return encode_units_with_offsets(tokenizer, texts, word_boundaries)[:3]


def encode_units_with_offsets(tokenizer, texts: Sequence[str], word_boundaries: str = DataSettings.word_boundaries):
    """``encode_units`` plus where each token sits in the text: ``(input_ids, flags, unit_offsets, offsets,
    joined)`` with ``offsets`` int64 [T, 2] character spans into ``joined``, the units joined with "\\n"
    (special tokens carry the empty span at the start of their unit). ``word_boundaries``: the rule of the flags,
    ``text`` or ``code`` (module docstring)."""
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
    flags = word_flags(word_boundaries, tokenizer, ids, joined, offsets, special, unit_offsets)
    return ids.astype(np.int32), flags, unit_offsets, offsets, joined


def word_flags(word_boundaries: str, tokenizer, ids: np.ndarray, text: str, offsets: np.ndarray, special: np.ndarray,
               unit_offsets: np.ndarray) -> np.ndarray:
    """The flags of tokens ``ids`` by rule ``word_boundaries``: ``text`` reads their spans ``offsets`` in ``text``
    (``token_flags``), ``code`` their ids' decoded strings (``decoded_flags``)."""
    if word_boundaries == "text":
        return token_flags(text, offsets, special, unit_offsets)
    if word_boundaries != "code":
        raise ValueError(f"word_boundaries must be 'text' or 'code', not {word_boundaries!r}")
    return decoded_flags(tokenizer)[ids]


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
