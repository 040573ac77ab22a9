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
sha1 of its files' names and bytes, so a changed file is a new revision. Only regular files under the root are
served or listed: a request path with ``..``, ``.`` or an encoded separator in any part is refused (400), and a link
that leads out of the root is neither served nor listed nor read. Every file carries an ETag and Last-Modified and
an ``If-Range`` naming another version gets the whole file, so a resumed download never splices two versions
(npm.data.download); an unsatisfiable range is a 416 with the file's size.
"""

from __future__ import annotations

import email.utils
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


def inside(root: Path, *parts: str) -> Path | None:
    """``root/parts...`` with every link resolved, or None when that leads out of ``root`` (a link to elsewhere)."""
    root = root.resolve()
    path = root.joinpath(*parts).resolve()
    return path if path.is_relative_to(root) else None


def repo_files(folder: Path, root: Path) -> dict[str, dict]:
    """{relative path: hub record} of the regular files of a checkpoint folder, sorted by path; a link that leads out
    of ``root`` is left out (never read: the listing hashes what it lists)."""
    out, root = {}, root.resolve()
    for dirpath, _, names in os.walk(folder):  # does not follow links to folders
        for name in names:
            p = Path(dirpath, name)
            real = p.resolve()
            if real.is_relative_to(root) and real.is_file():
                st = real.stat()
                out[p.relative_to(folder).as_posix()] = _file_info(str(real), st.st_size, st.st_mtime_ns)
    return dict(sorted(out.items()))


def repo_commit(files: dict[str, dict]) -> str:
    """A 40-hex commit id of a checkpoint folder: its file names and blob ids."""
    return hashlib.sha1("".join(f"{name}\0{info['blob']}\n" for name, info in files.items()).encode()).hexdigest()


def request_parts(raw: str) -> list[str] | None:
    """The decoded parts of a request path (``/a/b%20c`` -> ``["a", "b c"]``), or None when one is ``.`` or ``..``
    or holds a separator or NUL once decoded (``..%2F``, ``%5C``), or is still encoded after decoding (``%252F``):
    such a path could name something outside the root, so it is refused whole."""
    parts = []
    for part in urllib.parse.urlsplit(raw).path.split("/"):
        try:
            text = urllib.parse.unquote(part, errors="strict")
        except UnicodeDecodeError:
            return None
        if text in (".", "..") or re.search(r"[/\\\0]", text) or urllib.parse.unquote(text) != text:
            return None
        if text:
            parts.append(text)
    return parts


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first byte, end) asked by a single ``Range: bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` of a file of ``size``
    bytes, ``end`` exclusive; ``end <= first`` means unsatisfiable (416). None: no Range, or one this mirror does
    not serve (another unit, several ranges): the whole file."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if m is None or not (m[1] or m[2]):
        return None
    if not m[1]:  # the last n bytes
        return max(size - int(m[2]), 0), (size if int(m[2]) else 0)
    first = int(m[1])
    last = int(m[2]) if m[2] else size - 1
    return first, (min(last, size - 1) + 1 if first < size and last >= first else first)


class MirrorHandler(http.server.SimpleHTTPRequestHandler):
    """Static files under the root (``HOST/PATH``) with single-range requests, plus the hub API for the checkpoint
    folders under ``huggingface.co/``. Only regular files under the root are served or listed: the path is decoded
    and checked part by part (``request_parts``) and resolved, links included, inside the root (``inside``)."""

    REPO = r"(?P<repo>[^/]+(?:/[^/]+)?)"  # owner/name, or a name alone (roberta-large)
    API = re.compile(rf"/huggingface\.co/api/models/{REPO}(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+))?")
    RESOLVE = re.compile(rf"/huggingface\.co/{REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)")

    def log_message(self, *args):  # quiet: a test or a user's terminal does not need every request
        pass

    def _repo(self, repo: str) -> Path | None:
        folder = inside(Path(self.directory), "huggingface.co", *repo.split("/"))
        return folder if folder is not None and folder.is_dir() else None

    def _json(self, payload, status: int = 200) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _not_found(self, what: str, status: int = 404) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", "RepoNotFound" if "repository" in what else "EntryNotFound")
        self.send_header("X-Error-Message", what)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _api(self, match) -> None:
        folder = self._repo(match["repo"])
        if folder is None:
            return self._not_found(f"repository {match['repo']} not found on this mirror")
        files = repo_files(folder, Path(self.directory))
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
        files = repo_files(folder, Path(self.directory)) if folder else {}
        info = files.get(match["file"])
        if info is None:
            return self._not_found(f"{match['repo']}: no file {match['file']}")
        self._send_file((folder / match["file"]).resolve(), {"X-Repo-Commit": repo_commit(files),
                                                           "ETag": f'"{info.get("sha256", info["blob"])}"'})

    def _send_file(self, path: Path, headers: dict[str, str] | None = None) -> None:
        """``path``, or the single range asked of it: 206, or 416 with ``Content-Range: bytes */SIZE`` when the range
        is unsatisfiable, or the whole file (200) when ``If-Range`` names another version than its ETag (given in
        ``headers``, else size, mtime and inode) or Last-Modified."""
        st = path.stat()
        size = st.st_size
        headers = {"ETag": f'"{size:x}-{st.st_mtime_ns:x}-{st.st_ino:x}"', **(headers or {}),
                   "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True)}
        asked = byte_range(self.headers.get("Range"), size)
        if_range = self.headers.get("If-Range")
        if if_range is not None and if_range.strip() not in (headers["ETag"], headers["Last-Modified"]):
            asked = None  # another version than the one the client holds part of: the whole file
        if asked is not None and asked[1] <= asked[0]:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end = asked or (0, size)
        self.send_response(206 if asked else 200)
        if asked:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0 and (chunk := f.read(min(CHUNK, left))):
                self.wfile.write(chunk)
                left -= len(chunk)

    def _route(self) -> None:
        parts = request_parts(self.path)
        if parts is None:
            return self._not_found(f"refused path {self.path}: '..', '.' or an encoded separator in a part", 400)
        path = "/" + "/".join(parts)
        for pattern, handle in ((self.API, self._api), (self.RESOLVE, self._resolve)):
            match = pattern.fullmatch(path)
            if match:
                return handle(match)
        local = inside(Path(self.directory), *parts)
        if local is None or not local.is_file():
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
    try:
        server = http.server.ThreadingHTTPServer((host, port), handler)
    except OSError as e:  # the port is taken, or the host is not an address of this machine
        raise ValueError(f"cannot serve the mirror on {host}:{port}: {e.strerror or e}; pass another --port (0 = any "
                         "free one) or --host") from None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def base_url(server: http.server.ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"
