"""Downloads check what the server sends (npm.data.download): a body shorter than its Content-Length is resumed, a
Range answered from the wrong offset is refused, a file whose size changes between two responses is refused, and
only a complete body is checked against its sha256 or has its sha256 recorded. Each test runs a real HTTP server on
127.0.0.1 that answers the way a faulty server or a dropped connection does."""

from __future__ import annotations

import hashlib
import http.server
import json
import logging
import re
import threading
import time

import pytest

from npm.data.download import download

MIB = 1 << 20


def csv_rows(n: int) -> bytes:
    return "".join(f"{i},question {i} about a capital city,answer {i}\n" for i in range(n)).encode()


def blob(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


@pytest.fixture
def faulty():
    """Start a server of one file: ``start(versions, cuts=(), answer="honour", stall=0)`` -> (url, the Range header
    of every request). Request k serves ``versions[k]`` (the last one from then on) with the full Content-Length
    announced, but sends only the first ``cuts[k]`` bytes of its body (None: all), then waits ``stall`` seconds and
    closes the connection. ``answer``: how a Range is met: "honour" (206 from the offset asked), "from_zero" (206 of
    the whole file), "ignore" (200 of the whole file)."""
    servers = []

    def start(versions: list[bytes], cuts=(), answer: str = "honour", stall: float = 0.0):
        ranges: list[str | None] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                k = len(ranges)
                ranges.append(self.headers.get("Range"))
                body = versions[min(k, len(versions) - 1)]
                cut = cuts[k] if k < len(cuts) else None
                asked = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                start = 0
                if asked and answer != "ignore":
                    start = int(asked[1]) if answer == "honour" else 0
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:][:cut])  # HTTP/1.0: the connection closes after the handler
                if cut is not None:
                    time.sleep(stall)  # a stalled connection: the client's read times out

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/data.csv", ranges

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def interrupted(out, url: str, data: bytes) -> None:
    """Leave ``out.part`` as an interrupted earlier download of ``url`` left it."""
    out.with_name(out.name + ".part").write_bytes(data)
    out.with_name(out.name + ".part.json").write_text(json.dumps({"url": url}))


# ------------------------------------------------------------------------------- fault 1: a body cut short


def test_a_body_cut_short_is_resumed_from_its_length_and_installed_complete(faulty, tmp_path):
    """Fault: a CSV cut mid-row was installed as the whole file (42 of 60 rows)."""
    rows = csv_rows(60)
    cut = rows.index(b"42,") + 10  # mid-row
    url, ranges = faulty([rows], cuts=[cut])
    out = tmp_path / "data.csv"
    info = download(url, out, backoff=0)
    assert out.read_bytes() == rows and len(out.read_text().splitlines()) == 60
    assert ranges == [None, f"bytes={cut}-"]
    assert info["bytes"] == len(rows) and not out.with_name("data.csv.part").exists()


def test_a_connection_that_stalls_mid_body_is_resumed(faulty, tmp_path):
    payload = blob(MIB)
    url, ranges = faulty([payload], cuts=[5000], stall=2.0)
    out = tmp_path / "data.csv"
    download(url, out, timeout=0.5, backoff=0)
    assert out.read_bytes() == payload and ranges == [None, "bytes=5000-"]


def test_a_body_always_cut_short_is_never_installed_and_the_part_is_kept(faulty, tmp_path):
    payload = blob(MIB)
    url, ranges = faulty([payload], cuts=[1000] * 3)
    out = tmp_path / "data.csv"
    with pytest.raises(ValueError) as e:
        download(url, out, tries=3, backoff=0)
    message = str(e.value)
    assert "\n" not in message and url in message and "data.csv.part" in message and "run " in message
    assert "3000 of 1048576 bytes" in message
    assert ranges == [None, "bytes=1000-", "bytes=2000-"]
    assert not out.exists() and not out.with_name("data.csv.source.json").exists()
    assert out.with_name("data.csv.part").read_bytes() == payload[:3000]
    info = download(url, out, backoff=0)  # the server recovers: the next run resumes the part
    assert out.read_bytes() == payload and info["bytes"] == MIB and ranges[-1] == "bytes=3000-"


