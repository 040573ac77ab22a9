"""kNN index over the datastore's fp16 token vectors, built with FAISS (paper 3.3 and 5.3; paper-map §3.5, §4.1).

FAISS only *picks candidates*. The similarity of a neighbour is always recomputed exactly from the stored fp16
vector, upcast to fp32, as ``q . e / sqrt(h)`` (paper-map §3.5; the sqrt(h) scaling belongs to the similarity: /32
for roberta-large). FAISS distances are never used.

Input: the corpus vectors as raw fp16 memmaps (no .npy header), one file per embedding shard, each ``[rows_k, h]``
in datastore row order. A shard list is ``[(path, rows), ...]``; the global row id of a vector is the sum of the
rows of the shards before it plus its row within its shard. Vectors are added to FAISS in that order, so a FAISS id
*is* the global row id (no ID map).

Index type and metric are configuration: ``factory`` is a FAISS factory string and ``metric``
is stated explicitly.

* This re-implementation: ``metric="ip"`` (inner product, the quantity NPM ranks by). Default ``factory="HNSW32"``,
  what the paper (5.3) says it uses.
* CODE!=PAPER. The original code builds IVF-PQ (nlist 4096, M 64, 8 bits, nprobe 8, <= 1M training vectors,
  seed 1) and leaves FAISS's default metric, L2, although its coarse quantizer is IndexFlatIP. ``metric="code"``
  (config ``datastore.faiss_metric: code``) builds exactly that mixture: the factory's index in L2 with an
  inner-product flat quantizer put in before training: the index as its CPU build trains it. Its default build is
  on the GPU, where FAISS 1.7.2's copy rebuilds the coarse quantizer in the index's own metric, so the index behind
  the published numbers is L2 throughout: ``metric="l2"``, the paper routes' (paper-map §3.5).
  ``factory="IVF4096,PQ64", metric="ip"`` is the original's index type with the metric NPM actually scores by.

Choices this module makes and documents:

* Training uses a sample of at most ``train_sample`` rows drawn with ``np.random.default_rng(seed)`` (every row,
  in order, when the datastore is smaller); ``train_draw="code"`` (config ``datastore.faiss_train_draw``, the paper
  routes') draws the original's sample instead, in its order (``sample_rows``). The rows are read from the memmaps
  and upcast to fp32. Vectors are added in chunks of ``add_chunk`` rows, so the whole corpus is never held in RAM.
* IVF nlist too large for the sample: FAISS wants at least 39 training points per list. When
  ``39 * nlist > n_train``, nlist is **reduced automatically** to ``max(1, n_train // 39)``. A warning is logged
  and both values are recorded in the sidecar (``nlist_requested``, ``nlist``, ``factory_effective``). This keeps
  the original's "IVF4096,PQ64" working on the small embedded datastore.
* PQ: ``M`` must divide the dimension the PQ sees (h, or the output of an OPQ/PCA transform). Otherwise a ValueError
  says so and lists the valid M. PQ with b-bit codes needs at least 2**b training vectors; with fewer, a ValueError
  suggests "Flat". A datastore that small needs no approximate index.
* PQ: the polysemous training pass that ``index_factory`` turns on for "PQm" (and off for "PQmnp") is always
  switched off. It only serves Hamming filtering, which is never enabled here, and it dominates training
  time. The original's IndexIVFPQ constructor does not run it either.
* Search parameters (``nprobe`` for IVF, ``efSearch`` for HNSW) are set through ``faiss.ParameterSpace``. They are
  recorded in the sidecar ``<out_path>.json`` and re-applied by :func:`load_faiss_index`, where they can be
  overridden.
* The index is written atomically: to a temporary file in the same folder, then ``os.replace``. The sidecar is put
  in place first, so an index file under its final name always has its sidecar. A build that raises leaves nothing
  at ``out_path``.
* GPU: when FAISS sees a GPU (``faiss.get_num_gpus() > 0``) and ``use_gpu`` is not False, IVF indexes are trained
  and filled on GPU through ``index_cpu_to_gpu`` with ``GpuClonerOptions.useFloat16 = True``, then copied back to
  CPU (paper-map §3.5). HNSW has no GPU version and is always built on CPU. ``use_gpu=True`` without a GPU is an
  error. ``use_gpu=None`` silently uses the CPU.
* Searches run on CPU, as in the original (nprobe 8). Closed-set kNN over a Flat inner-product index does not
  call :func:`search`: it searches the index's vectors exactly in torch (``npm.datastore.exact_knn``, through
  :func:`flat_vectors`), on the CPU or a GPU.
* ``k`` larger than the index is clamped to ``ntotal``. FAISS pads a result list with id -1 when it finds fewer than
  k neighbours, for example IVF when the ``nprobe`` probed lists hold fewer than k vectors. With NPM's k=4096 and
  nprobe 8, that happens for any datastore under about 4096 * nlist / 8 vectors. :func:`search` keeps those -1
  entries and returns a ``valid`` mask with them. :func:`exact_scores` gives them the score ``-inf``, so that a
  softmax assigns them zero probability.
* HNSW: :func:`search` raises efSearch to k for a call with k > efSearch. It passes per-call search parameters and
  leaves the index unchanged. Otherwise FAISS explores only efSearch candidates and returns a poor or -1-padded list
  at NPM's k=4096.
* Recall: ``benchmarks/faiss_recall.py`` measures recall@k against "Flat". For datastores of a few hundred thousand
  vectors, "Flat" (exact) is fast enough and is the only setting whose k=4096 candidate list is exact.
* Identity (issue 12): the sidecar's ``datastore`` record (``plan``, ``model_fingerprint``, ``corpus_fingerprint``,
  ``n_rows``, ``hidden_size``, the datastore folder) says which datastore the vectors came from. The ``plan`` of
  ``meta.json`` hashes the datastore's token arrays, the model fingerprint and the embedding settings, so two models
  with the same hidden size over the same corpus (same rows) still differ. :func:`load_faiss_index` with
  ``datastore=`` (the Predictor always passes it) checks dimension, row count and plan and refuses a mismatch, a
  missing sidecar or a sidecar without the record. A file FAISS cannot read (not an index, truncated) is a
  ValueError naming it. The sidecar also records the index file's sha256 (``checksums``, ``npm.checksums``), which
  :func:`load_faiss_index` verifies (hashed once per file, then cached), so bytes changed after the build (the
  vectors of a Flat index, say) are an error, not a slightly different score.
* Determinism: IVF/PQ training on the seeded sample is deterministic, so two builds give identical indexes. HNSW
  construction with more than one thread is not bit-reproducible (FAISS inserts in parallel). Pass ``threads=1`` when
  that matters.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

import npm.checksums as checksums
from npm.edge_errors import faiss_gist, first_line
from npm.io import atomic_path, dumps_json, read_json
from npm.settings import DatastoreSettings, Settings

log = logging.getLogger(__name__)

METRICS = ("ip", "l2", "code")  # code: the original's IndexIVFPQ as built on a CPU, IP quantizer + L2 codes
BLAS_THRESHOLD = 20  # FAISS's former default, set by search for a batch (its matrix-product path; see search)
BLAS_MIN_QUERIES = 4  # from this many query vectors on, that path is faster (see search)
ADD_CHUNK = 1_000_000  # vectors added to the index at a time
MIN_POINTS_PER_CENTROID = 39  # below this FAISS's k-means warns that the clustering is unreliable

Shards = Sequence[tuple[str | os.PathLike, int]]


def _faiss():
    try:
        import faiss
    except ImportError as e:  # pragma: no cover - faiss is a declared dependency of the index stage
        raise ImportError("the FAISS index needs the faiss-cpu (or faiss-gpu) package: pip install faiss-cpu") from e
    return faiss


def _metric(metric: str) -> int:
    faiss = _faiss()
    if metric == "ip":
        return faiss.METRIC_INNER_PRODUCT
    if metric in ("l2", "code"):
        return faiss.METRIC_L2
    raise ValueError(f"metric must be one of {METRICS} (inner product, L2, or the original code's inner-product "
                     f"quantizer with L2 codes), got {metric!r}")


def sidecar_path(out_path: str | os.PathLike) -> Path:
    """The JSON sidecar beside an index: ``<out_path>.json``."""
    out_path = Path(out_path)
    return out_path.with_name(out_path.name + ".json")


# --------------------------------------------------------------------------------------------- identity

REBUILD = "rebuild the index (rule build_faiss_index)"


def datastore_record(datastore, corpus: bool = True) -> dict:
    """What identifies the datastore an index is built from: ``plan``, ``model_fingerprint``,
    ``corpus_fingerprint``, ``n_rows``, ``hidden_size``, ``model`` and ``root`` (the folder, informative only).

    ``datastore``: a ``npm.datastore.store.Datastore`` or its ``meta`` dict (then ``corpus_fingerprint`` only when
    the meta records it and ``root`` only when the dict has one). ``corpus=False``: take ``corpus_fingerprint``
    only from the meta, never hash the token arrays."""
    if isinstance(datastore, dict):
        meta, root, fingerprint = datastore, datastore.get("root"), datastore.get("corpus_fingerprint")
    else:
        meta, root = datastore.meta, str(datastore.root)
        fingerprint = datastore.corpus_fingerprint if corpus else meta.get("corpus_fingerprint")
    missing = [k for k in ("n_rows", "hidden_size") if k not in meta]
    if missing:
        raise ValueError(f"datastore record {root or '(no folder)'} lacks {missing}: pass a Datastore or its meta")
    return {"root": None if root is None else str(root), "model": meta.get("model"), "plan": meta.get("plan"),
            "model_fingerprint": meta.get("model_fingerprint"), "corpus_fingerprint": fingerprint,
            "n_rows": int(meta["n_rows"]), "hidden_size": int(meta["hidden_size"])}


def _short(x) -> str:
    return str(x)[:12] if x else "none"


def _check_datastore(path: Path, index, sidecar: dict | None, want: dict) -> None:
    """``index`` (read from ``path``, with its ``sidecar``) must have been built from the datastore ``want``."""
    name = f"the datastore {want['root']}" if want.get("root") else "the datastore"
    if int(index.d) != want["hidden_size"]:
        raise ValueError(f"FAISS index {path} has dimension {index.d}, {name} hidden size {want['hidden_size']}: "
                         f"the index holds other vectors; {REBUILD}")
    if int(index.ntotal) != want["n_rows"]:
        raise ValueError(f"FAISS index {path} holds {index.ntotal} vectors, {name} has {want['n_rows']} rows: the "
                         f"index holds other vectors; {REBUILD}")
    hint = f"{REBUILD}" + (f": `npm-repro build-faiss-index --datastore {want['root']} --out {path}`"
                           if want.get("root") else "")
    if sidecar is None:
        raise ValueError(f"FAISS index {path} has no sidecar {sidecar_path(path).name}, so it cannot be checked "
                         f"against {name}; {hint}")
    have = sidecar.get("datastore")
    if not isinstance(have, dict):
        raise ValueError(f"FAISS index {path}: its sidecar {sidecar_path(path).name} records no datastore (built "
                         f"before indexes recorded the datastore they index), so it cannot be checked against "
                         f"{name}; {hint}")
    keys = ("plan",) if have.get("plan") and want.get("plan") else ("model_fingerprint", "corpus_fingerprint")
    compared = [k for k in keys if want.get(k)]
    if not compared:
        raise ValueError(f"{name} records neither a plan nor fingerprints, so FAISS index {path} cannot be checked "
                         "against it; re-run the embed step")
    if any(have.get(k) != want[k] for k in compared):
        built = f" ({have['root']})" if have.get("root") else ""
        raise ValueError(f"FAISS index {path} was built from another datastore{built} than {name}: its sidecar "
                         f"records plan {_short(have.get('plan'))} (model fingerprint "
                         f"{_short(have.get('model_fingerprint'))}), the datastore's meta.json has plan "
                         f"{_short(want.get('plan'))} (model fingerprint {_short(want.get('model_fingerprint'))}); "
                         f"{hint}")


def _read_index(path: Path):
    """``faiss.read_index``, with a file FAISS cannot read (not an index, truncated, empty) a ValueError naming it."""
    faiss = _faiss()
    try:
        return faiss.read_index(str(path))
    except RuntimeError as e:
        gist = faiss_gist(e) or first_line(e) or type(e).__name__
        raise ValueError(f"{path} is not a readable FAISS index (FAISS: {gist}); rebuild it") from None


def _read_sidecar(path: Path) -> dict | None:
    side = sidecar_path(path)
    if not side.exists():
        return None
    record = read_json(side, f"it is the sidecar of FAISS index {path}: {REBUILD}")
    if not isinstance(record, dict):
        raise ValueError(f"{side}, the sidecar of FAISS index {path}, is not a JSON object; {REBUILD}")
    return record


# --------------------------------------------------------------------------------------------- shards (memmaps)


def _check_shards(shards: Shards, dim: int) -> list[tuple[Path, int]]:
    if dim <= 0:
        raise ValueError(f"dim must be positive, got {dim}")
    checked = []
    for path, rows in shards:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: embedding shard does not exist; run the embedding stage first")
        expected = int(rows) * dim * 2
        size = path.stat().st_size
        if size != expected:
            raise ValueError(
                f"{path}: {size} bytes, but {rows} rows x {dim} dims x 2 bytes (fp16) = {expected}; "
                "the row count or the hidden size does not match the file"
            )
        checked.append((path, int(rows)))
    if not checked:
        raise ValueError("no embedding shards given")
    return checked


def _open(path: Path, rows: int, dim: int) -> np.memmap | np.ndarray:
    if rows == 0:
        return np.empty((0, dim), dtype=np.float16)
    return np.memmap(path, dtype=np.float16, mode="r", shape=(rows, dim))


def shards_from_files(paths: Sequence[str | os.PathLike], dim: int) -> list[tuple[Path, int]]:
    """``[(path, rows)]`` for raw fp16 shard files, with each row count inferred from the file size."""
    shards = []
    for path in paths:
        size = Path(path).stat().st_size
        if size % (2 * dim):
            raise ValueError(f"{path}: {size} bytes is not a whole number of fp16 rows of dim {dim}")
        shards.append((Path(path), size // (2 * dim)))
    return shards


def memmap_vectors(shards: Shards, dim: int) -> Callable[[np.ndarray], np.ndarray]:
    """A ``vectors_fn(rows) -> float32 [n, dim]`` that gathers global rows across the shard memmaps.

    Use it with :func:`exact_scores`. The memmaps are opened once. Row ids index the concatenation of the shards in
    list order.
    """
    checked = _check_shards(shards, dim)
    maps = [_open(p, r, dim) for p, r in checked]
    offsets = np.concatenate([[0], np.cumsum([r for _, r in checked])]).astype(np.int64)
    ntotal = int(offsets[-1])

    def vectors_fn(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= ntotal):
            bad = rows[(rows < 0) | (rows >= ntotal)][0]
            raise IndexError(f"datastore row {bad} out of range [0, {ntotal})")
        out = np.empty((rows.size, dim), dtype=np.float32)
        shard_of = np.searchsorted(offsets, rows, side="right") - 1
        for s in np.unique(shard_of):
            sel = np.nonzero(shard_of == s)[0]
            local = rows[sel] - offsets[s]
            order = np.argsort(local, kind="stable")  # sequential reads from disk
            out[sel[order]] = maps[s][local[order]]
        return out

    return vectors_fn


def _iter_chunks(shards: list[tuple[Path, int]], dim: int, chunk: int) -> Iterator[np.ndarray]:
    """fp32 chunks of at most ``chunk`` rows, in global row order, never crossing a shard boundary."""
    for path, rows in shards:
        mm = _open(path, rows, dim)
        for start in range(0, rows, chunk):
            yield np.ascontiguousarray(mm[start : start + chunk], dtype=np.float32)
        del mm


def sample_rows(ntotal: int, n: int, seed: int, draw: str = DatastoreSettings.faiss_train_draw) -> np.ndarray:
    """The rows, at most ``n`` of ``ntotal``, an index trains on. ``draw="sorted"``: drawn with ``default_rng(seed)``
    and kept in row order (all rows if fewer). ``draw="code"``: the original's ``_train_index``, the legacy generator
    seeded with ``seed`` and ``choice(np.arange(ntotal), min(n, ntotal), replace=False)`` in drawn order (a shuffle of
    every row if fewer; it holds a permutation of all ``ntotal`` rows, 8 bytes each, while it draws). ``choice`` of
    the count draws the same rows as of ``np.arange``: both permute ``ntotal`` positions and keep the first ones."""
    if draw == "code":
        return np.random.RandomState(seed).choice(ntotal, size=min(n, ntotal), replace=False).astype(np.int64)
    if draw != "sorted":
        raise ValueError(f"train draw must be 'sorted' or 'code', not {draw!r}")
    if ntotal <= n:
        return np.arange(ntotal, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(ntotal, size=n, replace=False)).astype(np.int64)


# --------------------------------------------------------------------------------------------- factory strings

_IVF = re.compile(r"(?:^|,)IVF(\d+)")
_PQ = re.compile(r"(?:^|,)PQ(\d+)(?:x(\d+))?")
_DIM_TRANSFORM = re.compile(r"^(?:OPQ\d+_(\d+)|PCAW?R?(\d+)|RR(\d+))$")


def _pq_input_dim(factory: str, dim: int) -> int:
    """The dimension the PQ sees: ``dim``, or the output of the last OPQm_d / PCAd / RRd transform before it."""
    d = dim
    for part in factory.split(","):
        m = _DIM_TRANSFORM.match(part)
        if m:
            d = int(next(g for g in m.groups() if g))
    return d


def _check_factory(factory: str, dim: int, n_train: int) -> tuple[str, dict]:
    """Validate PQ/IVF parameters against ``dim`` and the training sample size.

    Returns the effective factory string (nlist reduced if need be) and the facts recorded in the sidecar.
    """
    info: dict = {}
    pq = _PQ.search(factory)
    if pq:
        m, nbits = int(pq.group(1)), int(pq.group(2) or 8)
        d = _pq_input_dim(factory, dim)
        if m <= 0 or d % m:
            valid = [x for x in range(1, min(d, 128) + 1) if d % x == 0]
            raise ValueError(
                f"factory {factory!r}: PQ{m} needs M to divide the vector dimension {d}; choose M in {valid}"
            )
        if n_train < 2**nbits:
            raise ValueError(
                f"factory {factory!r}: {nbits}-bit PQ needs at least {2**nbits} training vectors, the datastore has "
                f"{n_train}; use factory 'Flat' (exact search) for a datastore this small"
            )
        info.update(pq_m=m, pq_nbits=nbits)
    ivf = _IVF.search(factory)
    if ivf:
        nlist = int(ivf.group(1))
        info["nlist_requested"] = nlist
        if MIN_POINTS_PER_CENTROID * nlist > n_train:
            reduced = max(1, n_train // MIN_POINTS_PER_CENTROID)
            log.warning(
                "factory %r: %d training vectors are too few for nlist=%d (FAISS wants >= %d per list); "
                "reducing nlist to %d",
                factory, n_train, nlist, MIN_POINTS_PER_CENTROID, reduced,
            )
            start, end = ivf.span(1)
            factory = factory[:start] + str(reduced) + factory[end:]
            nlist = reduced
        info["nlist"] = nlist
    return factory, info


def _make_index(factory: str, dim: int, metric: str):
    """The untrained index of ``factory``. ``metric="code"``: the original code's ``IndexIVFPQ(IndexFlatIP(d), ...)``
    with the metric left at FAISS's default, i.e. the factory's index in L2 (its residual codes, its k-means without
    the spherical normalisation of an inner-product IVF) with an inner-product flat coarse quantizer put in before
    training (paper-map §3.5)."""
    faiss = _faiss()
    try:
        index = faiss.index_factory(dim, factory, _metric(metric))
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[-1]
        raise ValueError(
            f"FAISS rejected the factory string {factory!r} for dim {dim}: {msg}. "
            "Use a FAISS index_factory string such as 'Flat', 'HNSW32' or 'IVF4096,PQ64'"
        ) from None
    if metric == "code":
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is None or not isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexFlat):
            raise ValueError(f"FAISS metric 'code' (the original's inner-product coarse quantizer with L2 codes) needs "
                             f"an IVF factory with a flat quantizer such as 'IVF4096,PQ64', got {factory!r}; use "
                             "metric 'ip' (config datastore.faiss_metric: ip) for other indexes")
        quantizer = faiss.IndexFlatIP(ivf.d)
        quantizer.this.disown()  # the IVF index owns and frees it
        ivf.quantizer = quantizer
        ivf.own_fields = True
    return index


def index_bytes(factory: str, ntotal: int, dim: int, metric: str = "ip") -> int:
    """RAM of a filled ``factory`` index over ``ntotal`` vectors of dimension ``dim``, computed up front from FAISS's
    own code sizes (no vector is read): per vector, the stored code (``Flat`` 4·dim, ``SQ8`` dim, ``PQm`` m bytes)
    plus the 8-byte id of an IVF list entry or the HNSW links (int32 neighbours: 2M at level 0 and M per upper level,
    1/M of the vectors reaching each; plus its level and offset); fixed, the IVF centroids and any pre-transform
    matrix. Within a few percent of the written index for large ``ntotal`` (tested against FAISS)."""
    faiss = _faiss()
    effective, _ = _check_factory(factory, dim, max(ntotal, 1 << 20))  # nlist as requested (a full-size sample)
    index = outer = _make_index(effective, dim, metric)  # outer owns the inner indexes: keep it alive
    fixed = 0
    while isinstance(index, faiss.IndexPreTransform):
        for i in range(index.chain.size()):
            t = faiss.downcast_VectorTransform(index.chain.at(i))
            fixed += 4 * t.d_in * t.d_out if isinstance(t, faiss.LinearTransform) else 0
        index = faiss.downcast_index(index.index)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        fixed += index_bytes_of_quantizer(ivf)
        pq = getattr(faiss.downcast_index(ivf), "pq", None)
        fixed += 4 * pq.d * pq.ksub if pq is not None else 0  # the PQ codebooks
        del outer
        return int(fixed + ntotal * (ivf.code_size + 8))
    if isinstance(index, faiss.IndexHNSW):
        m = index.hnsw.nb_neighbors(1)
        links = 4 * (2 * m + m / max(m - 1, 1)) + 4 + 8  # neighbours, level, offset
        return int(fixed + ntotal * (faiss.downcast_index(index.storage).code_size + links))
    return int(fixed + ntotal * index.code_size)


def index_bytes_of_quantizer(ivf) -> int:
    """The IVF coarse quantizer's RAM: nlist centroids in fp32 (plus HNSW links for an IVF..._HNSW quantizer)."""
    faiss = _faiss()
    quantizer = faiss.downcast_index(ivf.quantizer)
    links = 4 * 2 * quantizer.hnsw.nb_neighbors(1) if isinstance(quantizer, faiss.IndexHNSW) else 0
    return (4 * ivf.d + links) * ivf.nlist


