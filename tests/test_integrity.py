"""Artefacts checked by their own content before use (issue 34; npm/checksums.py, docs/data-contracts.md "Checksums").

Each test names a fault a user can hit: a file whose bytes changed after the rule that made it ran (a disk error, an
edit, a copy gone wrong) and that the reader still parses. Before: the FAISS index answered with a slightly different
score, the Lucene index with "no candidate span", the datastore and the blocks with other vectors or text. Expected:
one line naming the file, the rule / command that built it and how to rebuild it. The world is built with the real
entry points (blocks, datastore, exact FAISS index, pyserini BM25 index) and corrupted for real.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from npm.cli import main
from npm.data.blocks import load_blocks
from npm.datastore.store import load_datastore
from npm.io import load_npz, save_npz, write_jsonl
from tests.conftest import WORDPIECE, build_tiny_corpus, lee_corpus_lines, require_jvm, save_tiny_bert

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    require_jvm()
    root = tmp_path_factory.mktemp("integrity")
    model = save_tiny_bert(root / "model")
    return {"root": root, "model": model, **build_tiny_corpus(root / "corpus", model, lee_corpus_lines()[:6])}


def _copy(src, dst) -> Path:
    (shutil.copytree if Path(src).is_dir() else shutil.copy2)(src, dst)
    return Path(dst)


def _flip(path: Path, at: int, n: int = 1, value: int | None = None) -> None:
    """Change ``n`` bytes of ``path`` from offset ``at`` (negative: from the end), keeping its size."""
    data = bytearray(path.read_bytes())
    at = at % len(data)
    for i in range(at, at + n):
        data[i] = value if value is not None else data[i] ^ 0x01
    path.write_bytes(bytes(data))


def _one_line(message: str, path: Path, rule: str, command: str) -> None:
    assert "\n" not in message, message
    assert message.startswith(f"{path} does not match the checksum recorded when it was built"), message
    assert f"by rule {rule} / npm-repro {command}" in message and "delete it and re-run snakemake" in message, message


def test_a_faiss_index_whose_vectors_were_overwritten_is_refused(world, tmp_path):
    """Fault: bytes of the stored vectors of a Flat index overwritten (same size). Before: the index loads and the
    score of a query moves a little (0.1140 -> 0.1141). Expected: ChecksumMismatch naming the index."""
    from npm.datastore.faiss_index import load_faiss_index

    ds = load_datastore(world["ds"])
    index = _copy(world["faiss"], tmp_path / "flat.faiss")
    _copy(world["faiss"] + ".json", tmp_path / "flat.faiss.json")
    load_faiss_index(index, datastore=ds)  # intact: fine
    _flip(index, -40, 4)  # inside the last stored vector
    with pytest.raises(ValueError, match="does not match the checksum") as e:
        load_faiss_index(index, datastore=ds)
    _one_line(str(e.value), index, "build_faiss_index", "build-faiss-index")


def test_a_lucene_index_with_zeroed_term_dictionary_bytes_is_refused(world, tmp_path):
    """Fault: 200 zeroed bytes in the Lucene index's ``.tim`` file. Before: Lucene opens it and answers "no candidate
    span". Expected: ChecksumMismatch naming the ``.tim`` file and the command that rebuilds the index."""
    from npm.datastore.bm25 import Bm25Searcher

    index = _copy(world["bm25"], tmp_path / "bm25")
    Bm25Searcher(index)  # intact: fine
    (tim,) = index.glob("*.tim")
    _flip(tim, 64, 200, value=0)
    with pytest.raises(ValueError, match="does not match the checksum") as e:
        Bm25Searcher(index)
    _one_line(str(e.value), tim, "build_bm25_index", "build-bm25-index")
    assert f"--out {world['bm25']}" in str(e.value)


def test_a_datastore_shard_with_changed_bytes_is_refused(world, tmp_path):
    """Fault: one byte of an embedding shard changed. Before: the loader memory-maps it (other vectors, other
    scores). Expected: ChecksumMismatch naming the shard file and rule embed_shard."""
    ds = _copy(world["ds"], tmp_path / "ds")
    load_datastore(ds)
    shard = sorted((ds / "embeddings").glob("shard*.f16"), key=lambda p: p.stat().st_size)[-1]
    _flip(shard, 100)
    with pytest.raises(ValueError, match="does not match the checksum") as e:
        load_datastore(ds)
    _one_line(str(e.value), shard, "embed_shard", "embed --step shard")


