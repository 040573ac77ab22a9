"""A dense block retriever for REPLUG (Shi et al. 2023, section 3.1; paper-map §R2.1 and §R2.5).

REPLUG retrieves with a dual encoder: E(d) = mean pooling of the last hidden states over d's tokens, E(x) the same
for the input, s(d, x) = cos(E(d), E(x)) (paper); the authors' code uses the raw inner product of the unnormalised
mean-pooled vectors (paper-map §R2.5). Here the encoder is NPM's own (``npm.model.load_encoder``; the blocks are
already tokenized with its tokenizer) or the retriever LSR trained from it (``npm.replug.lsr``), not Contriever.

* :func:`block_vectors`: the mean-pooled vector of every block of the blocks files (global block order); a block's
  tokens are exactly its stored ids (the units' own begin/end tokens included), padding excluded. Blocks holding a
  token id outside the encoder's vocabulary were made with another tokenizer: a ValueError naming the file.
* :class:`BlockIndex`: the vectors of the blocks *with surface text* in a FAISS index from a factory string
  (``"Flat"``, exact, by default; ``"IVF1024,Flat"``, ``"HNSW32"``, ``"IVF1024,PQ32"`` for a large corpus), metric
  inner product, built by ``npm.datastore.faiss_index.index_vectors`` (the same factory checks and errors as the
  datastore index: a corpus too small for the PQ or the nlist asked for is named). ``score="cosine"`` (default,
  paper) L2-normalises blocks and queries, ``score="ip"`` keeps the code's raw inner products. FAISS only picks
  candidates; their scores are the exact inner products with the stored vectors. A block without surface text
  (only the end token of a split unit) is never indexed, as in the BM25 index
  (``npm.datastore.bm25.block_documents``): there is nothing to prepend.
* :class:`DenseBlockSearcher`: an encoder and its :class:`BlockIndex`; ``search(query, k)`` has the interface of
  ``npm.datastore.bm25.Bm25Searcher.search``. LSR's trainable retriever uses the same :class:`BlockIndex`.

The index is built in memory on every construction: one encoder pass over the corpus. Not measured here; the
embedded enwiki corpus (2,617 blocks, 221 k tokens) at the ~1,400 tokens/s that results/benchmarks/embed-cpu.json
measured for MiniLM on 2 CPU cores is ~2.5 minutes. A paper-scale corpus would want its own rule and a saved index.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# torch and faiss are imported inside the functions that use them: the CLI's parser reads DEFAULT_INDEX from here.
from npm.data.blocks import check_vocabulary, load_blocks, pad_blocks
from npm.datastore.faiss_index import index_vectors, search
from npm.model import encode, load_encoder, load_tokenizer
from npm.progress import bar
from npm.settings import ReplugSettings

SCORES = ("cosine", "ip")
MAX_QUERY_TOKENS = 256
DEFAULT_INDEX = "Flat"  # exact search, REPLUG's own setting for its corpora of a few million chunks


def mean_pool(hidden, attention):
    """Mean of ``hidden`` [B, L, h] over the positions where ``attention`` [B, L] is 1: float32 [B, h]."""
    mask = attention.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def block_vectors(model, blocks_paths: Sequence[str | os.PathLike], batch_blocks: int = 32,
                  device=None) -> np.ndarray:
    """Mean-pooled last-layer vectors float32 [n_blocks, h] of every block of ``blocks_paths`` (global order).

    ``model`` is an encoder (``npm.model.load_encoder``) whose tokenizer made the blocks. Blocks are sorted by
    length inside each file so that a batch pads little; the rows come back in block order. A bar per file shows
    the progress (``npm.progress``: in a workflow job's log and a line on its terminal).
    """
    import torch

    if batch_blocks < 1:
        raise ValueError(f"batch_blocks must be >= 1, got {batch_blocks}")
    device = device or next(model.parameters()).device
    out = []
    for path in blocks_paths:
        arrays = load_blocks(path)
        check_vocabulary(path, arrays["input_ids"], model.config.vocab_size)
        offsets = arrays["block_offsets"]
        lengths = np.diff(offsets)
        vecs = np.zeros((len(lengths), model.config.hidden_size), dtype=np.float32)
        order = np.argsort(lengths, kind="stable")
        with torch.inference_mode(), bar(total=len(order), desc=f"retriever vectors {Path(path).name}",
                                         unit="block") as blocks_done:
            for start in range(0, len(order), batch_blocks):
                batch = order[start:start + batch_blocks]
                ids, attention = pad_blocks(arrays["input_ids"], offsets, batch, int(max(1, lengths[batch].max())))
                ids_t = torch.as_tensor(ids, device=device)
                att_t = torch.as_tensor(attention, device=device)
                vecs[batch] = mean_pool(encode(model, ids_t, att_t), att_t).float().cpu().numpy()
                blocks_done.update(len(batch))
        out.append(vecs)
    if not out:
        raise ValueError("no blocks files given: the dense retriever searches the corpus blocks")
    return np.concatenate(out)


def blocks_with_text(blocks_paths: Sequence[str | os.PathLike]) -> np.ndarray:
    """bool [n_blocks]: which blocks of the blocks files (global order) have surface text."""
    return np.concatenate([np.diff(load_blocks(p, text=True)["text_offsets"]) > 0 for p in blocks_paths])


class BlockIndex:
    """The blocks with surface text in a FAISS index from a factory string; exact inner-product scores.

    ``vectors`` float32 [n_blocks, h] of every block (global order), ``has_text`` bool [n_blocks]. ``ids``: the
    indexed global block ids; ``info``: the index record (factory, effective factory, search parameters)."""

    def __init__(self, vectors: np.ndarray, has_text: np.ndarray, score: str = ReplugSettings.score,
                 factory: str = DEFAULT_INDEX):
        import faiss

        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        if len(has_text) != len(vectors):
            raise ValueError(f"{len(vectors)} block vectors but {len(has_text)} blocks")
        self.score = score
        self.ids = np.flatnonzero(has_text).astype(np.int64)
        if not len(self.ids):
            raise ValueError("no block has surface text: there is nothing to retrieve")
        self.vectors = np.ascontiguousarray(vectors[self.ids], dtype=np.float32)
        if score == "cosine":
            faiss.normalize_L2(self.vectors)
        self.index, self.info = index_vectors(self.vectors, factory, "ip")

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(global block ids int64 [n, k'], exact scores float32 [n, k']) of query vectors [n, h], best first,
        k' = min(k, len(self)); where FAISS found fewer (an IVF probing few lists), id -1 and score -inf last."""
        import faiss

        q = np.array(queries, dtype=np.float32, ndmin=2)
        if self.score == "cosine":
            faiss.normalize_L2(q)
        rows, valid = search(self.index, q, k)
        picked = np.maximum(rows, 0)
        scores = np.where(valid, np.einsum("nkh,nh->nk", self.vectors[picked], q), -np.inf).astype(np.float32)
        order = np.argsort(-scores, axis=1, kind="stable")
        scores = np.take_along_axis(scores, order, axis=1)
        rows = np.take_along_axis(rows, order, axis=1)
        return np.where(rows >= 0, self.ids[np.maximum(rows, 0)], -1), scores


class DenseBlockSearcher:
    """REPLUG's retriever with NPM's (or an LSR-trained) encoder: mean-pooled block vectors in a
    :class:`BlockIndex` (``index``: a FAISS factory string). ``search(query, k) -> (global block ids int64, scores
    float32)``, best first, like ``Bm25Searcher``.
    """

    def __init__(self, encoder: str, blocks_paths: Sequence[str | os.PathLike], score: str = ReplugSettings.score,
                 index: str = DEFAULT_INDEX, batch_blocks: int = 32, device=None):
        import torch

        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        self.encoder_name, self.score = str(encoder), score
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.tokenizer = load_tokenizer(encoder)
        self.model = load_encoder(encoder).eval().to(self.device)
        vecs = block_vectors(self.model, blocks_paths, batch_blocks, self.device)
        self.block_index = BlockIndex(vecs, blocks_with_text(blocks_paths), score, index)
        self.index_info = self.block_index.info
        self.num_docs = len(self.block_index)

    def __len__(self) -> int:
        return self.num_docs

    def encode(self, queries: Sequence[str]) -> np.ndarray:
        """Mean-pooled query vectors float32 [n, h] (normalised for ``score="cosine"``)."""
        import faiss
        import torch

        enc = self.tokenizer(list(queries), padding=True, truncation=True, max_length=MAX_QUERY_TOKENS,
                             return_tensors="pt")
        with torch.inference_mode():
            ids, att = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
            q = np.ascontiguousarray(mean_pool(encode(self.model, ids, att), att).float().cpu().numpy())
        if self.score == "cosine":
            faiss.normalize_L2(q)
        return q

    def search(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The top-``k`` blocks of one query: (global block ids int64, scores float32), best first."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        ids, scores = self.block_index.search(self.encode([query]), int(k))
        keep = ids[0] >= 0
        return ids[0][keep], scores[0][keep]
