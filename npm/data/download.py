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
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

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
