"""Task registry and loaders (docs/task-formats.md; paper-map §4.2, §5.1, §5.2): a tiny file of every task in
its contract format, read through the registry, with the exact inputs, labels and answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from npm.tasks.metrics import sample_by_group, sample_indices
from npm.tasks.registry import (
    DEFAULT_REGISTRY,
    RegistryError,
    fuzzy_verbalizer_info,
    fuzzy_verbalizer_path,
    load_registry,
    task_examples,
)
from npm.tasks.templates import translation_input

ALL_TASKS = ["agn", "yahoo", "subj", "sst2", "mr", "rt", "cr", "amazon", "rte", "lama_trex", "lama_google_re",
             "kamel", "nq", "triviaqa", "templama_changed", "templama_unchanged", "entity_translation"]
M = "<mask>"


def write(folder: Path, files: dict[str, str | list | dict]) -> Path:
    """Write ``{relative name: text | JSON-lines list | JSON object}`` under ``folder``."""
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        elif name.endswith(".jsonl"):
            path.write_text("".join(json.dumps(r) + "\n" for r in content), encoding="utf-8")
        else:
            path.write_text(json.dumps(content), encoding="utf-8")
    return folder


def load_all(name: str, folder: Path, **kw) -> list[dict]:
    """Every example in file order (no sampling)."""
    return task_examples(name, folder, n_samples=0, **kw)


def project(examples: list[dict], *keys: str) -> list[tuple]:
    return [tuple(ex[k] for k in keys) for ex in examples]


# ------------------------------------------------------------------------------------------------ the registry

def test_registry_entries():
    reg = load_registry()
    assert list(reg) == ALL_TASKS
    closed = {n for n, t in reg.items() if t.family == "closed"}
    assert closed == {"agn", "yahoo", "subj", "sst2", "mr", "rt", "cr", "amazon", "rte"}
    for name, task in reg.items():
        assert task.metric == ("accuracy" if name in closed else "em")
        assert task.source
        if name in closed:
            assert task.label_words[0].startswith(" ") and task.pmi_premise and task.l_max is None
    assert {n: t.fuzzy for n, t in reg.items() if n in closed} == {
        "agn": "agn.txt", "yahoo": "yahoo.json", "subj": None, "rte": None,
        "sst2": "sst2.txt", "mr": "sst2.txt", "rt": "sst2.txt", "cr": "sst2.txt", "amazon": "sst2.txt"}
    assert {n for n, t in reg.items() if t.average == "macro"} == {"lama_trex", "lama_google_re", "entity_translation"}
    assert {n: (t.per_group, t.group_by) for n, t in reg.items() if t.group_by} == {
        "lama_trex": (1000, "bucket"), "lama_google_re": (1000, "bucket"), "entity_translation": (1000, "lang")}
    assert all(t.n_samples == 3000 for t in reg.values() if not t.group_by)
    assert {n for n, t in reg.items() if t.is_question} == {"kamel", "nq", "triviaqa"}
    assert {n: t.l_max for n, t in reg.items() if n not in closed} == {
        n: (20 if n == "entity_translation" else 10) for n in ALL_TASKS if n not in closed}
    corpora = {n: t.reference_corpus for n, t in reg.items()}
    assert corpora["agn"] == corpora["yahoo"] == corpora["rte"] == ("enwiki", "cc_news")
    assert corpora["subj"] == ("subj",)
    assert all(corpora[n] == ("imdb", "amazon") for n in ("sst2", "mr", "rt", "cr", "amazon"))
    assert all(corpora[n] == ("enwiki",) for n in ("lama_trex", "lama_google_re", "kamel", "nq", "triviaqa"))
    assert reg["templama_changed"].reference_corpus == ("enwiki_2022",)
    assert reg["templama_changed"].outdated_corpus == ("enwiki",)
    assert {n: t.hf_dataset["name"] for n, t in reg.items() if t.hf_dataset} == {
        "yahoo": "community-datasets/yahoo_answers_topics", "rt": "cornell-movie-review-data/rotten_tomatoes",
        "amazon": "fancyzhx/amazon_polarity", "rte": "nyu-mll/glue", "triviaqa": "mandarjoshi/trivia_qa"}
    urls = sorted({u for t in reg.values() for u in t.urls})
    assert urls == sorted([
        "https://github.com/tonyzhaozh/few-shot-learning/raw/main/data/agnews/train.csv",
        "https://nlp.cs.princeton.edu/projects/lm-bff/datasets.tar",
        "https://raw.githubusercontent.com/prrao87/fine-grained-sentiment/master/data/sst/sst_test.txt",
        "https://nlp.cs.princeton.edu/projects/optiprompt/data.tar.gz",
        "https://dl.fbaipublicfiles.com/LAMA/data.zip",
        "https://github.com/JanKalo/KAMEL/blob/master/data/kamel.zip?raw=true",
        "https://raw.githubusercontent.com/JanKalo/KAMEL/master/question-templates.csv",
        "https://nlp.cs.washington.edu/ambigqa/data/nqopen-test.json",
        "https://nlp.cs.washington.edu/ambigqa/data/test_id2answers.json",
        "https://dl.fbaipublicfiles.com/NPM/templama.tar.gz",
        "https://dl.fbaipublicfiles.com/NPM/entity_translation.tar.gz"])
    info = fuzzy_verbalizer_info()
    assert info["files"] == ["agn.txt", "sst2.txt", "yahoo.json"]
    assert "1aRlqMnNyJbgkMm6vgpfEGonukuX_eZEk" in info["source"]
    assert fuzzy_verbalizer_path(reg["mr"], "data/tasks") == Path("data/tasks/fuzzy_verbalizers/sst2.txt")
    assert fuzzy_verbalizer_path(reg["rte"]) is None


@pytest.mark.parametrize("task,key,value,pattern", [
    ("agn", "metric", "em", "task 'agn', key 'metric'"),
    ("nq", "loader", "load_nope", "task 'nq', key 'loader'"),
    ("sst2", "verbalizer", {"words": ["bad", " good"], "fuzzy": "sst2.txt", "premise": "It was"},
     "task 'sst2', key 'verbalizer.words'"),
    ("mr", "verbalizer", {"words": [" terrible", " great"], "fuzzy": "mr.txt", "premise": "It was"},
     "task 'mr', key 'verbalizer.fuzzy'"),
    ("sst2", "verbalizer", {"words": [" terrible", " great"], "fuzzy": "sst2.txt"}, "task 'sst2', key 'verbalizer'"),
    ("kamel", "is_question", "yes", "task 'kamel', key 'is_question'"),
    ("agn", "report", {"table": "table8", "paper_key": "agn"}, "task 'agn', key 'report'"),
    ("nq", "label", "", "task 'nq', key 'label'"),
    ("triviaqa", "average", "macro", "task 'triviaqa', key 'average'"),
    ("lama_trex", "sampling", {"per_group": 0, "group_by": "bucket"}, "task 'lama_trex', key 'sampling.per_group'"),
    ("entity_translation", "l_max", None, "task 'entity_translation', key 'l_max'"),
    ("rte", "template", "glue", "task 'rte', key 'template'"),
    ("nq", "url", "ftp://x", "task 'nq', key 'url'"),
    ("yahoo", "l_max", "__delete__", "task 'yahoo', key 'l_max': missing"),
    ("cr", "colour", "red", "task 'cr', key 'colour'"),
])
def test_registry_validation(tmp_path, task, key, value, pattern):
    raw = yaml.safe_load(DEFAULT_REGISTRY.read_text(encoding="utf-8"))
    if value == "__delete__":
        del raw["tasks"][task][key]
    else:
        raw["tasks"][task][key] = value
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(RegistryError, match=re.escape(pattern)):
        load_registry(path)


# ------------------------------------------------------------------------------------------------ closed set

AGN_CSV = ('Class Index,Title,Description\n'
           '3,Wall St. Bears Claw Back,"Reuters - Short-sellers, Wall Street\'s dwindling band."\n'
           '4,New Chip,"Intel unveils\na chip."\n'
           '2,Cup Final,"Team wins ""big"" final."\n'
           '1,Vote,Parliament votes.\n')


def test_agn(tmp_path):
    ex = load_all("agn", write(tmp_path, {"test.csv": AGN_CSV}))
    assert project(ex, "id", "input", "label") == [
        ("0", f"Wall St. Bears Claw Back \n Reuters - Short-sellers, Wall Street's dwindling band. "
              f"The text topic is about{M}.", 2),
        ("1", f"New Chip \n Intel unveils\na chip. The text topic is about{M}.", 3),
        ("2", f'Cup Final \n Team wins "big" final. The text topic is about{M}.', 1),
        ("3", f"Vote \n Parliament votes. The text topic is about{M}.", 0)]


def test_yahoo(tmp_path):
    rows = [{"id": 7, "topic": 1, "question_title": "Why is the sky blue?", "question_content": "Just curious.",
             "best_answer": "Rayleigh scattering."},
            {"id": 9, "topic": 9, "question_title": "Who votes?", "question_content": "",
             "best_answer": "Citizens."}]
    ex = load_all("yahoo", write(tmp_path, {"test.jsonl": rows}))
    assert project(ex, "id", "input", "label") == [
        ("7", "title: Why is the sky blue? content: Just curious. answer: Rayleigh scattering. "
              f"The text topic is about{M}.", 1),
        ("9", f"title: Who votes? content:  answer: Citizens. The text topic is about{M}.", 9)]


def test_rte(tmp_path):
    tsv = ("index\tsentence1\tsentence2\tlabel\n"
           "0\tDana Reeve died of lung cancer.\tChristopher Reeve had an accident!\tnot_entailment\n"
           "1\tYet, antibiotics are losing their effectiveness...\tBacteria is winning the war.\tentailment\n")
    ex = load_all("rte", write(tmp_path, {"dev.tsv": tsv}))
    assert project(ex, "id", "input", "label") == [
        ("0", f"Dana Reeve died of lung cancer, right?{M}, christopher Reeve had an accident.", 1),
        ("1", f"Yet, antibiotics are losing their effectiveness, right?{M}, bacteria is winning the war.", 0)]
    assert load_registry()["rte"].label_words[0] == " Yes"


def test_subj(tmp_path):
    csv_text = '0,"the movie is n\'t bad , really ."\n1,a man ( played by smith ) returns home .\n'
    ex = load_all("subj", write(tmp_path, {"test.csv": csv_text}))
    assert project(ex, "id", "input", "label") == [
        ("0", f"the movie isn't bad, really. This is a{M}.", 0),
        ("1", f"a man (played by smith) returns home. This is a{M}.", 1)]


def test_sst2_drops_neutral(tmp_path):
    tsv = ("__label__1\tit 's a dull film .\n__label__3\tneutral one .\n__label__5\twonderful !\n"
           "__label__4\tgood , not great .\n__label__2\tmeh .\n")
    ex = load_all("sst2", write(tmp_path, {"test.tsv": tsv}))
    assert project(ex, "id", "input", "label") == [
        ("0", f"it's a dull film. It was{M}.", 0), ("2", f"wonderful! It was{M}.", 1),
        ("3", f"good, not great. It was{M}.", 1), ("4", f"meh. It was{M}.", 0)]


@pytest.mark.parametrize("task", ["mr", "cr"])
def test_mr_cr(tmp_path, task):
    csv_text = '1,"a gorgeous , witty film ."\n0,an ugly mess .\n'
    ex = load_all(task, write(tmp_path, {"test.csv": csv_text}))
    assert project(ex, "id", "input", "label") == [
        ("0", f"a gorgeous, witty film. It was{M}.", 1), ("1", f"an ugly mess. It was{M}.", 0)]


def test_rt(tmp_path):
    rows = [{"text": "a gripping tale .", "label": 1}, {"text": "too long .", "label": 0}]
    ex = load_all("rt", write(tmp_path, {"test.jsonl": rows}))
    assert project(ex, "id", "input", "label") == [
        ("0", f"a gripping tale. It was{M}.", 1), ("1", f"too long. It was{M}.", 0)]


def test_amazon(tmp_path):
    csv_text = ('2,Great CD,"My lovely Pat has one of the GREAT voices."\n'
                '1,Buyer beware!,"This is a self-published book, not a novel."\n')
    ex = load_all("amazon", write(tmp_path, {"test.csv": csv_text}))
    assert project(ex, "id", "input", "label") == [
        ("0", f"Great CD. My lovely Pat has one of the GREAT voices. It was{M}.", 1),
        ("1", f"Buyer beware! This is a self-published book, not a novel. It was{M}.", 0)]


# ------------------------------------------------------------------------------------------------ open set

TREX = {
    "relations.jsonl": [{"relation": "P19", "template": "[X] was born in [Y] ."},
                        {"relation": "P276", "template": "[X] is located in [Y] ."}],
    "TREx/P19.jsonl": [
        {"uuid": "a1", "sub_label": "Allan Peiper", "obj_label": "Paris", "predicate_id": "P19",
         "evidences": [{"obj_surface": "Paris", "masked_sentence": "Born in [MASK]."},
                       {"obj_surface": "Paris, France", "masked_sentence": "[MASK] is home."}]},
        {"uuid": "a2", "sub_label": "Ann Lee", "obj_label": "Los Angeles", "predicate_id": "P19",
         "evidences": [{"obj_surface": "Los Angeles, California", "masked_sentence": "x [MASK]"}]},
        {"uuid": "a3", "sub_label": "Bo Li", "obj_label": "New York City", "predicate_id": "P19", "evidences": []}],
    "TREx/P276.jsonl": [
        {"uuid": "b1", "sub_label": "Arrowhead", "obj_label": "Kansas City Chiefs Stadium", "predicate_id": "P276",
         "evidences": [{"masked_sentence": "no surface here [MASK]"}]},
        {"uuid": "b2", "sub_label": "St. Peter's", "obj_label": "Vatican City State of the Church",
         "predicate_id": "P276", "evidences": [{"obj_surface": "Rome", "masked_sentence": "[MASK]"}]}],
    "uhn.txt": "a1\nb1\n",
    "hard.txt": "a2\n",
}
TREX_EXPECTED = [  # id, relation, input, answers, bucket, is_uhn, is_hard (file order: P19 then P276)
    ("a1", "P19", f"Allan Peiper was born in {M}.", ["Paris", "Paris, France"], 1, True, False),
    ("a2", "P19", f"Ann Lee was born in {M}.", ["Los Angeles", "Los Angeles, California"], 2, False, True),
    ("a3", "P19", f"Bo Li was born in {M}.", ["New York City"], 3, False, False),
    ("b1", "P276", f"Arrowhead is located in {M}.", ["Kansas City Chiefs Stadium"], 4, True, False),
    ("b2", "P276", f"St. Peter's is located in {M}.", ["Vatican City State of the Church", "Rome"], 1, False, False),
]
KEYS = ("id", "relation", "input", "answers", "bucket", "is_uhn", "is_hard")


def test_lama_trex(tmp_path, wordpiece_tokenizer):
    folder = write(tmp_path, TREX)
    ex = load_all("lama_trex", folder, tokenizer=wordpiece_tokenizer)
    assert project(ex, *KEYS) == [tuple(r) for r in TREX_EXPECTED]
    assert all(e["group"] == e["bucket"] for e in ex)
    # the registry's sampling: up to 1000 per bucket (all kept here), seed 0, then one more shuffle
    sampled = task_examples("lama_trex", folder, tokenizer=wordpiece_tokenizer)
    assert [e["id"] for e in sampled] == [ex[i]["id"] for i in sample_by_group([e["bucket"] for e in ex], 1000)]
    assert sorted(e["id"] for e in sampled) == ["a1", "a2", "a3", "b1", "b2"]
    # per_group cap: one example per bucket
    one = task_examples("lama_trex", folder, tokenizer=wordpiece_tokenizer, per_group=1)
    assert sorted(e["bucket"] for e in one) == [1, 2, 3, 4]
    assert [e["id"] for e in one] == [ex[i]["id"] for i in sample_by_group([e["bucket"] for e in ex], 1)]
    # n_samples gives n_samples // 3 per bucket, as the original Task
    assert len(task_examples("lama_trex", folder, tokenizer=wordpiece_tokenizer, n_samples=3)) == 4
    with pytest.raises(ValueError, match="tokenizer"):
        task_examples("lama_trex", folder)


def test_lama_google_re(tmp_path, wordpiece_tokenizer):
    files = {
        "relations.jsonl": [{"relation": "place_of_birth", "template": "[X] was born in [Y] ."},
                            {"relation": "date_of_birth", "template": "[X] (born [Y])."}],
        "Google_RE/place_of_birth.jsonl": [
            {"uuid": "g1", "sub_label": "Joshua Mathiot", "obj_label": "Paris", "predicate_id": "place_of_birth",
             "evidences": [{"obj_surface": "Paris", "masked_sentence": "..."}]}],
        # no predicate_id: the relation is the file's stem
        "Google_RE/date_of_birth.jsonl": [
            {"uuid": "g2", "sub_label": "Ann Lee", "obj_label": "1736", "evidences": []}],
        "uhn.txt": "g2\n",
    }
    ex = load_all("lama_google_re", write(tmp_path, files), tokenizer=wordpiece_tokenizer)
    assert project(ex, *KEYS) == [
        ("g2", "date_of_birth", f"Ann Lee (born {M}).", ["1736"], 1, True, None),
        ("g1", "place_of_birth", f"Joshua Mathiot was born in {M}.", ["Paris"], 1, False, None)]


def google_re_line(uuid: str, masked_sentences: list[str] | None) -> dict:
    """A line of LAMA's Google_RE/place_of_birth_test.jsonl (no predicate_id: the relation is the file's stem)."""
    rec = {"pred": "/people/person/place_of_birth", "sub": "/m/0", "obj": "/m/1", "sub_label": f"Person {uuid}",
           "obj_label": "Paris", "uuid": uuid, "evidences": [{"url": "http://en.wikipedia.org/wiki/X"}]}
    if masked_sentences is not None:
        rec["masked_sentences"] = masked_sentences
    return rec


GOOGLE_RE_MASKS = {
    "relations.jsonl": [{"relation": "place_of_birth", "template": "[X] was born in [Y] ."}],
    "Google_RE/place_of_birth.jsonl": [
        google_re_line("one", ["He was born in [MASK] ."]),
        google_re_line("zero", ["He was born in Paris ."]),
        google_re_line("two", ["Born in [MASK] , he died in [MASK] ."]),
        google_re_line("split", ["He was born in [MASK] .", "He returned to [MASK] in 1990 ."]),  # two once joined
        google_re_line("joined", ["He was a painter .", "He was born in [MASK] ."]),
        google_re_line("none", None)],  # no masked_sentences: nothing to check, as the original
    "uhn.txt": "one\nsplit\n",  # a dropped record in uhn.txt is no error (the original filters its UHN files alike)
}


def test_google_re_drops_records_without_exactly_one_joined_mask(tmp_path, wordpiece_tokenizer, caplog):
    """The original's loader keeps a LAMA record only when its `masked_sentences`, joined with spaces, hold exactly
    one [MASK] (paper silent; paper-map §5.1): the registry's `require_one_mask` switch, on for Google-RE."""
    import dataclasses
    import logging

    folder = write(tmp_path, GOOGLE_RE_MASKS)
    task = load_registry()["lama_google_re"]
    assert task.require_one_mask is True
    with caplog.at_level(logging.INFO, logger="npm-repro.tasks"):
        kept = load_all("lama_google_re", folder, tokenizer=wordpiece_tokenizer)
    assert [(e["id"], e["input"], e["is_uhn"]) for e in kept] == [
        ("one", f"Person one was born in {M}.", True), ("joined", f"Person joined was born in {M}.", False),
        ("none", f"Person none was born in {M}.", False)]
    assert re.search(r"place_of_birth\.jsonl: dropped 3 of 6 records whose masked_sentences do not hold exactly one "
                     r"\[MASK\]", caplog.text)
    everything = dataclasses.replace(task, require_one_mask=False)
    kept_all = load_all("lama_google_re", folder, tokenizer=wordpiece_tokenizer,
                        registry={"lama_google_re": everything})
    assert [e["id"] for e in kept_all] == ["one", "zero", "two", "split", "joined", "none"]


