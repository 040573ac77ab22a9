"""Faults of the retrieval indexes (issue 12 items 3 and 8): each test names a fault a user can hit and the behaviour
the project guarantees instead of an exit-0 answer from the wrong corpus or model, or a Java / C++ traceback.

Every index carries the fingerprint of what it was built from (npm/fingerprint.py): the BM25 index a record
``npm-repro-index.json`` with the corpus fingerprint of its blocks, the FAISS index a sidecar with the datastore's
``plan`` (token arrays + model fingerprint + settings); every reader of the pipeline (``Predictor``, the decoder
baselines) compares them with the datastore / blocks it serves before the first search.

The world: two tiny random BERTs (seeds 0 and 1, same shapes), corpus A (a few news paragraphs) and corpus B (more
paragraphs, so that B has more blocks than A and no size check can tell them apart), built with the real entry
points: blocks, datastore, exact FAISS index, pyserini BM25 index.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from npm.cli import main
from npm.datastore.faiss_index import build_faiss_index, load_faiss_index
from npm.datastore.store import load_datastore
from npm.fingerprint import corpus_fingerprint
from npm.inference.predictor import Predictor
from tests.conftest import build_tiny_corpus, lee_corpus_lines, require_jvm, save_tiny_bert

QUERY = "Thessaloniki is the second largest city in <mask>."


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Model A (seed 0) and model B (seed 1); corpus A and corpus B with every index built by model A; the datastore
    and exact FAISS index of model B over corpus A (same corpus, same hidden size, same rows as model A's)."""
    from npm.datastore.embed import embed_corpus

    root = tmp_path_factory.mktemp("faults_index")
    model_a, model_b = save_tiny_bert(root / "model_a", seed=0), save_tiny_bert(root / "model_b", seed=1)
    lines = lee_corpus_lines()
    a = build_tiny_corpus(root / "a", model_a, [QUERY.replace("<mask>", "Greece")] + lines[:5])
    b = build_tiny_corpus(root / "b", model_a, lines[20:44])
    embed_corpus(model_b, [a["blocks"]], root / "a" / "ds_b", batch_blocks=8, progress=False)
    ds_b = load_datastore(root / "a" / "ds_b")
    build_faiss_index(ds_b.vector_shards(), ds_b.hidden_size, root / "a" / "flat_b.faiss", factory="Flat",
                      datastore=ds_b)
    return {"root": root, "model_a": model_a, "model_b": model_b, "a": a, "b": b, "ds_b": str(root / "a" / "ds_b"),
            "faiss_b": str(root / "a" / "flat_b.faiss")}


# ------------------------------------------------------------------------------------ BM25 of another corpus


def test_bm25_index_records_the_fingerprint_of_its_blocks(world):
    """Not a fault, the contract the checks rely on: the BM25 index's record holds the corpus fingerprint of its
    blocks files, which equals the datastore's (same blocks, however they are cut into files)."""
    a = world["a"]
    record = json.loads((Path(a["bm25"]) / "npm-repro-index.json").read_text(encoding="utf-8"))
    ds = load_datastore(a["ds"])
    assert record["corpus_fingerprint"] == corpus_fingerprint([a["blocks"]]) == ds.corpus_fingerprint
    assert record["n_blocks"] == ds.n_blocks and record["documents"] <= ds.n_blocks
    assert record["sources"] == [a["blocks"]]
    assert Predictor(world["model_a"], a["ds"], bm25=a["bm25"]).predict(QUERY)  # the matching pair is accepted


def test_bm25_index_of_another_corpus_is_refused_by_the_predictor(world):
    """Fault: the BM25 index of corpus A given with the datastore of corpus B (B has more blocks, so no size check
    notices). Before: accepted, the BM25 block ids of A were read as blocks of B and the answers and evidence came
    from the wrong passages. Expected: ValueError naming the BM25 index, both fingerprints and the command that
    rebuilds it."""
    a, b = world["a"], world["b"]
    assert load_datastore(a["ds"]).n_blocks < load_datastore(b["ds"]).n_blocks
    p = Predictor(world["model_a"], b["ds"], bm25=a["bm25"])
    with pytest.raises(ValueError) as e:
        p.predict(QUERY)
    message = str(e.value)
    assert f"BM25 index {Path(a['bm25']).absolute()}" in message
    assert corpus_fingerprint([a["blocks"]])[:12] in message and corpus_fingerprint([b["blocks"]])[:12] in message
    assert "rebuild it with `npm-repro build-bm25-index --blocks" in message and "(rule build_bm25_index)" in message


def test_bm25_index_without_a_record_is_refused_by_the_predictor(world, tmp_path):
    """Fault: a BM25 index built before indexes carried their corpus fingerprint (no record). Expected: ValueError
    saying the record is missing and how to rebuild; a caller that asks for no check (tests, benchmarks) still
    reads it."""
    from npm.datastore.bm25 import Bm25Searcher

    a = world["a"]
    old = tmp_path / "bm25"
    shutil.copytree(a["bm25"], old)
    (old / "npm-repro-index.json").unlink()
    with pytest.raises(ValueError, match=r"npm-repro-index\.json.*rebuild it with `npm-repro build-bm25-index"):
        Predictor(world["model_a"], a["ds"], bm25=str(old)).predict(QUERY)
    assert len(Bm25Searcher(old).search("Thessaloniki", 3)[0]) >= 1


