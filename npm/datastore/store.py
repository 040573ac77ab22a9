"""The reference-corpus datastore: which tokens get a vector, the folder layout, and the loader (paper-map
§3.1-§3.4, §3.9; §9 items 20-21).

One rule decides which corpus positions get a vector: ``stored_mask`` (valid start or valid end under the shared
``npm.boundaries`` rule, never a special token, and, for open-set corpora, never a stop-word id). The embedder
(``npm.datastore.embed``) and the loader below both call it, so the number of rows and the row -> token mapping
cannot drift apart (paper-map §3.2, §9 item 20). Rows are the stored positions in corpus order: block
order (blocks files in the order given, then block order inside each file), then position order.

Everything is a flat numpy array; nothing is a Python object per token or per block (paper-map §3.9: the original
keeps per-token int64 indexes and per-block Python lists, ~70 GB of RAM for enwiki). Besides the vectors, a
datastore holds 3 bytes per token (uint16 id + uint8 flags) plus 24 bytes per block.

Folder layout::

    <datastore>/
      plan.json                 written first (npm.datastore.embed.plan_datastore): the plan hash (token arrays, model
                                fingerprint, settings), the corpus fingerprint and every shard's row and block range.
      meta.json                 written last and atomically: its presence means the datastore is complete (the plan
                                record plus sizes, devices and provenance).
                                model name, model fingerprint (sha256 of config.json + weight files), tokenizer,
                                hidden size, dtype, n_tokens, n_blocks, n_rows, shards (file, row range, block
                                range), drop_stopwords, stopwords, sources, bytes per token, plan hash,
                                provenance.
      tokens.npz                input_ids      uint16 [T] (int32 when the vocabulary has more than 65536 ids)
                                flags          uint8 [T]: the npm.boundaries bits | STORED (128) on stored rows
                                block_offsets  int64 [n_blocks+1], global over all sources
                                row_offsets    int64 [n_blocks+1]: first embedding row of each block
                                source_block_offsets int64 [n_sources+1]: first global block of each blocks file
                                sources        str [n_sources]: the blocks files, in order
      stopword_ids.npy          int64 [n_stop], sorted: the stop list chosen by ``stopwords`` (stopword_ids_for);
                                dropped from the rows only when meta.drop_stopwords (open-set), always used to
                                filter spans
      embeddings/shard{k}.f16   raw float16 [rows_k, hidden], C order, no .npy header (as the original's
                                ``*.float16.npy``); rows_k and the row range are in meta.json
      embeddings/shard{k}.done.json   the embedder's marker of a finished shard (rows, seconds, plan hash, the
                                shard file's checksum)

``plan.json`` records the checksums (``npm.checksums``) of ``tokens.npz`` and ``stopword_ids.npy``, each shard's
marker that of its vectors, and ``meta.json`` all of them; ``load_datastore`` verifies every file against them
(hashed once per file, then cached by size/mtime/ctime/inode).

A row r lives in the shard whose row range holds it; its block is ``searchsorted(row_offsets, r) - 1`` and its
position the (r - row_offsets[block])-th STORED position of that block (computed on demand, per queried block).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

import npm.checksums as checksums
from npm.boundaries import (
    PUNCT_END,
    PUNCT_PIECE,
    PUNCT_START,
    PUNCT_TOKEN,
    SPACE_BEFORE,
    SPECIAL,
    valid_ends,
    valid_starts,
)
from npm.fingerprint import (
    corpus_fingerprint,
    model_fingerprint,  # noqa: F401 - the datastore's model identity
)
from npm.io import load_npz, read_json

FORMAT_VERSION = 1
STORED = 128  # flag bit of a position that has a vector (free in npm.boundaries' flags)
assert not STORED & (SPACE_BEFORE | PUNCT_START | PUNCT_END | SPECIAL | PUNCT_TOKEN | PUNCT_PIECE)

META = "meta.json"
PLAN = "plan.json"
TOKENS = "tokens.npz"
STOPWORDS = "stopword_ids.npy"
EMBEDDINGS = "embeddings"
VECTOR_DTYPE = np.float16
VERIFY_CHUNK_TOKENS = 1 << 24  # tokens per chunk when the loader re-applies stored_mask

# The stop list (paper-map §3.4), switch ``datastore.stopwords``: "original" is the original code's published list of
# 211 roberta-large ids, shipped beside this module with each id's roberta-large token string (valid only for that
# vocabulary); "derived" is derived per tokenizer from STOPWORDS_EN and punctuation (WordPiece, any other vocabulary).
STOPWORD_LISTS = ("original", "derived")
STOPWORDS_DEFAULT = "derived"
ORIGINAL_STOPWORDS = Path(__file__).with_name("roberta_stopwords.txt")
ROBERTA_VOCAB_SIZE = 50265  # roberta-large's byte-level BPE vocabulary, <mask> included

# A classic English stop-word list (function words: articles, pronouns, auxiliaries, prepositions, conjunctions,
# common adverbs). Paper-map §3.4: the original's 211 RoBERTa ids are English function words and punctuation,
# mostly in their space-prefixed form; they exist only as roberta-large ids, so for another vocabulary this list is
# encoded with the tokenizer (stopwords: derived).
STOPWORDS_EN = tuple("""
a about above after again against all am an and any are as at be because been before being below between both but
by can could did do does doing down during each few for from further had has have having he her here hers herself
him himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only
or other our ours ourselves out over own same she should so some such than that the their theirs them themselves
then there these they this those through to too under until up very was we were what when where which while who
whom why will with would you your yours yourself yourselves
""".split())


# --------------------------------------------------------------------------------------------- the rule


def stored_mask(input_ids: np.ndarray, flags: np.ndarray, block_offsets: np.ndarray | None = None,
                stopword_ids: np.ndarray | None = None) -> np.ndarray:
    """Bool [T]: whether each position of the flat blocks gets a vector (paper-map §3.3, §9 item 20).

    Position i is stored iff it is a valid start or a valid end of its block (``npm.boundaries``, paper-map §3.2),
    it is not a special token, and (open-set corpora) its id is not in ``stopword_ids``. The one function used by
    the embedder and by the loader.
    """
    flags = np.asarray(flags)
    mask = valid_starts(flags, block_offsets) | valid_ends(flags, block_offsets)
    mask &= (flags & SPECIAL) == 0
    if stopword_ids is not None and len(stopword_ids):
        mask &= ~np.isin(np.asarray(input_ids), np.asarray(stopword_ids))
    return mask


def derive_stopword_ids(tokenizer) -> np.ndarray:
    """Sorted int64 ids of the stop list for ``tokenizer`` (paper-map §3.4).

    Every word of ``STOPWORDS_EN`` and every ``string.punctuation`` character is encoded with a leading space and
    without one; each form that is a single non-special token contributes its id. That gives "Ġthe" and "the"
    (and "Ġ." and ".") for byte-level BPE, and "the" / "." for WordPiece.
    """
    forms = [f for w in (*STOPWORDS_EN, *string.punctuation) for f in (" " + w, w)]
    enc = tokenizer(forms, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False)
    special = set(tokenizer.all_special_ids)
    ids = {seq[0] for seq in enc["input_ids"] if len(seq) == 1 and seq[0] not in special}
    return np.array(sorted(ids), dtype=np.int64)


def read_original_stopwords(path: str | Path = ORIGINAL_STOPWORDS) -> tuple[np.ndarray, list[str]]:
    """(ids int64, token strings) of the original's stop list as shipped: one ``id<TAB>token`` line per id, sorted,
    ``#`` lines are comments (paper-map §3.4)."""
    ids, tokens = [], []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        num, sep, token = line.partition("\t")
        if not sep or not num.isdigit() or not token:
            raise ValueError(f"{path}:{n}: expected `id<TAB>token`, got {line!r}; restore the file from the package")
        ids.append(int(num))
        tokens.append(token)
    return np.array(ids, dtype=np.int64), tokens


