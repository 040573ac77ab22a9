"""`npm-repro download-task` (npm.tasks.fetch): archives and files in the published layouts, served over loopback
HTTP, are downloaded once, extracted, validated with the task loaders and checksum-checked; HF datasets go through
`datasets`, from local parquet files; the workflow plans the downloads before the evaluations at paper scale only."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import urllib.parse
import zipfile
from pathlib import Path

import pytest
import yaml

from npm.cli import main
from npm.embedded.tasks import GOOGLE_RE_TEMPLATES
from npm.tasks.fetch import COMPLETE, SOURCE, UHN_TEMPLATE, cache_path, fetch_task
from npm.tasks.registry import DEFAULT_REGISTRY, RegistryError, download_checksums, load_task_records, parse_task
from tests.conftest import WORDPIECE
from tests.workflow_api import ROOT

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

# ------------------------------------------------------------------------------------------------ helpers


def local_registry(tmp_path: Path, base: str, checksums: dict | None = None, **changes) -> Path:
    """config/tasks.yaml with every url served by the local server (https://HOST/PATH -> BASE/HOST/PATH), and
    ``changes`` {task: {key: value}} applied."""
    raw = yaml.safe_load(DEFAULT_REGISTRY.read_text(encoding="utf-8"))
    for entry in raw["tasks"].values():
        if entry["url"]:
            entry["url"] = [local_url(base, u) for u in ([entry["url"]] if isinstance(entry["url"], str)
                                                          else entry["url"])]
    if raw["fuzzy_verbalizers"]["url"]:
        raw["fuzzy_verbalizers"]["url"] = local_url(base, raw["fuzzy_verbalizers"]["url"])
    for task, keys in changes.items():
        raw["tasks"][task].update(keys)
    raw["checksums"] = checksums or {}
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def local_url(base: str, url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{base}/{parts.netloc}{parts.path}" + (f"?{parts.query}" if parts.query else "")


def publish(root: Path, url: str, data: bytes) -> None:
    """Put ``data`` where the local server answers ``url`` (a url of ``local_url``)."""
    path = root / urllib.parse.urlsplit(url).path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def tar_bytes(members: dict[str, bytes], mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


LM_BFF = "https://nlp.cs.princeton.edu/projects/lm-bff/datasets.tar"
# LM-BFF's original/{task}/test.csv: no header, label,text (tokenized text, as released)
CSV = {"subj": b'0,"smart and alert , thirteen conversations about one thing is a small gem ."\n'
               b'1,"the movie follows a young woman who moves to new york to become a writer ."\n',
       "mr": b'1,"the rock is destined to be the 21st century\'s new conan ."\n0,"it\'s a bad sign ."\n',
       "cr": b'1,"weaknesses are minor : the feel and layout of the remote control are only so-so ."\n'
             b'0,"the battery life is poor ."\n1,"great phone ."\n'}


def lm_bff_tar(csv: dict[str, bytes] = CSV) -> bytes:
    members = {f"original/{t}/test.csv": data for t, data in csv.items()}
    members["original/SST-2/train.tsv"] = b"sentence\tlabel\nhide new secretions\t0\n"
    return tar_bytes(members)


# ------------------------------------------------------------------------------------------------ downloads


def test_lm_bff_tarball_is_downloaded_once_for_subj_mr_and_cr(server, tmp_path):
    root, base = server
    tar = lm_bff_tar()
    publish(root, local_url(base, LM_BFF), tar)
    registry = local_registry(tmp_path, base)
    cache = tmp_path / "cache"
    out = tmp_path / "tasks"
    assert main(["download-task", "--task", "subj", "--out", str(out / "subj"), "--cache", str(cache),
                 "--registry", str(registry)]) == 0
    assert (out / "subj" / "test.csv").read_bytes() == CSV["subj"]
    source = json.loads((out / "subj" / SOURCE).read_text())
    (dl,) = source["downloads"]
    assert dl == {"url": local_url(base, LM_BFF), "file": str(cache_path(local_url(base, LM_BFF), cache)),
                  "bytes": len(tar), "sha256": hashlib.sha256(tar).hexdigest()}
    assert source["examples"] == 2 and source["files"] == ["test.csv"]
    assert (out / "subj" / COMPLETE).is_file()
    assert [r["label"] for r in load_task_records(parse_task("subj", _raw("subj")), out / "subj")] == [0, 1]

    (root / urllib.parse.urlsplit(local_url(base, LM_BFF)).path.lstrip("/")).unlink()  # the server loses it
    for task in ("mr", "cr"):  # ... and the two other tasks read the cached archive
        summary = fetch_task(task, out / task, cache=cache, registry=registry)
        assert (out / task / "test.csv").read_bytes() == CSV[task]
        assert summary["examples"] == CSV[task].count(b"\n")
        assert summary["downloads"][0]["sha256"] == dl["sha256"]
    assert sorted(p.name for p in out.iterdir()) == ["cr", "mr", "subj"]  # no temporary folder left behind


def _raw(task: str) -> dict:
    return yaml.safe_load(DEFAULT_REGISTRY.read_text(encoding="utf-8"))["tasks"][task]


OPTIPROMPT = "https://nlp.cs.princeton.edu/projects/optiprompt/data.tar.gz"
LAMA_ZIP = "https://dl.fbaipublicfiles.com/LAMA/data.zip"


def trex(uuid: str, sub: str, obj: str, rel: str) -> dict:
    """A LAMA T-REx line (OptiPrompt's LAMA-TREx files keep LAMA's fields)."""
    return {"uuid": uuid, "obj_uri": "Q1", "obj_label": obj, "sub_uri": "Q2", "sub_label": sub, "predicate_id": rel,
            "evidences": [{"sub_surface": sub, "obj_surface": obj, "masked_sentence": f"{sub} is in [MASK] ."}]}


def test_lama_trex_comes_from_the_optiprompt_tarball_and_lama_relations(server, tmp_path):
    root, base = server
    p17 = [trex("a1", "Nantes", "France", "P17"), trex("a2", "Kyoto", "Japan", "P17")]
    p19 = [trex("b1", "Ada Lovelace", "London", "P19")]
    publish(root, local_url(base, OPTIPROMPT), tar_bytes({
        "data/LAMA-TREx/P17.jsonl": jsonl(p17), "data/LAMA-TREx/P19.jsonl": jsonl(p19),
        "data/LAMA-TREx_UHN/P17.jsonl": jsonl(p17[1:]), "data/LAMA-TREx_UHN/P19.jsonl": jsonl(p19),
        "data/LAMA-TREx-easy-hard/Hard/P17.jsonl": jsonl(p17[:1]),
        "data/LAMA-TREx-easy-hard/Easy/P17.jsonl": jsonl(p17[1:]),
        "data/autoprompt_data/P17/test.jsonl": jsonl(p17)}, mode="w:gz"))
    relations = [{"relation": "P17", "template": "[X] is located in [Y] .", "label": "country", "type": "N-1"},
                 {"relation": "P19", "template": "[X] was born in [Y] .", "label": "place of birth", "type": "N-1"}]
    publish(root, local_url(base, LAMA_ZIP), zip_bytes({"data/relations.jsonl": jsonl(relations),
                                                        "data/TREx/P17.jsonl": jsonl(p17)}))
    out = tmp_path / "lama_trex"
    summary = fetch_task("lama_trex", out, cache=tmp_path / "cache", registry=local_registry(tmp_path, base))
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == sorted(
        [COMPLETE, SOURCE, "TREx", "TREx/P17.jsonl", "TREx/P19.jsonl", "uhn.txt", "hard.txt", "relations.jsonl"])
    assert (out / "uhn.txt").read_text().split() == ["a2", "b1"]
    assert (out / "hard.txt").read_text().split() == ["a1"]
    assert [d["url"] for d in summary["downloads"]] == [local_url(base, OPTIPROMPT), local_url(base, LAMA_ZIP)]
    records = {r["id"]: r for r in load_task_records(parse_task("lama_trex", _raw("lama_trex")), out)}
    assert records["a1"]["input"] == "Nantes is located in <mask>."
    assert (records["a1"]["is_uhn"], records["a1"]["is_hard"]) == (False, True)
    assert (records["b1"]["is_uhn"], records["b1"]["is_hard"]) == (True, False)


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory):
    """A small randomly initialised BertForMaskedLM with the MiniLM WordPiece vocabulary (uncased), saved like a
    real checkpoint: the person-name filter's model in tests (the recipe names bert-base-cased)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from npm.model import load_tokenizer

    tok = load_tokenizer(WORDPIECE)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("tiny_mlm")
    BertForMaskedLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def fill_mask_top(model: str, text: str, k: int) -> list[str]:
    """The model's top-k fillers of ``text``'s [MASK] through transformers' fill-mask pipeline (which adds [CLS] and
    [SEP] itself), as vocabulary tokens."""
    from transformers import pipeline

    fill = pipeline("fill-mask", model=model, tokenizer=model, top_k=k)
    return [fill.tokenizer.convert_ids_to_tokens(r["token"]) for r in fill(text)]


def google_re(uuid: str, pred: str, sub: str, obj: str) -> dict:
    """A line of LAMA's Google_RE/*_test.jsonl (its fields: pred, sub/obj ids, evidences, masked_sentences ...)."""
    return {"pred": f"/people/{pred}", "sub": "/m/0", "obj": "/m/1", "sub_label": sub, "obj_label": obj,
            "sub_aliases": [], "obj_aliases": [], "uuid": uuid, "sub_w": None, "obj_w": None,
            "evidences": [{"url": "http://en.wikipedia.org/wiki/X", "snippet": f"{sub} ... {obj}",
                           "considered_sentences": [f"{sub} ... {obj} ."]}],
            "judgments": [{"rater": "1", "judgment": "yes"}], "masked_sentences": [f"{sub} ... [MASK] ."]}


def test_google_re_gets_lama_templates_and_the_uhn_filters(server, tmp_path, tiny_mlm):
    root, base = server
    guess = fill_mask_top(tiny_mlm, UHN_TEMPLATE.replace("[CLS] ", "").replace(" [SEP]", "")
                          .replace("[X]", "Mouradian").replace("[Y]", "city"), 3)[0]
    ada = {t for name in ("Ada", "Lovelace")
           for t in fill_mask_top(tiny_mlm, f"{name} is a common name in the following city : [MASK] .", 3)}
    assert "london" not in ada  # the precondition of the kept place_of_death fact
    facts = {"place_of_birth": [google_re("g1", "person/place_of_birth", "Khatchig Mouradian", guess),
                                google_re("g2", "person/place_of_birth", "Paris Hilton", "Paris")],
             "date_of_birth": [google_re("g3", "person/date_of_birth", "Ada Lovelace", "1815"),
                               dict(google_re("g5", "person/date_of_birth", "Ada Byron", "1816"),  # two masks joined
                                    masked_sentences=["Ada Byron ( [MASK] ) .", "She was born in [MASK] ."])],
             "place_of_death": [google_re("g4", "deceased_person/place_of_death", "Ada Lovelace", "London")]}
    publish(root, local_url(base, LAMA_ZIP), zip_bytes(
        {f"data/Google_RE/{rel}_test.jsonl": jsonl(lines) for rel, lines in facts.items()}
        | {"data/relations.jsonl": b"", "data/Squad/test.jsonl": b"{}\n"}))
    recipe = _raw("lama_google_re")["fetch"]
    recipe[2] = dict(recipe[2], model=tiny_mlm)
    registry = local_registry(tmp_path, base, lama_google_re={"fetch": recipe})
    out = tmp_path / "lama_google_re"
    summary = fetch_task("lama_google_re", out, cache=tmp_path / "cache", registry=registry)
    # g5 is dropped by the original's one-[MASK] filter (require_one_mask), and counted
    assert summary["examples"] == 4 and summary["dropped_not_one_mask"] == 1
    assert json.loads((out / SOURCE).read_text())["dropped_not_one_mask"] == 1
    assert sorted(p.name for p in (out / "Google_RE").iterdir()) == [
        "date_of_birth.jsonl", "place_of_birth.jsonl", "place_of_death.jsonl"]
    relations = [json.loads(line) for line in (out / "relations.jsonl").read_text().splitlines()]
    assert {r["relation"]: r["template"] for r in relations} == GOOGLE_RE_TEMPLATES
    # g1: the model guesses the object from the name (person-name filter); g2: the object is in the subject
    assert (out / "uhn.txt").read_text().split() == ["g3", "g5", "g4"]
    records = {r["id"]: r for r in load_task_records(parse_task("lama_google_re", _raw("lama_google_re")), out)}
    assert records["g4"]["input"] == "Ada Lovelace died in <mask>." and records["g4"]["relation"] == "place_of_death"
    assert {k: r["is_uhn"] for k, r in records.items()} == {"g1": False, "g2": False, "g3": True, "g4": True}


def test_kamel_takes_the_dev_files_of_the_zip_and_the_question_templates(server, tmp_path):
    root, base = server
    kamel, questions = _raw("kamel")["url"]
    dev = {"P19": [{"sub_label": "Ada Lovelace", "obj_label": ["London"]}],
           "P36": [{"sub_label": "France", "obj_label": ["Paris"]}, {"sub_label": "Japan", "obj_label": ["Tokyo"]}]}
    members = {f"{rel}/{split}.jsonl": jsonl(lines) for rel, lines in dev.items() for split in ("train", "dev", "test")}
    members["__MACOSX/P19/._dev.jsonl"] = b"\x00\x05\x16\x07"
    publish(root, local_url(base, kamel), zip_bytes(members))
    publish(root, local_url(base, questions),
            b"P19,Where was [S] born?\nP36,What is the capital of [S]?\nP20,Where did [S] die?\n")
    out = tmp_path / "kamel"
    fetch_task("kamel", out, cache=tmp_path / "cache", registry=local_registry(tmp_path, base))
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.jsonl")) == ["P19/dev.jsonl", "P36/dev.jsonl"]
    records = load_task_records(parse_task("kamel", _raw("kamel")), out)
    assert [r["input"] for r in records][:2] == ["Where was Ada Lovelace born? Answer: <mask>.",
                                                 "What is the capital of France? Answer: <mask>."]


def test_templama_members_of_one_tarball_get_ids_where_they_have_none(server, tmp_path):
    root, base = server
    url = _raw("templama_changed")["url"]
    changed = [{"input": "Contributor Covenant is developed by <mask>.", "answers": ["Coraline Ada Ehmke"]},
               {"input": "The CEO of Twitter is <mask>.", "answers": ["Elon Musk"]}]
    unchanged = [{"id": "u7", "input": "Paris is the capital of <mask>.", "answers": ["France"]}]
    publish(root, local_url(base, url), tar_bytes({"./templama/test.jsonl": jsonl(changed),
                                                   "./templama/dev.jsonl": jsonl(changed),
                                                   "./unchanged_templama/test.jsonl": jsonl(unchanged)}, "w:gz"))
    registry, cache = local_registry(tmp_path, base), tmp_path / "cache"
    fetch_task("templama_changed", tmp_path / "changed", cache=cache, registry=registry)
    fetch_task("templama_unchanged", tmp_path / "unchanged", cache=cache, registry=registry)
    lines = [json.loads(line) for line in (tmp_path / "changed" / "test.jsonl").read_text().splitlines()]
    assert lines == [dict(r, id=str(i)) for i, r in enumerate(changed)]
    assert json.loads((tmp_path / "unchanged" / "test.jsonl").read_text()) == unchanged[0]


# ------------------------------------------------------------------------------------------------ archive layouts
# The archives nobody here has opened (kamel.zip, the TempLAMA and entity-translation tarballs, LAMA's data.zip) may
# carry an extra top folder, and name the split test* or dev* (the original's load_data takes test*, else dev*).

TEMPLAMA = [{"input": "The CEO of Twitter is <mask>.", "answers": ["Elon Musk"]}]
TRANSLATION = [{"input": "The French translation of Germany is: <mask>.", "answers": ["Allemagne"], "lang": "fr"}]
KAMEL_DEV = [{"sub_label": "Ada Lovelace", "obj_label": ["London"]}]


def _templama(top: str, split: str) -> bytes:
    return tar_bytes({f"{top}templama/{split}.jsonl": jsonl(TEMPLAMA),
                      f"{top}unchanged_templama/{split}.jsonl": jsonl(TEMPLAMA)}, "w:gz")


@pytest.mark.parametrize("top", ["", "NPM/"])
@pytest.mark.parametrize("task,url_of,archive,expected", [
    ("templama_changed", "templama_changed", lambda top: _templama(top, "test"), "test.jsonl"),
    ("templama_changed", "templama_changed", lambda top: _templama(top, "dev"), "test.jsonl"),
    ("entity_translation", "entity_translation",
     lambda top: tar_bytes({f"{top}entity_translation/dev.jsonl": jsonl(TRANSLATION)}, "w:gz"), "test.jsonl"),
    ("entity_translation", "entity_translation",
     lambda top: tar_bytes({f"{top}entity_translation/test_v2.jsonl": jsonl(TRANSLATION)}, "w:gz"), "test.jsonl"),
    ("kamel", "kamel", lambda top: zip_bytes({f"{top}P19/{split}.jsonl": jsonl(KAMEL_DEV)
                                              for split in ("train", "dev", "test")}), "P19/dev.jsonl"),
])
def test_archives_with_an_extra_top_folder_and_test_or_dev_members(server, tmp_path, top, task, url_of, archive,
                                                                  expected):
    root, base = server
    urls = _raw(url_of)["url"]
    publish(root, local_url(base, urls if isinstance(urls, str) else urls[0]), archive(top))
    if task == "kamel":
        publish(root, local_url(base, urls[1]), b"P19,Where was [S] born?\n")
    out = tmp_path / task
    summary = fetch_task(task, out, cache=tmp_path / "cache", registry=local_registry(tmp_path, base))
    assert summary["examples"] == 1
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.jsonl")) == [expected]


def test_lama_archives_below_an_extra_top_folder(server, tmp_path):
    root, base = server
    p17 = [trex("a1", "Nantes", "France", "P17"), trex("a2", "Kyoto", "Japan", "P17")]
    publish(root, local_url(base, OPTIPROMPT), tar_bytes({
        "optiprompt/data/LAMA-TREx/P17.jsonl": jsonl(p17), "optiprompt/data/LAMA-TREx_UHN/P17.jsonl": jsonl(p17[1:]),
        "optiprompt/data/LAMA-TREx-easy-hard/Hard/P17.jsonl": jsonl(p17[:1])}, mode="w:gz"))
    relations = [{"relation": "P17", "template": "[X] is located in [Y] ."}]
    publish(root, local_url(base, LAMA_ZIP), zip_bytes({"LAMA/data/relations.jsonl": jsonl(relations),
                                                        "__MACOSX/LAMA/data/._relations.jsonl": b"\x00\x05"}))
    out = tmp_path / "lama_trex"
    fetch_task("lama_trex", out, cache=tmp_path / "cache", registry=local_registry(tmp_path, base))
    assert (out / "TREx" / "P17.jsonl").read_bytes() == jsonl(p17)
    assert ((out / "uhn.txt").read_text(), (out / "hard.txt").read_text()) == ("a2\n", "a1\n")
    assert (out / "relations.jsonl").read_bytes() == jsonl(relations)


def test_an_archive_without_the_split_lists_what_it_holds(server, tmp_path):
    root, base = server
    publish(root, local_url(base, _raw("templama_changed")["url"]), tar_bytes(
        {"templama/train.jsonl": jsonl(TEMPLAMA), "unchanged_templama/train.jsonl": jsonl(TEMPLAMA)}, "w:gz"))
    with pytest.raises(ValueError, match=r"task templama_changed: no member of templama\.tar\.gz .* matches "
                                         r"'templama/test\*\.jsonl' \(nor 'templama/dev\*\.jsonl', nor either below "
                                         r"one top folder\); it holds 2 files: \['templama/train\.jsonl', "
                                         r"'unchanged_templama/train\.jsonl'\]"):
        fetch_task("templama_changed", tmp_path / "t", cache=tmp_path / "cache",
                   registry=local_registry(tmp_path, base))
    assert not (tmp_path / "t").exists()


# ------------------------------------------------------------------------------------------------ fuzzy verbalizers

FUZZY_URL = yaml.safe_load(DEFAULT_REGISTRY.read_text(encoding="utf-8"))["fuzzy_verbalizers"]["url"]
FUZZY = {  # Shi et al. (2022)'s formats: one ", "-joined line per label; topic name -> words
    "agn.txt": b"politics, government, election\nsports, football, game\nbusiness, market, money\n"
               b"technology, computer, software\n",
    "sst2.txt": b"terrible, bad, awful\ngreat, good, nice\n",
    "yahoo.json": json.dumps({"Society & Culture": ["society", "culture"], "Science & Mathematics": ["science"],
                              "Health": ["health"], "Education & Reference": ["education"],
                              "Computers & Internet": ["computer"], "Sports": ["sports"],
                              "Business & Finance": ["business"], "Entertainment & Music": ["music"],
                              "Family & Relationships": ["family"], "Politics & Government": ["politics"]}).encode(),
}


@pytest.mark.parametrize("top", ["fuzzy_verbalizers/", ""])
def test_fuzzy_verbalizers_zip_is_unpacked_with_or_without_its_top_folder(server, tmp_path, top,
                                                                           wordpiece_tokenizer):
    from npm.tasks.registry import label_verbalizers

    root, base = server
    url = local_url(base, FUZZY_URL)
    members = {f"{top}{name}": data for name, data in FUZZY.items()}
    publish(root, url, zip_bytes(members | {f"__MACOSX/{top}._agn.txt": b"\x00\x05\x16\x07"}))
    registry, cache, out = local_registry(tmp_path, base), tmp_path / "cache", tmp_path / "tasks" / "fuzzy_verbalizers"
    assert main(["download-task", "--task", "fuzzy_verbalizers", "--out", str(out), "--cache", str(cache),
                 "--registry", str(registry)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*FUZZY, SOURCE, COMPLETE])
    assert all((out / name).read_bytes() == data for name, data in FUZZY.items())
    (dl,) = json.loads((out / SOURCE).read_text())["downloads"]
    assert dl["url"] == url and dl["sha256"] == hashlib.sha256((root / urllib.parse.urlsplit(url).path.lstrip("/"))
                                                               .read_bytes()).hexdigest()
    agn = label_verbalizers("agn", wordpiece_tokenizer, tmp_path / "tasks")
    assert [len(v) for v in agn] == [3, 3, 3, 3]
    # the first download's sha256 guards every later one, as for a task folder
    publish(root, url, zip_bytes({f"{top}{name}": data + b"\n" for name, data in FUZZY.items()}))
    cache_path(url, cache).unlink()
    with pytest.raises(ValueError, match=rf"checksum mismatch.*expected {dl['sha256']}.*{SOURCE} \(the first"):
        fetch_task("fuzzy_verbalizers", out, cache=cache, registry=registry)
    assert (out / "agn.txt").read_bytes() == FUZZY["agn.txt"]


@pytest.mark.parametrize("members,message", [
    ({f"fuzzy_verbalizers/{n}": FUZZY[n] for n in ("agn.txt", "sst2.txt")},
     r"no member of the fuzzy verbalizers' zip .* is yahoo\.json \(at the top or below one top folder\); it holds 2 "
     r"files: \['fuzzy_verbalizers/agn\.txt', 'fuzzy_verbalizers/sst2\.txt'\]"),
    (dict(FUZZY, **{"sst2.txt": b"terrible, bad\n"}),
     r"fuzzy verbalizer sst2\.txt .* 1 labels?, task sst2 \(and mr, rt, cr, amazon\) has 2"),
    (dict(FUZZY, **{"yahoo.json": b'{"Health": ["health"]}'}),
     r"fuzzy verbalizer yahoo\.json: .*no words for \['Society & Culture'"),
])
def test_a_fuzzy_verbalizer_zip_that_lacks_a_file_is_refused(server, tmp_path, members, message):
    root, base = server
    publish(root, local_url(base, FUZZY_URL), zip_bytes(members))
    out = tmp_path / "fuzzy_verbalizers"
    with pytest.raises(ValueError, match=message):
        fetch_task("fuzzy_verbalizers", out, cache=tmp_path / "cache", registry=local_registry(tmp_path, base))
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ HF datasets

HF_SPLITS = {  # task -> (split, columns of the HF dataset, the written file, its expected text)
    "rte": ("validation", {"sentence1": ["A cat sat.", "Rain fell."], "sentence2": ["A cat sat down.", "It snowed."],
                           "label": [0, 1], "idx": [0, 1]},
            "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tA cat sat.\tA cat sat down.\tentailment\n"
                       "1\tRain fell.\tIt snowed.\tnot_entailment\n"),
    "amazon": ("test", {"label": [1, 0], "title": ["Great", 'Bad, "really"'], "content": ["Loved it.", "Broke."]},
               "test.csv", '"2","Great","Loved it."\n"1","Bad, ""really""","Broke."\n'),
    "rt": ("test", {"text": ["a gorgeous film .", "dull ."], "label": [1, 0]},
           "test.jsonl", '{"text": "a gorgeous film .", "label": 1}\n{"text": "dull .", "label": 0}\n'),
}


@pytest.mark.parametrize("task", sorted(HF_SPLITS))
def test_hf_split_is_exported_in_the_task_format(tmp_path, task):
    import pyarrow as pa
    import pyarrow.parquet as pq

    split, columns, name, text = HF_SPLITS[task]
    local = tmp_path / "hub" / task
    (local / "data").mkdir(parents=True)
    parquet = local / "data" / f"{split}-00000-of-00001.parquet"  # a hub repository's layout
    pq.write_table(pa.table(columns), parquet)
    registry = local_registry(tmp_path, "http://unused", **{task: {"hf_dataset": {
        "name": str(local), "config": None, "split": split}}})
    out = tmp_path / "tasks" / task
    summary = fetch_task(task, out, cache=tmp_path / "cache", registry=registry)
    assert (out / name).read_text(encoding="utf-8") == text
    (dl,) = summary["downloads"]
    assert dl["rows"] == 2 and dl["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert [r["label"] for r in load_task_records(parse_task(task, _raw(task)), out)] == \
        ([0, 1] if task == "rte" else [1, 0])
    # a second export of the same split is checked against the first: a changed split is refused
    pq.write_table(pa.table(dict(columns, label=columns["label"][::-1])), parquet)
    with pytest.raises(ValueError, match=f"{SOURCE}.*first download"):
        fetch_task(task, out, cache=tmp_path / "cache2", registry=registry)
    assert (out / name).read_text(encoding="utf-8") == text


def test_unreachable_hf_dataset_is_one_line_saying_what_to_do(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    out = subprocess.run([str(Path(sys.executable).parent / "npm-repro"), "download-task", "--task", "rt", "--out",
                          str(tmp_path / "rt"), "--cache", str(tmp_path / "cache")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("npm-repro download-task: error: task rt: cannot load the HF dataset "
                           "cornell-movie-review-data/rotten_tomatoes, split test")
    assert "hf_dataset.name" in line and "rt/test.jsonl" in line
    assert not (tmp_path / "rt").exists()


# ------------------------------------------------------------------------------------------------ refusals


def test_registry_checksum_mismatch_is_refused_and_the_old_folder_kept(server, tmp_path):
    root, base = server
    publish(root, local_url(base, LM_BFF), lm_bff_tar())
    registry = local_registry(tmp_path, base, checksums={local_url(base, LM_BFF): "0" * 64})
    out = tmp_path / "subj"
    out.mkdir()
    (out / "test.csv").write_text("0,kept\n")
    with pytest.raises(ValueError, match=r"checksum mismatch.*recorded in .*tasks\.yaml \(checksums\)"):
        fetch_task("subj", out, cache=tmp_path / "cache", registry=registry)
    assert [p.name for p in out.iterdir()] == ["test.csv"] and (out / "test.csv").read_text() == "0,kept\n"
    assert not cache_path(local_url(base, LM_BFF), tmp_path / "cache").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "subj", "tasks.yaml", "www"]


def test_the_first_download_sha256_guards_every_later_one(server, tmp_path):
    root, base = server
    url = local_url(base, LM_BFF)
    publish(root, url, lm_bff_tar())
    registry, cache, out = local_registry(tmp_path, base), tmp_path / "cache", tmp_path / "subj"
    first = fetch_task("subj", out, cache=cache, registry=registry)["downloads"][0]["sha256"]
    # the publisher's file changes: a new download is refused against SOURCE.json, the folder stays
    publish(root, url, lm_bff_tar(dict(CSV, subj=b'1,"another text ."\n')))
    cache_path(url, cache).unlink()
    with pytest.raises(ValueError, match=rf"checksum mismatch.*expected {first}.*{SOURCE} \(the first download\)"):
        fetch_task("subj", out, cache=cache, registry=registry)
    assert (out / "test.csv").read_bytes() == CSV["subj"]
    # a cached file changed on disk is refused the same way
    cache_path(url, cache).write_bytes(lm_bff_tar(dict(CSV, subj=b'1,"another text ."\n')))
    with pytest.raises(ValueError, match=rf"the download .* has sha256 .*records {first}"):
        fetch_task("subj", out, cache=cache, registry=registry)
    assert (out / "test.csv").read_bytes() == CSV["subj"]


def test_a_download_that_does_not_load_leaves_no_folder(server, tmp_path):
    root, base = server
    publish(root, local_url(base, LM_BFF), lm_bff_tar(dict(CSV, subj=b'0,"a",extra\n')))
    out = tmp_path / "subj"
    with pytest.raises(ValueError, match=r"task subj: the downloaded files do not load with load_label_text_csv "
                                         r"\(.*test\.csv:1: expected 2 fields"):
        fetch_task("subj", out, cache=tmp_path / "cache", registry=local_registry(tmp_path, base))
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cache", "tasks.yaml", "www"]


def test_a_member_missing_from_the_archive_names_what_it_holds(server, tmp_path):
    root, base = server
    publish(root, local_url(base, LM_BFF), tar_bytes({"original/subj/train.csv": CSV["subj"]}))
    with pytest.raises(ValueError, match=r"no member of datasets\.tar .* matches 'original/subj/test\.csv'.*"
                                         r"original/subj/train\.csv"):
        fetch_task("subj", tmp_path / "subj", cache=tmp_path / "cache", registry=local_registry(tmp_path, base))


def test_offline_download_says_where_to_place_the_file(tmp_path):
    registry = local_registry(tmp_path, "http://127.0.0.1:9")
    url = local_url("http://127.0.0.1:9", _raw("sst2")["url"])
    with pytest.raises(ValueError, match=rf"task sst2: cannot reach {re.escape(url)} .*place it at "
                                         rf"{re.escape(str(cache_path(url, tmp_path / 'cache')))}"):
        fetch_task("sst2", tmp_path / "sst2", cache=tmp_path / "cache", registry=registry)
    assert not (tmp_path / "sst2").exists()


def test_unknown_task_lists_the_registry(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'nope'.*fuzzy_verbalizers"):
        fetch_task("nope", tmp_path / "nope")


@pytest.mark.parametrize("task,fetch,message", [
    ("subj", [{"file": "test.csv", "from": "other.tar", "member": "x"}], "key 'fetch[0].from'"),
    ("nq", [{"file": "nqopen-test.json"}, {"file": "test_id2answers.json"}], "key 'fetch[0].from'"),
    ("sst2", [{"file": "other.tsv"}], "key 'fetch': no step writes ['test.tsv']"),
    ("rt", [{"file": "test.jsonl", "hf": "xml", "columns": ["text"]}], "key 'fetch[0].hf'"),
    ("agn", [{"file": "test.csv", "hf": "csv", "columns": ["a"]}], "hf_dataset, which it does not have"),
    ("rte", [{"file": "dev.tsv", "hf": "tsv", "columns": ["label"], "values": {"idx": {0: 1}}}],
     "key 'fetch[0].values'"),
    ("cr", [{"file": "../test.csv", "member": "x"}], "key 'fetch[0].file': must be a relative path"),
    ("lama_trex", [{"folder": "TREx", "from": "data.zip", "members": "x", "add_ids": True}], "unknown ['add_ids']"),
])
def test_registry_rejects_a_bad_fetch_recipe(task, fetch, message):
    with pytest.raises(RegistryError, match=rf"task '{task}', .*{re.escape(message)}"):
        parse_task(task, dict(_raw(task), fetch=fetch))


def test_registry_checksums_name_task_urls_and_sha256s(tmp_path):
    assert download_checksums() == {}
    raw = yaml.safe_load(DEFAULT_REGISTRY.read_text(encoding="utf-8"))
    for sums, pattern in (({LM_BFF: "abc"}, "64 lowercase hex"), ({"https://x/y.tar": "0" * 64}, "not the url")):
        (tmp_path / "t.yaml").write_text(yaml.safe_dump(dict(raw, checksums=sums)))
        with pytest.raises(RegistryError, match=pattern):
            download_checksums(tmp_path / "t.yaml")


# ------------------------------------------------------------------------------------------------ workflow


def dry_run(workdir: Path, configfile: Path, *targets: str) -> str:
    out = subprocess.run([SNAKEMAKE, *targets, "-n", "--cores", "1", "--directory", str(workdir), "-s",
                          str(ROOT / "Snakefile"), "--configfile", str(configfile)], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def jobs(stdout: str) -> list[dict]:
    """(rule, input, output) of every job a dry run lists."""
    found = []
    for block in stdout.split("\nrule ")[1:]:
        fields = dict(re.findall(r"^\s+(input|output): (.*)$", block, re.M))
        found.append({"rule": block.split(":")[0], "input": fields.get("input", ""),
                      "output": fields.get("output", "")})
    return found


def test_paper_scale_evaluations_wait_for_their_downloaded_sets(tmp_path):
    """config/paper.yaml: each evaluation reads its task's folder, made by rule download_task from the cached
    downloads (rule download_task_file, one per URL however many tasks read it); the HF-only sets have no file."""
    planned = jobs(dry_run(tmp_path, ROOT / "config" / "paper.yaml", "results/metrics/nq/npm.json",
                           "results/metrics/subj/npm.json", "results/metrics/mr/npm.json",
                           "results/metrics/rt/npm.json"))
    evaluate = {j["output"].split("/")[-2]: j for j in planned if j["rule"] == "evaluate"}
    for task in ("nq", "subj", "mr", "rt"):
        assert f"data/tasks/{task}/{COMPLETE}" in evaluate[task]["input"].split(", ")
    made = {j["output"]: j for j in planned if j["rule"] == "download_task"}
    assert sorted(made) == sorted(f"data/tasks/{t}/{COMPLETE}" for t in ("nq", "subj", "mr", "rt"))
    files = sorted(j["output"] for j in planned if j["rule"] == "download_task_file")
    assert files == sorted(str(cache_path(u)) for u in  # datasets.tar once for subj and mr; NPM on mr reads
                           [LM_BFF, *_raw("nq")["url"], FUZZY_URL])  # the fuzzy verbalizer sst2.txt
    assert made[f"data/tasks/subj/{COMPLETE}"]["input"] == str(cache_path(LM_BFF))
    assert made[f"data/tasks/rt/{COMPLETE}"]["input"] == ""


def test_grouped_evaluations_wait_for_every_task_they_answer(tmp_path):
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    config["evaluation"]["group_jobs"] = True
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(config))
    planned = jobs(dry_run(tmp_path / "w", tmp_path / "paper.yaml", "results/tables/table8.csv"))
    group = next(j for j in planned if j["rule"].startswith("evaluate_npm_") and "nq/npm.json" in j["output"])
    tasks = sorted(set(re.findall(r"results/metrics/(\w+)/npm(?:@\w+)?\.json", group["output"])))
    assert len(tasks) > 1
    assert sorted(re.findall(rf"data/tasks/(\w+)/{re.escape(COMPLETE)}", group["input"])) == tasks


def test_released_route_fetches_the_fuzzy_verbalizers_before_the_npm_closed_set_evaluations(tmp_path):
    """config/released.yaml: the verbalizer zip is a download like a task file, rule download_fuzzy_verbalizers makes
    data/tasks/fuzzy_verbalizers from it, and every evaluation that reads a fuzzy verbalizer (a closed-set task with
    one, a system with a datastore) waits for it; the others do not."""
    marker = f"data/tasks/fuzzy_verbalizers/{COMPLETE}"
    targets = [f"results/metrics/{t}/{s}.json" for t in ("agn", "sst2", "yahoo", "subj") for s in ("npm", "mlm")]
    planned = jobs(dry_run(tmp_path, ROOT / "config" / "released.yaml", *targets,
                           "results/metrics/mr/npm_single.json"))
    order = [j["output"] for j in planned]
    (verbalizers,) = [j for j in planned if j["rule"] == "download_fuzzy_verbalizers"]
    assert verbalizers["output"] == marker and verbalizers["input"] == str(cache_path(FUZZY_URL))
    assert str(cache_path(FUZZY_URL)) in [j["output"] for j in planned if j["rule"] == "download_task_file"]
    evaluate = {"/".join(j["output"].split("/")[-2:]): j for j in planned if j["rule"] == "evaluate"}
    reads = {name for name, j in evaluate.items() if marker in j["input"].split(", ")}
    assert reads == {"agn/npm.json", "sst2/npm.json", "yahoo/npm.json", "mr/npm_single.json"}
    assert all(order.index(marker) < order.index(evaluate[name]["output"]) for name in reads)


def test_embedded_default_plans_no_download(tmp_path):
    planned = jobs(dry_run(tmp_path, ROOT / "config" / "config.yaml", "results/metrics/nq/npm.json"))
    assert not [j for j in planned if j["rule"].startswith("download_task")]
    assert "data/tasks" in next(j for j in planned if "metrics/nq/npm.json" in j["output"])["input"].split(", ")