def check_memory(factory: str, ntotal: int, dim: int, mem_mb: int, train_sample: int,
                 where: tuple[str, str] = ("build_faiss_index", "datastore.faiss_factory")) -> dict:
    """Refuse, before any training, an index that does not fit the job's memory ``mem_mb`` (the SLURM profile's
    ``mem_mb``): the filled index, plus the fp32 training sample, plus a chunk of vectors being added, must fit in 90 %
    of it. ``where``: the rule and the config key the refusal names. Returns the estimate for the sidecar."""
    filled = index_bytes(factory, ntotal, dim)
    need = filled + 4 * dim * min(train_sample, ntotal) + 4 * dim * min(ADD_CHUNK, ntotal)
    have = mem_mb * 1_000_000
    record = {"index_bytes_estimate": filled, "memory_needed_bytes": need, "memory_mb": mem_mb}
    if need > 0.9 * have:
        per = index_bytes(factory, 1_000_000, dim) / 1_000_000
        try:
            smaller = f"{index_bytes('IVF4096,PQ64', ntotal, dim) / 1e9:.1f} GB"
        except ValueError:  # PQ64 does not divide this dimension
            smaller = "with M dividing the dimension"
        raise ValueError(
            f"a {factory!r} index over {ntotal:,} vectors of dimension {dim} needs about {need / 1e9:.1f} GB "
            f"({per:,.0f} B per vector, plus the training sample), more than 90 % of this job's {mem_mb / 1000:.0f} "
            f"GB; give the job more memory (e.g. --set-resources {where[0]}:mem_mb=...) or choose a "
            f"compressed index in config {where[1]} (e.g. 'IVF4096,PQ64', {smaller}; "
            "docs/paper-scale.md section 4)")
    return record