# ------------------------------------------------------------------------ fault 2: a Range answered wrongly


def test_a_range_answered_from_the_wrong_offset_is_refused_not_appended(faulty, tmp_path):
    """Fault: a 206 of the whole file after a 400,000-byte part made a 1,048,576-byte file 1,448,576 bytes."""
    payload = blob(MIB)
    url, ranges = faulty([payload], answer="from_zero")
    out = tmp_path / "data.csv"
    interrupted(out, url, payload[:400_000])
    with pytest.raises(ValueError) as e:
        download(url, out, backoff=0)
    message = str(e.value)
    assert "\n" not in message and url in message and "from byte 400000" in message and "bytes 0-1048575" in message
    assert not out.exists() and not out.with_name("data.csv.part").exists()
    assert ranges == ["bytes=400000-"]


def test_a_range_ignored_by_the_server_starts_over(faulty, tmp_path):
    payload = blob(MIB)
    url, ranges = faulty([payload], answer="ignore")
    out = tmp_path / "data.csv"
    interrupted(out, url, payload[:400_000])
    download(url, out, backoff=0)
    assert out.read_bytes() == payload and ranges == ["bytes=400000-"]


def test_a_file_whose_size_changes_between_two_responses_is_refused(faulty, tmp_path):
    first, changed = blob(MIB), blob(MIB + 5000, seed=7)
    url, ranges = faulty([first, changed], cuts=[400_000])
    out = tmp_path / "data.csv"
    with pytest.raises(ValueError) as e:
        download(url, out, backoff=0)
    message = str(e.value)
    assert "\n" not in message and url in message and "changed on the server" in message
    assert "1048576" in message and "1053576" in message
    assert not out.exists() and not out.with_name("data.csv.part").exists()
    assert ranges == [None, "bytes=400000-"]


def test_a_part_longer_than_the_served_file_starts_over(faulty, tmp_path):
    payload = blob(5000)
    url, ranges = faulty([payload])
    out = tmp_path / "data.csv"
    interrupted(out, url, blob(9000, seed=3))  # more bytes than the file has: not a prefix of it
    download(url, out, backoff=0)
    assert out.read_bytes() == payload and ranges == ["bytes=9000-", None]


# ------------------------------------------------------------------ fault 3: a short body is not a mismatch


def test_with_a_sha256_a_body_cut_short_is_resumed_not_a_checksum_mismatch(faulty, tmp_path):
    payload = blob(MIB)
    url, ranges = faulty([payload], cuts=[300_000, 300_000])
    out = tmp_path / "data.csv"
    download(url, out, sha256=hashlib.sha256(payload).hexdigest(), backoff=0)
    assert out.read_bytes() == payload and ranges == [None, "bytes=300000-", "bytes=600000-"]


def test_a_complete_body_with_the_wrong_sha256_is_a_one_line_mismatch(faulty, tmp_path):
    payload = blob(5000)
    url, _ = faulty([payload])
    out = tmp_path / "data.csv"
    with pytest.raises(ValueError) as e:
        download(url, out, sha256="0" * 64, backoff=0)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"checksum mismatch for {url}")
    assert "expected " + "0" * 64 in message and "got " + hashlib.sha256(payload).hexdigest() in message
    assert not out.exists() and not out.with_name("data.csv.part").exists()


# ---------------------------------------------------- fault 4: no published sha256: the first download's


def test_a_short_body_is_never_recorded_and_the_complete_file_is_with_a_log_line(faulty, tmp_path, caplog):
    payload = blob(MIB)
    url, _ = faulty([payload], cuts=[1000, 1000])
    out = tmp_path / "data.csv"
    record = tmp_path / "data.csv.source.json"
    with pytest.raises(ValueError, match="cut short"):
        download(url, out, tries=2, backoff=0)
    assert not record.exists()
    with caplog.at_level(logging.INFO, logger="npm-repro.download"):
        download(url, out, backoff=0)
    sha = hashlib.sha256(payload).hexdigest()
    assert json.loads(record.read_text())["sha256"] == sha
    assert any(sha in r.getMessage() and "data.csv.source.json" in r.getMessage() for r in caplog.records)
