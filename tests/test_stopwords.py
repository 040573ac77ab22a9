"""The stop list (paper-map §3.4): the original's 211 roberta-large ids ship as package data and are selected by
``datastore.stopwords: original`` (released and paper configs); ``derived`` serves WordPiece and any other
vocabulary. ``original`` refuses a tokenizer that is not roberta-large's vocabulary, is what a datastore stores and
what span filtering reads, and is part of the plan hash."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from npm.datastore.embed import plan_datastore
from npm.datastore.store import (
    ORIGINAL_STOPWORDS,
    ROBERTA_VOCAB_SIZE,
    derive_stopword_ids,
    read_original_stopwords,
    stopword_ids_for,
)
from tests.conftest import ROBERTA_VOCAB, lee_corpus_lines, save_tiny_bert

ROOT = Path(__file__).resolve().parents[1]

# The original's config/roberta_stopwords.txt, sorted (paper-map §3.4), written out as ranges.
ORIGINAL_RANGES = """
4-16 19 21-25 28 30-37 39-43 45 47 49-59 61-64 66 68-71 73 77 79 81 84 87-89 95 97-99 103 106 108-111 113 114 116 122
123 127-129 131 136 137 141-145 147-150 159 160 162 167 172 182 197 207 209 215 218 222 223 227 258 259 276 308 328
349-351 359 367 385 399 454 456 473 475 479 519 524 579 596 608 617 630 646 683 742 769 787 849 874 938 939 947 965
1003 1009 1021 1039 1065 1215 1235 1423 1495 1589 1629 1640 1705 1721 1979 2025 2055 2156 2185 2220 2282 2512 2661
2744 2864 3226 3486 3559 4288 4395 4832 4839 5030 5214 5457 5844 7606 8061 9131 10431 10975 12905 14314 14434 15157
15483 15698 17487 18134 18212 19385 20343 22209 23367 24303 25522 25606 27779 27785 28696 31954 34437 35227 35524
37249 37457 41552 44128 45152
"""


def original_ids() -> list[int]:
    ids = []
    for part in ORIGINAL_RANGES.split():
        a, _, b = part.partition("-")
        ids.extend(range(int(a), int(b or a) + 1))
    return ids


def config(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text(encoding="utf-8"))


def test_shipped_original_list_holds_exactly_the_211_ids_of_the_original():
    ids, tokens = read_original_stopwords()
    assert len(original_ids()) == 211
    assert ids.tolist() == original_ids()
    assert len(tokens) == 211 and all(tokens)
    # The low ids are roberta-large's most frequent tokens (paper-map §3.4).
    assert tokens[:7] == [".", "Ġthe", ",", "Ġto", "Ġand", "Ġof", "Ġa"]


def test_shipped_list_is_package_data():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert ORIGINAL_STOPWORDS.parent.name == "datastore" and '"datastore/*.txt"' in pyproject


def test_released_and_paper_configs_select_the_original_list_and_the_demo_the_derived():
    assert config("released.yaml")["datastore"]["stopwords"] == "original"
    assert config("paper.yaml")["datastore"]["stopwords"] == "original"
    assert config("config.yaml")["datastore"]["stopwords"] == "derived"


def test_original_list_with_a_wordpiece_tokenizer_fails_naming_derived(wordpiece_tokenizer):
    with pytest.raises(ValueError, match=rf"not roberta-large's {ROBERTA_VOCAB_SIZE}.*stopwords: derived"):
        stopword_ids_for(wordpiece_tokenizer, "original")
    assert np.array_equal(stopword_ids_for(wordpiece_tokenizer, "derived"), derive_stopword_ids(wordpiece_tokenizer))


def test_original_list_with_another_byte_level_bpe_fails_naming_derived(bpe_tokenizer):
    with pytest.raises(ValueError, match="stopwords: derived"):
        stopword_ids_for(bpe_tokenizer, "original")
    with pytest.raises(ValueError, match="stopwords must be one of original, derived, not 'english'"):
        stopword_ids_for(bpe_tokenizer, "english")


def test_planning_with_the_original_list_and_a_wordpiece_model_fails_before_writing(tmp_path, wordpiece_tokenizer):
    from npm.data.blocks import tokenize_documents
    from npm.io import save_npz

    model = save_tiny_bert(tmp_path / "bert")
    save_npz(tmp_path / "blocks.npz", **tokenize_documents([{"id": "0", "units": ["The cat sat on the mat."]}],
                                                           wordpiece_tokenizer))
    with pytest.raises(ValueError, match="--stopwords derived"):
        plan_datastore(model, [tmp_path / "blocks.npz"], tmp_path / "ds", stopwords="original")
    assert not (tmp_path / "ds").exists()


# ---------------------------------------------------------------------------- with roberta-large's vocabulary

@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    """A tiny random roberta-architecture encoder (hidden 32) with roberta-large's tokenizer, saved like a
    checkpoint, and blocks of real text tokenized with it."""
    import torch
    from transformers import RobertaConfig, RobertaModel

    from npm.data.blocks import tokenize_documents
    from npm.io import save_npz
    from npm.model import load_tokenizer

    folder = ROBERTA_VOCAB
    root = tmp_path_factory.mktemp("roberta")
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=50265, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, type_vocab_size=1)
    RobertaModel(config, add_pooling_layer=False).save_pretrained(root / "model")
    for name in ("vocab.json", "merges.txt"):  # the released checkpoints' legacy layout
        shutil.copy(folder / name, root / "model" / name)
    tok = load_tokenizer(str(root / "model"))
    assert len(tok) == config.vocab_size
    lines = lee_corpus_lines()[:6] + ["The United States of America is a country; its capital is Washington."]
    docs = [{"id": str(i), "units": [line[:500]]} for i, line in enumerate(lines)]
    save_npz(root / "blocks.npz", **tokenize_documents(docs, tok, max_seq_length=128))
    return str(root / "model"), root / "blocks.npz", tok


def test_original_list_on_roberta_vocabulary_is_stored_and_filters_spans(tmp_path, roberta):
    from npm.boundaries import SPECIAL
    from npm.datastore.embed import embed_corpus
    from npm.datastore.store import load_datastore
    from npm.inference.predictor import Predictor

    model, blocks, tok = roberta
    shipped, tokens = read_original_stopwords()
    assert tok.convert_ids_to_tokens(shipped.tolist()) == tokens
    embed_corpus(model, [blocks], tmp_path / "ds", stopwords="original", shards=1, progress=False)
    ds = load_datastore(tmp_path / "ds")
    assert np.array_equal(ds.stopword_ids, shipped) and ds.meta["stopwords"] == "original"
    view = Predictor(model, str(tmp_path / "ds"))._view(np.arange(ds.n_blocks))
    stop = np.isin(view["ids"], shipped)
    assert np.array_equal(view["blocked"], stop | ((ds.flags[:len(stop)] & SPECIAL) != 0))
    # The lists differ in this corpus: a token of one list only is blocked or not as the original list says.
    derived = derive_stopword_ids(tok)
    assert np.isin(view["ids"], np.setxor1d(shipped, derived)).any()


def test_datastore_planned_with_derived_is_not_reused_for_original(tmp_path, roberta):
    from npm.datastore.embed import embed_corpus
    from npm.datastore.store import read_plan

    model, blocks, tok = roberta
    embed_corpus(model, [blocks], tmp_path / "ds", stopwords="derived", shards=1, progress=False)
    before = read_plan(tmp_path / "ds")
    plan = plan_datastore(model, [blocks], tmp_path / "ds", stopwords="original", shards=1)
    assert plan["plan"] != before["plan"] and plan["stopwords"] == "original"
    assert not (tmp_path / "ds" / "meta.json").exists()  # the derived datastore is no longer complete
    assert np.array_equal(np.load(tmp_path / "ds" / "stopword_ids.npy"), read_original_stopwords()[0])
