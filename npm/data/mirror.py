"""A local mirror of the public downloads: the configured URLs with their scheme and host swapped (config ``mirror``).

Every download of the workflow (corpora, task files, verbalizers, hub checkpoints) names its public URL in the config;
with ``mirror: BASE`` set, ``https://HOST/PATH`` is fetched from ``BASE/HOST/PATH`` instead, and the Hugging Face hub
(``https://huggingface.co``) is reached as the endpoint ``BASE/huggingface.co``. That is how a cluster behind a proxy,
a site with a local copy of the files, or the rehearsal test (tests/test_released_rehearsal.py) runs the released
route unchanged.

``npm-repro mirror --root FOLDER`` serves such a copy on loopback: ``FOLDER/HOST/PATH`` as static files (single-range
requests, so downloads resume), and, for every checkpoint placed as ``FOLDER/huggingface.co/OWNER/NAME/`` (its files,
as the hub lists them), the few hub API routes that ``huggingface_hub`` needs to download it (repository info with
file sizes and sha256, the file tree, ``resolve`` with the commit and ETag headers). A checkpoint's commit is the
sha1 of its files' names and bytes, so a changed file is a new revision.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import threading
import urllib.parse
from functools import lru_cache
from pathlib import Path

HUB = "https://huggingface.co"
LFS_SUFFIXES = (".bin", ".safetensors", ".h5", ".msgpack", ".ot", ".pt", ".pth", ".onnx", ".npy", ".gz", ".zip")
CHUNK = 1 << 20


def mirrored(url: str, mirror: str | None) -> str:
    """``url`` fetched through ``mirror``: ``https://HOST/PATH?Q`` -> ``MIRROR/HOST/PATH?Q``; unchanged without one."""
    if not mirror:
        return url
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"{url!r} is not an absolute URL; a mirror replaces its scheme and host")
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{mirror.rstrip('/')}/{parts.netloc}{rest}"


def mirror_path(url: str) -> Path:
    """Where a mirror folder holds the copy of ``url``: ``HOST/PATH`` (the query is not part of it, so a mirror holds
    one file per path: ``.../kamel.zip?raw=true`` is ``github.com/.../kamel.zip``)."""
    parts = urllib.parse.urlsplit(url)
    return Path(parts.netloc, *[p for p in urllib.parse.unquote(parts.path).split("/") if p not in ("", ".", "..")])


def hub_endpoint(mirror: str | None) -> str | None:
    """The Hugging Face hub endpoint through ``mirror`` (None: huggingface_hub's own, HF_ENDPOINT or the hub)."""
    return mirrored(HUB, mirror) if mirror else None


# ------------------------------------------------------------------------------------------ the local server


def _digest(path: Path, h) -> str:
    """``h`` (a hashlib object, maybe already fed a header) over the bytes of ``path``. npm.fingerprint has its own
    sha256 of a file, but npm.data may not import it (dependencies point one way: npm.fingerprint imports npm.data)."""
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=256)
def _file_info(path: str, size: int, mtime_ns: int) -> dict:
    """The hub's record of one file: git blob id, and for large (LFS) files their sha256."""
    p = Path(path)
    info = {"size": size, "blob": _digest(p, hashlib.sha1(f"blob {size}\0".encode()))}  # git's blob id
    if p.suffix in LFS_SUFFIXES:
        info["sha256"] = _digest(p, hashlib.sha256())
    return info


def repo_files(folder: Path) -> dict[str, dict]:
    """{relative path: hub record} of the files of a checkpoint folder, sorted by path."""
    out = {}
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        st = p.stat()
        out[p.relative_to(folder).as_posix()] = _file_info(str(p), st.st_size, st.st_mtime_ns)
    return out


def repo_commit(files: dict[str, dict]) -> str:
    """A 40-hex commit id of a checkpoint folder: its file names and blob ids."""
    return hashlib.sha1("".join(f"{name}\0{info['blob']}\n" for name, info in files.items()).encode()).hexdigest()


class MirrorHandler(http.server.SimpleHTTPRequestHandler):
    """Static files under the root (``HOST/PATH``) with single-range requests, plus the hub API for the checkpoint
    folders under ``huggingface.co/``."""

    REPO = r"(?P<repo>[^/]+(?:/[^/]+)?)"  # owner/name, or a name alone (roberta-large)
    API = re.compile(rf"/huggingface\.co/api/models/{REPO}(?:/(?P<kind>revision|tree)/(?P<rev>[^/?]+))?")
    RESOLVE = re.compile(rf"/huggingface\.co/{REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)")

    def log_message(self, *args):  # quiet: a test or a user's terminal does not need every request
        pass

    def _repo(self, repo: str) -> Path | None:
        folder = Path(self.directory) / "huggingface.co" / urllib.parse.unquote(repo)
        return folder if folder.is_dir() else None

    def _json(self, payload, status: int = 200) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _not_found(self, what: str) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound" if "repository" in what else "EntryNotFound")
        self.send_header("X-Error-Message", what)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _api(self, match) -> None:
        folder = self._repo(match["repo"])
        if folder is None:
            return self._not_found(f"repository {match['repo']} not found on this mirror")
        files = repo_files(folder)
        sha = repo_commit(files)
        if match["kind"] == "tree":
            return self._json([{"type": "file", "path": name, "size": f["size"], "oid": f["blob"],
                                **({"lfs": {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}}
                                   if "sha256" in f else {})} for name, f in files.items()])
        return self._json({"id": match["repo"], "modelId": match["repo"], "sha": sha, "private": False,
                           "siblings": [{"rfilename": name, "size": f["size"], "blobId": f["blob"],
                                         **({"lfs": {"sha256": f["sha256"], "size": f["size"], "pointerSize": 134}}
                                            if "sha256" in f else {})} for name, f in files.items()]})

    def _resolve(self, match) -> None:
        folder = self._repo(match["repo"])
        name = urllib.parse.unquote(match["file"])
        path = folder / name if folder else None
        if path is None or not path.is_file() or ".." in Path(name).parts:
            return self._not_found(f"{match['repo']}: no file {name}")
        files = repo_files(folder)
        info = files[name]
        self._send_file(path, {"X-Repo-Commit": repo_commit(files), "ETag": f'"{info.get("sha256", info["blob"])}"'})

    def _send_file(self, path: Path, headers: dict[str, str] | None = None) -> None:
        size = path.stat().st_size
        start = 0
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            start = int(m[1]) if m else 0
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            end = min(int(m[2]), size - 1) if m and m[2] else size - 1
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            end = size - 1
            self.send_response(200)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0 and (chunk := f.read(min(CHUNK, left))):
                self.wfile.write(chunk)
                left -= len(chunk)

    def _route(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        for pattern, handle in ((self.API, self._api), (self.RESOLVE, self._resolve)):
            match = pattern.fullmatch(path)
            if match:
                return handle(match)
        local = Path(self.translate_path(path))
        if not local.is_file():
            return self._not_found(f"no file {path} on this mirror")
        self._send_file(local)

    do_GET = do_HEAD = _route


def serve(root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0) -> http.server.ThreadingHTTPServer:
    """A mirror of ``root`` listening on ``host:port`` (0: a free port), serving from a daemon thread; its base URL is
    ``base_url(server)``; stop it with ``server.shutdown()``."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"mirror root {root} is not a folder (it holds HOST/PATH copies of the downloads)")
    handler = lambda *a, **kw: MirrorHandler(*a, directory=str(root), **kw)  # noqa: E731
    server = http.server.ThreadingHTTPServer((host, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def base_url(server: http.server.ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"