def original_stopword_ids(tokenizer) -> np.ndarray:
    """The original's 211 stop-word ids (paper-map §3.4), after checking that ``tokenizer`` is roberta-large's
    byte-level BPE vocabulary: 50265 ids, and every shipped id maps to its shipped token string."""
    ids, tokens = read_original_stopwords()
    name = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
    if len(tokenizer) != ROBERTA_VOCAB_SIZE:
        raise ValueError(f"stopwords: original is the list of roberta-large token ids, but tokenizer {name!r} has "
                         f"{len(tokenizer)} ids, not roberta-large's {ROBERTA_VOCAB_SIZE}; set datastore.stopwords: "
                         "derived (npm-repro embed --stopwords derived) for this vocabulary")
    found = tokenizer.convert_ids_to_tokens(ids.tolist())
    wrong = [(int(i), want, got) for i, want, got in zip(ids, tokens, found, strict=True) if want != got]
    if wrong:
        shown = ", ".join(f"{i}: {got!r} (roberta-large {want!r})" for i, want, got in wrong[:5])
        raise ValueError(f"stopwords: original is the list of roberta-large token ids, but tokenizer {name!r} maps "
                         f"{len(wrong)} of its {len(ids)} ids to other tokens ({shown}); it is not roberta-large's "
                         "vocabulary: set datastore.stopwords: derived (npm-repro embed --stopwords derived)")
    return ids