def test_bm25_index_of_another_corpus_is_refused_by_the_decoder_baseline(world):
    """Fault: ``bm25_lm`` (BM25 + causal LM) given the BM25 index of corpus A and the blocks files of corpus B.
    Before: accepted (A has fewer documents than B has blocks), the prompts got B's passages at A's block ids.
    Expected: ValueError naming the index, before the LM answers anything."""
    from npm.baselines.decoder import DecoderScorer
    from npm.evaluation.systems import SYSTEMS, Inputs
    from npm.settings import Settings
    from tests.test_baselines import save_tiny_llama

    a, b = world["a"], world["b"]
    lm = save_tiny_llama(world["root"] / "lm")
    inputs = Inputs(checkpoint=lm, bm25=[a["bm25"]], blocks=[b["blocks"]], device="cpu")
    with pytest.raises(ValueError, match=r"BM25 index .*rebuild it with `npm-repro build-bm25-index --blocks"):
        DecoderScorer(SYSTEMS["bm25_lm"], inputs, Settings())
    inputs = Inputs(checkpoint=lm, bm25=[a["bm25"]], blocks=[a["blocks"]], device="cpu")
    scorer = DecoderScorer(SYSTEMS["bm25_lm"], inputs, Settings())
    assert scorer.searcher.search("Thessaloniki", 1)[0].tolist() == [0]


# ------------------------------------------------------------------------------------ FAISS of another model


def test_faiss_index_of_another_model_is_refused(world):
    """Fault: the FAISS index built from model A's datastore used with model B's datastore of the same corpus (same
    hidden size, same row count). Before: accepted, the candidates were model A's neighbours. Expected: ValueError
    naming the index and the datastore and saying to rebuild the index."""
    a = world["a"]
    assert load_datastore(a["ds"]).n_rows == load_datastore(world["ds_b"]).n_rows
    p = Predictor(world["model_b"], world["ds_b"], faiss=a["faiss"])
    with pytest.raises(ValueError) as e:
        p.predict(QUERY, mode="faiss")
    message = str(e.value)
    assert f"FAISS index {Path(a['faiss']).absolute()}" in message and world["ds_b"] in message
    assert "rebuild the index (rule build_faiss_index)" in message
    with pytest.raises(ValueError, match="rebuild the index"):
        p.knn("It was <mask>.")  # closed-set kNN reads the same index
    good = Predictor(world["model_b"], world["ds_b"], faiss=world["faiss_b"])
    assert good.predict(QUERY, mode="faiss")


def test_faiss_index_without_a_datastore_record_is_refused(world, tmp_path):
    """Fault: a FAISS index whose sidecar records no datastore (built before indexes carried it) or that has no
    sidecar at all. Expected: ValueError saying so and to rebuild; callers that pass no datastore still read it."""
    a = world["a"]
    ds = load_datastore(a["ds"])
    build_faiss_index(ds.vector_shards(), ds.hidden_size, tmp_path / "old.faiss", factory="Flat")
    with pytest.raises(ValueError, match=r"records no datastore.*rebuild the index \(rule build_faiss_index\)"):
        load_faiss_index(tmp_path / "old.faiss", datastore=ds)
    (tmp_path / "old.faiss.json").unlink()
    with pytest.raises(ValueError, match=r"has no sidecar.*rebuild the index \(rule build_faiss_index\)"):
        load_faiss_index(tmp_path / "old.faiss", datastore=ds)
    assert load_faiss_index(tmp_path / "old.faiss").ntotal == ds.n_rows


# ------------------------------------------------------------------------------------ unreadable FAISS files