def _hnsw(index):
    """The IndexHNSW inside ``index`` (through a pre-transform), or None."""
    faiss = _faiss()
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        index = faiss.downcast_index(index.index)
    return index if isinstance(index, faiss.IndexHNSW) else None


def _disable_polysemous_training(index) -> bool:
    """Turn off the polysemous code-reordering pass that index_factory enables for PQ; True if there was one.

    That pass only serves Hamming-distance filtering (``polysemous_ht``), which is never enabled here. It made a
    PQ8 training 25x slower in a measurement. The original's directly constructed IndexIVFPQ does not run it either.
    """
    faiss = _faiss()
    found = False
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexPreTransform):
        inner = faiss.downcast_index(inner.index)
    ivf = _ivf(index)
    for candidate in (inner, faiss.downcast_index(ivf) if ivf is not None else None):
        if isinstance(candidate, faiss.IndexPQ | faiss.IndexIVFPQ) and candidate.do_polysemous_training:
            candidate.do_polysemous_training = False
            found = True
    return found


def _ivf(index):
    faiss = _faiss()
    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:
        return None


def _apply_search_params(index, nprobe: int | None, ef_search: int | None) -> dict:
    """Set nprobe (IVF) / efSearch (HNSW) where the index has them; return what was set."""
    faiss = _faiss()
    params: dict = {}
    space = faiss.ParameterSpace()
    if nprobe is not None and _ivf(index) is not None:
        space.set_index_parameter(index, "nprobe", int(nprobe))
        params["nprobe"] = int(nprobe)
    if ef_search is not None and _hnsw(index) is not None:
        space.set_index_parameter(index, "efSearch", int(ef_search))
        params["efSearch"] = int(ef_search)
    return params