@pytest.mark.parametrize("task,value,pattern", [
    ("lama_google_re", "yes", "key 'require_one_mask': must be true or false"),
    ("nq", True, "key 'require_one_mask': only the LAMA loader load_lama reads it"),
])
def test_registry_require_one_mask_is_a_lama_switch(tmp_path, task, value, pattern):
    raw = yaml.safe_load(DEFAULT_REGISTRY.read_text(encoding="utf-8"))
    raw["tasks"][task]["require_one_mask"] = value
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(RegistryError, match=re.escape(pattern)):
        load_registry(tmp_path / "tasks.yaml")


def test_lama_subset_ids_must_exist(tmp_path, wordpiece_tokenizer):
    write(tmp_path, {**TREX, "hard.txt": "a2\nzz9\n"})
    with pytest.raises(ValueError, match=r"hard\.txt: 1 uuid\(s\) not in the data.*zz9"):
        load_all("lama_trex", tmp_path, tokenizer=wordpiece_tokenizer)


def test_kamel(tmp_path):
    files = {
        "question-templates.csv": 'P19,Where was [S] born?\nP1412,"Which language does [S] speak, write or sign?"\n',
        "P19/dev.jsonl": [{"sub_label": "Allan Peiper", "obj_label": ["Alexandra"]}],
        "P1412/dev.jsonl": [{"sub_label": "Jean", "obj_label": ["C++"]},
                            {"sub_label": "Anna", "obj_label": ["French", "French language", "French"]}],
    }
    ex = load_all("kamel", write(tmp_path, files))
    assert project(ex, "id", "input", "answers") == [
        ("P1412-0", f"Which language does Jean speak, write or sign? Answer: {M}", ["C++"]),
        ("P1412-1", f"Which language does Anna speak, write or sign? Answer: {M}.", ["French", "French language"]),
        ("P19-0", f"Where was Allan Peiper born? Answer: {M}.", ["Alexandra"])]


