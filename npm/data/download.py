"""Download a public source (paper-scale raw dumps): resumable, checksum-verified, atomic.

A partial download is kept as ``<out>.part`` and continued with an HTTP Range request on the next run, but only by
a download of the same URL (recorded in ``<out>.part.json``; another URL starts over);
the file appears under its final name only once complete and verified: against the configured sha256, or else
against the sha256 its first download recorded (``<out>.source.json``), so that a file that changes on the server
between two runs is refused. Every URL can be fetched through a mirror (config ``mirror``, npm.data.mirror).
Offline, the error says which URL could not be reached and where to put the file by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from npm.data.mirror import hub_endpoint, mirrored
from npm.io import atomic_dir

CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _part_url(record: Path) -> str | None:
    try:
        return json.loads(record.read_text(encoding="utf-8")).get("url")
    except (OSError, ValueError, AttributeError):
        return None


def _record(out: Path) -> Path:
    """Where the first download of ``out`` left its URL and sha256 (kept beside it, not a workflow output, so that a
    later download of the same file, after the file was deleted, is checked against it)."""
    return out.with_name(out.name + ".source.json")


def _first_sha256(out: Path, url: str) -> tuple[str | None, str]:
    try:
        first = json.loads(_record(out).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, ""
    if not isinstance(first, dict) or first.get("url") != url:
        return None, ""
    return first.get("sha256"), f"its first download ({first.get('date', 'date unknown')}, {_record(out)})"


def download(url: str, out: str | os.PathLike, sha256: str | None = None, timeout: float = 60.0,
             mirror: str | None = None) -> dict:
    """Fetch ``url`` (through ``mirror``, npm.data.mirror) into ``out``, resuming ``out.part`` if present.

    The file is checked against ``sha256`` when given, else against the sha256 its first download recorded in
    ``out.source.json`` (a served file that changed between two runs is refused, never installed). A body shorter
    than its Content-Length is kept as the part file, to be resumed by the next run."""
    out = Path(out)
    part = out.with_name(out.name + ".part")
    record = out.with_name(out.name + ".part.json")
    source = mirrored(url, mirror)
    out.parent.mkdir(parents=True, exist_ok=True)
    if part.exists() and _part_url(record) != url:  # bytes of another URL (or of unknown origin): start over
        part.unlink()
    have = part.stat().st_size if part.exists() else 0
    record.write_text(json.dumps({"url": url}) + "\n", encoding="utf-8")
    request = urllib.request.Request(source, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left to fetch: the part file is complete
            response = None
        else:
            raise ValueError(f"download of {source} failed: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ValueError(
            f"cannot reach {source} ({getattr(e, 'reason', e)}). Offline? Download it elsewhere and place it at {out}"
        ) from None
    if response is not None:
        resumed = have and response.status == 206
        mode = "ab" if resumed else "wb"
        length = response.headers.get("Content-Length")
        length = int(length) if length else None
        got = 0
        with response, open(part, mode) as f, tqdm(total=None if length is None else length + (have if resumed else 0),
                                                   initial=have if resumed else 0, unit="B", unit_scale=True,
                                                   desc=out.name) as bar:
            for block in iter(lambda: response.read(CHUNK), b""):
                f.write(block)
                got += len(block)
                bar.update(len(block))
        if length is not None and got < length:
            raise ValueError(f"download of {source} was cut short: {got} of {length} bytes; the part file "
                             f"{part} is kept and the next run resumes it")
    expected, what = (sha256, "the configured sha256") if sha256 else _first_sha256(out, url)
    got_sha = sha256_of(part)
    if expected and got_sha != expected:
        part.unlink()
        record.unlink(missing_ok=True)
        hint = ("" if sha256 else f"; if the new file is wanted, delete {_record(out)} and run again")
        raise ValueError(f"checksum mismatch for {url}: expected {expected} ({what}), got {got_sha}; the "
                         f"downloaded file was removed{hint}")
    os.replace(part, out)
    record.unlink(missing_ok=True)
    info = {"url": url, "fetched_from": source, "bytes": out.stat().st_size, "sha256": got_sha,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if expected is None or sha256:
        _record(out).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def unpack(archive: str | os.PathLike, out: str | os.PathLike) -> dict:
    """Unpack a ``.tar[.gz|.bz2|.xz]`` or ``.zip`` archive into the folder ``out``, which appears only once complete
    (built beside it, then renamed: ``npm.io.atomic_dir``). Members that would land outside ``out`` (absolute paths,
    ``..``, links out of the folder) are refused (tarfile's ``data`` filter; zip names checked)."""
    import tarfile
    import zipfile

    archive, out = Path(archive), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it to unpack {archive} again")
    with atomic_dir(out) as tmp:
        tmp.mkdir()
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                for name in z.namelist():
                    if Path(name).is_absolute() or ".." in Path(name).parts:
                        raise ValueError(f"{archive}: member {name!r} would unpack outside {out}; nothing was "
                                         "unpacked")
                z.extractall(tmp)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as t:
                try:
                    t.extractall(tmp, filter="data")
                except tarfile.FilterError as e:  # absolute paths, "..", links out of the folder, devices
                    member = getattr(getattr(e, "tarinfo", None), "name", "?")
                    raise ValueError(f"{archive}: member {member!r} would unpack outside {out} or is not a plain "
                                     f"file ({type(e).__name__}); nothing was unpacked") from None
        else:
            raise ValueError(f"{archive} is neither a tar nor a zip archive (a partial or failed download?)")
    files = [p for p in out.rglob("*") if p.is_file()]
    return {"archive": str(archive), "files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def verify_checkpoint(folder: str | os.PathLike, published: dict[str, str]) -> dict[str, str]:
    """Check every file that has a published sha256 (``{relative path: sha256}``) in ``folder``; returns them."""
    folder = Path(folder)
    for name, expected in published.items():
        path = folder / name
        if not path.exists():
            raise ValueError(f"{path} is missing: the hub lists {name} in this checkpoint")
        got = sha256_of(path)
        if got != expected:
            raise ValueError(f"checksum mismatch for {path}: the hub publishes {expected}, the file has {got}; "
                             f"delete it and run again")
    return dict(published)


# The files of a checkpoint that the workflow reads: config, tokenizer and one framework's weights (the hub's TF, Flax,
# Rust and ONNX copies of roberta-large or OPT would multiply the download).
CHECKPOINT_FILES = ("*.json", "*.txt", "*.model", "vocab*", "merges*", "tokenizer*")
WEIGHT_PATTERNS = {"safetensors": ("*.safetensors", "*.safetensors.index.json"),
                   "pytorch": ("pytorch_model*.bin", "pytorch_model*.bin.index.json")}


def checkpoint_patterns(names: list[str]) -> list[str]:
    """The file patterns to fetch from a repository holding ``names``: safetensors weights where the hub has them,
    else the legacy ``pytorch_model*.bin``; a repository with neither is refused before any download."""
    from fnmatch import fnmatch

    for kind in ("safetensors", "pytorch"):
        if any(fnmatch(n, WEIGHT_PATTERNS[kind][0]) for n in names):
            return [*CHECKPOINT_FILES, *WEIGHT_PATTERNS[kind]]
    raise ValueError(f"the repository holds no weights (*.safetensors or pytorch_model*.bin); its files: "
                     f"{', '.join(names) or 'none'}")


def download_checkpoint(repo: str, out: str | os.PathLike, revision: str | None = None,
                        mirror: str | None = None) -> dict:
    """A released checkpoint from the Hugging Face hub (``facebook/npm``; through ``mirror``: its endpoint
    ``MIRROR/huggingface.co``) into the folder ``out``, which appears only once every file is there and matches the
    sha256 the hub publishes for it (its large, LFS-stored files). Only the config, the tokenizer and one framework's
    weights are fetched (``checkpoint_patterns``); a repository without weights is refused.

    Files are fetched into ``out.tmp`` (kept on failure: a second run resumes there); the exact revision, the files
    and their checksums are written to ``out/download.json``. Offline, the error says how to fetch it elsewhere."""
    from fnmatch import fnmatch

    from huggingface_hub import HfApi, snapshot_download

    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    endpoint = hub_endpoint(mirror)
    where = f"the mirror {endpoint}" if endpoint else "the Hugging Face hub"

    def unreachable(e: Exception) -> ValueError:  # network, offline mode, unknown repo: one line that says what to do
        return ValueError(f"cannot download {repo} from {where} ({type(e).__name__}: {e}). Offline? On a machine "
                          f"with network run `hf download {repo} --local-dir {out}`, copy the folder here and run "
                          "again")

    try:
        info = HfApi(endpoint=endpoint).model_info(repo, revision=revision, files_metadata=True)
    except Exception as e:  # noqa: BLE001 - any failure gets the advice above
        raise unreachable(e) from None
    names = [s.rfilename for s in info.siblings]
    try:
        patterns = checkpoint_patterns(names)
    except ValueError as e:
        raise ValueError(f"{repo} ({where}, revision {info.sha}) is not a checkpoint: {e}") from None
    wanted = {s.rfilename: s for s in info.siblings if any(fnmatch(s.rfilename, p) for p in patterns)}
    try:
        snapshot_download(repo, revision=info.sha, local_dir=tmp, allow_patterns=patterns, endpoint=endpoint)
    except Exception as e:  # noqa: BLE001 - any failure gets the advice above
        raise unreachable(e) from None
    published = {name: s.lfs.sha256 for name, s in wanted.items() if s.lfs is not None}
    verify_checkpoint(tmp, published)
    record = {"repo": repo, "revision": info.sha, "endpoint": endpoint or "huggingface_hub default",
              "files": sorted(wanted), "sha256": published}
    (tmp / "download.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(tmp / ".cache", ignore_errors=True)  # the hub client's resume records
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it to download {repo} again")
    os.replace(tmp, out)
    return record
