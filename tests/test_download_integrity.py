"""Downloads check what the server sends (npm.data.download): a body shorter than its Content-Length is resumed, a
Range answered from the wrong offset is refused, a file whose size changes between two responses is refused, and
only a complete body is checked against its sha256 or has its sha256 recorded. Each test runs a real HTTP server on
127.0.0.1 that answers the way a faulty server or a dropped connection does."""

from __future__ import annotations

import email.utils
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


def etag(body: bytes) -> str:
    """The ETag the faulty server sends for ``body`` (one per version of the file)."""
    return f'"{hashlib.sha1(body).hexdigest()[:16]}"'


def modified(version: int) -> str:
    """The Last-Modified the faulty server sends for its ``version``-th file."""
    return email.utils.formatdate(1_600_000_000 + 1000 * version, usegmt=True)


@pytest.fixture
def faulty():
    """Start a server of one file: ``start(versions, cuts=(), answer="honour", stall=0, validator="etag",
    if_range=True)`` -> (url, the Range header of every request). Request k serves ``versions[k]`` (the last one
    from then on) with the full Content-Length announced, but sends only the first ``cuts[k]`` bytes of its body
    (None: all), then waits ``stall`` seconds and closes the connection. ``answer``: how a Range is met: "honour"
    (206 from the offset asked), "from_zero" (206 of the whole file), "ignore" (200 of the whole file),
    "whole_body" (206 whose Content-Range claims the offset asked, with the whole file as body and its
    Content-Length), "whole_body_unsized" (the same without Content-Length). ``validator``: what identifies the
    version: "etag" (``etag(body)``), "modified" (Last-Modified only), "fixed" (one ETag for every version: a server
    whose ETag does not follow the file), "none". ``if_range``: whether a Range whose If-Range names another version
    gets the whole file (200), as HTTP says."""
    servers = []

    def start(versions: list[bytes], cuts=(), answer: str = "honour", stall: float = 0.0, validator: str = "etag",
              if_range: bool = True):
        ranges: list[str | None] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                k = len(ranges)
                ranges.append(self.headers.get("Range"))
                version = min(k, len(versions) - 1)
                body = versions[version]
                cut = cuts[k] if k < len(cuts) else None
                current = {"etag": {"ETag": etag(body)}, "fixed": {"ETag": '"fixed"'},
                           "modified": {"Last-Modified": modified(version)}, "none": {}}[validator]
                asked = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                stale = if_range and self.headers.get("If-Range") not in (None, *current.values())
                start = 0
                if asked and answer != "ignore" and not stale:
                    start = int(asked[1]) if answer in ("honour", "whole_body", "whole_body_unsized") else 0
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                    if answer.startswith("whole_body"):
                        start = 0  # the whole body despite its Content-Range
                else:
                    self.send_response(200)
                for key, value in current.items():
                    self.send_header(key, value)
                if answer != "whole_body_unsized":
                    self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:][:cut])  # HTTP/1.0: the connection closes after the handler
                if cut is not None:
                    time.sleep(stall)  # a stalled connection: the client's read times out

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.handle_error = lambda *a: None  # a client that hangs up mid-body (as refusals do) is no server error
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/data.csv", ranges

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def interrupted(out, url: str, data: bytes, validator: str | None) -> None:
    """Leave ``out.part`` as an interrupted earlier download of ``url`` left it, from the version ``validator``."""
    out.with_name(out.name + ".part").write_bytes(data)
    out.with_name(out.name + ".part.json").write_text(json.dumps({"url": url, "validator": validator}))


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
    interrupted(out, url, payload[:400_000], etag(payload))
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
    interrupted(out, url, payload[:400_000], etag(payload))
    download(url, out, backoff=0)
    assert out.read_bytes() == payload and ranges == ["bytes=400000-"]


def test_a_file_whose_size_changes_between_two_responses_is_refused(faulty, tmp_path):
    first, changed = blob(MIB), blob(MIB + 5000, seed=7)
    url, ranges = faulty([first, changed], cuts=[400_000], validator="fixed")  # its ETag does not follow the file
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
    interrupted(out, url, blob(9000, seed=3), etag(payload))  # more bytes than the file has: not a prefix of it
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


# ------------------------------------------- fault 5: a resume splices two versions of a file (issue 41)