def test_nq(tmp_path):
    files = {"nqopen-test.json": [{"id": "q1", "question": "who wrote hamlet"},
                                  {"id": "q2", "question": '"what is the capital of france"'},
                                  {"id": "q3", "question": " when was it? "}],
             "test_id2answers.json": {"q1": ["William Shakespeare", "Shakespeare"], "q2": ["Paris"],
                                      "q3": ["1999"], "unused": ["x"]}}
    ex = load_all("nq", write(tmp_path, files))
    assert project(ex, "id", "input", "answers") == [
        ("q1", f"who wrote hamlet? The answer is: {M}.", ["William Shakespeare", "Shakespeare"]),
        ("q2", f"what is the capital of france? The answer is: {M}.", ["Paris"]),
        ("q3", f"when was it? The answer is: {M}.", ["1999"])]


def test_triviaqa(tmp_path):
    rows = [{"question_id": "tc_1", "question": "Which city is the capital of France",
             "answer": {"value": "Paris", "aliases": ["Paris", "City of Light"],
                        "normalized_aliases": ["paris", "city of light"]}},
            {"question_id": "tc_2", "question": "Who wrote Hamlet?",
             "answer": {"value": "Shakespeare", "aliases": [], "normalized_aliases": ["shakespeare"]}}]
    ex = load_all("triviaqa", write(tmp_path, {"validation.jsonl": rows}))
    assert project(ex, "id", "input", "answers") == [
        ("tc_1", f"Which city is the capital of France? The answer is: {M}.",
         ["Paris", "City of Light", "paris", "city of light"]),
        ("tc_2", f"Who wrote Hamlet? The answer is: {M}.", ["Shakespeare", "shakespeare"])]


