"""The importer of the original's released pre-tokenised corpora (npm.data.released; paper-map §3.1, §3.2).

The released files are written here in exactly their format (``X.npy`` flat ids, ``X_blocks.npy`` block starts,
``X_valid.pkl`` a pickled list of (starts, ends) uint8 position arrays per block, ``X.jsonl`` decoded blocks) from real
text (gensim's Lee corpus plus non-ASCII units), tokenized with a byte-level BPE in roberta-large's layout
(``bpe_tokenizer``) and packed with our own block packing, the same algorithm as the original's. The valid positions
are computed with the original's decoded-string rule (paper-map §3.2), written independently below. The import must
give back the same ids, blocks and surface text as our own tokenization of that text, and keep the released valid
positions exactly.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import string
import tarfile
from pathlib import Path

import numpy as np
import pytest

from npm.boundaries import SPECIAL, valid_ends, valid_starts
from npm.data.blocks import block_text, load_blocks, tokenize_documents
from npm.data.released import import_shard, read_shard, released_blocks
from npm.datastore.store import stored_mask
from tests.conftest import lee_corpus_lines, original_strings

EXTRA_UNITS = ["Café au lait — naïve “quotes” and 東京 in one line.", "Prices rose 3.5% (about $2,000) in 2019...",
               "The cat's hat.", "The vote was 52 , 48 against ."]


def original_valid(tokenizer, ids, block_offsets):
    """(starts, ends) per block by the original's rule: valid start at i if i == 0, or token i starts with a space,
    or token i-1 ends with punctuation; valid end at i if i is last, or token i+1 starts with a space or with
    punctuation; ids 0 and 2 (``<s>``, ``</s>``) never listed. Each token is read decoded on its own, as the
    original's rule reads it (paper-map §3.2): the whole vocabulary is decoded once (half a second for roberta's)."""
    strings = original_strings(tokenizer)
    valid = []
    for b in range(len(block_offsets) - 1):
        block = ids[block_offsets[b]:block_offsets[b + 1]]
        s = [strings[int(i)] for i in block]
        n = len(block)
        starts = [i for i in range(n) if i == 0 or s[i].startswith(" ") or s[i - 1][-1:] in set(string.punctuation)]
        ends = [i for i in range(n)
                if i == n - 1 or s[i + 1].startswith(" ") or s[i + 1][:1] in set(string.punctuation)]
        skip = set(np.flatnonzero(np.isin(block, [0, 2])).tolist())
        valid.append((np.array([i for i in starts if i not in skip], dtype=np.uint8),
                      np.array([i for i in ends if i not in skip], dtype=np.uint8)))
    return valid


@pytest.fixture(scope="module")
def released(bpe_tokenizer, tmp_path_factory):
    """Our own blocks of the text (max 64 tokens, so that units spill across blocks) and the released files of the
    same corpus, shard ``corpus/enwiki/0``."""
    lines = lee_corpus_lines()[:60]
    docs = [{"id": str(i), "units": [lines[i], lines[i + 1]]} for i in range(0, len(lines), 2)]
    docs.append({"id": "extra", "units": EXTRA_UNITS})
    ours = tokenize_documents(docs, bpe_tokenizer, max_seq_length=64)
    folder = tmp_path_factory.mktemp("released")
    shard = folder / "corpus" / "enwiki"
    shard.mkdir(parents=True)
    ids, offsets = ours["input_ids"].astype(np.int32), ours["block_offsets"]
    np.save(shard / "0.npy", ids)
    np.save(shard / "0_blocks.npy", offsets[:-1])
    valid = original_valid(bpe_tokenizer, ids, offsets)
    with open(shard / "0_valid.pkl", "wb") as f:
        pickle.dump(valid, f)
    with open(shard / "0.jsonl", "w", encoding="utf-8") as f:
        for b in range(len(offsets) - 1):
            f.write(json.dumps({"id": b, "contents": bpe_tokenizer.decode(ids[offsets[b]:offsets[b + 1]])}) + "\n")
    return {"ours": ours, "folder": folder, "valid": valid, "tokenizer": bpe_tokenizer}


def test_the_code_rule_finds_the_released_positions_where_the_text_rule_differs(released):
    """``word_boundaries: code`` (the paper routes') decodes each id on its own as the original's valid-position rule
    did, so it agrees with the released positions everywhere; the text rule does not (non-ASCII, " ,")."""
    shard = read_shard(released["folder"], "corpus/enwiki/0")
    counts = {}
    for rule in ("code", "text"):
        _, summary = released_blocks(shard["ids"], shard["block_offsets"], shard["valid"], released["tokenizer"],
                                     "0", word_boundaries=rule)
        counts[rule] = summary["start_disagreements"] + summary["end_disagreements"]
        assert summary["word_boundaries"] == rule
    assert counts["code"] == 0 and counts["text"] > 0


def test_import_gives_back_the_ids_blocks_and_exact_surface_text(released, tmp_path):
    tok_path = tmp_path / "tok"
    released["tokenizer"].save_pretrained(tok_path)
    summary = import_shard(released["folder"], "corpus/enwiki/0", str(tok_path), tmp_path / "blocks.npz")
    got, ours = load_blocks(tmp_path / "blocks.npz", text=True), released["ours"]
    np.testing.assert_array_equal(got["input_ids"], ours["input_ids"])
    np.testing.assert_array_equal(got["block_offsets"], ours["block_offsets"])
    np.testing.assert_array_equal(got["text_offsets"], ours["text_offsets"])
    np.testing.assert_array_equal(got["text"], ours["text"])
    texts = [block_text(got, b) for b in range(len(got["block_offsets"]) - 1)]
    assert any("Café au lait — naïve “quotes” and 東京" in t for t in texts)
    # Every token's span holds exactly its own bytes, spaces trimmed (the byte-level BPE is lossless).
    spans, special = got["token_spans"], (got["flags"] & SPECIAL) != 0
    from npm.data.released import vocab_bytes

    flat, voff = vocab_bytes(released["tokenizer"])
    block = np.repeat(np.arange(len(texts)), np.diff(got["block_offsets"]))
    for t in np.flatnonzero(~special):
        tb = got["text"][got["text_offsets"][block[t]]:].tobytes()
        piece = flat[voff[got["input_ids"][t]]:voff[got["input_ids"][t] + 1]].tobytes()
        assert tb[spans[t, 0]:spans[t, 1]] == piece.strip(b" ")  # a token of spaces only: the empty span
    assert summary["blocks"] == len(texts) and summary["tokens"] == len(ours["input_ids"])
    assert len(got["doc_ids"]) == len(texts) and got["doc_ids"][1] == "corpus/enwiki/0/1"


def test_released_valid_positions_are_kept_and_the_disagreement_is_reported(released):
    tok, ours = released["tokenizer"], released["ours"]
    shard = read_shard(released["folder"], "corpus/enwiki/0")
    arrays, summary = released_blocks(shard["ids"], shard["block_offsets"], shard["valid"], tok, "0")
    offsets = arrays["block_offsets"]
    for b, (starts, ends) in enumerate(released["valid"]):
        a, e = offsets[b], offsets[b + 1]
        assert np.flatnonzero(valid_starts(arrays["flags"], offsets)[a:e]).tolist() == starts.tolist()
        assert np.flatnonzero(valid_ends(arrays["flags"], offsets)[a:e]).tolist() == ends.tolist()
    # The disagreement between the original's rule and ours, counted independently.
    ours_s, ours_e = valid_starts(ours["flags"], offsets), valid_ends(ours["flags"], offsets)
    rel_s, rel_e = valid_starts(arrays["flags"], offsets), valid_ends(arrays["flags"], offsets)
    assert summary["start_disagreements"] == int((ours_s != rel_s).sum())
    assert summary["end_disagreements"] == int((ours_e != rel_e).sum())
    assert summary["unrepresentable"] == 0 and summary["valid"] == "released"
    assert 0 <= summary["valid_disagreement_rate"] < 0.05
    # The datastore stores exactly the released positions (their union), as the original's embedder did.
    stored = stored_mask(arrays["input_ids"], arrays["flags"], offsets)
    assert stored.sum() == sum(len(set(s.tolist()) | set(e.tolist())) for s, e in released["valid"])


def test_a_changed_released_position_is_kept_and_counted(released):
    shard = read_shard(released["folder"], "corpus/enwiki/0")
    _, base = released_blocks(shard["ids"], shard["block_offsets"], shard["valid"], released["tokenizer"], "0")
    valid = [(s.copy(), e.copy()) for s, e in shard["valid"]]
    starts, ends = valid[3]
    dropped = int(starts[len(starts) // 2])
    valid[3] = (np.array([p for p in starts if p != dropped], dtype=np.uint8), ends)
    arrays, summary = released_blocks(shard["ids"], shard["block_offsets"], valid, released["tokenizer"], "0")
    a = arrays["block_offsets"][3]
    assert not valid_starts(arrays["flags"], arrays["block_offsets"])[a + dropped]
    assert summary["start_disagreements"] == base["start_disagreements"] + 1


def test_without_a_valid_file_the_flags_are_ours(released, tmp_path):
    shard = read_shard(released["folder"], "corpus/enwiki/0")
    arrays, summary = released_blocks(shard["ids"], shard["block_offsets"], None, released["tokenizer"], "0")
    np.testing.assert_array_equal(arrays["flags"], released["ours"]["flags"])
    assert summary["valid"].startswith("npm.boundaries")


def test_a_wrong_tokenizer_or_a_broken_shard_is_refused(released, wordpiece_tokenizer, tmp_path):
    shard = read_shard(released["folder"], "corpus/enwiki/0")
    with pytest.raises(ValueError, match="not a byte-level BPE|outside"):
        released_blocks(shard["ids"], shard["block_offsets"], None, wordpiece_tokenizer, "0")
    assert read_shard(released["folder"], "enwiki/0")["block_offsets"][-1] == len(shard["ids"])  # below corpus/
    with pytest.raises(FileNotFoundError, match=r"corpus/enwiki/0.npy"):
        read_shard(released["folder"], "new-enwiki/0")
    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "0.npy", shard["ids"])
    np.save(bad / "0_blocks.npy", shard["block_offsets"][:-1][::-1])
    with pytest.raises(ValueError, match="increase strictly"):
        read_shard(bad, "0")


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_valid_file_that_would_run_code_is_refused(released, tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    shard = read_shard(released["folder"], "corpus/enwiki/0")
    np.save(folder / "0.npy", shard["ids"])
    np.save(folder / "0_blocks.npy", shard["block_offsets"][:-1])
    (folder / "0_valid.pkl").write_bytes(pickle.dumps([_Evil()]))
    with pytest.raises(ValueError, match=r"0_valid\.pkl: not read \(refusing to load posix\.system"):
        read_shard(folder, "0")


def test_the_cli_unpacks_a_tarball_and_imports_a_shard(released, tmp_path):
    from npm.cli import main

    archive = tmp_path / "enwiki-0.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(released["folder"] / "corpus", arcname="corpus")
    released["tokenizer"].save_pretrained(tmp_path / "tok")
    assert main(["unpack", "--archive", str(archive), "--out", str(tmp_path / "unpacked")]) == 0
    assert not (tmp_path / "unpacked.tmp").exists()
    assert main(["import-corpus", "--folder", str(tmp_path / "unpacked"), "--stem", "corpus/enwiki/0",
                 "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "b.npz"),
                 "--summary", str(tmp_path / "b.summary.json")]) == 0
    summary = json.loads((tmp_path / "b.summary.json").read_text())
    assert summary["valid"] == "released" and "valid_disagreement_rate" in summary
    np.testing.assert_array_equal(load_blocks(tmp_path / "b.npz")["input_ids"], released["ours"]["input_ids"])


def test_unpack_refuses_members_outside_the_folder_and_leaves_nothing(tmp_path):
    from npm.data.download import unpack

    evil = tmp_path / "evil.tar"
    payload = tmp_path / "x.txt"
    payload.write_text("x")
    with tarfile.open(evil, "w") as t:
        t.add(payload, arcname="../escaped.txt")
    with pytest.raises(ValueError, match=r"evil.tar: member '../escaped.txt' would unpack outside"):
        unpack(evil, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
    assert not (tmp_path.parent / "escaped.txt").exists()


# ------------------------------------------------------------------------------------------------ the released route


def test_the_released_route_plans_downloads_import_embedding_indexes_evaluation_tables_and_check(tmp_path):
    """config/released.yaml: `snakemake -n results/check/paper.txt` plans downloads -> import -> per-shard embedding ->
    indexes -> evaluation -> tables -> check, with the task sets as inputs of the evaluations, and trains nothing."""
    from npm.tasks.fetch import COMPLETE
    from tests.test_task_fetch import ROOT, dry_run, jobs

    planned = jobs(dry_run(tmp_path, ROOT / "config" / "released.yaml", "results/check/paper.txt"))
    rules = {j["rule"] for j in planned}
    assert {"download_checkpoint", "download_source", "unpack_source", "import_blocks", "plan_datastore",
            "embed_shard", "embed_corpus", "build_faiss_index", "build_bm25_index", "download_task", "evaluate",
            "table1", "table2", "table3", "table8", "check_paper"} <= rules
    assert not rules & {"pretrain", "mask_batches", "extract_documents", "tokenize_blocks"}
    outputs = {j["output"] for j in planned if j["rule"] == "download_checkpoint"}
    assert outputs == {"data/checkpoints/facebook/npm", "data/checkpoints/facebook/npm-single",
                       "data/checkpoints/roberta-large", "data/checkpoints/facebook/opt-2.7b"}
    imported = {j["output"].split(",")[0] for j in planned if j["rule"] == "import_blocks"}
    assert "data/blocks/enwiki/shard19.npz" in imported and "data/blocks/cc_news/shard0.npz" in imported
    agn = next(j for j in planned if j["rule"] == "evaluate" and j["output"].endswith("agn/npm.json"))
    for needed in ("data/checkpoints/facebook/npm", "data/datastore/npm/enwiki_0/meta.json",
                   "data/datastore/npm/cc_news/meta.json", f"data/tasks/agn/{COMPLETE}"):
        assert needed in agn["input"].split(", ")


def test_a_legacy_layout_checkpoint_tokenizes_the_mask_as_roberta_large(bpe_tokenizer, tmp_path):
    """The released checkpoints carry only vocab.json and merges.txt (the hub's legacy layout). RoBERTa's <mask> eats
    the space before it (lstrip, set in the tokenizer's code in transformers 4, read only from tokenizer files in
    transformers 5): " in <mask>." must give ... "Ġin" "<mask>" "." as roberta-large, not an extra "Ġ" token."""
    from npm.model import load_tokenizer

    legacy = tmp_path / "npm"
    legacy.mkdir()
    bpe_tokenizer.backend_tokenizer.model.save(str(legacy))  # vocab.json, merges.txt
    (legacy / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    loaded = load_tokenizer(str(legacy))
    text = ["Thessaloniki is the second largest city in <mask>.", " The cat's hat."]
    assert loaded(text)["input_ids"] == bpe_tokenizer(text)["input_ids"]
    ids = loaded(text[0])["input_ids"]
    assert ids[ids.index(loaded.mask_token_id) - 1] == loaded.convert_tokens_to_ids("Ġin")


def test_npm_single_is_closed_set_only_on_the_released_and_paper_routes_and_the_plan_states_disk_costs(tmp_path):
    """The original never evaluates NPM-single open-set, and an open-set NPM-single costs a second Wikipedia datastore
    (~1.5 TB at fp16): config/released.yaml and config/paper.yaml leave it out of the open-set systems (it stays
    selectable), the released route plans no NPM-single Wikipedia datastore, and the dry run states every datastore's
    disk cost."""
    import subprocess
    import sys

    import yaml

    from npm.evaluation.systems import SYSTEMS
    from tests.test_task_fetch import ROOT, jobs

    for name in ("released.yaml", "paper.yaml"):
        config = yaml.safe_load((ROOT / "config" / name).read_text(encoding="utf-8"))
        assert "npm_single" not in config["evaluation"]["open_set_systems"], name
        assert "npm_single" in config["evaluation"]["closed_set_systems"], name
    assert SYSTEMS["npm_single"].open is not None  # still selectable for open-set tasks

    snakemake = str(Path(sys.executable).with_name("snakemake"))
    out = subprocess.run([snakemake, "results/check/paper.txt", "-n", "--cores", "1", "--directory", str(tmp_path),
                          "-s", str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config" / "released.yaml")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    planned = jobs(out.stdout)
    datastores = {j["output"].split(",")[0].rsplit("/", 1)[0] for j in planned if j["rule"] == "plan_datastore"}
    assert "data/datastore/npm/enwiki" in datastores and "data/datastore/npm_single/enwiki_0" in datastores
    assert not any(d.startswith("data/datastore/npm_single/enwiki") and not d.endswith("enwiki_0") for d in datastores)
    costs = datastore_costs(out.stderr)
    assert costs["data/datastore/npm/enwiki"] == "810,000,000 tokens, 1,658.9 GB"  # x 1024 x 2 B at most
    assert "data/datastore/npm_single/enwiki" not in costs
    # Only the datastores of the requested targets' DAG: the paper check reads none of Figure 7's subsamples (1.49 TB),
    # Figure 7 reads them all and nothing else.
    unknown = {f"data/datastore/{model}/{corpus}" for model in ("npm", "npm_single") for corpus in ("amazon", "imdb")}
    assert set(costs) == datastores - unknown  # no `tokens` in their sources: "size unknown until planned"
    assert not any("enwiki_p" in name for name in costs), costs
    figure7 = subprocess.run([snakemake, "results/figures/figure7.pdf", "-n", "--cores", "1", "--directory",
                              str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile",
                              str(ROOT / "config" / "released.yaml")], cwd=ROOT, capture_output=True, text=True)
    assert figure7.returncode == 0, figure7.stderr[-3000:]
    assert set(datastore_costs(figure7.stderr)) == {f"data/datastore/npm/enwiki{p}" for p in
                                                    ("", "_p5", "_p10", "_p25", "_p50")}


def datastore_costs(stderr: str) -> dict[str, str]:
    """The datastore lines a snakemake run prints once its DAG is built: name -> "N tokens, X GB"; checks the total."""
    lines = stderr[stderr.index("npm-repro: datastores the requested targets build"):].splitlines()[1:]
    costs, total = {}, 0.0
    for line in lines:
        if line.startswith("  total: "):
            assert abs(float(line.split()[1].replace(",", "")) - total) < 0.1 * len(costs) + 0.05, (line, total)
            return costs
        if line.startswith("  data/datastore/"):
            name, cost = line.strip().split(": ", 1)
            costs[name] = cost.split("  (")[0]
            total += float(costs[name].split(", ")[1].split()[0].replace(",", ""))
    raise AssertionError(f"no total line: {lines[:20]}")


@pytest.mark.parametrize("name", ["paper.yaml", "released.yaml"])
def test_the_paper_routes_closed_set_tasks_read_the_original_s_released_datastores(tmp_path, name):
    """The original's closed-set datastores (Wikipedia shard 0 with Shi et al.'s news; subj; imdb + amazon) ship
    pre-tokenised, and no raw source rebuilds Shi et al.'s corpora. Before: config/paper.yaml evaluated Subj and the
    five sentiment tasks on its Wikipedia + news fallback and AGN, Yahoo, RTE on subsamples of its training corpora."""
    import yaml

    from tests.test_task_fetch import ROOT, dry_run, jobs

    config = yaml.safe_load((ROOT / "config" / name).read_text(encoding="utf-8"))
    planned = jobs(dry_run(tmp_path, ROOT / "config" / name, *(f"results/metrics/{t}/npm.json" for t in
                                                                ("agn", "subj", "sst2", "amazon"))))
    read = {j["output"].split("/")[2]: set(re.findall(r"data/datastore/npm/(\w+)/meta\.json", j["input"]))
            for j in planned if j["rule"] == "evaluate"}
    news = "cc_news" if name == "released.yaml" else "cc_news_shi"
    assert read == {"agn": {"enwiki_0", news}, "subj": {"subj"}, "sst2": {"imdb", "amazon"},
                    "amazon": {"imdb", "amazon"}}
    for corpus in set().union(*read.values()):
        assert config["sources"][corpus]["format"] == "npm_corpus", corpus
    assert not any(j["rule"] == "subsample_corpus" for j in planned)
