"""Content checksums of the artefacts a later rule reads: written by the code that makes a file, verified where a
file is read (issue 34; docs/data-contracts.md, "Checksums"; docs/paper-map.md §9).

A checksum record maps file names (relative to the folder of the JSON that holds it) to entries
``{"sha256", "bytes", "rule", "command"}``: what the bytes were when rule ``rule`` (its command ``command``) made
them. It lives under the key ``checksums`` of the artefact's own JSON where it has one (the FAISS index's sidecar,
the BM25 index's ``npm-repro-index.json``, the datastore's ``plan.json``, shard markers and ``meta.json``), else in a
sidecar ``X.sha256.json`` beside file ``X`` (blocks files) or ``sha256.json`` inside folder ``X`` (checkpoints,
trained models). Readers call ``verify``: hashing goes through ``npm.fingerprint.file_sha256``, cached by each
file's size, mtime_ns, ctime_ns and inode, so a file is hashed once, not by every job that reads it (the cost is
in docs/paper-scale.md). A file without a record is read as before: checksums catch a changed file, they do not
refuse an artefact made before they existed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from npm.io import write_json

CHUNK_BYTES = 1 << 22
# The cache of a fingerprint beside what it hashes: JSON, but not named *.json, which checkpoint downloads fetch
# (npm.data.download.CHECKPOINT_FILES); no weight or tokenizer pattern matches it either.
MODEL_FINGERPRINT_CACHE = ".npm-fingerprint.cache"
KEY = "checksums"  # the key of a record inside an artefact's JSON
SIDECAR_SUFFIX = ".sha256.json"  # the record of file X: X.sha256.json
FOLDER_RECORD = "sha256.json"  # the record of a folder's files, inside it


# ------------------------------------------------------------------------------------- hashing, cached


def file_fingerprint(path: str | os.PathLike) -> str:
    """sha256 of the bytes of ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """``file_fingerprint(path)``, cached (``cached_digest``): hashed again only when the file changed."""
    path = Path(path)
    return cached_digest([path], path, lambda files: file_fingerprint(files[0]))


def cached_digest(files: Sequence[Path], where: Path, compute: Callable[[Sequence[Path]], str]) -> str:
    """``compute(files)``, or the value cached for ``where`` (a folder or a file) when every file's name, size,
    mtime_ns, ctime_ns and inode are those it was computed for (``_stat_key``): any change to a file (or a copy)
    computes it again. The cache changes how fast, never what, the value is (npm.fingerprint.model_fingerprint uses
    it for a model's weights)."""
    key, at = _stat_key(files), str(where.resolve())
    for cache in _fingerprint_caches(where):
        try:
            cached = json.loads(cache.read_text(encoding="utf-8"))
            if cached["folder"] == at and cached["files"] == key:
                return str(cached["fingerprint"])
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: not trusted
            pass
    value = compute(files)
    if _stat_key(files) == key:  # no file changed while it was hashed
        _write_fingerprint_cache(where, {"folder": at, "files": key, "fingerprint": value})
    return value


def _stat_key(files: Sequence[Path]) -> list[list]:
    """[name, size, mtime_ns, ctime_ns, inode] of each file: what a cached fingerprint of ``files`` is valid for."""
    return [[p.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] for p in files for st in [p.stat()]]


def _fingerprint_caches(where: Path) -> list[Path]:
    """Where the fingerprint of ``where`` may be cached, in order: beside it (a folder: ``MODEL_FINGERPRINT_CACHE``
    inside it; a file NAME: ``.NAME`` + that suffix in its folder), then the user's cache folder ($XDG_CACHE_HOME or
    ~/.cache)/npm-repro/fingerprints/, under the sha256 of ``where``'s resolved path."""
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "npm-repro" / "fingerprints"
    named = hashlib.sha256(str(where.resolve()).encode()).hexdigest()
    beside = (where / MODEL_FINGERPRINT_CACHE if where.is_dir()
              else where.parent / f".{where.name}{MODEL_FINGERPRINT_CACHE}")
    return [beside, user / f"{named}.json"]


def _write_fingerprint_cache(where: Path, record: dict) -> None:
    """Write the cache record atomically beside ``where`` when that folder is writable, else (or when that fails: a
    read-only file system) in the user's cache folder; when both fail the next call only hashes again."""
    beside, user = _fingerprint_caches(where)
    for target in ([beside] if os.access(beside.parent, os.W_OK) else []) + [user]:
        try:
            write_json(target, record)
            return
        except OSError:
            continue


# ------------------------------------------------------------------------------------------ records


class ChecksumMismatch(ValueError):
    """A file whose bytes differ from the checksum recorded when it was made."""


def entry(path: str | os.PathLike, rule: str, command: str, cached: bool = True) -> dict:
    """The record entry of ``path``: its sha256 and size, and the rule / command that made it. ``cached=False`` for
    a file about to be renamed (a temporary file), whose cache would be left behind under the temporary name."""
    path = Path(path)
    return {"sha256": file_sha256(path) if cached else file_fingerprint(path), "bytes": path.stat().st_size,
            "rule": rule, "command": command}