def _hnsw_params_for_k(index, k: int):
    """Per-call HNSW params with efSearch >= k, or None when the index is not HNSW or efSearch already suffices.

    FAISS's HNSW explores only efSearch candidates. With k > efSearch it returns a poor list or pads it with -1
    (measured: at k=4000 with efSearch=128, 65% of the entries were -1), so efSearch is raised to k for that call.
    The index itself is left unchanged.
    """
    faiss = _faiss()
    hnsw = _hnsw(index)
    if hnsw is None or hnsw.hnsw.efSearch >= k:
        return None
    params = faiss.SearchParametersHNSW()
    params.efSearch = int(k)
    if isinstance(faiss.downcast_index(index), faiss.IndexPreTransform):
        outer = faiss.SearchParametersPreTransform()
        outer.index_params = params
        outer.referenced_objects = [params]  # keep the inner params alive for the C++ side
        return outer
    return params


class RowFilter:
    """The rows a search may return (``search(..., rows=RowFilter(allowed))``, ``allowed`` bool [ntotal]). Open-set
    NPM leaves out the stop-word rows this way, so that they never take one of the k places (the original's
    open-set datastore holds no stop-word vectors)."""

    def __init__(self, allowed: np.ndarray):
        self.allowed = np.asarray(allowed, dtype=bool)
        self.n_allowed = int(self.allowed.sum())