@pytest.mark.parametrize("task", ["templama_changed", "templama_unchanged"])
def test_templama(tmp_path, task):
    rows = [{"id": "t1", "input": f"Contributor Covenant is developed by {M}.", "answers": ["Coraline Ada Ehmke"]},
            {"id": 2, "input": f"{M} is the head of the government of Japan.", "answers": ["Fumio Kishida", "Kishida"]}]
    ex = load_all(task, write(tmp_path, {"test.jsonl": rows}))
    assert project(ex, "id", "input", "answers") == [
        ("t1", f"Contributor Covenant is developed by {M}.", ["Coraline Ada Ehmke"]),
        ("2", f"{M} is the head of the government of Japan.", ["Fumio Kishida", "Kishida"])]


def test_entity_translation(tmp_path):
    rows = [{"id": "e1", "input": translation_input("ko", "Banpo Bridge"), "answers": ["반포대교"], "lang": "ko"},
            {"id": "e2", "input": translation_input("zh", "Great Wall"), "answers": ["长城", "萬里長城"], "lang": "zh"},
            {"id": "e3", "input": translation_input("ko", "Seoul"), "answers": ["서울"], "lang": "ko"},
            {"id": "e4", "input": translation_input("ko", "Busan"), "answers": ["부산"], "lang": "ko"}]
    folder = write(tmp_path, {"test.jsonl": rows})
    ex = load_all("entity_translation", folder)
    assert project(ex, "id", "input", "answers", "lang", "group") == [
        ("e1", f"The Korean translation of Banpo Bridge is: {M}.", ["반포대교"], "ko", "ko"),
        ("e2", f"The Chinese translation of Great Wall is: {M}.", ["长城", "萬里長城"], "zh", "zh"),
        ("e3", f"The Korean translation of Seoul is: {M}.", ["서울"], "ko", "ko"),
        ("e4", f"The Korean translation of Busan is: {M}.", ["부산"], "ko", "ko")]
    one = task_examples("entity_translation", folder, per_group=1)
    assert sorted(e["lang"] for e in one) == ["ko", "zh"]
    assert [e["id"] for e in one] == [ex[i]["id"] for i in sample_by_group([e["lang"] for e in ex], 1)]
    assert len(task_examples("entity_translation", folder)) == 4