def test_a_blocks_file_changed_after_the_datastore_was_built_is_refused(world, tmp_path):
    """Fault: the blocks file rewritten after the datastore was built from it (here: its text, so that the surface
    strings of the answers change). Before: read as is. Expected: ChecksumMismatch naming the blocks file and rule
    tokenize_blocks, from ``load_blocks`` and from the Predictor that reads the answers' text from it."""
    from npm.inference.predictor import Predictor

    blocks = Path(world["blocks"])
    saved = blocks.read_bytes()
    arrays = load_npz(blocks)
    arrays["text"] = arrays["text"].copy()
    arrays["text"][:5] = np.frombuffer(b"XXXXX", dtype=np.uint8)
    try:
        save_npz(blocks, **arrays)
        with pytest.raises(ValueError, match="does not match the checksum") as e:
            load_blocks(blocks, text=True)
        _one_line(str(e.value), blocks, "tokenize_blocks", "tokenize-blocks")
        with pytest.raises(ValueError, match="does not match the checksum"):
            Predictor(world["model"], world["ds"], bm25=world["bm25"]).block_text(0)  # an answer's evidence
    finally:
        blocks.write_bytes(saved)


def test_verification_hashes_a_file_once_and_again_when_it_changes(world, tmp_path, monkeypatch):
    from npm import checksums

    calls = []
    real = checksums.file_fingerprint
    monkeypatch.setattr(checksums, "file_fingerprint", lambda p, *a: calls.append(Path(p).name) or real(p, *a))
    ds = _copy(world["ds"], tmp_path / "ds")
    load_datastore(ds)
    n_files = len(json.loads((ds / "meta.json").read_text())["checksums"])
    assert len(calls) == n_files >= 3  # tokens.npz, stopword_ids.npy, every shard
    load_datastore(ds)
    assert len(calls) == n_files  # cached: nothing hashed again
    (ds / "stopword_ids.npy").touch()  # same bytes, new mtime: hashed again, still ok
    load_datastore(ds)
    assert calls[n_files:] == ["stopword_ids.npy"]