def stopword_ids_for(tokenizer, stopwords: str = STOPWORDS_DEFAULT) -> np.ndarray:
    """Sorted int64 ids of the stop list ``stopwords`` (one of ``STOPWORD_LISTS``) for ``tokenizer``."""
    if stopwords == "original":
        return original_stopword_ids(tokenizer)
    if stopwords == "derived":
        return derive_stopword_ids(tokenizer)
    raise ValueError(f"stopwords must be one of {', '.join(STOPWORD_LISTS)}, not {stopwords!r}")


# ------------------------------------------------------------------------------------------------ loader


def shard_path(root: str | Path, k: int) -> Path:
    return Path(root) / EMBEDDINGS / f"shard{k}.f16"


def done_path(root: str | Path, k: int) -> Path:
    return Path(root) / EMBEDDINGS / f"shard{k}.done.json"


def read_meta(root: str | Path) -> dict:
    """meta.json of a datastore, or a clear error when it is missing (embedding unfinished) or corrupt."""
    path = Path(root) / META
    if not path.exists():
        done = sorted(Path(root).glob(f"{EMBEDDINGS}/shard*.done.json")) if Path(root).is_dir() else []
        raise FileNotFoundError(f"{root} is not a complete datastore: {META} is missing (written last by the "
                                f"embedder; {len(done)} shard(s) marked done). Re-run the embed step; it resumes.")
    meta = read_json(path, "delete it and re-run the embed step (finished shards are kept)")
    need = {"format_version", "model", "model_fingerprint", "hidden_size", "dtype", "n_tokens", "n_blocks", "n_rows",
            "shards"}
    if not isinstance(meta, dict) or need - set(meta):
        missing = sorted(need - set(meta)) if isinstance(meta, dict) else sorted(need)
        raise ValueError(f"{path} is corrupt (missing {missing}); delete it and re-run the embed step")
    if meta["format_version"] != FORMAT_VERSION:
        raise ValueError(f"{path}: datastore format {meta['format_version']}, this code reads {FORMAT_VERSION}; "
                         "re-embed the corpus")
    return meta


def read_plan(root: str | Path) -> dict:
    """plan.json of a datastore (written by the embedder's first step), or a clear error when missing or corrupt."""
    path = Path(root) / PLAN
    if not path.exists():
        raise FileNotFoundError(f"{root} has no {PLAN}: plan the datastore first (`npm-repro embed --step plan`, rule "
                                "plan_datastore)")
    plan = read_json(path, "delete it and plan the datastore again")
    if not isinstance(plan, dict) or not {"plan", "model", "model_fingerprint", "shards", "hidden_size"} <= set(plan):
        raise ValueError(f"{path} is not a datastore plan; delete it and plan the datastore again")
    return plan