def folder_files(folder: str | os.PathLike, skip: Iterable[str] = ()) -> list[str]:
    """The files under ``folder`` (relative names, sorted) but ``skip``, fingerprint caches and records."""
    folder, skip = Path(folder), set(skip) | {FOLDER_RECORD}
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and p.name not in skip and not p.name.endswith(MODEL_FINGERPRINT_CACHE))


def folder_record(folder: str | os.PathLike, rule: str, command: str, skip: Iterable[str] = ()) -> dict:
    """Entries of every file under ``folder`` (``folder_files``), hashed uncached: ``folder`` is a build folder about
    to be renamed."""
    folder = Path(folder)
    return {name: entry(folder / name, rule, command, cached=False) for name in folder_files(folder, skip)}


def write_sidecar(path: str | os.PathLike, rule: str, command: str) -> dict:
    """Record the checksum of file ``path`` (in place) in its sidecar ``path.sha256.json``; returns the record."""
    path = Path(path)
    record = {path.name: entry(path, rule, command)}
    write_json(sidecar_of(path), {KEY: record})
    return record


def write_folder_record(folder: str | os.PathLike, rule: str, command: str) -> dict:
    """Record the checksums of every file of ``folder`` (a build folder) in ``folder/sha256.json``."""
    record = folder_record(folder, rule, command)
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


def mismatch(path: Path, recorded: dict, now: str | None) -> str:
    """The one-line message for file ``path`` whose bytes (sha256 ``now``; None: missing) differ from ``recorded``."""
    state = "is missing" if now is None else (f"does not match the checksum recorded when it was built (sha256 "
                                              f"{recorded['sha256'][:12]}, now {now[:12]})")
    return (f"{path} {state} by rule {recorded.get('rule')} / {recorded.get('command')}: it changed since; delete it "
            f"and re-run snakemake, or re-run `{recorded.get('command')}`")


def status(root: str | os.PathLike, record: dict | None) -> list[tuple[Path, str, str | None]]:
    """``(file, "ok" | "MISMATCH" | "MISSING", message)`` of every file of ``record`` (names relative to ``root``)."""
    out = []
    for name, recorded in (record or {}).items():
        path = Path(root) / name
        if not path.is_file():
            out.append((path, "MISSING", mismatch(path, recorded, None)))
            continue
        now = file_sha256(path)
        ok = now == recorded.get("sha256")
        out.append((path, "ok" if ok else "MISMATCH", None if ok else mismatch(path, recorded, now)))
    return out


def verify(root: str | os.PathLike, record: dict | None, names: Iterable[str] | None = None) -> None:
    """Raise ``ChecksumMismatch`` (one line: the file, the rule that made it, how to rebuild it) for the first file of
    ``record`` (only ``names`` when given) whose bytes differ from its recorded sha256. No record: nothing to check."""
    if record and names is not None:
        record = {n: record[n] for n in names if n in record}
    for _, state, message in status(root, record):
        if state != "ok":
            raise ChecksumMismatch(message)


def verify_sidecar(path: str | os.PathLike) -> None:
    """Verify file ``path`` against its sidecar ``path.sha256.json`` when it has one."""
    path = Path(path)
    verify(path.parent, _read(sidecar_of(path)), [path.name])


def verify_folder(folder: str | os.PathLike) -> None:
    """Verify the files of ``folder`` against ``folder/sha256.json`` when it has one."""
    verify(folder, _read(Path(folder) / FOLDER_RECORD))


def records_for(path: str | os.PathLike) -> list[tuple[Path, dict]]:
    """``(root, record)`` of every checksum record that covers ``path``: a file's sidecar (``X.sha256.json``) or own
    JSON (``X.json``: a FAISS index), a record file itself, or, for a folder, every record found under it."""
    path = Path(path)
    if path.is_dir():
        found = [(j.parent, r) for j in sorted(path.rglob("*.json")) for r in [_read(j)] if r]
        return found
    own = _read(path) if path.suffix == ".json" else None
    if own:
        return [(path.parent, own)]
    for side in (sidecar_of(path), path.with_name(path.name + ".json")):
        record = _read(side)
        if record and path.name in record:
            return [(path.parent, {path.name: record[path.name]})]
    return []


def verify_paths(paths: Iterable[str | os.PathLike]) -> list[tuple[Path, str, str | None]]:
    """One ``(file, state, message)`` per file of ``paths`` (``npm-repro verify``): ``ok``, ``MISMATCH``,
    ``MISSING`` or ``no checksum recorded``; a file covered by several records is checked once."""
    out, seen = [], set()
    for path in paths:
        found = records_for(path)
        if not found:
            out.append((Path(path), "no checksum recorded", None))
        for root, record in found:
            fresh = {n: e for n, e in record.items() if (Path(root) / n).resolve() not in seen}
            seen |= {(Path(root) / n).resolve() for n in fresh}
            out += status(root, fresh)
    return out