# --------------------------------------------------------------------------------------------- build


def _use_gpu(index, use_gpu: bool | None) -> bool:
    faiss = _faiss()
    n_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if use_gpu and n_gpus == 0:
        raise RuntimeError("use_gpu=True but FAISS sees no GPU (install faiss-gpu and check CUDA_VISIBLE_DEVICES)")
    if use_gpu is False or n_gpus == 0:
        return False
    if _hnsw(index) is not None or _ivf(index) is None:
        if use_gpu:
            log.warning("index %s has no GPU build path (HNSW/Flat); building on CPU", type(index).__name__)
        return False
    if _ivf(index).metric_type != faiss.downcast_index(_ivf(index).quantizer).metric_type:
        log.warning("index %s mixes metrics (metric 'code'), which FAISS's GPU index does not; building on CPU",
                    type(index).__name__)
        return False
    return True


def _fill(index, shards, dim, sample, add_chunk) -> None:
    if not index.is_trained:
        index.train(sample)
    for chunk in _iter_chunks(shards, dim, add_chunk):
        index.add(chunk)


@contextlib.contextmanager
def _omp_threads(threads: int | None) -> Iterator[None]:
    """Run FAISS with ``threads`` OpenMP threads (None: leave as is), restoring the previous count after."""
    faiss = _faiss()
    before = faiss.omp_get_max_threads()
    if threads is not None:
        faiss.omp_set_num_threads(int(threads))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def build_faiss_index(
    shards: Shards,
    dim: int,
    out_path: str | os.PathLike,
    factory: str = "HNSW32",
    metric: str = "ip",
    train_sample: int = 1_000_000,
    seed: int = 1,
    train_draw: str = DatastoreSettings.faiss_train_draw,
    add_chunk: int = ADD_CHUNK,
    nprobe: int = DatastoreSettings.nprobe,
    ef_search: int = DatastoreSettings.ef_search,
    ef_construction: int = 200,
    use_gpu: bool | None = None,
    threads: int | None = None,
    datastore=None,
    mem_mb: int | None = None,
    where: tuple[str, str] = ("build_faiss_index", "datastore.faiss_factory"),
) -> dict:
    """Build a FAISS index over the fp16 shard memmaps and write it (with its JSON sidecar) atomically.

    ``shards`` is ``[(path, rows), ...]`` in datastore order. ``dim`` is the hidden size h. ``threads`` sets FAISS's
    OpenMP threads for the build only. ``datastore``: the ``Datastore`` (or its meta dict) the shards belong to; its
    :func:`datastore_record` goes into the sidecar, which a reader checks (``load_faiss_index(datastore=...)``);
    its row count and hidden size must be those of the shards. ``mem_mb``: the job's memory; an index that would not
    fit (:func:`check_memory`; ``where``: the rule and config key its refusal names) is refused before any work.
    Returns the sidecar record (factory, metric, ntotal, dim, training sample size, seed, search params, build
    seconds, datastore, ...).
    """
    faiss = _faiss()
    t0 = time.perf_counter()
    shards, ntotal, owner = _check_build(shards, dim, metric, train_sample, add_chunk, datastore)
    out_path = Path(out_path)
    n_train = min(train_sample, ntotal)
    effective, info = _check_factory(factory, dim, n_train)
    if mem_mb:
        info.update(check_memory(effective, ntotal, dim, mem_mb, n_train, where))
    index = _make_index(effective, dim, metric)
    if _disable_polysemous_training(index):
        info["polysemous_training"] = False
    hnsw = _hnsw(index)
    if hnsw is not None:
        hnsw.hnsw.efConstruction = int(ef_construction)

    with _omp_threads(threads):
        n_threads = faiss.omp_get_max_threads()
        needs_training = not index.is_trained
        sample = memmap_vectors(shards, dim)(sample_rows(ntotal, n_train, seed, train_draw)) if needs_training else None
        index, on_gpu = _train_and_add(index, effective, shards, dim, sample, add_chunk, use_gpu)
        del sample
    if index.ntotal != ntotal:
        raise RuntimeError(f"FAISS holds {index.ntotal} vectors after adding {ntotal}; the index is inconsistent")

    params = _apply_search_params(index, nprobe, ef_search)
    record = {
        "factory": factory,
        "factory_effective": effective,
        "metric": metric,
        "ntotal": int(index.ntotal),
        "dim": dim,
        "train_sample": n_train if needs_training else 0,
        "seed": seed,
        "train_draw": train_draw,
        "params": params,
        "ef_construction": int(ef_construction) if hnsw is not None else None,
        **info,
        "built_on": "gpu" if on_gpu else "cpu",
        "threads": n_threads,
        "faiss_version": getattr(faiss, "__version__", "unknown"),
        "shards": [[str(p), r] for p, r in shards],
        "datastore": owner,
        "build_seconds": None,
    }
    _save_index(index, out_path, record, where[0], t0)
    log.info("FAISS %s (%s) over %d vectors -> %s in %.1fs", effective, metric, ntotal, out_path,
             record["build_seconds"])
    return record