def test_verify_command_prints_one_line_per_file_and_exits_1_on_a_mismatch(world, tmp_path, capsys):
    ds = _copy(world["ds"], tmp_path / "ds")
    index = _copy(world["bm25"], tmp_path / "bm25")
    assert main(["verify", str(ds), str(index), world["blocks"], world["faiss"]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"ok  {ds / 'tokens.npz'}" in out and f"ok  {world['blocks']}" in out and f"ok  {world['faiss']}" in out
    assert len(out) == len(set(out))  # each file once
    assert {line.split("  ")[0] for line in out} == {"ok", "record", "lock"}
    shard = ds / "embeddings" / "shard0.f16"
    _flip(shard, 0)
    with pytest.raises(SystemExit) as e:
        main(["verify", str(ds)])
    assert e.value.code == 1
    captured = capsys.readouterr()
    assert f"MISMATCH  {shard}" in captured.out.splitlines() and "does not match the checksum" in captured.err


def test_a_checkpoint_whose_weights_changed_is_set_aside_on_resume(tmp_path):
    """Fault: a byte of a resumable checkpoint's weights changed (safetensors still loads it). Before: training
    resumed from the changed weights. Expected: the checkpoint is set aside like an unreadable one and the previous
    one is resumed."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    from npm.model import load_encoder, load_tokenizer
    from npm.training.loop import _resume_point, _save_checkpoint

    model, tok = load_encoder(save_tiny_bert(tmp_path / "m")), load_tokenizer(WORDPIECE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = get_linear_schedule_with_warmup(opt, 1, 10)
    run = tmp_path / "run"
    for step in (1, 2):
        _save_checkpoint(run, step, model, tok, opt, sched, (0, step), keep=2)
    assert (run / "step-2" / "sha256.json").exists()
    _flip(run / "step-2" / "model.safetensors", -3)
    ckpt, state, _ = _resume_point(run, 2, load_encoder, rank=0)
    assert ckpt.name == "step-1" and state["step"] == 1
    assert [p.name.split(".")[0] for p in run.glob("step-2.corrupt-*")] == ["step-2"]


# ------------------------------------------------------------------------------------------ blocks' token spans


def test_token_spans_outside_the_text_are_refused_by_the_loader_and_the_datastore_plan(world, tmp_path):
    """Fault: a blocks file whose token_spans point past its block's text. Before: embedded, and the answer's
    surface string is empty. Expected: ValueError naming the file, the block and the token."""
    from npm.datastore.embed import plan_datastore

    arrays = load_npz(world["blocks"])
    arrays["token_spans"] = arrays["token_spans"].copy()
    b = 1
    t = int(arrays["block_offsets"][b]) + 2
    arrays["token_spans"][t] = [60000, 60010]
    bad = tmp_path / "blocks.npz"
    save_npz(bad, **arrays)
    with pytest.raises(ValueError, match=rf"^{bad}: block {b}, token 2: token_spans \(60000, 60010\) lie outside"):
        load_blocks(bad, text=True)
    with pytest.raises(ValueError, match=f"{bad}: block {b}, token 2"):
        plan_datastore(world["model"], [bad], tmp_path / "ds")


def test_token_spans_going_backwards_are_refused(world, tmp_path):
    arrays = load_npz(world["blocks"])
    arrays["token_spans"] = arrays["token_spans"].copy()
    t = int(arrays["block_offsets"][0]) + 3  # a word token of block 0 (after [CLS] and two words)
    arrays["token_spans"][t] = [0, 1]
    bad = tmp_path / "blocks.npz"
    save_npz(bad, **arrays)
    with pytest.raises(ValueError, match="block 0, token 3: token_spans .* start before the previous token's"):
        load_blocks(bad, text=True)


def test_the_corpus_fingerprint_covers_the_token_spans(world, tmp_path):
    from npm.fingerprint import corpus_fingerprint

    arrays = load_npz(world["blocks"])
    arrays["token_spans"] = arrays["token_spans"].copy()
    t = int(arrays["block_offsets"][0]) + 1
    arrays["token_spans"][t, 1] -= 1  # the first word one byte shorter: still inside the text, in order
    other = tmp_path / "blocks.npz"
    save_npz(other, **arrays)
    assert corpus_fingerprint([other]) != corpus_fingerprint([world["blocks"]])
    assert corpus_fingerprint([world["blocks"]]) == load_datastore(world["ds"]).corpus_fingerprint


# ------------------------------------------------------------------------------------------ encoder positions


def test_blocks_longer_than_the_encoder_positions_are_refused_at_the_plan(world, tmp_path):
    """Fault: blocks of 256 tokens for an encoder with 128 positions. Before: the plan passes and the shard job dies
    in the encoder with a RuntimeError. Expected: ValueError at the plan naming the blocks file, the block, its
    length and the limit."""
    from npm.data.blocks import build_blocks
    from npm.datastore.embed import plan_datastore

    write_jsonl(tmp_path / "docs.jsonl", [{"id": "0", "units": [" ".join(lee_corpus_lines()[:4])]}])
    blocks = tmp_path / "long.npz"
    build_blocks(tmp_path / "docs.jsonl", blocks, WORDPIECE, max_seq_length=256)
    length = int(np.diff(load_blocks(blocks)["block_offsets"])[0])
    assert length > 128
    with pytest.raises(ValueError, match=rf"^{blocks}: block 0 has {length} tokens, more than the 128 positions"):
        plan_datastore(world["model"], [blocks], tmp_path / "ds")
    assert not (tmp_path / "ds" / "plan.json").exists()


# ------------------------------------------------------------------------------------------ issue 41: records


def _verify(capsys, *paths) -> tuple[int, list[str], str]:
    """``npm-repro verify PATHS``: (exit status, stdout lines, stderr)."""
    try:
        code = main(["verify", *map(str, paths)])
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_a_faiss_index_copied_under_another_name_is_checked_against_its_own_bytes(world, tmp_path, capsys):
    """Fault: the index and its sidecar copied as other.faiss / other.faiss.json, the copy damaged. Before: the
    sidecar's record names flat.faiss, so nothing was checked: the reader used the damaged bytes and `verify` said "no
    checksum recorded", exit 0. Expected: the sidecar's digest applies to the file it sits beside."""
    from npm.datastore.faiss_index import load_faiss_index

    ds = load_datastore(world["ds"])
    index = _copy(world["faiss"], tmp_path / "other.faiss")
    _copy(world["faiss"] + ".json", tmp_path / "other.faiss.json")
    load_faiss_index(index, datastore=ds)  # intact: fine
    assert _verify(capsys, index)[:2] == (0, [f"ok  {index}"])
    _flip(index, -40, 4)
    with pytest.raises(ValueError, match="does not match the checksum") as e:
        load_faiss_index(index, datastore=ds)
    _one_line(str(e.value), index, "build_faiss_index", "build-faiss-index")
    code, out, err = _verify(capsys, index)
    assert code == 1 and out == [f"MISMATCH  {index}"] and "does not match the checksum" in err
    code = main(["predict", "Sydney is in <mask>.", "--checkpoint", world["model"], "--datastore", world["ds"],
                 "--faiss", str(index), "--mode", "faiss"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith(f"npm-repro predict: error: {index} does not match the checksum"), err


def test_verify_exits_1_for_a_missing_path_and_a_missing_or_empty_record(world, tmp_path, capsys):
    """Fault: `verify` of a path that does not exist, of a file without a record and of a blocks file whose sidecar
    is 0 bytes. Before: exit 0 ("no checksum recorded"). Expected: one status line each and exit 1."""
    missing, plain = tmp_path / "no-such-file.faiss", tmp_path / "plain.bin"
    plain.write_bytes(b"no record")
    blocks = _copy(world["blocks"], tmp_path / "blocks.npz")
    (tmp_path / "blocks.npz.sha256.json").write_bytes(b"")
    for path, state in ((missing, "NOT FOUND"), (plain, "NO RECORD"), (blocks, "UNREADABLE RECORD")):
        code, out, err = _verify(capsys, path)
        assert (code, out) == (1, [f"{state}  {path}"]), (code, out, err)
        assert len(err.strip().splitlines()) == 1 and str(path) in err, err
    with pytest.raises(ValueError, match=r"blocks\.npz\.sha256\.json is empty or not a checksum record"):
        load_blocks(blocks)


def test_verify_of_a_folder_lists_every_file_with_its_state(world, tmp_path, capsys):
    """Fault: a file without a record inside a verified folder. Before: skipped (not listed), exit 0. Expected: every
    file of the folder is listed once (records and the files they name: ok; others: NO RECORD) and exit 1."""
    ds = _copy(world["ds"], tmp_path / "ds")
    code, out, err = _verify(capsys, ds)
    files = sorted(str(p) for p in ds.rglob("*") if p.is_file())
    assert code == 0 and sorted(line.split("  ", 1)[1] for line in out) == files, (out, err)
    extra = ds / "embeddings" / "notes.txt"
    extra.write_text("added by hand")
    code, out, err = _verify(capsys, ds)
    assert code == 1 and f"NO RECORD  {extra}" in out and len(out) == len(files) + 1
    assert "1 of" in err and str(extra) in err


def _damaged_model(world, tmp_path) -> Path:
    """A copy of the world's model with a checksum record (as `npm-repro train` writes one), one weight byte changed
    afterwards (safetensors still loads it)."""
    from npm import checksums

    model = _copy(world["model"], tmp_path / "model")
    checksums.write_folder_record(model, "pretrain", f"npm-repro train --out {model}")
    _flip(model / "model.safetensors", -3)
    return model


def test_embedding_with_a_damaged_model_is_refused_naming_its_weights(world, tmp_path, capsys):
    """Fault: model.safetensors changed after training (`verify` says MISMATCH). Before: `npm-repro embed` built a
    whole datastore from it. Expected: one line naming the weights file and saying to rebuild the model."""
    model = _damaged_model(world, tmp_path)
    code = main(["embed", "--checkpoint", str(model), "--blocks", world["blocks"], "--out", str(tmp_path / "ds")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"npm-repro embed: error: {model / 'model.safetensors'} does not match the checksum")
    assert "rebuild the model" in err[0] and not (tmp_path / "ds" / "plan.json").exists()


def test_every_reader_of_a_damaged_model_refuses_it_and_says_to_rebuild_the_model(world, tmp_path):
    """Fault: as above, read by predict (the datastore's fingerprint check), the encoder and masked-LM loaders
    (evaluate, serve, training) and the fingerprint. Before: predict's error advised re-embedding the corpus.
    Expected: each refuses with the checksum line that says to rebuild the model, not to re-embed."""
    from npm.checksums import ChecksumMismatch
    from npm.fingerprint import model_fingerprint
    from npm.inference.predictor import Predictor
    from npm.model import load_encoder, load_masked_lm, load_tokenizer

    model = str(_damaged_model(world, tmp_path))
    readers = (lambda: Predictor(model, world["ds"], bm25=world["bm25"]), lambda: load_encoder(model),
               lambda: load_masked_lm(model, allow_new_head=True), lambda: load_tokenizer(model),
               lambda: model_fingerprint(model), lambda: load_datastore(world["ds"], expected_model=model))
    for read in readers:
        with pytest.raises(ChecksumMismatch) as e:
            read()
        assert str(e.value).startswith(f"{model}/model.safetensors does not match"), str(e.value)
        assert "rebuild the model" in str(e.value) and "re-embed" not in str(e.value)


def _files(*folders) -> set[str]:
    return {str(p) for folder in folders for p in Path(folder).rglob("*")}


def test_predicting_writes_nothing_into_the_model_datastore_or_index(world, tmp_path, monkeypatch):
    """Fault: `predict` only reads the model, datastore and index, yet wrote `.npm-fingerprint.cache` files into their
    folders. Expected: caches go to the user's cache folder ($XDG_CACHE_HOME/npm-repro), nothing into what is read."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    model, ds = _copy(world["model"], tmp_path / "model"), _copy(world["ds"], tmp_path / "ds")
    (tmp_path / "index").mkdir()
    index = _copy(world["faiss"], tmp_path / "index" / "flat.faiss")
    _copy(world["faiss"] + ".json", tmp_path / "index" / "flat.faiss.json")
    from npm import checksums

    checksums.write_folder_record(model, "pretrain", f"npm-repro train --out {model}")
    before = _files(model, ds, index.parent)
    assert main(["predict", "Sydney is in <mask>.", "--checkpoint", str(model), "--datastore", str(ds),
                 "--faiss", str(index), "--mode", "faiss"]) == 0
    assert _files(model, ds, index.parent) == before
    assert (tmp_path / "user-cache" / "npm-repro").is_dir()


def test_predicting_from_a_read_only_model_datastore_and_index_works(world, tmp_path):
    """Fault: a shared model / datastore folder mounted read-only on a cluster. Expected: predict answers (its caches
    go to the user's cache folder). A read-only bind mount in a private mount namespace (root ignores chmod)."""
    import os
    import subprocess
    import sys

    shared = tmp_path / "shared"
    shared.mkdir()
    model, ds = _copy(world["model"], shared / "model"), _copy(world["ds"], shared / "ds")
    index = _copy(world["faiss"], shared / "flat.faiss")
    _copy(world["faiss"] + ".json", shared / "flat.faiss.json")
    from npm import checksums

    checksums.write_folder_record(model, "pretrain", f"npm-repro train --out {model}")
    before = _files(shared)
    predict = [str(Path(sys.executable).parent / "npm-repro"), "predict", "Sydney is in <mask>.", "--checkpoint",
               str(model), "--datastore", str(ds), "--faiss", str(index), "--mode", "faiss"]
    script = ('mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" || exit 99; '
              'touch "$1/.probe" 2>/dev/null && exit 98; shift; exec "$@"')  # 98: the mount is not read-only
    unshare = ["unshare", "--user", "--map-root-user", "--mount"] if os.geteuid() else ["unshare", "--mount"]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "user-cache"), "WANDB_MODE": "disabled"}
    out = subprocess.run([*unshare, "sh", "-c", script, "sh", str(shared), *predict], capture_output=True, text=True,
                         env=env)
    if out.returncode == 99 or (out.returncode and "unshare" in out.stderr):
        pytest.skip(f"no read-only bind mount here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Sydney is in <mask>." in out.stdout and _files(shared) == before
