"""Content checksums of the artefacts a later rule reads: written by the code that makes a file, verified where a
file is read (issue 34; docs/data-contracts.md, "Checksums"; docs/paper-map.md §9).

A checksum record maps file names (relative to the folder of the JSON that holds it) to entries
``{"sha256", "bytes", "rule", "command"}``: what the bytes were when rule ``rule`` (its command ``command``) made
them. It lives under the key ``checksums`` of the artefact's own JSON where it has one (the FAISS index's sidecar,
the BM25 index's ``npm-repro-index.json``, the datastore's ``plan.json``, shard markers and ``meta.json``), else in a
sidecar ``X.sha256.json`` beside file ``X`` (blocks files) or ``sha256.json`` inside folder ``X`` (checkpoints,
trained models). Readers call ``verify``: hashing goes through ``file_sha256``, cached by each file's size,
mtime_ns, ctime_ns and inode, so a file is hashed once, not by every job that reads it (the cost is in
docs/paper-scale.md). The cache lives in the user's cache folder (``cache_folder``), never beside what it hashes:
reading an artefact writes nothing into its folder, so a read-only, shared model or datastore works. A file without
a record is read as before: checksums catch a changed file, they do not refuse an artefact made before they existed.

A sidecar's record (``X.sha256.json``, a FAISS index's ``X.json``) belongs to the file it sits beside: copied or
renamed with its file, its one entry still applies (``own_record``). ``npm-repro verify`` (``verify_paths``) fails
on anything it cannot check: a missing path, a file without a record, an empty or unreadable record.

Digest kinds (an entry's ``kind``; none: ``sha256``): ``sha256``, the file's sha256, and ``parts-sha256`` (issue 43),
the sha256 of the sha256 digests of the file's consecutive ``part_bytes``-long parts (the last may be shorter), in
file order. The second is computed while a file is written in any order (``WriteDigest``: a datastore shard's rows
land sorted by block length, not in row order), so its writer hashes the bytes it has in memory and never reads the
file back; a reader recomputes either kind from the file (``file_fingerprint``). Writers pass their ``WriteDigest`` to
``entry``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from pathlib import Path

from npm.io import write_json

CHUNK_BYTES = 1 << 22
# The suffix of the fingerprint caches that earlier versions wrote beside what they hashed: skipped by folder records
# and listed as caches by `verify`.
MODEL_FINGERPRINT_CACHE = ".npm-fingerprint.cache"
LOCK_SUFFIX = ".lock"  # npm.io.folder_lock's files: `verify` lists them as locks
KEY = "checksums"  # the key of a record inside an artefact's JSON
SIDECAR_SUFFIX = ".sha256.json"  # the record of file X: X.sha256.json
FOLDER_RECORD = "sha256.json"  # the record of a folder's files, inside it
SHA256, PARTS = "sha256", "parts-sha256"  # the digest kinds (module docstring); an entry without "kind": SHA256
# parts-sha256's part size: 32 KiB hashes at 0.93 of one sha256 over the whole file (per-call overhead), and bounds
# what a WriteDigest holds for a part whose bytes came out of order (about half a part per document of a datastore)
PART_BYTES = 1 << 15
TASK_PARTS = 64  # whole parts per hashing task of WriteDigest.update_many's pool (2 MiB: the GIL is held per part)


# ------------------------------------------------------------------------------------- hashing, cached


def file_fingerprint(path: str | os.PathLike, part_bytes: int | None = None) -> str:
    """The sha256 of the bytes of ``path`` or, given ``part_bytes``, their parts-sha256 (module docstring): every
    digest a reader computes from a file's bytes is computed here."""
    h = hashlib.sha256()
    step = CHUNK_BYTES if part_bytes is None else max(1, CHUNK_BYTES // part_bytes) * part_bytes
    with open(path, "rb") as f:
        while chunk := f.read(step):
            if part_bytes is None:
                h.update(chunk)
            else:
                view = memoryview(chunk)
                for a in range(0, len(view), part_bytes):
                    h.update(hashlib.sha256(view[a:a + part_bytes]).digest())
    return h.hexdigest()


def file_sha256(path: str | os.PathLike, recorded: dict | None = None) -> str:
    """``path``'s digest of the kind of entry ``recorded`` (default: sha256), cached (``cached_digest``): hashed again
    only when the file changed. A ValueError for a kind this version does not know."""
    path, part_bytes = Path(path), _kind(recorded or {})[1]
    return cached_digest([path], path, lambda files: file_fingerprint(files[0], part_bytes),
                         _cache_kind(recorded or {}))


def _kind(recorded: dict) -> tuple[str, int | None]:
    """(kind, part_bytes) of a record entry; a ValueError for a kind this version does not know."""
    kind = recorded.get("kind", SHA256)
    if kind == SHA256:
        return kind, None
    if kind == PARTS and isinstance(recorded.get("part_bytes"), int) and recorded["part_bytes"] > 0:
        return kind, recorded["part_bytes"]
    raise ValueError(f"checksum kind {kind!r} (part_bytes {recorded.get('part_bytes')!r}) is not one this version of "
                     f"npm-repro computes ({SHA256}, {PARTS})")


def _cache_kind(recorded: dict) -> str | None:
    """The ``kind`` under which ``cached_digest`` keeps a file's digest of the kind of entry ``recorded``."""
    kind, part_bytes = _kind(recorded)
    return None if kind == SHA256 else f"{kind}/{part_bytes}"


def cached_digest(files: Sequence[Path], where: Path, compute: Callable[[Sequence[Path]], str],
                  kind: str | None = None) -> str:
    """``compute(files)``, or the value cached for ``where`` (a folder or a file) and ``kind`` (a digest kind other
    than the default's, cached apart) when every file's name, size, mtime_ns, ctime_ns and inode are those it was
    computed for (``_stat_key``): any change to a file (or a copy) computes it again. The cache changes how fast,
    never what, the value is (npm.fingerprint.model_fingerprint uses it for a model's weights)."""
    key, at = _stat_key(files), str(where.resolve()) + ("" if kind is None else f" [{kind}]")
    cache = cache_folder() / "fingerprints" / f"{hashlib.sha256(at.encode()).hexdigest()}.json"
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
        if cached["folder"] == at and cached["files"] == key:
            return str(cached["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: not trusted
        pass
    value = compute(files)
    if _stat_key(files) == key:  # no file changed while it was hashed
        try:
            write_json(cache, {"folder": at, "files": key, "fingerprint": value})
        except OSError:  # a read-only or full cache folder: the next call only hashes again
            pass
    return value


class WriteDigest:
    """The digest of a file computed from the bytes its writer has in memory, as it writes them: ``update(offset,
    data)`` for each write (each byte once). Kind ``PARTS`` (parts of ``PART_BYTES``): the writes in any order (a part
    is hashed when its bytes are all in: at once when one write covers it; a piece that comes before the bytes
    preceding it in its part is held until they come); kind ``SHA256``: the writes in file order (a FAISS index
    streamed by ``faiss.write_index``). One thread feeds it; ``entry(..., written=digest)`` records it."""

    def __init__(self, kind: str = PARTS):
        if kind not in (SHA256, PARTS):
            raise ValueError(f"unknown checksum kind {kind!r}")
        self.part_bytes = PART_BYTES if kind == PARTS else None
        self.size, self.whole, self._fed = 0, hashlib.sha256(), 0
        self.digests, self.done = bytearray(), bytearray()  # 32 bytes, and 1 once taken, per part: ~1/1000 of a file
        self.open: dict[int, list] = {}  # part number -> [sha256 so far, bytes fed, {offset in part: bytes held}]

    def update(self, offset: int, data) -> None:
        """Bytes ``data`` written at ``offset`` of the file."""
        self.update_many([(offset, data)])

    def update_many(self, writes: Sequence[tuple[int, object]], pool: Executor | None = None) -> None:
        """Bytes written: ``writes`` = [(offset, data), ...]. For parts-sha256, the whole parts they hold are hashed
        by ``pool``'s threads when given (tasks of ``TASK_PARTS`` parts; sha256 releases the GIL), the pieces of
        parts here, in this thread; returns when all are hashed, so the caller may reuse the buffers then."""
        whole: list[tuple[int, memoryview]] = []
        for offset, data in writes:
            view = memoryview(data).cast("B")
            self.size = max(self.size, offset + len(view))
            if self.part_bytes is None:
                if offset != self._fed:
                    raise ValueError(f"a sha256 WriteDigest takes its bytes in file order: offset {offset}, "
                                     f"not {self._fed}")
                self.whole.update(view)
                self._fed += len(view)
                continue
            p, at = divmod(offset, self.part_bytes)
            while view:
                piece, view = view[:self.part_bytes - at], view[self.part_bytes - at:]
                if len(piece) == self.part_bytes:
                    whole.append((p, piece))
                else:
                    self._piece(p, at, piece)
                p, at = p + 1, 0
        tasks = [whole[a:a + TASK_PARTS] for a in range(0, len(whole), TASK_PARTS)]
        for task, digests in zip(tasks, (pool.map if pool is not None and len(tasks) > 1 else map)(_digests, tasks),
                                 strict=True):
            for (p, _), digest in zip(task, digests, strict=True):
                self._take(p, digest)

    def _piece(self, p: int, at: int, piece: memoryview) -> None:
        """Bytes ``at`` .. of part ``p``, fewer than the whole part: hashed now if they follow the bytes hashed so
        far, else held; the part's digest is taken when it is full."""
        state = self.open.setdefault(p, [hashlib.sha256(), 0, {}])
        if at != state[1]:
            state[2][at] = bytes(piece)
            return
        state[0].update(piece)
        state[1] += len(piece)
        while state[1] in state[2]:
            held = state[2].pop(state[1])
            state[0].update(held)
            state[1] += len(held)
        if state[1] == self.part_bytes:
            self._take(p, state[0].digest())
            del self.open[p]

    def _take(self, p: int, digest: bytes) -> None:
        """Part ``p``'s digest is ``digest``."""
        if len(self.done) <= p:
            grow = max(p + 1, 2 * len(self.done)) - len(self.done)
            self.done.extend(bytes(grow))
            self.digests.extend(bytes(32 * grow))
        self.digests[32 * p:32 * p + 32] = digest
        self.done[p] = 1

    def fields(self) -> dict:
        """The entry's digest fields (``sha256``, and for parts-sha256 ``kind`` and ``part_bytes``) for the ``size``
        bytes written; a ValueError when bytes below ``size`` were never written."""
        if self.part_bytes is None:
            return {"sha256": self.whole.hexdigest()}
        n, last = -(-self.size // self.part_bytes), self.size % self.part_bytes
        if last and self.open.get(n - 1, [None, 0, {}])[1] == last and not self.open[n - 1][2]:
            self._take(n - 1, self.open.pop(n - 1)[0].digest())  # the last, shorter part
        missing = n - self.done[:n].count(1)
        if missing or self.open:
            raise ValueError(f"{missing or len(self.open)} of the {n} parts of {self.size} bytes were not all written")
        return {"sha256": hashlib.sha256(self.digests[:32 * n]).hexdigest(), "kind": PARTS,
                "part_bytes": self.part_bytes}


def _digests(parts: Sequence[tuple[int, memoryview]]) -> list[bytes]:
    """The sha256 digest of each (part number, bytes)."""
    return [hashlib.sha256(view).digest() for _, view in parts]


class HashingWriter:
    """A file object open for writing whose ``write`` also feeds a sha256 ``WriteDigest`` (``digest``): for a
    library that writes a whole file in one pass through a file object or a callback (``torch.save`` of a
    checkpoint's state, ``faiss.write_index``), so the file's sha256 is taken from the bytes as they go out."""

    def __init__(self, file):
        self.file, self.digest = file, WriteDigest(SHA256)

    def write(self, data) -> int:
        self.digest.update(self.file.tell(), data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def cache_folder() -> Path:
    """The user's cache folder of npm-repro, ``$XDG_CACHE_HOME/npm-repro`` (default ``~/.cache/npm-repro``): where the
    digests of ``cached_digest`` live (``fingerprints/``, one small JSON per hashed file or model folder, named by the
    sha256 of its resolved path). Nothing is cached beside what is hashed, so reading writes nothing into a model,
    datastore or index folder. Deleting it only costs hashing again."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "npm-repro"


def _stat_key(files: Sequence[Path]) -> list[list]:
    """[name, size, mtime_ns, ctime_ns, inode] of each file: what a cached fingerprint of ``files`` is valid for."""
    return [[p.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] for p in files for st in [p.stat()]]


# ------------------------------------------------------------------------------------------ records


class ChecksumMismatch(ValueError):
    """A file whose bytes differ from the checksum recorded when it was made."""


def entry(path: str | os.PathLike, rule: str, command: str, cached: bool = True,
          written: WriteDigest | None = None) -> dict:
    """The record entry of ``path``: its digest and size, and the rule / command that made it. ``written``: the
    digest its writer computed while writing it (``WriteDigest``; the file is not read); else its sha256, read from
    the file. ``cached=False`` for a file about to be renamed (a temporary file), whose cache would be left behind
    under the temporary name; otherwise the digest is cached for the file as it is now, so its readers do not hash it
    again."""
    path = Path(path)
    size = path.stat().st_size
    if written is None:
        fields = {"sha256": file_sha256(path) if cached else file_fingerprint(path)}
    else:
        fields = written.fields()
        if written.size != size:
            raise ValueError(f"{path} has {size} bytes, but {written.size} were written and hashed")
        if cached:  # what a reader would compute, so that it does not
            cached_digest([path], path, lambda _: fields["sha256"], _cache_kind(fields))
    return {**fields, "bytes": size, "rule": rule, "command": command}


def folder_files(folder: str | os.PathLike, skip: Iterable[str] = ()) -> list[str]:
    """The files under ``folder`` (relative names, sorted) but ``skip``, fingerprint caches and records."""
    folder, skip = Path(folder), set(skip) | {FOLDER_RECORD}
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and p.name not in skip and not p.name.endswith(MODEL_FINGERPRINT_CACHE))


def folder_record(folder: str | os.PathLike, rule: str, command: str, skip: Iterable[str] = (),
                  written: dict[str, WriteDigest] | None = None) -> dict:
    """Entries of every file under ``folder`` (``folder_files``), uncached: ``folder`` is a build folder about to be
    renamed. A file of ``written`` (relative name: the digest its writer took) is not read; the others are hashed."""
    folder, written = Path(folder), written or {}
    return {name: entry(folder / name, rule, command, cached=False, written=written.get(name))
            for name in folder_files(folder, skip)}


def write_sidecar(path: str | os.PathLike, rule: str, command: str) -> dict:
    """Record the checksum of file ``path`` (in place) in its sidecar ``path.sha256.json``; returns the record."""
    path = Path(path)
    record = {path.name: entry(path, rule, command)}
    write_json(sidecar_of(path), {KEY: record})
    return record


def write_folder_record(folder: str | os.PathLike, rule: str, command: str,
                        written: dict[str, WriteDigest] | None = None) -> dict:
    """Record the checksums of every file of ``folder`` (a build folder) in ``folder/sha256.json`` (``written``: as
    ``folder_record``)."""
    record = folder_record(folder, rule, command, written=written)
    write_json(Path(folder) / FOLDER_RECORD, {KEY: record})
    return record


def sidecar_of(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def _read(json_path: Path) -> dict | None:
    """The checksum record inside ``json_path``, or None (no such file, no record, not JSON)."""
    try:
        record = json.loads(json_path.read_text(encoding="utf-8")).get(KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return record if isinstance(record, dict) else None


REBUILD = "it changed since; delete it and re-run snakemake, or re-run `{command}`"  # the advice of a mismatch
# ... of a model's file (npm.model.model_path): a damaged model is rebuilt, not the datastores made from it
REBUILD_MODEL = ("the model changed since it was built: rebuild the model (delete it and re-run `{command}`, or "
                 "download it again) before embedding, training or evaluating with it")


def mismatch(path: Path, recorded: dict, now: str | None, advice: str = REBUILD) -> str:
    """The one-line message for file ``path`` whose bytes (sha256 ``now``; None: missing) differ from ``recorded``;
    ``advice`` (``{command}``: the recorded command) says how to rebuild it."""
    state = "is missing" if now is None else (f"does not match the checksum recorded when it was built "
                                              f"({recorded.get('kind', SHA256)} {recorded['sha256'][:12]}, now "
                                              f"{now[:12]})")
    copy = f" (recorded as {recorded['recorded_as']}: a copied or renamed file)" if "recorded_as" in recorded else ""
    return (f"{path} {state} by rule {recorded.get('rule')} / {recorded.get('command')}{copy}: "
            f"{advice.format(command=recorded.get('command'))}")


def status(root: str | os.PathLike, record: dict | None,
           advice: str = REBUILD) -> list[tuple[Path, str, str | None]]:
    """``(file, "ok" | "MISMATCH" | "MISSING" | "UNREADABLE RECORD", message)`` of every file of ``record`` (names
    relative to ``root``), each recomputed with its entry's digest kind (an unknown kind: UNREADABLE RECORD)."""
    out = []
    for name, recorded in (record or {}).items():
        path = Path(root) / name
        if not path.is_file():
            out.append((path, "MISSING", mismatch(path, recorded, None, advice)))
            continue
        try:
            now = file_sha256(path, recorded)
        except ValueError as e:
            out.append((path, "UNREADABLE RECORD", f"{path}: its record's {e}; rebuild it with the rule that made it, "
                                                   "or use the npm-repro that did"))
            continue
        ok = now == recorded.get("sha256")
        out.append((path, "ok" if ok else "MISMATCH", None if ok else mismatch(path, recorded, now, advice)))
    return out


def verify(root: str | os.PathLike, record: dict | None, names: Iterable[str] | None = None,
           advice: str = REBUILD) -> None:
    """Raise ``ChecksumMismatch`` (one line: the file, the rule that made it, how to rebuild it) for the first file of
    ``record`` (only ``names`` when given) whose bytes differ from its recorded sha256. No record: nothing to check."""
    if record and names is not None:
        record = {n: record[n] for n in names if n in record}
    for _, state, message in status(root, record, advice):
        if state != "ok":
            raise ChecksumMismatch(message)


def own_record(path: str | os.PathLike, record: dict | None) -> dict | None:
    """The record of file ``path`` held by its sidecar (``X.sha256.json``, a FAISS index's ``X.json``): the entry
    under its name or, when the pair was copied or renamed (the sidecar names another file), the sidecar's only
    entry (its old name under ``recorded_as``, which the message gives), since a sidecar's digest is that of the file
    it sits beside. None without a record; a ChecksumMismatch
    for a record of several other files, which cannot say which is this one."""
    path = Path(path)
    if not record:
        return None
    if path.name in record:
        return {path.name: record[path.name]}
    if len(record) == 1:
        ((name, recorded),) = record.items()
        return {path.name: {**recorded, "recorded_as": name}}
    raise ChecksumMismatch(f"{path}: the checksum record beside it names {', '.join(sorted(record))}, not "
                           f"{path.name}; rebuild it with the rule that made it")


def verify_sidecar(path: str | os.PathLike) -> None:
    """Verify file ``path`` against its sidecar ``path.sha256.json`` when it has one; an empty or unreadable
    sidecar is refused (ChecksumMismatch), never read as "no record"."""
    path, side = Path(path), sidecar_of(path)
    record = _read(side)
    if not record and side.exists():
        raise ChecksumMismatch(_unreadable(side))
    verify(path.parent, own_record(path, record))


def verify_folder(folder: str | os.PathLike, advice: str = REBUILD) -> None:
    """Verify the files of ``folder`` against ``folder/sha256.json`` when it has one (an empty or unreadable one is
    refused); ``advice`` as ``mismatch``."""
    record_path = Path(folder) / FOLDER_RECORD
    record = _read(record_path)
    if not record and record_path.exists():
        raise ChecksumMismatch(_unreadable(record_path))
    verify(folder, record, advice=advice)


def _unreadable(record_path: Path) -> str:
    return (f"{record_path} is empty or not a checksum record (no JSON object with a non-empty {KEY!r} mapping); "
            "restore it or rebuild what it records")


# ------------------------------------------------------------------------------------------ npm-repro verify

Result = tuple[Path, str, str | None]  # (file, state, message: None for a state that is not a failure)


def verify_paths(paths: Iterable[str | os.PathLike]) -> list[Result]:
    """One ``(file, state, message)`` per file of ``paths`` (``npm-repro verify``; a folder: every file under it),
    each file once. Checked: ``ok``, ``MISMATCH``, ``MISSING`` (named by a record, not there); not artefacts:
    ``record`` (a JSON holding checksums), ``lock`` and ``cache`` files; and what cannot be checked, each a failure
    with its message: ``NOT FOUND`` (no such path), ``NO RECORD``, ``UNREADABLE RECORD`` (an empty or foreign record).
    A file's record is its sidecar, else a record in its folder (a folder: any under it; a file: also the folder
    above, where a datastore's meta.json names its shards)."""
    out, seen = [], set()
    for path in map(Path, paths):
        if not path.exists():
            out.append((path, "NOT FOUND", f"{path} does not exist"))
            continue
        folder = path.is_dir()
        named = _named_by_records(path if folder else path.parent, recursive=folder)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if folder else [path]
        results = [r for f in files for r in _file_states(f, named)]
        record = None if folder or path.suffix != ".json" else _read(path)
        if record:  # a record named by itself: also the files it names
            target = _sidecar_target(path)
            results += status(path.parent, own_record(target, record) if target else record)
        if folder:  # files named by a record under the folder that are not there
            results += [(Path(root) / name, "MISSING", mismatch(Path(root) / name, recorded, None))
                        for at, (root, name, recorded) in named.items() if not at.is_file()]
        for result in results:
            if result[0].resolve() not in seen:
                seen.add(result[0].resolve())
                out.append(result)
    return out


def _named_by_records(folder: Path, recursive: bool) -> dict[Path, tuple[Path, str, dict]]:
    """``{resolved file: (root, name, entry)}`` of every file named by a record in the JSON files under ``folder``
    (``recursive``) or in ``folder`` and the folder above; sidecars are left to the file beside them."""
    jsons = folder.rglob("*.json") if recursive else [*folder.glob("*.json"), *folder.parent.glob("*.json")]
    named = {}
    for j in sorted(jsons):
        if _sidecar_target(j) is None:
            for name, recorded in (_read(j) or {}).items():
                named.setdefault((j.parent / name).resolve(), (j.parent, name, recorded))
    return named


def _sidecar_target(json_path: Path) -> Path | None:
    """The file that ``json_path`` is the sidecar of (X for ``X.sha256.json`` or ``X.json``), when it exists."""
    for suffix in (SIDECAR_SUFFIX, ".json"):
        if json_path.name.endswith(suffix) and len(json_path.name) > len(suffix):
            target = json_path.with_name(json_path.name[: -len(suffix)])
            return target if target.is_file() else None
    return None


def _file_states(path: Path, named: dict) -> list[Result]:
    """The states of file ``path`` (``verify_paths``): by its sidecar, by a record naming it, or what it is."""
    for side in (sidecar_of(path), path.with_name(path.name + ".json")):
        record = _read(side)
        if not record and side.name.endswith(SIDECAR_SUFFIX) and side.exists():
            return [(path, "UNREADABLE RECORD", _unreadable(side))]
        if record:
            try:
                return status(path.parent, own_record(path, record))
            except ChecksumMismatch as e:
                return [(path, "UNREADABLE RECORD", str(e))]
    if path.resolve() in named:
        root, name, recorded = named[path.resolve()]
        return status(root, {name: recorded})
    if path.suffix == ".json" and _read(path) is not None:
        return [(path, "record", None)]
    if path.name == FOLDER_RECORD or path.name.endswith(SIDECAR_SUFFIX):
        return [(path, "UNREADABLE RECORD", _unreadable(path))]
    if path.name.endswith(MODEL_FINGERPRINT_CACHE) or path.name.endswith(LOCK_SUFFIX):
        return [(path, "cache" if path.name.endswith(MODEL_FINGERPRINT_CACHE) else "lock", None)]
    return [(path, "NO RECORD", f"{path}: no checksum recorded (no {sidecar_of(path).name} or {path.name}.json "
                                f"beside it, and no record in its folder names it); it cannot be verified")]