# ------------------------------------------------------------------------------------------------ sampling

def test_sampling_is_seed0_and_capped(tmp_path):
    folder = write(tmp_path, {"test.csv": AGN_CSV})
    everything = load_all("agn", folder)
    default = task_examples("agn", folder)  # registry n_samples 3000: all 4, reordered by the seed-0 permutation
    assert [e["id"] for e in default] == [everything[i]["id"] for i in sample_indices(4, 3000)]
    two = task_examples("agn", folder, n_samples=2)
    assert [e["id"] for e in two] == [everything[i]["id"] for i in sample_indices(4, 2)]
    assert len(two) == 2 and task_examples("agn", folder, n_samples=2) == two
    assert sorted(e["id"] for e in default) == ["0", "1", "2", "3"]


# ------------------------------------------------------------------------------------------------ errors

@pytest.mark.parametrize("task", ALL_TASKS)
def test_missing_file_says_where_to_get_it(tmp_path, task):
    t = load_registry()[task]
    with pytest.raises(FileNotFoundError) as err:
        task_examples(task, tmp_path / "absent")
    msg = str(err.value)
    assert str(tmp_path / "absent" / t.files[0]) in msg
    assert (t.urls[0] in msg) if t.urls else (t.hf_dataset["name"] in msg)
    assert f"task {task}" in msg and "docs/task-formats.md" in msg


