"""Download a public source (paper-scale raw dumps): resumable, checked against what the server says, atomic.

A partial download is kept as ``<out>.part`` and continued with an HTTP Range request, but only by a download of
the same URL and only from the same version of the file: the first response's validator (ETag, else Last-Modified)
is recorded, with the URL and the file's size, in ``<out>.part.json`` and sent as ``If-Range`` (``_Part``); a part
of another URL or without a recorded version is discarded, with a log line, and a server that sends no validator
is never resumed, so two versions are never spliced. Every response is checked against what the server states
(``_receive``): a body shorter than its Content-Length is kept and resumed from its length, up to ``tries`` requests
with a doubling delay; a 206 must start at the byte asked (its ``Content-Range: bytes a-b/total``), be of the
version the part holds and carry no more bytes than it announces; a 200 to a Range request is the whole file (a
new version, or a server that ignores ranges) and starts the part over; a size that differs from an earlier
response's of the same version means the file changed on the server and is refused. The file
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
from dataclasses import dataclass
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


def _content_range(value: str | None) -> tuple[int | None, int | None, int | None] | None:
    """(first byte, last byte, total size) of a ``Content-Range: bytes a-b/total`` (``bytes */total``: first and last
    None; a total of ``*``: None); None when the header is absent or unreadable."""
    m = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", (value or "").strip())
    if m is None:
        return None
    return (None if m[1] is None else int(m[1])), (None if m[2] is None else int(m[2])), \
        (None if m[3] == "*" else int(m[3]))


def _validator(headers) -> str | None:
    """What names the version of a response's file, as ``If-Range`` takes it: its strong ETag, else its
    Last-Modified (a weak ``W/`` ETag may not be used in If-Range); None when the server sends neither."""
    tag = (headers.get("ETag") or "").strip()
    if tag and not tag.startswith("W/"):
        return tag
    return (headers.get("Last-Modified") or "").strip() or None


@dataclass
class _Part:
    """``out.part`` and what is known of the file whose first bytes it holds: the URL, the size and the version (the
    validator of the response its bytes came from), recorded in ``out.part.json`` as soon as a response arrives, so
    that a later run resumes only the same version of the same URL (``If-Range``)."""

    path: Path
    url: str
    size: int | None = None
    validator: str | None = None

    @property
    def record(self) -> Path:
        return self.path.with_name(self.path.name + ".json")

    @classmethod
    def left_by(cls, out: Path, url: str) -> _Part:
        """The part of ``out`` left by an earlier run of ``url``; one from another URL, or without a recorded version
        (an earlier downloader's, or a server that sends no validator), is discarded, with a log line."""
        part = cls(out.with_name(out.name + ".part"), url)
        try:
            known = json.loads(part.record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = None
        known = known if isinstance(known, dict) else {}
        if part.path.exists() and (known.get("url") != url or not known.get("validator")):
            why = (f"holds bytes of {known['url']}" if known.get("url") not in (None, url) else
                   "has no recorded version (ETag or Last-Modified) of the file")
            log.info("%s %s: discarded, downloading %s from byte 0", part.path, why, url)
            part.path.unlink()
        if part.path.exists():
            part.size, part.validator = known.get("bytes"), known["validator"]
        return part

    def have(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def save(self) -> None:
        self.record.write_text(json.dumps({"url": self.url, "bytes": self.size, "validator": self.validator}) + "\n",
                               encoding="utf-8")

    def restart(self, size: int | None, validator: str | None) -> None:
        """Empty the part: it holds the bytes of the version ``validator`` of ``size`` bytes from byte 0 on."""
        self.path.write_bytes(b"")
        self.size, self.validator = size, validator
        self.save()

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)

    def same_size(self, total: int | None, source: str, where: str) -> None:
        """Refuse a stated ``total`` other than the size known for this version: the file changed on the server."""
        if total is not None and self.size is not None and total != self.size:
            self.discard()
            raise ValueError(f"{source} changed on the server while {where} was downloaded: {self.size} bytes at "
                             f"first, {total} now; the part file was removed: run again to download the new file")
        self.size = total if total is not None else self.size


def _open(source: str, part: _Part, timeout: float, where: str):
    """The response to the request for ``source`` from the part's length on (``If-Range``: only from the version the
    part holds; a part without one is emptied first: nothing says the server's file is still that one); None for a
    416, after which the part is complete when the file has exactly its length, and emptied otherwise (not a prefix
    of the file). A network failure before any byte arrives is the offline error."""
    have = part.have()
    if have and part.validator is None:  # this run's first response named no version: a resume could splice
        log.info("%s sends no ETag or Last-Modified, so a resume cannot ask for the same version: %s starts over "
                 "from byte 0", source, part.path)
        part.restart(None, None)
        have = 0
    headers = {"Range": f"bytes={have}-", "If-Range": part.validator} if have else {}
    try:
        return urllib.request.urlopen(urllib.request.Request(source, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing from `have` on: complete if the file has exactly `have` bytes
            total = (_content_range(e.headers.get("Content-Range")) or (None, None, None))[2]
            if total is not None and total != have:
                part.path.write_bytes(b"")
            part.same_size(total, source, where)
            return None
        raise ValueError(f"download of {source} failed: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ValueError(f"cannot reach {source} ({getattr(e, 'reason', e)}). Offline? Download it elsewhere and "
                         f"place it at {where}") from None


def _receive(source: str, part: _Part, timeout: float, where: str) -> bool:
    """One request for the bytes of ``source`` that ``part`` lacks, written into it; whether the body arrived in full
    (its Content-Length, or a clean close where there is none).

    A 206 must start at the part's length, be of the version the part holds and announce as many bytes in
    Content-Length as in Content-Range; a 200 is the whole file (the server's file changed, or it ignores ranges):
    the part starts over from byte 0 with that version. More bytes than announced is refused at once."""
    response = _open(source, part, timeout, where)
    if response is None:
        return part.size is None or part.size == part.have()
    have, version = part.have(), _validator(response.headers)
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.isdigit() else None
    if response.status == 206:
        stated = response.headers.get("Content-Range")
        first, last, total = _content_range(stated) or (None, None, None)
        if first != have:
            response.close()
            part.discard()
            raise ValueError(f"{source} answered the request for its bytes from byte {have} with "
                             f"'{stated or 'no Content-Range'}'; the part file of {where} was removed: run again to "
                             "download the whole file")
        if have and version is not None and version != part.validator:  # the server ignored If-Range
            response.close()
            log.info("%s now serves the version %s, not %s of the part file %s: downloading it again from byte 0",
                     source, version, part.validator, part.path)
            part.restart(None, version)
            return _receive(source, part, timeout, where)
        announced = last - first + 1
        if (length is not None and length != announced) or (total is not None and last >= total):
            response.close()
            _refuse_body(source, part, where, f"Content-Range '{stated}' announces {announced} bytes, Content-Length "
                                              f"{length}")
        part.same_size(total, source, where)
        part.validator, expected = version or part.validator, announced
    else:
        if have:
            log.info("%s answered the request for its bytes from byte %d with the whole file (it changed on the "
                     "server, or the server ignores ranges): %s starts over from byte 0", source, have, part.path)
        part.restart(length, version)
        expected = length
    part.save()
    return _write_body(source, response, part, expected, where)


def _refuse_body(source: str, part: _Part, where: str, why: str):
    """A body that does not match its headers (a server that sends the whole file under a Content-Range of the rest,
    which grew the part past the file's size on every resume): the part is removed, the next run starts over."""
    part.discard()
    raise ValueError(f"{source} sent a body that does not match its headers ({why}); the part file of {where} was "
                     "removed: run again to download the whole file")


def _write_body(source: str, response, part: _Part, expected: int | None, where: str) -> bool:
    """Append the body of ``response`` to the part; whether it arrived in full (``expected`` bytes, or a clean close
    where that is unknown). A body longer than ``expected`` is refused at its first extra byte."""
    start, got, clean = part.have(), 0, True
    with response, open(part.path, "r+b") as f, tqdm(total=part.size, initial=start, unit="B", unit_scale=True,
                                                     desc=Path(where).name) as bar:
        f.seek(start)
        read = getattr(response, "read1", response.read)  # read1: what has arrived is written before a stall
        try:
            for block in iter(lambda: read(CHUNK), b""):
                if expected is not None and got + len(block) > expected:
                    f.close()
                    _refuse_body(source, part, where, f"more than the {expected} bytes its Content-Range or "
                                                      "Content-Length announce")
                f.write(block)
                got += len(block)
                bar.update(len(block))
        except (OSError, http.client.HTTPException):  # connection reset or timed out mid-body: a short body
            clean = False
    return clean and (expected is None or got == expected)


def download(url: str, out: str | os.PathLike, sha256: str | None = None, timeout: float = 60.0,
             mirror: str | None = None, tries: int = 5, backoff: float = 1.0) -> dict:
    """Fetch ``url`` (through ``mirror``, npm.data.mirror) into ``out``, resuming ``out.part`` if present.

    Each response is checked by ``_receive``; a short one is resumed from the part's length (only from the same
    version of the file: ``_Part``), up to ``tries`` requests in all, waiting ``backoff`` seconds before the second,
    doubling after each. Only a file of its full length is checked against ``sha256`` when given, else against the
    sha256 its first download recorded in ``out.source.json`` (a served file that changed between two runs is
    refused, never installed); a file without either has its sha256 recorded there. After ``tries`` short bodies the
    part file is kept for the next run."""
    out = Path(out)
    source = mirrored(url, mirror)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = _Part.left_by(out, url)
    for attempt in range(tries):
        if attempt:
            delay = backoff * 2 ** (attempt - 1)
            log.info("download of %s has %d of %s bytes; asking for the rest in %g s (request %d of %d)", source,
                     part.have(), part.size or "?", delay, attempt + 1, tries)
            time.sleep(delay)
        body_complete = _receive(source, part, timeout, str(out))
        have = part.have()
        if (have == part.size) if part.size is not None else body_complete:
            break
    else:
        kept = (f"the part file {part.path} is kept: run again to resume it" if part.validator else
                "the server names no version of the file (ETag or Last-Modified), so a run again starts over")
        raise ValueError(f"download of {source} was cut short {tries} times ({have} of {part.size or '?'} bytes): "
                         f"{out} was not installed; {kept}")
    expected, what = (sha256, "the configured sha256") if sha256 else _first_sha256(out, url)
    got_sha = sha256_of(part.path)
    if expected and got_sha != expected:
        part.discard()
        hint = (f"; if the new file is wanted, delete {_record(out)} and run again" if not sha256 else
                "; check the URL, or the configured sha256 if the server's file is the right one")
        raise ValueError(f"checksum mismatch for {url}: expected {expected} ({what}), got {got_sha}; the "
                         f"downloaded file {out} was removed{hint}")
    os.replace(part.path, out)
    part.record.unlink(missing_ok=True)
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