def _upcast(half: np.ndarray) -> np.ndarray:
    """fp16 -> fp32 (exact) through torch's vectorised conversion: 0.2 ms for 4096 x 384 values where numpy's
    ``astype`` takes 3.5 ms (the exact scores of closed-set kNN upcast 16k rows per query)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(half)).float().numpy()


@dataclass
class _Shard:
    row_start: int
    row_end: int
    array: np.memmap | np.ndarray


class Datastore:
    """A loaded datastore: flat token arrays in RAM, the fp16 vectors as read-only memmaps.

    Attributes: ``input_ids`` [T], ``flags`` [T] (with the STORED bit), ``block_offsets`` / ``row_offsets``
    [n_blocks+1], ``source_block_offsets`` [n_sources+1], ``sources``, ``stopword_ids``, ``meta``, ``shards``
    (list of memmaps [rows_k, h], in row order), ``n_tokens``, ``n_blocks``, ``n_rows``, ``hidden_size``.
    """

    def __init__(self, root: str | Path, meta: dict, arrays: dict[str, np.ndarray], stopword_ids: np.ndarray,
                 shards: list[_Shard]):
        self.root = Path(root)
        self.meta = meta
        self.input_ids = arrays["input_ids"]
        self.flags = arrays["flags"]
        self.block_offsets = arrays["block_offsets"]
        self.row_offsets = arrays["row_offsets"]
        self.source_block_offsets = arrays["source_block_offsets"]
        self.sources = [str(s) for s in arrays["sources"]]
        self.stopword_ids = stopword_ids
        self._shards = shards
        self._shard_starts = np.array([s.row_start for s in shards], dtype=np.int64)
        self.n_tokens = int(meta["n_tokens"])
        self.n_blocks = int(meta["n_blocks"])
        self.n_rows = int(meta["n_rows"])
        self.hidden_size = int(meta["hidden_size"])
        self.shuffled: np.ndarray | None = None  # negative control: row i reads the stored vector shuffled[i]
        self._unshuffled: np.ndarray | None = None

    def shuffle_vectors(self, seed: int) -> None:
        """Negative control (docs/expected-numbers.md): decouple every vector from its token. Row ``i`` then reads the
        stored vector of row ``perm[i]`` (a seeded permutation), and :meth:`index_rows` maps the ids a FAISS index
        built from the stored vectors returns to the rows that now hold those vectors. Tokens, blocks and BM25 are
        untouched, so an NPM that works scores like chance on such a datastore."""
        perm = np.random.default_rng(seed).permutation(self.n_rows)
        self.shuffled, self._unshuffled = perm, np.argsort(perm)

    def index_rows(self, found: np.ndarray) -> np.ndarray:
        """The rows holding the stored vectors of FAISS ids ``found`` (-1 = none stays -1): the ids themselves unless
        the vectors are shuffled (:meth:`shuffle_vectors`)."""
        if self.shuffled is None:
            return found
        return np.where(found >= 0, self._unshuffled[np.maximum(found, 0)], found)

    # -- identity

    @cached_property
    def corpus_fingerprint(self) -> str:
        """The content fingerprint of the corpus blocks (``npm.fingerprint.CorpusHasher`` over ``input_ids``,
        ``block_offsets`` and the blocks' ``token_spans``): meta.json's ``corpus_fingerprint``, computed from its
        blocks files when the meta (written before it recorded one) lacks it. Equals ``corpus_fingerprint`` of the
        blocks files the datastore was built from, which a BM25 index records."""
        recorded = self.meta.get("corpus_fingerprint")
        if recorded:
            return str(recorded)
        return corpus_fingerprint(self.sources)  # the token spans are only in the blocks files

    # -- sizes

    @property
    def shards(self) -> list[np.ndarray]:
        return [s.array for s in self._shards]

    @property
    def nbytes_non_vector(self) -> int:
        """Bytes of the arrays held in RAM besides the vectors."""
        arrays = (self.input_ids, self.flags, self.block_offsets, self.row_offsets, self.source_block_offsets,
                  self.stopword_ids)
        return int(sum(a.nbytes for a in arrays))

    # -- vectors

    def vector_shards(self) -> list[tuple[Path, int]]:
        """``(file, rows)`` of every embedding shard in row order (the input of npm.datastore.faiss_index)."""
        return [(self.root / s["file"], s["rows"][1] - s["rows"][0]) for s in self.meta["shards"]]

    def vectors(self, rows) -> np.ndarray:
        """float32 [n, h]: the vectors of ``rows`` (any order, any shards), upcast exactly from fp16."""
        rows = self._check_rows(rows)
        if self.shuffled is not None:
            rows = self.shuffled[rows]
        shard = np.searchsorted(self._shard_starts, rows, side="right") - 1
        present = np.unique(shard)
        if len(present) == 1:
            s = self._shards[present[0]]
            return _upcast(np.take(s.array, rows - s.row_start, axis=0))
        out = np.empty((len(rows), self.hidden_size), dtype=np.float32)
        for k in present:
            sel = np.flatnonzero(shard == k)
            s = self._shards[k]
            out[sel] = _upcast(np.take(s.array, rows[sel] - s.row_start, axis=0))
        return out

    def iter_vectors(self, chunk_rows: int = 1 << 20):
        """Yield (first_row, float16 [n, h] view) over all rows in order, at most ``chunk_rows`` at a time."""
        for s in self._shards:
            for a in range(0, s.row_end - s.row_start, chunk_rows):
                yield s.row_start + a, s.array[a:a + chunk_rows]

    # -- rows <-> tokens

    def block_rows(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows int64, positions int64): all stored vectors of ``block`` and their positions in the block, in
        order (the BM25-restricted mode of paper-map §3.7-§3.8 scores every stored vector of its top blocks)."""
        block = self._check_block(block)
        start, end = self.block_offsets[block], self.block_offsets[block + 1]
        positions = np.flatnonzero(self.flags[start:end] & STORED).astype(np.int64)
        rows = np.arange(self.row_offsets[block], self.row_offsets[block + 1], dtype=np.int64)
        assert len(rows) == len(positions), "tokens.npz is inconsistent: STORED bits differ from row_offsets"
        return rows, positions

    def row_blocks(self, rows) -> np.ndarray:
        """int64 [n]: the block of each row (searchsorted on ``row_offsets``)."""
        return (np.searchsorted(self.row_offsets, self._check_rows(rows), side="right") - 1).astype(np.int64)

    def row_to_position(self, rows, chunk: int = 1 << 14) -> tuple[np.ndarray, np.ndarray]:
        """(block int64, position int64) of each row: ``row_blocks``, then the rank of the row among its block's
        STORED positions (per queried block; no per-token index is kept in RAM)."""
        rows = self._check_rows(rows)
        blocks = self.row_blocks(rows)
        positions = np.empty(len(rows), dtype=np.int64)
        if not len(rows):
            return blocks.astype(np.int64), positions
        for a in range(0, len(rows), chunk):
            r, b = rows[a:a + chunk], blocks[a:a + chunk]
            ub, inv = np.unique(b, return_inverse=True)
            starts = self.block_offsets[ub]
            lengths = self.block_offsets[ub + 1] - starts
            width = int(lengths.max())
            cols = np.arange(width)
            inside = cols < lengths[:, None]
            idx = np.where(inside, starts[:, None] + cols, 0)
            stored = inside & ((self.flags[idx] & STORED) != 0)
            # Global row number of the last row at or before each (block, column): nondecreasing when flattened.
            cum = self.row_offsets[ub][:, None] + np.cumsum(stored, axis=1)
            flat = np.searchsorted(cum.ravel(), r + 1, side="left")
            positions[a:a + chunk] = flat % width
            assert np.array_equal(flat // width, inv.ravel()), "row_offsets do not match the STORED bits"
        return blocks.astype(np.int64), positions

    def row_token_ids(self, rows) -> np.ndarray:
        """int64 [n]: the token id at each row's position (closed-set kNN: a neighbour votes for its token), read
        from ``row_tokens``."""
        return self.row_tokens[self._check_rows(rows)].astype(np.int64)

    @cached_property
    def row_tokens(self) -> np.ndarray:
        """The token id of every row, in row order and in ``input_ids``'s dtype (rows are the STORED positions in
        corpus order): 2 bytes per row for a vocabulary under 65,536, built on first use in chunks of 2**24
        tokens. A lookup is then one gather (closed-set kNN looks up 16k neighbours per query)."""
        chunk = 1 << 24
        parts = [self.input_ids[a:a + chunk][(self.flags[a:a + chunk] & STORED) != 0]
                 for a in range(0, self.n_tokens, chunk)]
        ids = np.concatenate(parts) if parts else np.zeros(0, self.input_ids.dtype)
        if len(ids) != self.n_rows:
            raise ValueError(f"datastore {self.root}: tokens.npz has {len(ids)} STORED positions for {self.n_rows} "
                             "rows; rebuild it")
        return ids

    def token_ids(self, block: int) -> np.ndarray:
        """int64: the token ids of ``block`` (with its special tokens)."""
        block = self._check_block(block)
        return self.input_ids[self.block_offsets[block]:self.block_offsets[block + 1]].astype(np.int64)

    def block_flags(self, block: int) -> np.ndarray:
        """uint8: the flags of ``block`` (npm.boundaries bits | STORED)."""
        block = self._check_block(block)
        return self.flags[self.block_offsets[block]:self.block_offsets[block + 1]]

    def block_source(self, blocks) -> tuple[np.ndarray, np.ndarray]:
        """(source index, block index inside that blocks file) of global ``blocks``."""
        blocks = np.asarray(blocks, dtype=np.int64)
        src = np.searchsorted(self.source_block_offsets, blocks, side="right") - 1
        return src, blocks - self.source_block_offsets[src]

    # -- checks

    def _check_rows(self, rows) -> np.ndarray:
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        if len(rows) and (rows.min() < 0 or rows.max() >= self.n_rows):
            raise IndexError(f"row out of range [0, {self.n_rows}) of datastore {self.root}")
        return rows

    def _check_block(self, block) -> int:
        block = int(block)
        if not 0 <= block < self.n_blocks:
            raise IndexError(f"block {block} out of range [0, {self.n_blocks}) of datastore {self.root}")
        return block


def check_stored(arrays: dict[str, np.ndarray], stopword_ids: np.ndarray | None,
                 chunk_tokens: int = VERIFY_CHUNK_TOKENS) -> None:
    """Re-apply ``stored_mask`` (block-aligned chunks) and check the STORED bits and ``row_offsets`` against it."""
    ids, flags, bo, ro = arrays["input_ids"], arrays["flags"], arrays["block_offsets"], arrays["row_offsets"]
    if ro[0] != 0 or len(ro) != len(bo):
        raise ValueError("row_offsets do not start at 0 or have another length than block_offsets")
    b = 0
    n_blocks = len(bo) - 1
    while b < n_blocks:
        e = max(b + 1, int(np.searchsorted(bo, bo[b] + chunk_tokens, side="right")) - 1)
        e = min(e, n_blocks)
        s, t = int(bo[b]), int(bo[e])
        mask = stored_mask(ids[s:t], flags[s:t], bo[b:e + 1] - s, stopword_ids)
        if not np.array_equal(mask, (flags[s:t] & STORED) != 0):
            bad = b + int(np.searchsorted(bo[b:e + 1] - s, np.flatnonzero(mask != ((flags[s:t] & STORED) != 0))[0],
                                          side="right")) - 1
            raise ValueError(f"block {bad}: the STORED bits differ from stored_mask (npm.boundaries rule); the "
                             "datastore was built by another version of the rule; re-embed the corpus")
        counts = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])[bo[b:e + 1] - s]
        if not np.array_equal(ro[b:e + 1] - ro[b], counts):
            raise ValueError(f"row_offsets of blocks {b}..{e} do not match the stored positions; re-embed the corpus")
        b = e