MALFORMED = [
    ("yahoo", {"test.jsonl": '{"id": 1, "topic": 0, "question_title": "a", "question_content": "b", '
                             '"best_answer": "c"}\n{not json\n'}, "test.jsonl:2:"),
    ("yahoo", {"test.jsonl": '{"id": 1, "topic": 10, "question_title": "a", "question_content": "b", '
                             '"best_answer": "c"}\n'}, "test.jsonl:1: topic 10"),
    ("agn", {"test.csv": AGN_CSV + "9,Bad,Row\n"}, "test.csv:7: Class Index 9"),  # the quoted newline counts
    ("agn", {"test.csv": "Label,Title,Description\n1,a,b\n"}, "test.csv:1: header"),
    ("rte", {"dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\ta.\tb.\tentailment\n1\ta.\tb.\tmaybe\n"},
     "dev.tsv:3: label 'maybe'"),
    ("subj", {"test.csv": "0,fine\n2,bad label\n"}, "test.csv:2: label 2"),
    ("mr", {"test.csv": "1,good\n0,too,many\n"}, "test.csv:2: expected 2 fields"),
    ("sst2", {"test.tsv": "__label__1\tx .\n\n__label__7\ty .\n"}, "test.tsv:3:"),
    ("rt", {"test.jsonl": '{"text": "a ."}\n'}, "test.jsonl:1: missing field 'label'"),
    ("amazon", {"test.csv": '3,t,"c"\n'}, "test.csv:1: label 3"),
    ("lama_trex", {**TREX, "TREx/P19.jsonl": '{"uuid": "z", "sub_label": "A", "obj_label": "B", '
                                           '"predicate_id": "P999"}\n'}, "P19.jsonl:1: relation 'P999'"),
    ("lama_trex", {**TREX, "relations.jsonl": [{"relation": "P19", "template": "[X] born."}]},
     "relations.jsonl:1: template of P19"),
    ("kamel", {"question-templates.csv": "P19,Where was [S] born?\n",
               "P19/dev.jsonl": '{"sub_label": "A", "obj_label": ["x"]}\n{"sub_label": "B", "obj_label": "y"}\n'},
     "dev.jsonl:2: field 'obj_label' must be list"),
    ("nq", {"nqopen-test.json": [{"id": "q1", "question": "a"}, {"id": "q2", "question": "b"}],
            "test_id2answers.json": {"q1": ["x"]}}, "test_id2answers.json:q2: no answers for id 'q2'"),
    ("nq", {"nqopen-test.json": '[{"id": "q1",\n "question": }]', "test_id2answers.json": {}},
     "nqopen-test.json:2: not valid JSON"),
    ("triviaqa", {"validation.jsonl": '{"question_id": "t", "question": "q", "answer": {"value": "v"}}\n'},
     "validation.jsonl:1: missing field 'aliases'"),
    ("templama_changed", {"test.jsonl": [{"id": "1", "input": f"a {M}.", "answers": ["x"]},
                                         {"id": "2", "input": "no mask.", "answers": ["x"]}]},
     "test.jsonl:2: input must contain exactly one <mask>"),
    ("entity_translation", {"test.jsonl": [{"id": "1", "input": f"a {M}.", "answers": ["x"], "lang": "ko"},
                                           {"id": "2", "input": f"b {M}.", "answers": ["y"]}]},
     "test.jsonl:2: missing field 'lang'"),
]


