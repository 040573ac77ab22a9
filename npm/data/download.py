"""Download a public source (paper-scale raw dumps): resumable, checksum-verified, atomic.

A partial download is kept as ``<out>.part`` and continued with an HTTP Range request on the next run, but only by
a download of the same URL (recorded in ``<out>.part.json``; another URL starts over);
the file appears under its final name only once complete (and, when a sha256 is configured, verified).
Offline, the error says which URL could not be reached and where to put the file by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

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


def download(url: str, out: str | os.PathLike, sha256: str | None = None, timeout: float = 60.0) -> dict:
    """Fetch ``url`` into ``out``, resuming ``out.part`` if present; verify ``sha256`` when given."""
    out = Path(out)
    part = out.with_name(out.name + ".part")
    record = out.with_name(out.name + ".part.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    if part.exists() and _part_url(record) != url:  # bytes of another URL (or of unknown origin): start over
        part.unlink()
    have = part.stat().st_size if part.exists() else 0
    record.write_text(json.dumps({"url": url}) + "\n", encoding="utf-8")
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left to fetch: the part file is complete
            response = None
        else:
            raise ValueError(f"download of {url} failed: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ValueError(
            f"cannot reach {url} ({getattr(e, 'reason', e)}). Offline? Download it elsewhere and place it at {out}"
        ) from None
    if response is not None:
        resumed = have and response.status == 206
        mode = "ab" if resumed else "wb"
        total = response.headers.get("Content-Length")
        total = int(total) + (have if resumed else 0) if total else None
        with response, open(part, mode) as f, tqdm(total=total, initial=have if resumed else 0, unit="B",
                                                   unit_scale=True, desc=out.name) as bar:
            for block in iter(lambda: response.read(CHUNK), b""):
                f.write(block)
                bar.update(len(block))
    if sha256:
        got = sha256_of(part)
        if got != sha256:
            part.unlink()
            raise ValueError(f"checksum mismatch for {url}: expected {sha256}, got {got}; the partial file was removed")
    os.replace(part, out)
    record.unlink(missing_ok=True)
    return {"url": url, "bytes": out.stat().st_size, "sha256": sha256 or sha256_of(out)}


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
                        raise ValueError(f"{archive}: member {name!r} would unpack outside {out}")
                z.extractall(tmp)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as t:
                t.extractall(tmp, filter="data")
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


def download_checkpoint(repo: str, out: str | os.PathLike, revision: str | None = None) -> dict:
    """A released checkpoint from the Hugging Face hub (``facebook/npm``) into the folder ``out``, which appears only
    once every file is there and matches the sha256 the hub publishes for it (its large, LFS-stored files).

    Files are fetched into ``out.tmp`` (kept on failure: a second run resumes there); the exact revision, the files
    and their checksums are written to ``out/download.json``. Offline, the error says how to fetch it elsewhere."""
    from huggingface_hub import HfApi, snapshot_download

    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
        snapshot_download(repo, revision=info.sha, local_dir=tmp)
    except Exception as e:  # network, offline mode, unknown repo: one line that says what to do
        raise ValueError(f"cannot download {repo} from the Hugging Face hub ({type(e).__name__}: {e}). Offline? On "
                         f"a machine with network run `hf download {repo} --local-dir {out}`, copy the folder here and "
                         "run again") from None
    published = {s.rfilename: s.lfs.sha256 for s in info.siblings if s.lfs is not None}
    verify_checkpoint(tmp, published)
    record = {"repo": repo, "revision": info.sha, "files": sorted(s.rfilename for s in info.siblings),
              "sha256": published}
    (tmp / "download.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(tmp / ".cache", ignore_errors=True)  # the hub client's resume records
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it to download {repo} again")
    os.replace(tmp, out)
    return record