def _check_build(shards: Shards, dim: int, metric: str, train_sample: int, add_chunk: int,
                 datastore) -> tuple[Shards, int, dict | None]:
    """``build_faiss_index``'s checks before any work: (the checked shards, their row count, the datastore's record
    or None). The shards must hold vectors, and be ``datastore``'s rows when it is given."""
    _metric(metric)
    if train_sample < 1 or add_chunk < 1:
        raise ValueError(f"train_sample and add_chunk must be positive, got {train_sample} and {add_chunk}")
    shards = _check_shards(shards, dim)
    ntotal = sum(r for _, r in shards)
    if ntotal == 0:
        raise ValueError("the embedding shards hold no vectors; nothing to index")
    owner = datastore_record(datastore) if datastore is not None else None
    if owner is not None and (owner["n_rows"], owner["hidden_size"]) != (ntotal, dim):
        raise ValueError(f"datastore {owner['root']} has {owner['n_rows']} rows of dimension {owner['hidden_size']}, "
                         f"the shards given {ntotal} rows of dimension {dim}: they are not that datastore's vectors")
    return shards, ntotal, owner


def _train_and_add(index, effective: str, shards: Shards, dim: int, sample: np.ndarray | None, add_chunk: int,
                   use_gpu: bool | None) -> tuple[object, bool]:
    """Train ``index`` on ``sample`` (None: it needs no training) and add the shards' vectors, on the GPU where
    ``_use_gpu`` says so (fp16, as the original; a failed move falls back to the CPU unless ``use_gpu`` asked for
    it); returns (the filled CPU index, whether it was built on the GPU)."""
    faiss = _faiss()
    on_gpu = _use_gpu(index, use_gpu)
    if on_gpu:
        try:
            co = faiss.GpuClonerOptions()
            co.useFloat16 = True  # fp16 lookup tables / storage on GPU, as the original (paper-map §3.5)
            res = faiss.StandardGpuResources()
            gpu_index = faiss.index_cpu_to_gpu(res, 0, index, co)
        except (RuntimeError, AttributeError) as e:
            if use_gpu:
                raise RuntimeError(f"cannot put FAISS index {effective!r} on GPU: {e}") from e
            log.warning("cannot put FAISS index %r on GPU (%s); building on CPU", effective, e)
            on_gpu = False
    if on_gpu:
        _fill(gpu_index, shards, dim, sample, add_chunk)
        index = faiss.index_gpu_to_cpu(gpu_index)
        del gpu_index, res
    else:
        _fill(index, shards, dim, sample, add_chunk)
    return index, on_gpu