@pytest.mark.parametrize("task,files,where", MALFORMED, ids=[f"{m[0]}-{i}" for i, m in enumerate(MALFORMED)])
def test_malformed_row_names_file_and_line(tmp_path, wordpiece_tokenizer, task, files, where):
    write(tmp_path, files)
    with pytest.raises(ValueError, match=re.escape(where)):
        load_all(task, tmp_path, tokenizer=wordpiece_tokenizer)


CUT_SHORT = [  # a download or copy cut inside the last record: (task, files, "file:line: " of the cut record)
    ("agn", {"test.csv": AGN_CSV + '2,Cut,"The download stopped in the mid'}, "test.csv:7: "),
    ("agn", {"test.csv": AGN_CSV + '2,Cut,"A quoted newline\nthen the cut'}, "test.csv:7: "),
    ("amazon", {"test.csv": '2,Great CD,"My lovely Pat."\n1,Buyer beware!,"This is a self-pub'}, "test.csv:2: "),
    ("subj", {"test.csv": '0,fine\n1,"cut inside the quotes'}, "test.csv:2: "),
    ("yahoo", {"test.jsonl": '{"id": 1, "topic": 0, "question_title": "a", "question_content": "b", '
                             '"best_answer": "c"}\n{"id": 2, "topic": 0, "question_title": "cut he'}, "test.jsonl:2: "),
]


@pytest.mark.parametrize("task,files,where", CUT_SHORT, ids=[f"{m[0]}-{i}" for i, m in enumerate(CUT_SHORT)])
def test_a_file_cut_inside_its_last_record_is_refused(tmp_path, task, files, where):
    """Fault: a task CSV cut inside a quoted field evaluated the rows before the cut and the cut row's text up to the
    cut (the csv module closes an open quote at the end of the file). Expected: one line naming the file, the line
    where the cut record starts, and that the file is cut short."""
    write(tmp_path, files)
    with pytest.raises(ValueError, match=re.escape(where) + ".*cut short") as err:
        load_all(task, tmp_path)
    assert len(str(err.value).splitlines()) == 1