@pytest.mark.parametrize("validator", ["etag", "modified"])
def test_a_file_changed_between_the_cut_and_the_resume_is_downloaded_again_never_spliced(faulty, tmp_path, caplog,
                                                                                        validator):
    """Fault: first half old, second half new, installed and its sha256 recorded as the reference."""
    old, new = blob(MIB), blob(MIB, seed=9)  # the same size: only the version tells them apart
    url, ranges = faulty([old, new], cuts=[400_000], validator=validator)
    out = tmp_path / "data.csv"
    with caplog.at_level(logging.INFO, logger="npm-repro.download"):
        info = download(url, out, backoff=0)
    assert out.read_bytes() == new and info["sha256"] == hashlib.sha256(new).hexdigest()
    assert ranges == [None, "bytes=400000-"]  # asked If-Range, answered with the whole new file
    assert any(url in r.getMessage() and "starts over from byte 0" in r.getMessage() for r in caplog.records)


def test_a_resume_sends_the_recorded_version_in_if_range(faulty, tmp_path):
    payload = blob(MIB)
    url, _ = faulty([payload], cuts=[400_000])
    out = tmp_path / "data.csv"
    with pytest.raises(ValueError, match="cut short"):
        download(url, out, tries=1, backoff=0)
    assert json.loads(out.with_name("data.csv.part.json").read_text())["validator"] == etag(payload)


def test_a_206_of_another_version_is_discarded_and_the_file_downloaded_again(faulty, tmp_path, caplog):
    """A server that does not honour If-Range but names the new version in its 206."""
    old, new = blob(MIB), blob(MIB, seed=9)
    url, ranges = faulty([old, new], cuts=[400_000], if_range=False)
    out = tmp_path / "data.csv"
    with caplog.at_level(logging.INFO, logger="npm-repro.download"):
        download(url, out, backoff=0)
    assert out.read_bytes() == new and ranges == [None, "bytes=400000-", None]
    assert any(etag(new) in r.getMessage() and "data.csv.part" in r.getMessage() for r in caplog.records)


def test_an_old_part_against_a_newer_file_gives_the_new_file(faulty, tmp_path):
    old, new = blob(MIB), blob(MIB, seed=9)
    url, ranges = faulty([new])
    out = tmp_path / "data.csv"
    interrupted(out, url, old[:400_000], etag(old))  # an earlier run, before the file changed on the server
    download(url, out, backoff=0)
    assert out.read_bytes() == new and ranges == ["bytes=400000-"]


def test_a_part_without_a_recorded_version_is_discarded_with_a_log_line(faulty, tmp_path, caplog):
    """A part an earlier version of the downloader left (its record has no validator) is never resumed."""
    old, new = blob(MIB), blob(MIB, seed=9)
    url, ranges = faulty([new])
    out = tmp_path / "data.csv"
    interrupted(out, url, old[:400_000], None)
    with caplog.at_level(logging.INFO, logger="npm-repro.download"):
        download(url, out, backoff=0)
    assert out.read_bytes() == new and ranges == [None]
    lines = [r.getMessage() for r in caplog.records if "data.csv.part" in r.getMessage()]
    assert len(lines) == 1 and "no recorded version" in lines[0], lines


def test_a_server_without_validators_is_never_resumed(faulty, tmp_path):
    """Without ETag or Last-Modified nothing tells a resume that the file is the same: a cut starts over."""
    payload = blob(MIB)
    url, ranges = faulty([payload], cuts=[400_000], validator="none")
    out = tmp_path / "data.csv"
    download(url, out, backoff=0)
    assert out.read_bytes() == payload and ranges == [None, None]


# --------------------------------- fault 6: a 206 with more bytes than its Content-Range announces (issue 41)


@pytest.mark.parametrize("answer", ["whole_body", "whole_body_unsized"])
def test_a_206_with_more_bytes_than_announced_is_refused_at_once(faulty, tmp_path, answer):
    """Fault: the whole file appended after every resume: 'cut short 5 times (5767168 of 1048576 bytes)'."""
    payload = blob(MIB)
    url, ranges = faulty([payload], answer=answer)
    out = tmp_path / "data.csv"
    interrupted(out, url, payload[:400_000], etag(payload))
    with pytest.raises(ValueError) as e:
        download(url, out, backoff=0)
    message = str(e.value)
    assert "\n" not in message and url in message and "648576" in message and "cut short" not in message, message
    assert not out.exists() and not out.with_name("data.csv.part").exists() and ranges == ["bytes=400000-"]
    download(url, out, backoff=0)  # the next run starts over, without a Range
    assert out.read_bytes() == payload and ranges == ["bytes=400000-", None]


def test_a_cut_without_validators_says_a_run_again_starts_over(faulty, tmp_path):
    payload = blob(MIB)
    url, ranges = faulty([payload], cuts=[1000, 1000], validator="none")
    with pytest.raises(ValueError) as e:
        download(url, tmp_path / "data.csv", tries=2, backoff=0)
    assert "names no version" in str(e.value) and "starts over" in str(e.value) and ranges == [None, None]
