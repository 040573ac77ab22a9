"""The Python API ``npm.Predictor`` as a researcher meets it: ``from_config`` finds the model, datastore and indexes
where the workflow builds them (``results/models/{model}`` or config ``models``, ``data/datastore/{model}/{corpus}``,
``data/index/{model}/{corpus}.faiss``, ``data/bm25/{corpus}``) and reads the config's ``inference`` switches;
``predict_batch`` (one encoder pass) answers like ``predict`` one query at a time; what is missing is an error
naming the Snakemake target that builds it."""

import dataclasses
import os

import numpy as np
import pytest
import yaml

import npm
from npm.inference.predictor import Predictor
from npm.settings import Settings
from tests.conftest import WORDPIECE, lee_corpus_lines, save_tiny_bert

QUERIES = [
    "Thessaloniki is the second largest city in <mask>.",
    "The fires were burning near <mask>.",
    "Where did the Palestinian leader meet the <mask>?",
    "<mask> said on Tuesday that the government would act quickly to end the crisis in the country.",
]
INFERENCE = {"open_set_tau": 0.5, "k": 64, "restricted_blocks": 2}  # not the defaults: they must reach the Predictor


def _corpus(corpus, lines, models, faiss=True):
    """Blocks, BM25 index and, per model, datastore and exact FAISS index of ``lines``, at the workflow's paths
    relative to the current directory (so the datastore records its blocks file as the workflow does)."""
    from npm.data.blocks import build_blocks
    from npm.datastore.bm25 import block_documents, build_bm25_index
    from npm.datastore.embed import embed_corpus
    from npm.datastore.faiss_index import build_faiss_index
    from npm.datastore.store import load_datastore
    from npm.io import write_jsonl

    docs, blocks = f"data/documents/{corpus}.jsonl", f"data/blocks/{corpus}/shard0.npz"
    os.makedirs(f"data/blocks/{corpus}", exist_ok=True)
    write_jsonl(docs, [{"id": str(i), "units": [line]} for i, line in enumerate(lines)])
    build_blocks(docs, blocks, WORDPIECE, max_seq_length=64)
    build_bm25_index(block_documents([blocks]), f"data/bm25/{corpus}")
    for model, checkpoint in models.items():
        ds = f"data/datastore/{model}/{corpus}"
        embed_corpus(checkpoint, [blocks], ds, batch_blocks=8, progress=False)
        if faiss:
            os.makedirs(f"data/index/{model}", exist_ok=True)
            store = load_datastore(ds)
            build_faiss_index(store.vector_shards(), store.hidden_size, f"data/index/{model}/{corpus}.faiss",
                              factory="Flat", datastore=store)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A workflow working directory: NPM trained here (results/models/npm), NPM-single a "released" checkpoint named
    by config ``models``, corpus ``enwiki`` with every index, corpus ``news`` without FAISS indexes."""
    root = tmp_path_factory.mktemp("workdir")
    lines = lee_corpus_lines()[:16]
    lines[3] = "Thessaloniki is the second largest city in Greece, with the café Ω on its waterfront."
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        models = {"npm": save_tiny_bert("results/models/npm", seed=0),
                  "npm_single": save_tiny_bert("released/npm-single", seed=1)}
        _corpus("enwiki", lines[:12], models)
        _corpus("news", lines[12:], models, faiss=False)
    (root / "config").mkdir()
    config = {"models": {"npm": None, "npm_single": "released/npm-single"}, "inference": INFERENCE}
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return root


def explicit(root, model, corpus="enwiki", **kw):
    """The Predictor built by hand from absolute paths (what ``from_config`` must equal)."""
    checkpoint = root / ("results/models/npm" if model == "npm" else "released/npm-single")
    return Predictor(str(checkpoint), str(root / f"data/datastore/{model}/{corpus}"), model,
                     bm25=str(root / f"data/bm25/{corpus}"), faiss=str(root / f"data/index/{model}/{corpus}.faiss"),
                     root=root, **kw)


def assert_same(batch, single):
    """Phrases, occurrences and evidence equal; scores equal up to the last float bits (a padded batch and a single
    query go through differently shaped matrix products)."""
    assert [[(r["text"], r["occurrences"], r["evidence"]) for r in rs] for rs in batch] == \
        [[(r["text"], r["occurrences"], r["evidence"]) for r in rs] for rs in single]
    for got, want in zip(batch, single, strict=True):
        np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], rtol=1e-5)


@pytest.fixture(scope="module")
def configured(workdir):
    """from_config of both models, called from outside the working directory."""
    assert os.getcwd() != str(workdir)
    return {model: Predictor.from_config(model, "enwiki", root=workdir) for model in ("npm", "npm_single")}


@pytest.mark.parametrize("model", ["npm", "npm_single"])
def test_from_config_finds_the_workflow_paths_and_answers_like_explicit_paths(workdir, configured, model):
    p = configured[model]
    assert p.model == model
    assert p._bm25_path == str(workdir / "data/bm25/enwiki")
    assert p._faiss_path == str(workdir / f"data/index/{model}/enwiki.faiss")
    # The config's inference section reaches the Predictor; the rest are Settings' defaults.
    assert p.settings == Settings.from_mapping(INFERENCE)
    assert p.settings == Settings(open_set_tau=INFERENCE["open_set_tau"], k=INFERENCE["k"],
                                  restricted_blocks=INFERENCE["restricted_blocks"])
    hand = explicit(workdir, model, settings=Settings(**INFERENCE))
    for mode in ("restricted", "faiss"):
        got = p.predict(QUERIES[0], top=5, mode=mode)
        assert got and got == hand.predict(QUERIES[0], top=5, mode=mode)
    assert "Thessaloniki" in p.block_text(int(p.retrieve_blocks(QUERIES[0])[0]))  # blocks read relative to root


def test_from_config_defaults_to_the_current_directory_and_takes_overrides(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    p = npm.Predictor.from_config(open_set_tau=0.1, l_max=4)  # model npm, corpus enwiki, config/config.yaml, root "."
    assert (p.model, p.settings.open_set_tau, p.settings.k, p.l_max) == ("npm", 0.1, INFERENCE["k"], 4)
    settings = Settings(**{**INFERENCE, "open_set_tau": 0.1})
    assert p.settings == settings
    assert p.predict(QUERIES[0], top=3) == Predictor("results/models/npm", "data/datastore/npm/enwiki", "npm", settings,
                                                     bm25="data/bm25/enwiki", l_max=4).predict(QUERIES[0], top=3)
    # a whole settings object is an override too; Settings fields given beside it change it
    assert Predictor.from_config(settings=Settings(), k=8).settings == Settings(k=8)


def test_predictor_defaults_are_the_settings_defaults(workdir):
    assert explicit(workdir, "npm").settings == Settings()
    with pytest.raises(ValueError, match="open_set_tau"):
        Predictor.from_config(root=workdir, open_set_tau=0.0)
    with pytest.raises(ValueError, match=r"model must be one of \['npm', 'npm_single'\], not 'mlm'"):
        explicit(workdir, "mlm")


@pytest.mark.parametrize("model", ["npm", "npm_single"])
@pytest.mark.parametrize("mode", ["restricted", "faiss"])
def test_predict_batch_equals_predict_query_by_query(configured, model, mode):
    p = configured[model]
    batch = p.predict_batch(QUERIES, top=5, mode=mode)
    assert len(batch) == len(QUERIES) and all(batch)
    singles = [p.predict(text, top=5, mode=mode) for text in QUERIES]
    assert_same(batch, singles)
    for text, one in zip(QUERIES, singles, strict=True):
        assert p.predict_batch([text], top=5, mode=mode)[0] == one  # exactly predict


def test_predict_batch_scores_precomputed_vectors_and_checks_its_arguments(configured):
    p = configured["npm"]
    q = p.encode(QUERIES)
    assert q.shape == (len(QUERIES), 2, p.ds.hidden_size)
    assert p.predict_vectors(QUERIES[1], q[1], mode="faiss") == p.predict_batch(QUERIES, mode="faiss")[1]
    assert_same(p.predict_batch(QUERIES, mode="faiss", batch_size=3), p.predict_batch(QUERIES, mode="faiss"))
    assert p.predict_batch([]) == []
    assert_same(p.predict_batch(QUERIES[:2], is_question=[False, True]),
                [p.predict(QUERIES[0], is_question=False), p.predict(QUERIES[1], is_question=True)])
    with pytest.raises(TypeError, match="list of queries"):
        p.predict_batch(QUERIES[0])
    with pytest.raises(ValueError, match="mode"):
        p.predict_batch(QUERIES, mode="dense")
    with pytest.raises(ValueError, match="2 values for 4 queries"):
        p.predict_batch(QUERIES, is_question=[True, False])
    with pytest.raises(ValueError, match="no mask"):
        p.predict_batch([QUERIES[0], "No mask here."])


def test_a_missing_datastore_names_the_snakemake_target(workdir, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"data/datastore/npm/cc_news/meta.json does not exist.*"
                                                r"snakemake data/datastore/npm/cc_news/meta.json"):
        Predictor.from_config("npm", "cc_news", root=workdir)
    monkeypatch.chdir(workdir)  # from the working directory: the bare command, no `cd`
    with pytest.raises(FileNotFoundError, match=r"`snakemake data/datastore/npm_single/cc_news/meta.json`"):
        Predictor.from_config("npm_single", "cc_news")


def test_a_missing_index_is_an_error_naming_its_target_when_a_mode_needs_it(workdir):
    p = Predictor.from_config("npm", "news", root=workdir)
    assert p._faiss_path is None and p.predict(QUERIES[1], top=2)  # restricted mode needs BM25 only
    with pytest.raises(ValueError, match=r"data/index/npm/news.faiss does not exist.*snakemake data/index/npm/news"):
        p.predict(QUERIES[1], mode="faiss")


def test_a_missing_model_or_config_is_a_clear_error(workdir, tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump({"models": {"npm": None}}), encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=r"results/models/npm does not exist.*snakemake results/models/npm"):
        Predictor.from_config("npm", "enwiki", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="config file .*paper.yaml does not exist"):
        Predictor.from_config("npm", "enwiki", config="config/paper.yaml", root=tmp_path)
    bad = {"models": {"npm": "no/such/folder/here"}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="models.npm: 'no/such/folder/here' is neither an existing folder"):
        Predictor.from_config("npm", "enwiki", config=tmp_path / "bad.yaml", root=workdir)
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({"inference": {"open_set_temperature": 1}}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"typo.yaml: inference: unknown key\(s\) \['open_set_temperature'\]"):
        Predictor.from_config("npm", "enwiki", config=tmp_path / "typo.yaml", root=workdir)
    with pytest.raises(ValueError, match="'mlm' has no datastore"):
        Predictor.from_config("mlm", "enwiki", root=workdir)


def test_settings_reach_label_scores(configured):
    p = configured["npm_single"]
    words = [np.array(p.tokenizer.convert_tokens_to_ids(w)) for w in (["the"], ["a", "an"])]
    default = p.label_scores("It was <mask>.", words)
    np.testing.assert_array_equal(default, p.label_scores("It was <mask>.", words, tau=Settings().closed_set_tau))
    hot = dataclasses.replace(p.settings, closed_set_tau=50.0)
    p.settings, saved = hot, p.settings
    try:
        np.testing.assert_array_equal(p.label_scores("It was <mask>.", words),
                                      p.label_scores("It was <mask>.", words, tau=50.0))
    finally:
        p.settings = saved
