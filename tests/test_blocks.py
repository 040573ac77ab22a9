"""Documents -> 256-token blocks and blocks -> batch lines (paper-map §2.1; §9 items 1-4)."""

from collections import Counter

import numpy as np
import pytest

from npm.boundaries import SPECIAL
from npm.data.batches import build_batches, make_batches
from npm.data.blocks import (
    block_text,
    build_blocks,
    load_blocks,
    pack_blocks,
    pad_blocks,
    subsample_blocks,
    tokenize_documents,
)
from npm.io import load_npz, write_jsonl
from tests.conftest import WORDPIECE, lee_corpus_lines


def block_lengths(unit_lengths, unit_doc=None, max_len=256):
    offsets, _ = pack_blocks(np.array(unit_lengths), None if unit_doc is None else np.array(unit_doc), max_len)
    return np.diff(offsets).tolist()


def test_item1_whole_units_are_packed_up_to_256_tokens():
    assert block_lengths([100, 100, 100]) == [200, 100]


def test_item1_an_oversized_unit_fills_the_open_block_then_spills_over():
    assert block_lengths([100, 600]) == [256, 256, 188]
    assert block_lengths([600]) == [256, 256, 88]
    assert block_lengths([256, 1]) == [256, 1]


def test_blocks_never_cross_documents():
    offsets, doc = pack_blocks(np.array([100, 100, 100]), np.array([0, 1, 1]))
    assert np.diff(offsets).tolist() == [100, 200] and doc.tolist() == [0, 1]


@pytest.mark.parametrize("family", ["bpe", "wordpiece"])
def test_item1_every_unit_is_wrapped_in_the_tokenizers_begin_and_end_tokens(family, bpe_tokenizer,
                                                                            wordpiece_tokenizer):
    tok = bpe_tokenizer if family == "bpe" else wordpiece_tokenizer
    docs = [{"id": "a", "units": lee_corpus_lines()[:6]}, {"id": "b", "units": ["Short one.", "Another."]}]
    blocks = tokenize_documents(docs, tok, max_seq_length=256)
    ids, offsets = blocks["input_ids"], blocks["block_offsets"]
    begin, end = tok.cls_token_id, tok.sep_token_id
    assert np.diff(offsets).max() <= 256
    # Units that fit are whole: a block that does not come from a split unit starts with begin, ends with end.
    doc_b = np.flatnonzero(blocks["doc_ids"][blocks["block_doc"]] == "b")
    assert len(doc_b) == 1
    b = int(doc_b[0])
    row = ids[offsets[b]:offsets[b + 1]].tolist()
    assert row[0] == begin and row[-1] == end and row.count(begin) == 2 and row.count(end) == 2
    assert (blocks["flags"][ids == begin] & SPECIAL).all()
    assert ids.dtype == np.int32 and offsets.dtype == np.int64


@pytest.mark.parametrize("family", ["bpe", "wordpiece"])
def test_item2_a_unit_containing_the_mask_token_is_dropped(family, bpe_tokenizer, wordpiece_tokenizer):
    tok = bpe_tokenizer if family == "bpe" else wordpiece_tokenizer
    docs = [{"id": "d", "units": ["The first unit.", f"A unit with {tok.mask_token} inside.", "The last unit."]}]
    stats = Counter()
    blocks = tokenize_documents(docs, tok, stats=stats)
    assert tok.mask_token_id not in blocks["input_ids"]
    assert stats["units_dropped_mask"] == 1 and stats["units"] == 3
    assert (blocks["input_ids"] == tok.cls_token_id).sum() == 2


def test_item3_blocks_are_padded_with_id_0_and_attention_0():
    ids = np.arange(10, 17, dtype=np.int32)
    offsets = np.array([0, 3, 7])
    padded, attention = pad_blocks(ids, offsets, np.array([1, 0]), length=6)
    assert padded.tolist() == [[13, 14, 15, 16, 0, 0], [10, 11, 12, 0, 0, 0]]
    assert attention.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    with pytest.raises(ValueError, match="more than the padded length"):
        pad_blocks(ids, offsets, np.array([1]), length=3)


def test_item4_rollover_batches_hold_exactly_16_blocks_and_leftovers_roll_over():
    # 10 + 10 blocks of two articles -> one batch of 16 (all of article 0, six of article 1), 4 carried over
    block_doc = np.repeat([0, 1], 10)
    batches = make_batches(block_doc, 16, rollover=True)
    assert batches.tolist() == [list(range(16))]
    # with a third article of 12 blocks, the 4 leftovers open the next line
    batches = make_batches(np.repeat([0, 1, 2], [10, 10, 12]), 16, rollover=True)
    assert batches.tolist() == [list(range(16)), list(range(16, 32))]


def test_item4_per_document_batching_drops_each_documents_tail():
    # CC-News: one document per date, tails of fewer than 16 blocks dropped
    batches = make_batches(np.repeat([0, 1, 2], [20, 33, 15]), 16, rollover=False)
    assert batches.tolist() == [list(range(0, 16)), list(range(20, 36)), list(range(36, 52))]


def test_build_blocks_and_batches_stream_a_documents_file(tmp_path):
    lines = lee_corpus_lines()
    docs = [{"id": f"doc{i}", "title": f"T{i}", "units": lines[i * 5:(i + 1) * 5]} for i in range(20)]
    write_jsonl(tmp_path / "docs.jsonl.gz", docs)
    summary = build_blocks(tmp_path / "docs.jsonl.gz", tmp_path / "blocks.npz", WORDPIECE, max_seq_length=128)
    blocks = load_blocks(tmp_path / "blocks.npz")
    assert summary["documents"] == 20 and summary["blocks"] == len(blocks["block_doc"])
    assert summary["tokens"] == len(blocks["input_ids"]) == blocks["block_offsets"][-1]
    assert np.diff(blocks["block_offsets"]).max() <= 128
    assert blocks["doc_ids"].tolist() == [d["id"] for d in docs]
    out = build_batches(tmp_path / "blocks.npz", tmp_path / "batches.npz", batch_size=8)
    batches = load_npz(tmp_path / "batches.npz")["batches"]
    assert batches.shape == (out["batches"], 8)
    assert out["blocks_dropped"] == summary["blocks"] - batches.size < 8