def load_datastore(path: str | Path, expected_model: str | None = None, verify: bool = True) -> Datastore:
    """Open the datastore at ``path`` (layout in the module docstring).

    ``expected_model``: a model name; its fingerprint must equal the one the vectors were made with (queries and
    corpus vectors must come from the same encoder). ``verify`` re-applies ``stored_mask`` to the token arrays and
    checks that it gives the stored rows (paper-map §9 item 20); about a second per 100M tokens.
    """
    root = Path(path)
    meta = read_meta(root)
    if int(meta["n_rows"]) <= 0:
        raise ValueError(f"datastore {root} has no stored vectors (n_rows = {meta['n_rows']}): the corpus has no "
                         "valid start/end positions left (all special or stop words?)")
    if expected_model is not None:
        want = model_fingerprint(expected_model)
        if want != meta["model_fingerprint"]:
            raise ValueError(f"datastore {root} was built with model {meta['model']!r} (fingerprint "
                             f"{meta['model_fingerprint'][:12]}), not with {expected_model!r} (fingerprint "
                             f"{want[:12]}); re-embed the corpus with this model, or, if the model changed by "
                             "accident, rebuild the model (retrain it or download it again)")
    if meta["dtype"] != "float16":
        raise ValueError(f"{root}/{META}: vectors of dtype {meta['dtype']!r}; this code reads float16")
    h = int(meta["hidden_size"])
    itemsize = np.dtype(VECTOR_DTYPE).itemsize
    shards, expect_start = [], 0
    for k, sh in enumerate(meta["shards"]):
        start, end = (int(x) for x in sh["rows"])
        f = root / sh["file"]
        if start != expect_start or end < start:
            raise ValueError(f"{root}/{META}: shard {k} covers rows [{start}, {end}), expected to start at "
                             f"{expect_start}; the meta is corrupt, re-run the embed step")
        expect_start = end
        if not f.exists():
            raise FileNotFoundError(f"datastore {root} is incomplete: {f} is missing; delete {META} and re-run the "
                                    "embed step (it redoes missing shards)")
        size, want_size = f.stat().st_size, (end - start) * h * itemsize
        if size != want_size:
            raise ValueError(f"datastore {root} is incomplete: {f} has {size} bytes, expected {want_size} "
                             f"({end - start} rows x {h} x fp16); delete {META} and its done marker and re-run")
        array = (np.memmap(f, dtype=VECTOR_DTYPE, mode="r", shape=(end - start, h)) if end > start
                 else np.zeros((0, h), dtype=VECTOR_DTYPE))
        shards.append(_Shard(start, end, array))
    if expect_start != int(meta["n_rows"]):
        raise ValueError(f"{root}/{META}: the shards hold {expect_start} rows, meta says n_rows = {meta['n_rows']}")

    arrays = load_npz(root / TOKENS)
    missing = {"input_ids", "flags", "block_offsets", "row_offsets", "source_block_offsets", "sources"} - set(arrays)
    if missing:
        raise ValueError(f"{root / TOKENS} lacks {sorted(missing)}; re-run the embed step")
    if len(arrays["input_ids"]) != int(meta["n_tokens"]) or len(arrays["block_offsets"]) != int(meta["n_blocks"]) + 1:
        raise ValueError(f"{root / TOKENS} does not match {META} (tokens or blocks differ); re-run the embed step")
    if int(arrays["row_offsets"][-1]) != int(meta["n_rows"]):
        raise ValueError(f"{root / TOKENS}: row_offsets end at {int(arrays['row_offsets'][-1])}, meta says "
                         f"n_rows = {meta['n_rows']}; re-run the embed step")
    stop_path = root / STOPWORDS
    if not stop_path.exists():
        raise FileNotFoundError(f"datastore {root} is incomplete: {stop_path} is missing; re-run the embed step")
    stopword_ids = np.load(stop_path, allow_pickle=False).astype(np.int64)
    if verify:
        check_stored(arrays, stopword_ids if meta.get("drop_stopwords") else None)
    checksums.verify(root, meta.get("checksums"))  # last: the checks above name what is wrong more precisely
    return Datastore(root, meta, arrays, stopword_ids, shards)
