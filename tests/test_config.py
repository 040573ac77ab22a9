"""Config validation: both shipped configs are valid; a bad value names the key and the allowed values."""

from pathlib import Path

import jsonschema
import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from npm.datastore.faiss_index import _check_factory
from npm.settings import DataSettings, DatastoreSettings, DensePhrasesSettings, MaskingSettings, Settings
from npm.tasks.registry import config_task_lists, task_names

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = str(ROOT / "workflow" / "schemas" / "config.schema.yaml")


def load(name):
    return yaml.safe_load((ROOT / "config" / name).read_text())


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml"])
def test_shipped_configs_are_valid(name):
    config = load(name)
    validate(config, SCHEMA)
    config_task_lists(config)  # the task lists come from config/tasks.yaml, not the schema
    assert config["evaluation"]["closed_set_tasks"] == task_names(family="closed"), "defaults are filled in"
    assert config["ablation"]["tasks"] == task_names(table="table8")


def test_paper_config_has_paper_constants():
    config = load("paper.yaml")
    assert config["model"]["encoder"] == "roberta-large"
    assert config["data"] == {"max_seq_length": 256, "word_boundaries": "code", "batch_size": 16,
                              "shuffle_buffer": 1_000_000}
    m = config["masking"]
    assert (m["ratio"], m["p"], m["max_span_length"]) == (0.15, 0.5, 10)


# Where the paper and the original code differ, the paper routes compute as the code did: its published cells came
# from it (docs/paper-map.md, "The paper routes compute as the original code").
ORIGINAL_CODE = {
    "inference": {"tau_twice": True, "span_score": "code", "span_walk": "code", "passages": 3,
                  "passage_text": "contents", "kamel_prompt": "code", "mlm_max_length": 256,
                  "translation_cut": "decoders", "lama_average": "macro"},
    "datastore": {"precision": "fp32", "faiss_factory": "IVF4096,PQ64", "faiss_metric": "l2", "nprobe": 8,
                  "stopwords": "original", "bm25_markers": True, "faiss_train_draw": "code"},
    "masking": {"max_spans_per_sequence": 64},
    "data": {"word_boundaries": "code"},
}


SECTIONS = {"inference": Settings, "datastore": DatastoreSettings, "masking": MaskingSettings, "data": DataSettings}


@pytest.mark.parametrize("name", ["released.yaml", "paper.yaml"])
def test_paper_routes_select_the_original_codes_variants(name):
    config = load(name)
    for section, values in ORIGINAL_CODE.items():
        settings = SECTIONS[section].from_mapping(config.get(section)).as_dict()
        assert {k: settings[k] for k in values} == values, section


def test_the_paper_route_s_densephrases_computes_as_the_code():
    """Before: paper.yaml kept the paper's L (20 words), query-side fine-tuning (10 epochs, phrase MML alone) and
    lambda (2, 4) where DensePhrases' published numbers came from the code's (10; 5 epochs with start- and end-only
    MML; 4, 2 for SQuAD, the route's reading-comprehension data), and scored phrases from the fp16 dump where the
    code reads them back from its index; its query-side candidates were the top-k phrases where the code's are the
    top-k starts and ends, each with its best partner; its evaluations searched eq. 10 where the code answers with the
    best of those groups, and chose the best epoch at k 100 where the code evaluates at top_k 10."""
    config = load("paper.yaml")
    dp = DensePhrasesSettings.from_mapping(config["densephrases"])
    assert Settings.from_mapping(config["inference"]).phrase_max_words == 10
    assert (dp.query_ft.objective, dp.search_form, dp.query_ft.epochs, dp.query_ft.dev_k) == ("code", "code", 5, 10)
    assert (dp.train.lambda_distill, dp.train.lambda_neg) == (4.0, 2.0)
    assert (dp.vectors, dp.refine_factor) == ("index", 1)  # scored from the index's codes, as the code


# (config, section, its factory keys, its training-sample key, the vectors' dimension)
ROUTE_INDEXES = [("paper.yaml", "densephrases", ("index", "compare_indexes"), "index_train_sample", 768),
                 ("paper.yaml", "datastore", ("faiss_factory",), "faiss_train_sample", 1024),
                 ("released.yaml", "datastore", ("faiss_factory",), "faiss_train_sample", 1024)]


@pytest.mark.parametrize("name, section, keys, sample_key, dim", ROUTE_INDEXES)
def test_the_paper_routes_indexes_train_every_list_they_name(name, section, keys, sample_key, dim):
    """Before: paper.yaml's DensePhrases index IVF1048576,SQ4 trained on the default 1,000,000 vectors, too few for
    39 per list, so the build silently cut it to IVF25641 (nprobe 256 then searched 1 % of the lists, not 0.024 %)."""
    cls = {"densephrases": DensePhrasesSettings, "datastore": DatastoreSettings}[section]
    settings = cls.from_mapping(load(name).get(section)).as_dict()
    factories = [f for key in keys for f in ([settings[key]] if isinstance(settings[key], str) else settings[key])]
    assert factories
    for factory in factories:
        assert _check_factory(factory, dim, settings[sample_key])[0] == factory, factory


def test_the_embedded_default_keeps_the_paper_form_where_it_documents_it():
    s = Settings.from_mapping(load("config.yaml")["inference"])
    assert (s.tau_twice, s.span_score, s.passage_text, s.kamel_prompt, s.translation_cut) == (
        False, "paper", "units", "question", "all")


def error_of(config):
    with pytest.raises(WorkflowError) as info:
        validate(config, SCHEMA)
    return str(info.value)


def test_bad_enum_names_key_and_allowed_values():
    config = load("config.yaml")
    config["sources"]["enwiki"]["format"] = "wikitext"
    message = error_of(config)
    assert "['sources']['enwiki']['format']" in message and "'wikitext' is not one of" in message
    assert "mediawiki" in message and "kilt" in message and "cc_news" in message


def test_span_cap_accepts_only_paper_or_code_value():
    config = load("config.yaml")
    config["masking"]["max_spans_per_sequence"] = 100
    message = error_of(config)
    assert "max_spans_per_sequence" in message and "64" in message and "128" in message


def test_unknown_key_is_rejected():
    config = load("config.yaml")
    config["masking"]["mask_ratio"] = 0.2
    assert "mask_ratio" in error_of(config)


def test_source_needs_path_or_embedded():
    config = load("config.yaml")
    del config["sources"]["cc_news"]["embedded"]
    assert "cc_news" in error_of(config)


def test_schema_is_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(yaml.safe_load(Path(SCHEMA).read_text()))