@pytest.mark.parametrize("fault", ["random bytes", "truncated", "json file", "empty"])
def test_a_file_that_is_not_a_faiss_index_is_a_clear_error(world, tmp_path, fault):
    """Fault: the FAISS path holds random bytes, a truncated index, a JSON file or nothing. Before: FAISS's C++
    RuntimeError ("Error in ... at index_read.cpp:3251: ..."). Expected: ValueError "PATH is not a readable FAISS
    index (FAISS: gist); rebuild it", without the C++ location; also through the Predictor."""
    good = Path(world["a"]["faiss"]).read_bytes()
    data = {"random bytes": np.random.default_rng(0).bytes(4096), "truncated": good[: len(good) // 2],
            "json file": b'{"factory": "Flat"}\n', "empty": b""}[fault]
    path = tmp_path / "bad.faiss"
    path.write_bytes(data)
    with pytest.raises(ValueError) as e:
        load_faiss_index(path)
    message = str(e.value)
    assert message.startswith(f"{path} is not a readable FAISS index (FAISS: ") and message.endswith("rebuild it")
    assert "index_read.cpp" not in message and "Error in" not in message
    p = Predictor(world["model_a"], world["a"]["ds"], faiss=str(path))
    with pytest.raises(ValueError, match="is not a readable FAISS index"):
        p.predict(QUERY, mode="faiss")


def test_faiss_index_of_another_dimension_is_refused(world, tmp_path):
    """Fault: a FAISS index of dimension 16 (as many vectors as the datastore has rows) given for a datastore of hidden
    size 32. Before: an error only at search time ("queries must be [q, 16]"), naming no file. Expected: ValueError at
    load naming the index file, both dimensions and saying to rebuild."""
    ds = load_datastore(world["a"]["ds"])
    vectors = np.random.default_rng(0).normal(size=(ds.n_rows, 16)).astype(np.float16)
    shard = tmp_path / "shard0.f16"
    vectors.tofile(shard)
    path = tmp_path / "d16.faiss"
    build_faiss_index([(shard, ds.n_rows)], 16, path, factory="Flat")
    with pytest.raises(ValueError, match=rf"FAISS index {path} has dimension 16, the datastore .* 32.*rebuild the "
                                         r"index \(rule build_faiss_index\)"):
        load_faiss_index(path, datastore=ds)
    p = Predictor(world["model_a"], world["a"]["ds"], faiss=str(path))
    with pytest.raises(ValueError, match="has dimension 16"):
        p.predict(QUERY, mode="faiss")
    # The same file copied over another index, whose sidecar stays: the mismatch is caught without a datastore too.
    replaced = tmp_path / "replaced.faiss"
    build_faiss_index(ds.vector_shards(), ds.hidden_size, replaced, factory="Flat", datastore=ds)
    shutil.copyfile(path, replaced)
    with pytest.raises(ValueError, match=rf"FAISS index {replaced} does not match its sidecar replaced\.faiss\.json "
                                         r"\(dim 32 in the sidecar, 16 in the index\)"):
        load_faiss_index(replaced)


def test_faiss_build_refuses_a_datastore_record_that_does_not_match_its_shards(world, tmp_path):
    """Fault: ``build_faiss_index`` given the shards of one datastore and the record of another (a wrong argument in
    a script). Expected: ValueError before anything is written."""
    ds_a, ds_b = load_datastore(world["a"]["ds"]), load_datastore(world["b"]["ds"])
    assert ds_a.n_rows != ds_b.n_rows
    with pytest.raises(ValueError, match="rows"):
        build_faiss_index(ds_a.vector_shards(), ds_a.hidden_size, tmp_path / "x.faiss", factory="Flat", datastore=ds_b)
    assert not (tmp_path / "x.faiss").exists()


# ------------------------------------------------------------------------------------ corrupt Lucene index


def _truncate_segments(index: Path) -> None:
    for f in index.iterdir():
        if f.name not in ("write.lock", "npm-repro-index.json") and not f.name.startswith("segments"):
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _overwrite_commit(index: Path) -> None:
    for f in index.glob("segments_*"):
        f.write_bytes(b"not a Lucene commit point " * 8)


@pytest.mark.parametrize("corrupt", [_truncate_segments, _overwrite_commit], ids=["truncated", "overwritten"])
def test_a_corrupt_lucene_index_is_a_clear_error(world, tmp_path, capsys, corrupt):
    """Fault: the BM25 index folder is corrupt (segment files truncated, or the commit point overwritten). Before: a
    ``jnius.JavaException`` (Java traceback) from pyserini, or at best the CLI's generic "Java (pyserini/Lucene): ..."
    line that names no file. Expected: ValueError "INDEX is not a readable Lucene index (Java: CLASS: gist); delete it
    and rebuild it ..." from the searcher and the Predictor, and one such line with exit status 1 from
    ``npm-repro predict``."""
    require_jvm()
    from npm.datastore.bm25 import Bm25Searcher

    a = world["a"]
    index = tmp_path / "bm25"
    shutil.copytree(a["bm25"], index)
    corrupt(index)
    with pytest.raises(ValueError) as e:
        Bm25Searcher(index)
    message = str(e.value)
    assert message.startswith(f"{index} is not a readable Lucene index (Java: org.apache.lucene."), message
    assert "delete it and rebuild it" in message and "\n" not in message and ".java" not in message

    p = Predictor(world["model_a"], a["ds"], bm25=str(index))
    with pytest.raises(ValueError, match="is not a readable Lucene index"):
        p.predict(QUERY)

    capsys.readouterr()
    rc = main(["predict", "--checkpoint", world["model_a"], "--datastore", a["ds"], "--bm25", str(index), QUERY])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and ".java:" not in err
    lines = [line for line in err.strip().splitlines() if "error" in line.lower()]  # not the model-loading bar
    assert len(lines) == 1 and lines[0] == err.strip().splitlines()[-1], err
    assert lines[0].startswith(f"npm-repro predict: error: {index} is not a readable Lucene index (Java: "
                               "org.apache.lucene."), err
