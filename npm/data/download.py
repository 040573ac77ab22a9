"""Download a public source (paper-scale raw dumps): resumable, checked against what the server says, atomic.

A partial download is kept as ``<out>.part`` and continued with an HTTP Range request, but only by a download of
the same URL (recorded, with the file's size, in ``<out>.part.json``; another URL starts over). Every response is
checked against what the server states (``_receive``): a body shorter than its Content-Length is kept and resumed
from its length, up to ``tries`` requests with a doubling delay; a 206 must start at the byte asked (its
``Content-Range: bytes a-b/total``); a 200 to a Range request is the whole file and starts the part over; a size
that differs from an earlier response's (or run's) means the file changed on the server and is refused. The file
appears under its final name only once it has its full length and matches the configured sha256, or else the
sha256 its first download recorded (``<out>.source.json``, written and logged then), so that a file that changes on
the server between two runs is refused; a short body is never checked nor recorded. Every URL can be fetched
through a mirror (config ``mirror``, npm.data.mirror). Offline, the error says which URL could not be reached and
where to put the file by hand. (Data acquisition, not a paper method: docs/paper-map.md §8.2 item 4.)
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from npm.data.mirror import hub_endpoint, mirrored
from npm.io import atomic_dir

CHUNK = 1 << 20
log = logging.getLogger("npm-repro.download")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _part_record(record: Path) -> dict:
    """What the download that left ``out.part`` recorded: its ``url`` and the file's size ``bytes`` if known."""
    try:
        got = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


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


def _content_range(value: str | None) -> tuple[int | None, int | None] | None:
    """(first byte, total size) of a ``Content-Range: bytes a-b/total`` (``bytes */total``: first byte None; a
    total of ``*``: None); None when the header is absent or unreadable."""
    m = re.fullmatch(r"bytes (?:(\d+)-\d+|\*)/(\d+|\*)", (value or "").strip())
    if m is None:
        return None
    return (None if m[1] is None else int(m[1])), (None if m[2] == "*" else int(m[2]))


