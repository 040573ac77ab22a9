"""Bad input on the released route, each met with a clear error naming the file and nothing half-written left as if
complete: a corpus shard whose valid file disagrees with its blocks, a checkpoint without weights, a served file
that changes between two runs, an archive member outside the target folder (served by npm.data.mirror on loopback,
as in the rehearsal, tests/test_released_rehearsal.py)."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from npm.data.mirror import mirrored

NPM_REPRO = str(Path(sys.executable).with_name("npm-repro"))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NPM_REPRO, *args], capture_output=True, text=True)


def test_a_mirror_swaps_scheme_and_host_and_keeps_path_and_query():
    url = "https://github.com/JanKalo/KAMEL/blob/master/data/kamel.zip?raw=true"
    assert mirrored(url, "http://127.0.0.1:8000/") == ("http://127.0.0.1:8000/github.com/JanKalo/KAMEL/blob/master/"
                                                        "data/kamel.zip?raw=true")
    assert mirrored(url, None) == url
    with pytest.raises(ValueError, match="not an absolute URL"):
        mirrored("data/raw/x.tar.gz", "http://127.0.0.1:8000")


def test_a_corpus_shard_whose_valid_file_disagrees_with_its_blocks_is_refused(tmp_path, bpe_tokenizer):
    shard = tmp_path / "corpus" / "enwiki"
    shard.mkdir(parents=True)
    ids = np.array(bpe_tokenizer(" The cat's hat. The cat's hat.")["input_ids"] * 2, dtype=np.int32)
    np.save(shard / "0.npy", ids)
    np.save(shard / "0_blocks.npy", np.array([0, len(ids) // 2], dtype=np.int64))
    with open(shard / "0_valid.pkl", "wb") as f:  # three pairs for two blocks
        pickle.dump([(np.array([1], np.uint8), np.array([1], np.uint8))] * 3, f)
    tok = tmp_path / "tok"
    bpe_tokenizer.save_pretrained(tok)
    out = tmp_path / "blocks" / "shard0.npz"
    done = cli("import-corpus", "--folder", str(tmp_path), "--stem", "enwiki/0", "--tokenizer", str(tok),
               "--out", str(out))
    assert done.returncode != 0
    assert "0_valid.pkl" in done.stderr and "2 blocks" in done.stderr and "got list of 3" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() and not list(out.parent.glob("*")) if out.parent.exists() else True


def test_a_checkpoint_without_weights_is_refused_before_any_download(server, tmp_path):
    from npm.data.download import download_checkpoint

    root, url = server
    repo = root / "huggingface.co" / "facebook" / "npm"
    repo.mkdir(parents=True)
    (repo / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    (repo / "vocab.json").write_text("{}")
    out = tmp_path / "checkpoints" / "facebook" / "npm"
    with pytest.raises(ValueError, match=r"facebook/npm .*is not a checkpoint: the repository holds no weights .*"
                                         r"config\.json, vocab\.json"):
        download_checkpoint("facebook/npm", out, mirror=url)
    assert not out.exists() and not out.with_name("npm.tmp").exists()


def test_a_served_checkpoint_is_downloaded_in_the_legacy_layout_with_its_sha256(server, tmp_path):
    from npm.data.download import download_checkpoint, sha256_of

    root, url = server
    repo = root / "huggingface.co" / "facebook" / "npm-single"
    repo.mkdir(parents=True)
    for name, data in (("config.json", b'{"model_type": "roberta"}'), ("pytorch_model.bin", b"weights"),
                       ("vocab.json", b"{}"), ("merges.txt", b"#version: 0.2\n"), ("tf_model.h5", b"tf")):
        (repo / name).write_bytes(data)
    out = tmp_path / "npm-single"
    record = download_checkpoint("facebook/npm-single", out, mirror=url)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "download.json", "merges.txt",
                                                     "pytorch_model.bin", "vocab.json"]  # no TF weights
    assert record["sha256"] == {"pytorch_model.bin": sha256_of(repo / "pytorch_model.bin")}
    assert record["endpoint"] == f"{url}/huggingface.co"


def test_a_served_file_that_changes_between_two_runs_is_refused_and_not_installed(server, tmp_path):
    root, url = server
    served = root / "dl.fbaipublicfiles.com" / "NPM" / "templama.tar.gz"
    served.parent.mkdir(parents=True)
    served.write_bytes(b"first release" * 100)
    out = tmp_path / "raw" / "templama.tar.gz"
    public = "https://dl.fbaipublicfiles.com/NPM/templama.tar.gz"
    first = cli("download", "--url", public, "--out", str(out), "--mirror", url)
    assert first.returncode == 0, first.stderr
    recorded = json.loads(out.with_name("templama.tar.gz.source.json").read_text())
    assert recorded["url"] == public and recorded["fetched_from"] == f"{url}/dl.fbaipublicfiles.com/NPM/templama.tar.gz"
    out.unlink()  # a later run (a clean re-run, another machine sharing data/raw) fetches it again
    served.write_bytes(b"silently changed" * 100)
    second = cli("download", "--url", public, "--out", str(out), "--mirror", url)
    assert second.returncode != 0
    assert "checksum mismatch for " + public in second.stderr and "its first download" in second.stderr
    assert "templama.tar.gz.source.json" in second.stderr and "Traceback" not in second.stderr
    assert not out.exists() and not out.with_name("templama.tar.gz.part").exists()


def test_a_body_cut_short_is_kept_as_a_part_file_and_resumed(server, tmp_path):
    """A served body shorter than its Content-Length is never installed; the next run resumes the part file."""
    from npm.data.download import download

    root, url = server
    payload = bytes(range(256)) * 64
    (root / "example.org").mkdir()
    (root / "example.org" / "f.bin").write_bytes(payload)
    out = tmp_path / "f.bin"
    part = tmp_path / "f.bin.part"
    part.write_bytes(payload[:1000])
    from tests.test_download import version  # the ETag the mirror sends: what the cut download recorded

    part.with_name("f.bin.part.json").write_text(json.dumps({"url": "https://example.org/f.bin",
                                                             "validator": version(f"{url}/example.org/f.bin")}))
    info = download("https://example.org/f.bin", out, mirror=url)
    assert out.read_bytes() == payload and info["bytes"] == len(payload)


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_an_archive_member_outside_the_target_folder_is_refused_and_nothing_is_left(tmp_path, kind):
    archive = tmp_path / f"corpus.{'tar.gz' if kind == 'tar' else 'zip'}"
    members = {"corpus/enwiki/0.npy": b"ok", "../escaped.txt": b"outside"}
    if kind == "tar":
        with tarfile.open(archive, "w:gz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    else:
        with zipfile.ZipFile(archive, "w") as z:
            for name, data in members.items():
                z.writestr(name, data)
    out = tmp_path / "unpacked" / "corpus"
    done = cli("unpack", "--archive", str(archive), "--out", str(out))
    assert done.returncode != 0
    assert "escaped.txt" in done.stderr and str(archive.name) in done.stderr, done.stderr
    assert not out.exists() and not (tmp_path / "unpacked" / "escaped.txt").exists()
    assert not list((tmp_path / "unpacked").glob("*")) if (tmp_path / "unpacked").exists() else True
