"""What made an artefact: content fingerprints of files, models and corpora (docs/paper-map.md §9).

Every resumable state and every index records the fingerprints of what it was made from, and every reader compares
them before use: a checkpoint is resumed only by the same training inputs, a FAISS index is read only with the
datastore it was built from, a BM25 index only with the blocks it indexes. A fingerprint is a sha256 hex digest of
content (never of paths or modification times), so a rebuilt but identical input keeps its fingerprint.

* ``file_fingerprint``: the bytes of one file.
* ``model_fingerprint``: config.json and the weight files of a model (names and bytes), after the model's checksum
  record is checked (``npm.model.model_path``: a damaged model is refused, not fingerprinted). Hashing a 1.4 GB
  checkpoint takes seconds and every shard job of a datastore needs it, so the value is cached in a small JSON file
  in the user's cache folder (``npm.checksums.cache_folder``: ``$XDG_CACHE_HOME/npm-repro/fingerprints/``, never
  inside the model folder, which may be read-only and shared), keyed by each hashed file's name, size, mtime_ns,
  ctime_ns and inode: a cached value is used only when every key matches exactly; any change to a file (or a copy of
  the folder) hashes the bytes again. The cache changes how fast, never what, the fingerprint is.
  The cache (``cached_digest``) lives in ``npm.checksums``, whose artefact checksums use it too.
* ``tokenizer_fingerprint``: the vocabulary and tokenizer files of a model folder.
* ``CorpusHasher`` / ``corpus_fingerprint``: the token ids, block lengths and token spans (each token's bytes in
  its block's text, what a predicted phrase's surface string is cut by) of a corpus's blocks, in order. It does not
  depend on how the corpus is cut into files, so the datastore (its plan, from the blocks files) and the BM25 index
  (its blocks files) of the same blocks agree.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npm.checksums import (  # noqa: F401 - file_fingerprint and the cache's name are this module's API too
    CHUNK_BYTES,
    MODEL_FINGERPRINT_CACHE,
    cached_digest,
    file_fingerprint,
)
from npm.data.blocks import load_blocks
from npm.model import model_path

CHUNK_TOKENS = 1 << 24
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "spiece.model", "sentencepiece.bpe.model")


def _hash_files(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                h.update(chunk)
    return h.hexdigest()


def model_folder(name: str) -> Path:
    """The local folder of a model name (a folder, ``pypi:PACKAGE/SUBDIR``, or a hub id already in the cache), checked
    against its checksum record when it has one (``npm.model.model_path``)."""
    path = Path(model_path(name))
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name), local_files_only=True))
    except Exception as e:  # noqa: BLE001 - any failure means: not available locally
        raise FileNotFoundError(f"model {name!r} is neither a local folder nor in the Hugging Face cache ({e}); "
                                "load it once with npm.model.load_encoder") from None


def _weight_files(folder: Path) -> list[Path]:
    names = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model*.bin.index.json")
    files = sorted({p for pattern in names for p in folder.glob(pattern)})
    return [folder / "config.json", *files] if (folder / "config.json").exists() else files


def model_fingerprint(name: str) -> str:
    """sha256 over config.json and the weight files (names and bytes) of model ``name``: what made the vectors.

    Cached (``npm.checksums.cached_digest``): the bytes are hashed again only when a file's name, size, mtime, ctime
    or inode changed since the cached value was computed."""
    folder = model_folder(name)
    files = _weight_files(folder)
    if not any(p.name != "config.json" for p in files):
        raise FileNotFoundError(f"model {name!r}: no weight files (*.safetensors, pytorch_model*.bin) in {folder}")
    return cached_digest(files, folder, lambda fs: _hash_files(fs))


def tokenizer_fingerprint(name: str) -> str:
    """sha256 over the tokenizer files (vocabulary, merges, tokenizer.json, special tokens) of ``name``'s folder."""
    folder = model_folder(name)
    files = [folder / f for f in TOKENIZER_FILES if (folder / f).exists()]
    if not files:
        raise FileNotFoundError(f"tokenizer {name!r}: no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...) in "
                                f"{folder}")
    return _hash_files(files)


class CorpusHasher:
    """Streaming fingerprint of blocks: feed ``(input_ids, block_offsets, token_spans)`` of consecutive parts in
    corpus order."""

    def __init__(self):
        self._ids = hashlib.sha256()
        self._lengths = hashlib.sha256()
        self._spans = hashlib.sha256()
        self.n_blocks = 0
        self.n_tokens = 0

    def update(self, input_ids: np.ndarray, block_offsets: np.ndarray, token_spans: np.ndarray) -> None:
        """Add the blocks ``block_offsets[b]:block_offsets[b+1]`` of ``input_ids`` and ``token_spans`` [T, 2]
        (offsets relative to the arrays)."""
        block_offsets = np.asarray(block_offsets, dtype=np.int64)
        first, last = int(block_offsets[0]), int(block_offsets[-1])
        for a in range(first, last, CHUNK_TOKENS):  # as little-endian int32 / uint16, whatever the stored dtype
            b = min(a + CHUNK_TOKENS, last)
            self._ids.update(np.asarray(input_ids[a:b], dtype="<i4").tobytes())
            self._spans.update(np.asarray(token_spans[a:b], dtype="<u2").tobytes())
        self._lengths.update(np.diff(block_offsets).astype("<i8").tobytes())
        self.n_blocks += len(block_offsets) - 1
        self.n_tokens += last - first

    def hexdigest(self) -> str:
        return hashlib.sha256(self._ids.digest() + self._lengths.digest() + self._spans.digest()).hexdigest()


def corpus_fingerprint(blocks_paths: Sequence[str | os.PathLike]) -> str:
    """The ``CorpusHasher`` fingerprint of the blocks files ``blocks_paths``, in order."""
    hasher = CorpusHasher()
    for path in blocks_paths:
        blocks = load_blocks(path, text=True)
        hasher.update(blocks["input_ids"], blocks["block_offsets"], blocks["token_spans"])
    return hasher.hexdigest()