def _save_index(index, out_path: Path, record: dict, rule: str, t0: float) -> None:
    """Write ``index`` to ``out_path`` and ``record`` (its build seconds since ``t0`` and checksum added) to its
    sidecar, each atomically, the index first; the digest is taken as the index is written (``_write_index``)."""
    owner = record["datastore"]
    command = f"npm-repro build-faiss-index --datastore {owner['root'] if owner else '...'} --out {out_path}"
    with atomic_path(out_path) as tmp_index:
        digest = _write_index(index, tmp_index)
        record["build_seconds"] = round(time.perf_counter() - t0, 3)
        record["checksums"] = {out_path.name: checksums.entry(tmp_index, rule, command, cached=False,
                                                              written=digest)}
        with atomic_path(sidecar_path(out_path)) as tmp_json:
            tmp_json.write_text(dumps_json(record, str(sidecar_path(out_path)), indent=2) + "\n", encoding="utf-8")
    checksums.entry(out_path, rule, command, written=digest)  # renamed: its first reader finds the digest cached


def _write_index(index, path: Path) -> checksums.WriteDigest:
    """``faiss.write_index(index)`` into ``path`` through a callback that hashes each chunk as it writes it: the
    index's sha256 without reading the file back (about 1 min for a 54 GB IVF-PQ index) and without a second copy
    of it in RAM (``faiss.serialize_index``)."""
    import faiss

    with open(path, "wb") as f:
        sink = checksums.HashingWriter(f)
        writer = faiss.PyCallbackIOWriter(sink.write)
        faiss.write_index(index, writer)
        del writer  # done with the file before it closes
    return sink.digest


def index_vectors(vectors: np.ndarray, factory: str = "Flat", metric: str = "ip", train_sample: int = 1_000_000,
                  seed: int = 1, nprobe: int = DatastoreSettings.nprobe,
                  ef_search: int = DatastoreSettings.ef_search) -> tuple[object, dict]:
    """An in-memory FAISS index over ``vectors`` float32 [n, d] (FAISS id = row), for a corpus small enough to embed
    on the fly (REPLUG's dense block retriever, ``npm.baselines.dense``); nothing is written.

    The factory string is checked and adapted to the training sample exactly as :func:`build_faiss_index` does (PQ M
    and sample size, IVF nlist reduced, polysemous training off; the same errors), trained on a ``default_rng(seed)``
    sample of at most ``train_sample`` rows, filled in row order, and given ``nprobe`` / ``efSearch``. Returns
    ``(index, record)`` with the record's factory, effective factory, metric, ntotal and search parameters."""
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if x.ndim != 2 or not len(x):
        raise ValueError(f"no vectors to index (shape {x.shape})")
    n, dim = x.shape
    n_train = min(train_sample, n)
    effective, info = _check_factory(factory, dim, n_train)
    index = _make_index(effective, dim, metric)
    _disable_polysemous_training(index)
    if not index.is_trained:
        index.train(x[sample_rows(n, n_train, seed)])
    index.add(x)
    params = _apply_search_params(index, nprobe, ef_search)
    return index, {"factory": factory, "factory_effective": effective, "metric": metric, "ntotal": n,
                   "params": params, **info}


# --------------------------------------------------------------------------------------------- load and search