def test_bad_documents_are_clear_errors(tmp_path):
    write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(ValueError, match="holds no documents"):
        build_blocks(tmp_path / "empty.jsonl", tmp_path / "out.npz", WORDPIECE)
    write_jsonl(tmp_path / "bad.jsonl", [{"id": "x", "text": "no units"}])
    with pytest.raises(ValueError, match=r"bad.jsonl: document 0 \(id 'x'\) is not a documents record"):
        build_blocks(tmp_path / "bad.jsonl", tmp_path / "out.npz", WORDPIECE)
    assert not (tmp_path / "out.npz").exists()


def test_too_few_blocks_for_a_batch_is_a_clear_error(tmp_path):
    write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "units": ["One short unit."]}])
    build_blocks(tmp_path / "docs.jsonl", tmp_path / "blocks.npz", WORDPIECE)
    with pytest.raises(ValueError, match="make no batch of 16 blocks"):
        build_batches(tmp_path / "blocks.npz", tmp_path / "batches.npz", 16)


@pytest.mark.parametrize("family", ["bpe", "wordpiece"])
def test_blocks_keep_the_exact_surface_text_of_every_token(family, bpe_tokenizer, wordpiece_tokenizer):
    tok = bpe_tokenizer if family == "bpe" else wordpiece_tokenizer
    units = lee_corpus_lines()[:12] + ["Θεσσαλονίκη is the second largest city in Greece.", "Ünïcödé — “quotes”."]
    docs = [{"id": "a", "units": units[:7]}, {"id": "b", "units": units[7:]}]
    blocks = tokenize_documents(docs, tok, max_seq_length=64)
    texts = [block_text(blocks, b) for b in range(len(blocks["block_doc"]))]
    joined = "\n".join(texts)
    for unit in units:  # a unit that spans blocks is cut between tokens; whitespace may fall at the cut
        assert "".join(unit.split()) in "".join(joined.split())
    ids, spans, offsets = blocks["input_ids"], blocks["token_spans"], blocks["block_offsets"]
    special = (blocks["flags"] & SPECIAL) != 0
    for b in range(len(texts)):
        raw = texts[b].encode()
        for i in range(offsets[b], offsets[b + 1]):
            surface = raw[spans[i, 0]:spans[i, 1]].decode()
            if special[i]:
                assert surface == ""
            elif tok.convert_ids_to_tokens(int(ids[i])) != tok.unk_token and "\ufffd" not in tok.decode([int(ids[i])]):
                # the surface string is the token's text (case and accents kept; byte pieces of one character
                # share that character's span)
                piece = tok.decode([int(ids[i])]).strip().removeprefix("##")
                norm = tok.backend_tokenizer.normalizer
                assert (norm.normalize_str(surface) if norm else surface).strip() == piece, (surface, piece)


def test_subsampled_corpus_keeps_whole_blocks_in_corpus_order(tmp_path):
    """Figure 7's corpus-size ablation: a seeded fraction of the blocks of all shards, each block unchanged."""
    lines = lee_corpus_lines()
    paths = []
    for shard in range(2):
        docs = [{"id": f"s{shard}d{i}", "title": f"T{i}", "units": lines[(shard * 10 + i) * 3:(shard * 10 + i + 1) * 3]}
                for i in range(10)]
        write_jsonl(tmp_path / f"docs{shard}.jsonl", docs)
        build_blocks(tmp_path / f"docs{shard}.jsonl", tmp_path / f"b{shard}.npz", WORDPIECE, max_seq_length=64)
        paths.append(tmp_path / f"b{shard}.npz")
    full = [load_blocks(p, text=True) for p in paths]
    originals = [(s, b) for s in full for b in range(len(s["block_doc"]))]
    summary = subsample_blocks(paths, 0.5, tmp_path / "half.npz", seed=3)
    sub = load_blocks(tmp_path / "half.npz", text=True)
    assert summary["blocks"] == len(sub["block_doc"]) == round(0.5 * len(originals))
    assert summary["tokens"] == len(sub["input_ids"]) == len(sub["token_spans"]) == sub["block_offsets"][-1]
    texts = [block_text(s, b) for s, b in originals]
    positions = [texts.index(block_text(sub, b)) for b in range(len(sub["block_doc"]))]
    assert positions == sorted(positions), "blocks keep their corpus order"
    for b, pos in enumerate(positions):
        s, ob = originals[pos]
        a, e = sub["block_offsets"][b], sub["block_offsets"][b + 1]
        oa, oe = s["block_offsets"][ob], s["block_offsets"][ob + 1]
        assert np.array_equal(sub["input_ids"][a:e], s["input_ids"][oa:oe])
        assert np.array_equal(sub["token_spans"][a:e], s["token_spans"][oa:oe])
        assert sub["doc_ids"][sub["block_doc"][b]] == s["doc_ids"][s["block_doc"][ob]]
    again = tmp_path / "again.npz"
    subsample_blocks(paths, 0.5, again, seed=3)
    assert np.array_equal(load_blocks(again)["input_ids"], sub["input_ids"]), "seeded"
    with pytest.raises(ValueError, match="fraction"):
        subsample_blocks(paths, 0, tmp_path / "none.npz", seed=0)