def _receive(source: str, part: Path, have: int, timeout: float, where: str) -> tuple[int | None, bool]:
    """One request for the bytes of ``source`` from ``have`` (the length of ``part``) on, written into ``part``.

    Returns the file's total size as the server states it (None: not stated) and whether the body arrived in full
    (its Content-Length, or a clean close where there is none). A 206 must start at ``have``; a 200 is the whole file
    and starts the part over; a 416 with a size other than ``have`` means the part is not a prefix of the file: it is
    emptied (the next request starts over). A network failure before any byte arrives is the offline error."""
    request = urllib.request.Request(source, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing from `have` on: complete if the file has exactly `have` bytes
            total = (_content_range(e.headers.get("Content-Range")) or (None, None))[1]
            if total is not None and total != have:
                part.write_bytes(b"")
            return total, total is None or total == have
        raise ValueError(f"download of {source} failed: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ValueError(f"cannot reach {source} ({getattr(e, 'reason', e)}). Offline? Download it elsewhere and "
                         f"place it at {where}") from None
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.isdigit() else None
    start, total = 0, length
    if response.status == 206:
        stated = response.headers.get("Content-Range")
        start, total = _content_range(stated) or (None, None)
        if start != have:
            response.close()
            part.unlink()
            raise ValueError(f"{source} answered the request for its bytes from byte {have} with "
                             f"'{stated or 'no Content-Range'}'; the part file of {where} was removed: run again to "
                             "download the whole file")
    elif have:
        log.info("%s ignored the request for its bytes from byte %d: downloading the whole file again", source, have)
    got, clean = 0, True
    with response, open(part, "r+b" if start else "wb") as f, tqdm(
            total=total, initial=start, unit="B", unit_scale=True, desc=Path(where).name) as bar:
        f.seek(start)
        read = getattr(response, "read1", response.read)  # read1: what has arrived is written before a stall
        try:
            for block in iter(lambda: read(CHUNK), b""):
                f.write(block)
                got += len(block)
                bar.update(len(block))
        except (OSError, http.client.HTTPException):  # connection reset or timed out mid-body: a short body
            clean = False
    return total, clean and (length is None or got == length)


def download(url: str, out: str | os.PathLike, sha256: str | None = None, timeout: float = 60.0,
             mirror: str | None = None, tries: int = 5, backoff: float = 1.0) -> dict:
    """Fetch ``url`` (through ``mirror``, npm.data.mirror) into ``out``, resuming ``out.part`` if present.

    Each response is checked by ``_receive``; a short one is resumed from the part's length, up to ``tries`` requests
    in all, waiting ``backoff`` seconds before the second, doubling after each. Only a file of its full length is
    checked against ``sha256`` when given, else against the sha256 its first download recorded in
    ``out.source.json`` (a served file that changed between two runs is refused, never installed); a file without
    either has its sha256 recorded there. After ``tries`` short bodies the part file is kept for the next run."""
    out = Path(out)
    part = out.with_name(out.name + ".part")
    record = out.with_name(out.name + ".part.json")
    source = mirrored(url, mirror)
    out.parent.mkdir(parents=True, exist_ok=True)
    known = _part_record(record)
    if known.get("url") != url or not part.exists():  # bytes of another URL (or of unknown origin): start over
        part.unlink(missing_ok=True)
        known = {}
    size = known.get("bytes")
    for attempt in range(tries):
        have = part.stat().st_size if part.exists() else 0
        if attempt:
            delay = backoff * 2 ** (attempt - 1)
            log.info("download of %s has %d of %s bytes; asking for the rest in %g s (request %d of %d)", source, have,
                     size or "?", delay, attempt + 1, tries)
            time.sleep(delay)
        record.write_text(json.dumps({"url": url, "bytes": size}) + "\n", encoding="utf-8")
        total, body_complete = _receive(source, part, have, timeout, str(out))
        if total is not None and size is not None and total != size:
            part.unlink(missing_ok=True)
            record.unlink(missing_ok=True)
            raise ValueError(f"{source} changed on the server while {out} was downloaded: {size} bytes at first, "
                             f"{total} now; the part file was removed: run again to download the new file")
        size = size if total is None else total
        record.write_text(json.dumps({"url": url, "bytes": size}) + "\n", encoding="utf-8")
        have = part.stat().st_size if part.exists() else 0
        if (have == size) if size is not None else body_complete:
            break
    else:
        raise ValueError(f"download of {source} was cut short {tries} times ({have} of {size or '?'} bytes): {out} "
                         f"was not installed; the part file {part} is kept: run again to resume it")
    expected, what = (sha256, "the configured sha256") if sha256 else _first_sha256(out, url)
    got_sha = sha256_of(part)
    if expected and got_sha != expected:
        part.unlink()
        record.unlink(missing_ok=True)
        hint = (f"; if the new file is wanted, delete {_record(out)} and run again" if not sha256 else
                "; check the URL, or the configured sha256 if the server's file is the right one")
        raise ValueError(f"checksum mismatch for {url}: expected {expected} ({what}), got {got_sha}; the "
                         f"downloaded file {out} was removed{hint}")
    os.replace(part, out)
    record.unlink(missing_ok=True)
    info = {"url": url, "fetched_from": source, "bytes": out.stat().st_size, "sha256": got_sha,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if expected is None or sha256:
        _record(out).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        if expected is None:
            log.info("%s has no published sha256: recorded this download's, %s, in %s; a later download of %s must "
                     "match it", out, got_sha, _record(out), url)
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
                    info = getattr(e, "tarinfo", None)
                    member, link = getattr(info, "name", "?"), getattr(info, "linkname", "")
                    why = {"SpecialFileError": "is a device or pipe, not a plain file",
                           "AbsoluteLinkError": f"is a link to the absolute path {link!r}",
                           "LinkOutsideDestinationError": f"is a link to {link!r}, outside {out}",
                           }.get(type(e).__name__, f"would unpack outside {out}")
                    raise ValueError(f"{archive}: member {member!r} {why} ({type(e).__name__}); refused, nothing "
                                     "was unpacked") from None
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