def load_faiss_index(path: str | os.PathLike, nprobe: int | None = None, ef_search: int | None = None,
                     datastore=None):
    """Read an index written by :func:`build_faiss_index` and apply its sidecar's search params.

    ``nprobe`` / ``ef_search`` override the recorded values. Without a sidecar the index's stored params are kept.
    ``datastore`` (a ``Datastore`` or its meta dict; the pipeline's readers always pass it): the index must have
    been built from it: dimension = its hidden size, vectors = its rows, and the sidecar's recorded ``plan`` = its
    plan; otherwise (or without a sidecar recording a datastore) a ValueError naming both and saying to rebuild. A
    file FAISS cannot read, or one that does not match its sidecar, is a ValueError naming it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: FAISS index does not exist; run the build_faiss_index rule first")
    index = _read_index(path)
    sidecar = _read_sidecar(path)
    if sidecar is not None:
        recorded = {"dim": int(index.d), "ntotal": int(index.ntotal)}
        differs = {k: (sidecar[k], v) for k, v in recorded.items() if k in sidecar and sidecar[k] != v}
        if differs:
            said = ", ".join(f"{k} {a} in the sidecar, {b} in the index" for k, (a, b) in differs.items())
            raise ValueError(f"FAISS index {path} does not match its sidecar {sidecar_path(path).name} ({said}): one "
                             f"of them was replaced; {REBUILD}")
    if datastore is not None:
        meta = datastore if isinstance(datastore, dict) else datastore.meta
        _check_datastore(path, index, sidecar, datastore_record(datastore, corpus=not meta.get("plan")))
    checksums.verify(path.parent, checksums.own_record(path, (sidecar or {}).get("checksums")))  # also a copy's
    params = {}
    side = sidecar_path(path)
    if sidecar is not None:
        params = sidecar.get("params", {})
    else:
        log.warning("%s has no sidecar %s; using the search parameters stored in the index", path, side.name)
    _apply_search_params(
        index,
        nprobe if nprobe is not None else params.get("nprobe"),
        ef_search if ef_search is not None else params.get("efSearch"),
    )
    return index


def search(index, queries: np.ndarray, k: int = Settings.k,
           rows: RowFilter | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k candidate rows for each query, all queries in one FAISS call: ``(rows int64 [q, k'], valid bool
    [q, k'])``.

    ``k' = min(k, index.ntotal)``: k is clamped to the index size (to the allowed rows with ``rows``, a
    :class:`RowFilter`: then only those rows are returned). Entries FAISS could not fill are -1 in ``rows``
    and False in ``valid``. Candidates come in FAISS's order. Their exact scores come from :func:`exact_scores`.

    ``rows``: FAISS is asked for more neighbours than k (k + k/2, then twice as many, up to the index size) until
    every query has k allowed ones, which are its first k allowed neighbours: for an exact index exactly the k
    nearest allowed rows. (FAISS's own ``IDSelector`` gives the same lists but scans query by query: 25 ms per
    query against 3 on the embedded Flat index, where a batch goes through one matrix product.)
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if index.ntotal == 0:
        raise ValueError("the FAISS index is empty")
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim != 2 or queries.shape[1] != index.d:
        raise ValueError(f"queries must be [q, {index.d}], got shape {queries.shape}")
    # FAISS >= 1.8 scans query by query below 128,000 queries; with BLAS_THRESHOLD a batch is one matrix product:
    # 2.9 ms per query against 15 in batches of 128 on the embedded Flat index, the same neighbours. Per vector at
    # k 4096, one thread, 200k x 384 (FAISS 1.15): 1 vector 28 ms by default / 67 ms with it, 2: 26 / 35,
    # 4: 27 / 19, 16: 31 / 16, 64 (issue 42): 24 / 3.3. So only from BLAS_MIN_QUERIES on, and for this call only.
    with _blas_threshold(BLAS_THRESHOLD if len(queries) >= BLAS_MIN_QUERIES else None):
        return _search(index, queries, k, rows)


@contextlib.contextmanager
def _blas_threshold(value: int | None) -> Iterator[None]:
    """FAISS's process-wide ``distance_compute_blas_threshold`` set to ``value`` (None: left as is) for the block,
    then put back, so that other FAISS users in the process (index training, other searches) never see it."""
    cvar = _faiss().cvar
    before = cvar.distance_compute_blas_threshold
    if value is not None:
        cvar.distance_compute_blas_threshold = value
    try:
        yield
    finally:
        cvar.distance_compute_blas_threshold = before


def _search(index, queries: np.ndarray, k: int, rows: RowFilter | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search` once its arguments are checked."""
    ntotal = int(index.ntotal)
    if rows is None:
        k = min(int(k), ntotal)
        _, found = index.search(queries, k, params=_hnsw_params_for_k(index, k))
        found = found.astype(np.int64, copy=False)
        return found, found >= 0
    if len(rows.allowed) != ntotal:
        raise ValueError(f"the row filter covers {len(rows.allowed)} rows, the index holds {ntotal}")
    k = min(int(k), max(1, rows.n_allowed))
    out = np.full((len(queries), k), -1, np.int64)
    todo, fetch = np.arange(len(queries)), min(ntotal, k + k // 2)
    while len(todo):
        _, found = index.search(queries[todo], fetch, params=_hnsw_params_for_k(index, fetch))
        found = found.astype(np.int64, copy=False)
        keep = (found >= 0) & rows.allowed[np.maximum(found, 0)]
        enough = (keep.sum(axis=1) >= k) | (fetch == ntotal)
        first = np.argsort(~keep, axis=1, kind="stable")[:, :k]  # the first k allowed, in FAISS's order
        picked = np.take_along_axis(found, first, axis=1)
        picked[~np.take_along_axis(keep, first, axis=1)] = -1
        out[todo[enough]] = picked[enough]
        todo, fetch = todo[~enough], min(ntotal, 2 * fetch)
    return out, out >= 0


def flat_vectors(index) -> np.ndarray | None:
    """The fp32 vectors [ntotal, d] of an exact inner-product index ("Flat", metric ip): a read-only view of the
    index's own storage, no copy, valid while ``index`` lives (``npm.datastore.exact_knn`` searches them); None for
    any other index (IVF, HNSW, PQ, L2), which only FAISS searches."""
    faiss = _faiss()
    inner = faiss.downcast_index(index)
    if not isinstance(inner, faiss.IndexFlat) or inner.metric_type != faiss.METRIC_INNER_PRODUCT or not inner.ntotal:
        return None
    view = faiss.rev_swig_ptr(inner.get_xb(), inner.ntotal * inner.d).reshape(inner.ntotal, inner.d)
    view.flags.writeable = False
    return view


def exact_scores(
    queries: np.ndarray, rows: np.ndarray, vectors_fn: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """Exact neighbour scores ``q . e / sqrt(h)`` (fp32) from the stored vectors; ``-inf`` where ``rows`` is -1.

    ``vectors_fn(rows_flat) -> float32 [n, h]`` gathers datastore rows (see :func:`memmap_vectors`).
    """
    queries = np.asarray(queries, dtype=np.float32)
    rows = np.asarray(rows, dtype=np.int64)
    if queries.ndim != 2 or rows.ndim != 2 or rows.shape[0] != queries.shape[0]:
        raise ValueError(f"queries [q, h] and rows [q, k] must agree on q, got {queries.shape} and {rows.shape}")
    h = queries.shape[1]
    scale = np.float32(1.0 / math.sqrt(h))
    scores = np.full(rows.shape, -np.inf, dtype=np.float32)
    for i in range(rows.shape[0]):
        valid = rows[i] >= 0
        if not valid.any():
            continue
        vecs = np.asarray(vectors_fn(rows[i][valid]), dtype=np.float32)
        if vecs.shape != (int(valid.sum()), h):
            raise ValueError(f"vectors_fn returned shape {vecs.shape}, expected ({int(valid.sum())}, {h})")
        scores[i, valid] = (vecs @ queries[i]) * scale
    return scores
