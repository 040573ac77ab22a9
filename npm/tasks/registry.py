"""The task registry (config/tasks.yaml) and the examples of a task (paper-map §4.2, §5.1, §5.2).

* ``load_registry(path)`` -> ``{name: Task}``, every key checked (an error names the task and the key).
* ``task_examples(name, folder, tokenizer=None, n_samples=None)`` -> the evaluated examples of one task: read with
  its loader (local files only), templated, subsampled with seed 0 by the original ``Task``'s procedure, each a
  dict with ``id``, ``input`` and ``label`` (closed set) or ``answers`` (open set); LAMA adds ``bucket``
  (``metrics.ngram_bucket``, needs the tokenizer), ``relation``, ``is_uhn``, ``is_hard``; entity translation adds
  ``lang``. ``group`` holds the macro-average group (bucket or lang) where the task has one.

Sampling (paper-map §5.2): ``sampling.n_samples`` -> ``metrics.sample_indices`` (the first n of a seed-0
permutation; smaller sets are kept whole, reordered); ``sampling.per_group`` -> ``metrics.sample_by_group`` over
``group_by`` (LAMA bucket, translation language). ``n_samples=0`` keeps every example in file order.

The procedure is the original's; the sample is not always its sample. A seed-0 permutation draws positions in the
example list, so the sample depends on the list's order. The loaders read a task's files in sorted order; the
original's LAMA and KAMEL loaders read their relation files in the order of an unsorted ``os.listdir``, which depends
on its file system and is not recorded, so its LAMA / KAMEL samples cannot be recovered. How much another order moves
a cell: docs/paper-map.md, "The paper routes compute as the original code" (``benchmarks/original_code.py``).

Downloads (``npm.tasks.fetch``, docs/task-formats.md): a task's ``fetch`` steps say how its ``url`` files (or its
``hf_dataset``) become the contract files; ``download_checksums`` is the registry's ``checksums`` section (sha256 by
URL, where one is known). Both are validated here, with the rest of the registry.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from npm.io import read_yaml
from npm.settings import SHA256
from npm.tasks import loaders as loaders_module
from npm.tasks.metrics import SAMPLING_SEED, ngram_bucket, sample_by_group, sample_indices
from npm.tasks.templates import (
    CLOSED_SET_TEMPLATES,
    YAHOO_TOPICS,
    causal_text,
    closed_set_text,
    fuzzy_json_words,
    fuzzy_txt_words,
    read_fuzzy_verbalizer_json,
    read_fuzzy_verbalizer_txt,
)

log = logging.getLogger("npm-repro.tasks")

DEFAULT_REGISTRY = Path(__file__).resolve().parents[2] / "config" / "tasks.yaml"
DEFAULT_TASKS_ROOT = Path("data/tasks")
OPEN_TEMPLATES = ("lama", "kamel", "qa", "given", "translation")
FUZZY_FILES = ("agn.txt", "sst2.txt", "yahoo.json")
GROUP_BY = ("bucket", "lang")

REQUIRED = ("family", "loader", "files", "template", "verbalizer", "metric", "label", "report", "average", "sampling",
            "reference_corpus", "is_question", "l_max", "url", "source")
# The tables a task can be a column of (npm.report.tables), by family; table3 has fixed columns (no paper_key).
REPORT_TABLES = {"closed": ("table1",), "open": ("table8", "table2", "table3")}
OPTIONAL = ("hf_dataset", "outdated_corpus", "fetch", "require_one_mask")

# The kinds of a `fetch` step (npm.tasks.fetch runs them): kind -> (required keys, optional keys). A step's kind is the
# first of these keys it has (KIND_KEYS); a step with none of them copies a download (or one archive `member`).
FETCH_KINDS = {
    "copy": ({"file"}, {"from", "member", "add_ids"}),
    "members": ({"folder", "members"}, {"from", "rename"}),
    "uuids": ({"file", "uuids"}, {"from"}),
    "records": ({"file", "records"}, set()),
    "uhn_of": ({"file", "uhn_of", "model", "top_k"}, set()),
    "hf": ({"file", "hf", "columns"}, {"header", "values"}),
}
KIND_KEYS = ("hf", "records", "uhn_of", "members", "uuids")
DOWNLOAD_KINDS = ("copy", "members", "uuids")  # the steps that read a `url` file
HF_FORMATS = ("jsonl", "csv", "tsv")


@dataclass(frozen=True)
class Report:
    """Where a task's numbers go in the report (config/tasks.yaml ``report``): its table, its column there and the
    key of the paper's number (npm/report/paper_values.yaml); ``subsets``: Table 8's extra columns of a task,
    ``{subset: (column, paper_key)}`` (LAMA's UHN and Hard)."""

    table: str
    column: str
    paper_key: str | None
    subsets: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """One entry of config/tasks.yaml (see its header for the keys)."""

    name: str
    family: str
    loader: str
    files: tuple[str, ...]
    template: str
    label_words: tuple[str, ...] | None
    fuzzy: str | None
    metric: str
    average: str
    n_samples: int | None
    per_group: int | None
    group_by: str | None
    reference_corpus: tuple[str, ...]
    is_question: bool
    l_max: int | None
    urls: tuple[str, ...]
    source: str
    hf_dataset: dict | None = None
    outdated_corpus: tuple[str, ...] = field(default_factory=tuple)
    fetch: tuple[dict, ...] = field(default_factory=tuple)
    require_one_mask: bool | None = None  # load_lama's switch (None: the loader's default, the original's filter)
    label: str = ""  # the task's name in figures (and its table column unless report.column)
    report: Report | None = None
    pmi_premise: str | None = None  # closed set: the domain premise of lm_pmi (verbalizer.premise)

    @property
    def closed(self) -> bool:
        return self.family == "closed"

    @property
    def prompt_family(self) -> str | None:
        """The decoders' open-set prompt form (npm.baselines.lm.open_set_prompt): question (``is_question``),
        translation (template ``translation``) or cloze; None for a closed-set task."""
        if self.closed:
            return None
        return "question" if self.is_question else "translation" if self.template == "translation" else "cloze"

    def where(self) -> str:
        """Where this task's files come from, for a missing-file error."""
        get = f"download {' and '.join(self.urls)}" if self.urls else "no public URL"
        hf = ""
        if self.hf_dataset:
            hf = " ".join(str(v) for v in (self.hf_dataset.get("name"), self.hf_dataset.get("config")) if v)
            hf = f"; HF dataset {hf} ({self.hf_dataset.get('split')})"
        fetch = f"; `npm-repro download-task --task {self.name}` fetches them" if self.fetch else ""
        return (f"task {self.name} expects {list(self.files)} in the format of docs/task-formats.md: "
                f"{get}{hf}; source: {self.source}{fetch}")


class RegistryError(ValueError):
    """A malformed config/tasks.yaml entry."""


def _err(name: str, key: str, msg: str) -> RegistryError:
    return RegistryError(f"config/tasks.yaml: task {name!r}, key {key!r}: {msg}")


def _str_list(name: str, key: str, value, allow_empty: bool = False) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _err(name, key, f"must be a list of non-empty strings, got {value!r}")
    if not value and not allow_empty:
        raise _err(name, key, "must not be empty")
    return tuple(value)


def _positive_int(name: str, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _err(name, key, f"must be a positive integer, got {value!r}")
    return value


def download_name(url: str) -> str:
    """The file name of a download URL (its path's last part, query dropped): what a `fetch` step's `from` names."""
    return PurePosixPath(urllib.parse.urlsplit(url).path).name


def _relative(name: str, key: str, value) -> str:
    """A path inside the task folder: relative, without `..`."""
    if not isinstance(value, str) or not value or PurePosixPath(value).is_absolute() or ".." in value.split("/"):
        raise _err(name, key, f"must be a relative path inside the task folder, got {value!r}")
    return value


def hf_columns(step: Mapping):
    """``{written column: dataset column}`` of an hf step (a list of columns keeps their names)."""
    columns = step["columns"]
    if isinstance(columns, list) and all(isinstance(c, str) for c in columns):
        return {c: c for c in columns}
    return columns


def fetch_kind(step: Mapping) -> str:
    """The kind of a `fetch` step (FETCH_KINDS)."""
    return next((k for k in KIND_KEYS if k in step), "copy")


def _fetch_step(name: str, i: int, step, urls: tuple[str, ...], hf) -> dict:
    key = f"fetch[{i}]"
    if not isinstance(step, Mapping):
        raise _err(name, key, f"must be a mapping, got {step!r}")
    kind = fetch_kind(step)
    required, optional = FETCH_KINDS[kind]
    missing, unknown = sorted(required - set(step)), sorted(set(step) - required - optional)
    if missing or unknown:
        raise _err(name, key, f"a {kind} step needs {sorted(required)} and may have {sorted(optional)}; "
                              f"missing {missing}, unknown {unknown}")
    _relative(name, f"{key}.{'folder' if kind == 'members' else 'file'}", step.get("folder", step.get("file")))
    for glob_key in ("member", "members", "uuids", "uhn_of"):
        if glob_key in step and not (isinstance(step[glob_key], str) and step[glob_key]):
            raise _err(name, f"{key}.{glob_key}", f"must be a path or glob, got {step[glob_key]!r}")
    if kind in DOWNLOAD_KINDS:
        names = [download_name(u) for u in urls]
        if not urls:
            raise _err(name, key, f"a {kind} step reads a download, but the task has no url")
        if "from" in step and step["from"] not in names:
            raise _err(name, f"{key}.from", f"{step['from']!r} is not the file name of one of its urls {names}")
        if "from" not in step and len(urls) > 1:
            raise _err(name, f"{key}.from", f"the task has {len(urls)} urls: say which one ({names})")
    if "add_ids" in step and not isinstance(step["add_ids"], bool):
        raise _err(name, f"{key}.add_ids", f"must be true or false, got {step['add_ids']!r}")
    if "rename" in step and not (isinstance(step["rename"], list) and len(step["rename"]) == 2
                                 and all(isinstance(v, str) for v in step["rename"])):
        raise _err(name, f"{key}.rename", f"must be [old suffix, new suffix], got {step['rename']!r}")
    if kind == "records" and not (isinstance(step["records"], list) and step["records"]
                                  and all(isinstance(r, Mapping) for r in step["records"])):
        raise _err(name, f"{key}.records", "must be a non-empty list of mappings (one JSON line each)")
    if kind == "uhn_of":
        if not isinstance(step["model"], str) or not step["model"]:
            raise _err(name, f"{key}.model", f"must name a BERT masked LM, got {step['model']!r}")
        _positive_int(name, f"{key}.top_k", step["top_k"])
    if kind == "hf":
        if hf is None:
            raise _err(name, key, "an hf step exports the task's hf_dataset, which it does not have")
        if step["hf"] not in HF_FORMATS:
            raise _err(name, f"{key}.hf", f"must be one of {list(HF_FORMATS)}, got {step['hf']!r}")
        columns = hf_columns(step)
        if not (isinstance(columns, Mapping) and columns
                and all(isinstance(k, str) and isinstance(v, str) for k, v in columns.items())):
            raise _err(name, f"{key}.columns", f"must be a list of columns or {{output: dataset column}}, "
                                               f"got {step['columns']!r}")
        if "header" in step and not isinstance(step["header"], bool):
            raise _err(name, f"{key}.header", f"must be true or false, got {step['header']!r}")
        values = step.get("values") or {}
        if not isinstance(values, Mapping) or not all(k in columns and isinstance(v, Mapping)
                                                       for k, v in values.items()):
            raise _err(name, f"{key}.values", f"must map output columns {list(columns)} to {{value: written "
                                              f"value}}, got {values!r}")
    return dict(step)


def _fetch(name: str, value, files: tuple[str, ...], urls: tuple[str, ...], hf) -> tuple[dict, ...]:
    """The validated `fetch` steps of a task; every file of `files` that is no glob must be a step's `file`."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise _err(name, "fetch", f"must be a non-empty list of steps, got {value!r}")
    names = [download_name(u) for u in urls]
    if len(set(names)) != len(names):
        raise _err(name, "url", f"two urls have the same file name {names}; `fetch` steps could not tell them apart")
    steps = tuple(_fetch_step(name, i, step, urls, hf) for i, step in enumerate(value))
    written = {s["file"] for s in steps if "file" in s}
    unmade = [f for f in files if not any(c in f for c in "*?[") and f not in written]
    if unmade:
        raise _err(name, "fetch", f"no step writes {unmade} (a step's `file`)")
    return steps


def _check_keys(name: str, entry) -> None:
    """``entry`` is a mapping with every REQUIRED key and no key outside REQUIRED and OPTIONAL."""
    if not isinstance(entry, Mapping):
        raise _err(name, "*", f"must be a mapping, got {type(entry).__name__}")
    for key in REQUIRED:
        if key not in entry:
            raise _err(name, key, "missing")
    unknown = set(entry) - set(REQUIRED) - set(OPTIONAL)
    if unknown:
        raise _err(name, sorted(unknown)[0], f"unknown key (allowed: {list(REQUIRED + OPTIONAL)})")


def _verbalizer(name: str, verbalizer, closed: bool) -> dict:
    """``label_words``, ``fuzzy`` (verbalizer file) and ``pmi_premise`` of a closed-set task's ``verbalizer``; all
    None for an open-set one. Label words keep their leading space (each must encode to one token)."""
    if not closed:
        if verbalizer is not None:
            raise _err(name, "verbalizer", "an open-set task has no verbalizer (null)")
        return {"label_words": None, "fuzzy": None, "pmi_premise": None}
    if not isinstance(verbalizer, Mapping) or set(verbalizer) != {"words", "fuzzy", "premise"}:
        raise _err(name, "verbalizer", f"a closed-set task needs {{words, fuzzy, premise}}, got {verbalizer!r}")
    label_words = _str_list(name, "verbalizer.words", verbalizer["words"])
    if len(label_words) < 2 or not all(w.startswith(" ") and w.strip() for w in label_words):
        raise _err(name, "verbalizer.words", f"must be two or more words, each with one leading space, got "
                                             f"{list(label_words)}")
    fuzzy = verbalizer["fuzzy"]
    if fuzzy is not None and fuzzy not in FUZZY_FILES:
        raise _err(name, "verbalizer.fuzzy", f"must be one of {list(FUZZY_FILES)} or null, got {fuzzy!r}")
    premise = verbalizer["premise"]
    if not isinstance(premise, str) or not premise.strip():
        raise _err(name, "verbalizer.premise", f"must be the PMI domain premise (a non-empty string), got {premise!r}")
    return {"label_words": label_words, "fuzzy": fuzzy, "pmi_premise": premise}


def _report(name: str, entry: Mapping, family: str) -> dict:
    """``label`` and ``report`` (a Report) of a task: its name in figures and its place in the report's tables."""
    label, report = entry["label"], entry["report"]
    if not isinstance(label, str) or not label.strip():
        raise _err(name, "label", f"must name the task in tables and figures, got {label!r}")
    allowed = REPORT_TABLES[family]
    if not isinstance(report, Mapping) or report.get("table") not in allowed:
        raise _err(name, "report", f"must be {{table, paper_key, column?}} with table one of {list(allowed)} for a "
                                   f"{family}-set task, got {report!r}")
    table = report["table"]
    required = set() if table == "table3" else {"paper_key"}
    optional = set() if table == "table3" else {"column", "subsets"} if table == "table8" else {"column"}
    if not required <= set(report) - {"table"} <= required | optional:
        raise _err(name, "report", f"a {table} task's report needs {sorted(required)} and may have {sorted(optional)}, "
                                   f"got {sorted(report)}")
    texts = [report.get("column", label), report.get("paper_key", "-")]
    subsets = report.get("subsets") or {}
    if not isinstance(subsets, Mapping) or not all(isinstance(v, list) and len(v) == 2 for v in subsets.values()):
        raise _err(name, "report.subsets", f"must map subsets to [column, paper_key], got {subsets!r}")
    texts += [t for pair in subsets.values() for t in pair]
    if not all(isinstance(t, str) and t for t in texts):
        raise _err(name, "report", f"column and paper keys must be non-empty strings, got {report!r}")
    return {"label": label, "report": Report(table, report.get("column", label), report.get("paper_key"),
                                             {str(k): tuple(v) for k, v in subsets.items()})}


def _sampling(name: str, sampling, template: str) -> tuple[int | None, int | None, str | None]:
    """(n_samples, per_group, group_by) of ``sampling``: ``{n_samples}`` or ``{per_group, group_by}``."""
    if not isinstance(sampling, Mapping):
        raise _err(name, "sampling", f"must be a mapping, got {sampling!r}")
    if set(sampling) == {"n_samples"}:
        return _positive_int(name, "sampling.n_samples", sampling["n_samples"]), None, None
    if set(sampling) != {"per_group", "group_by"}:
        raise _err(name, "sampling", f"must be {{n_samples}} or {{per_group, group_by}}, got {dict(sampling)}")
    per_group = _positive_int(name, "sampling.per_group", sampling["per_group"])
    group_by = sampling["group_by"]
    if group_by not in GROUP_BY:
        raise _err(name, "sampling.group_by", f"must be one of {list(GROUP_BY)}, got {group_by!r}")
    if group_by == "bucket" and template != "lama":
        raise _err(name, "sampling.group_by", "n-gram buckets are defined for the LAMA tasks only")
    return None, per_group, group_by


def _scoring(name: str, entry: Mapping, closed: bool, group_by: str | None) -> tuple[bool, int | None]:
    """(is_question, l_max) once ``average`` is checked: how the task's predictions are averaged and read."""
    average = entry["average"]
    if average not in ("micro", "macro"):
        raise _err(name, "average", f"must be micro or macro, got {average!r}")
    if average == "macro" and group_by is None:
        raise _err(name, "average", "macro needs groups: set sampling {per_group, group_by}")
    question = entry["is_question"]
    if not isinstance(question, bool):
        raise _err(name, "is_question", f"must be true or false, got {question!r}")
    if closed:
        if entry["l_max"] is not None:
            raise _err(name, "l_max", "closed-set tasks predict one token: l_max must be null")
        return question, None
    return question, _positive_int(name, "l_max", entry["l_max"])


def _origin(name: str, entry: Mapping, files: tuple[str, ...]) -> dict:
    """``urls``, ``source``, ``hf_dataset`` and ``fetch`` of a task: where its files come from."""
    url = entry["url"]
    urls = () if url is None else _str_list(name, "url", url)
    if not all(u.startswith(("https://", "http://")) for u in urls):
        raise _err(name, "url", f"must be http(s) URLs or null, got {list(urls)}")
    source = entry["source"]
    if not isinstance(source, str) or not source.strip():
        raise _err(name, "source", "must say where the data comes from")
    hf = entry.get("hf_dataset")
    if hf is not None and not (isinstance(hf, Mapping) and isinstance(hf.get("name"), str) and "split" in hf):
        raise _err(name, "hf_dataset", f"must be {{name, config, split}}, got {hf!r}")
    return {"urls": urls, "source": source.strip(), "hf_dataset": dict(hf) if hf is not None else None,
            "fetch": _fetch(name, entry.get("fetch"), files, urls, hf)}


def parse_task(name: str, entry) -> Task:
    """Validate one registry entry and build its Task (the first fault found, in the order checked, is raised)."""
    _check_keys(name, entry)
    family = entry["family"]
    if family not in ("closed", "open"):
        raise _err(name, "family", f"must be closed or open, got {family!r}")
    closed = family == "closed"
    loader = entry["loader"]
    if loader not in loaders_module.LOADERS:
        raise _err(name, "loader", f"{loader!r} is not in npm/tasks/loaders.py {sorted(loaders_module.LOADERS)}")
    files = _str_list(name, "files", entry["files"])
    template = entry["template"]
    allowed = tuple(CLOSED_SET_TEMPLATES) if closed else OPEN_TEMPLATES
    if template not in allowed:
        raise _err(name, "template", f"{template!r} is not one of {list(allowed)}")
    words = _verbalizer(name, entry["verbalizer"], closed)
    metric, expected = entry["metric"], "accuracy" if closed else "em"
    if metric != expected:
        raise _err(name, "metric", f"a {family}-set task is scored with {expected}, not {metric!r}")
    n_samples, per_group, group_by = _sampling(name, entry["sampling"], template)
    question, l_max = _scoring(name, entry, closed, group_by)
    origin = _origin(name, entry, files)
    require_one_mask = entry.get("require_one_mask")
    if require_one_mask is not None:
        if not isinstance(require_one_mask, bool):
            raise _err(name, "require_one_mask", f"must be true or false, got {require_one_mask!r}")
        if loader != "load_lama":
            raise _err(name, "require_one_mask", f"only the LAMA loader load_lama reads it, not {loader}")
    return Task(name=name, family=family, loader=loader, files=files, template=template, **words,
                **_report(name, entry, family), metric=metric, average=entry["average"], n_samples=n_samples,
                per_group=per_group, group_by=group_by,
                reference_corpus=_str_list(name, "reference_corpus", entry["reference_corpus"]), is_question=question,
                l_max=l_max, **origin,
                outdated_corpus=_str_list(name, "outdated_corpus", entry.get("outdated_corpus", []), True),
                require_one_mask=require_one_mask)


def read_registry_file(path: str | os.PathLike = DEFAULT_REGISTRY) -> dict:
    """The raw YAML of the registry (``tasks`` and ``fuzzy_verbalizers``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task registry {path} does not exist")
    raw = read_yaml(path)
    if not isinstance(raw, Mapping) or not isinstance(raw.get("tasks"), Mapping) or not raw["tasks"]:
        raise RegistryError(f"{path}: expected a mapping with a non-empty `tasks` mapping")
    return dict(raw)


def load_registry(path: str | os.PathLike = DEFAULT_REGISTRY) -> dict[str, Task]:
    """``{task name: Task}`` of config/tasks.yaml, in file order, every entry validated."""
    return {str(name): parse_task(str(name), entry) for name, entry in read_registry_file(path)["tasks"].items()}


def task_names(registry: Mapping[str, Task] | str | os.PathLike | None = None, *, family: str | None = None,
               table: str | None = None) -> list[str]:
    """The registry's task names, in file order: those of ``family`` (closed | open) and of the report ``table``
    (table1 | table2 | table3 | table8) when given. Every list of tasks in the code and the workflow is one of these."""
    tasks = registry if isinstance(registry, Mapping) else load_registry(registry or DEFAULT_REGISTRY)
    return [name for name, t in tasks.items()
            if (family is None or t.family == family) and (table is None or (t.report and t.report.table == table))]


def config_task_lists(config: dict, registry: str | os.PathLike = DEFAULT_REGISTRY) -> dict:
    """Fill in the workflow config's task lists that it leaves out, from the registry (the config schema names no
    task): ``evaluation.closed_set_tasks`` every closed-set task, ``evaluation.open_set_tasks`` every open-set task,
    ``ablation.tasks`` the Table 8 tasks, each in file order. Returns ``config``, changed in place."""
    tasks = load_registry(registry)
    evaluation, ablation = config.setdefault("evaluation", {}), config.setdefault("ablation", {})
    evaluation.setdefault("closed_set_tasks", task_names(tasks, family="closed"))
    evaluation.setdefault("open_set_tasks", task_names(tasks, family="open"))
    ablation.setdefault("tasks", task_names(tasks, table="table8"))
    return config


def download_checksums(path: str | os.PathLike = DEFAULT_REGISTRY) -> dict[str, str]:
    """The registry's ``checksums`` section: ``{url: sha256}`` of the task downloads whose checksum is known; every
    URL must be one of a task's ``url``."""
    raw = read_registry_file(path)
    sums = raw.get("checksums") or {}
    urls = {u for name, entry in raw["tasks"].items() for u in parse_task(str(name), entry).urls}
    urls |= {fuzzy_verbalizer_info(path)["url"]} - {None}
    if not isinstance(sums, Mapping):
        raise RegistryError(f"{path}: `checksums` must map URLs to sha256 hex digests, got {sums!r}")
    for url, digest in sums.items():
        if url not in urls:
            raise RegistryError(f"{path}: checksums: {url!r} is not the url of any task")
        if not isinstance(digest, str) or not SHA256.fullmatch(digest):
            raise RegistryError(f"{path}: checksums: {url!r} must be a sha256 of 64 lowercase hex digits, "
                                f"got {digest!r}")
    return dict(sums)


def fuzzy_verbalizer_info(path: str | os.PathLike = DEFAULT_REGISTRY) -> dict:
    """The registry's ``fuzzy_verbalizers`` section: folder, files (``FUZZY_FILES``), url (the zip's direct download,
    or null) and source, checked."""
    info = read_registry_file(path).get("fuzzy_verbalizers")
    if not isinstance(info, Mapping) or set(info) != {"folder", "files", "url", "source"}:
        raise RegistryError(f"{path}: `fuzzy_verbalizers` must have exactly folder, files, url, source; got {info!r}")
    if list(info["files"]) != list(FUZZY_FILES):
        raise RegistryError(f"{path}: fuzzy_verbalizers.files must be {list(FUZZY_FILES)}, got {info['files']!r}")
    url = info["url"]
    if url is not None and not (isinstance(url, str) and url.startswith(("https://", "http://"))):
        raise RegistryError(f"{path}: fuzzy_verbalizers.url must be an http(s) URL or null, got {url!r}")
    return dict(info)


def load_fuzzy_words(path: str | os.PathLike, registry: str | os.PathLike = DEFAULT_REGISTRY) -> dict:
    """The words per label of the fuzzy verbalizer file ``path`` (named as in ``FUZZY_FILES``), read with the readers
    of ``npm.tasks.templates`` without a tokenizer, and checked against the label count of every task naming it."""
    path = Path(path)
    tasks = [t for t in load_registry(registry).values() if t.fuzzy == path.name]
    if not tasks:
        raise ValueError(f"{path}: no task of {registry} names the fuzzy verbalizer {path.name}")
    template = tasks[0].template
    try:
        if path.suffix == ".json":
            words = fuzzy_json_words(path, YAHOO_TOPICS if template == "yahoo" else None)
        else:
            words = fuzzy_txt_words(path)
    except ValueError as e:  # a JSON or encoding error too
        raise ValueError(f"fuzzy verbalizer {path.name}: {e}") from None
    names = [t.name for t in tasks]
    if len(words) != len(tasks[0].label_words):
        also = f" (and {', '.join(names[1:])})" if len(names) > 1 else ""
        raise ValueError(f"fuzzy verbalizer {path.name} has {len(words)} labels, task {names[0]}{also} has "
                         f"{len(tasks[0].label_words)}")
    return words


def fuzzy_verbalizer_path(task: Task, tasks_root: str | os.PathLike = DEFAULT_TASKS_ROOT) -> Path | None:
    """``{tasks_root}/fuzzy_verbalizers/{task.fuzzy}``, or None when the task has no fuzzy verbalizer."""
    return None if task.fuzzy is None else Path(tasks_root) / "fuzzy_verbalizers" / task.fuzzy


def resolve_task(task: Task | str, registry: Mapping[str, Task] | str | os.PathLike | None = None) -> Task:
    """A ``Task`` as is, or the registry entry of a task name (an unknown name is a KeyError listing the tasks)."""
    if isinstance(task, Task):
        return task
    tasks = registry if isinstance(registry, Mapping) else load_registry(registry or DEFAULT_REGISTRY)
    if task not in tasks:
        raise KeyError(f"unknown task {task!r}; the registry has {list(tasks)}")
    return tasks[task]


def _single_token(word: str, tokenizer, label) -> int:
    pieces = tokenizer(" " + word.strip(), add_special_tokens=False)["input_ids"]
    if len(pieces) != 1:
        raise ValueError(f"label word {word!r} of label {label!r} encodes to {len(pieces)} tokens {pieces} with a "
                         "leading space; every verbalizer word must be exactly one token (paper-map §4.1 step 6)")
    return int(pieces[0])


def label_verbalizers(task: Task | str, tokenizer, tasks_root: str | os.PathLike = DEFAULT_TASKS_ROOT,
                      fuzzy: bool = True) -> list[np.ndarray]:
    """Token ids (int64 arrays, label-id order) of each label's verbalizer (paper-map §4.1 step 6).

    The fuzzy verbalizer ``{tasks_root}/fuzzy_verbalizers/{task.fuzzy}`` when ``fuzzy`` and the registry names one
    and the file exists (a warning when it is missing); else the task's single label words (``verbalizer.words``).
    Every word must be one token after a leading space (a clear ValueError otherwise).
    """
    task = resolve_task(task)
    if not task.closed:
        raise ValueError(f"task {task.name} is open-set: it has no verbalizer")
    words = task.label_words
    path = fuzzy_verbalizer_path(task, tasks_root) if fuzzy else None
    if path is not None and path.is_file():
        if path.suffix == ".json":
            topics = YAHOO_TOPICS if task.template == "yahoo" else None
            out = read_fuzzy_verbalizer_json(path, tokenizer, topics=topics)
        else:
            out = read_fuzzy_verbalizer_txt(path, tokenizer)
        if len(out) != len(words):
            raise ValueError(f"fuzzy verbalizer {path} has {len(out)} labels, task {task.name} has {len(words)}")
        log.info("task %s: fuzzy verbalizer %s (%s words per label)", task.name, path, [len(v) for v in out])
        return out
    if path is not None:
        log.warning("task %s: fuzzy verbalizer %s not found; using the single label words", task.name, path)
    return [np.array([_single_token(w, tokenizer, label)], dtype=np.int64) for label, w in enumerate(words)]


def load_task_records(task: Task, folder: str | os.PathLike) -> list[dict]:
    """The raw records of ``task`` (its loader on ``folder``), before templating and sampling."""
    loader = loaders_module.LOADERS[task.loader]
    options = {} if task.require_one_mask is None else {"require_one_mask": task.require_one_mask}
    records = loader(Path(folder), task.files, where=task.where(), **options)
    if not records:
        raise ValueError(f"task {task.name}: no examples in {Path(folder)} ({list(task.files)})")
    return records


def _example(task: Task, rec: dict) -> dict:
    if task.closed:
        out = {"id": rec["id"], "input": closed_set_text(task.template, rec), "label": rec["label"]}
        causal = causal_text(task.template, rec)  # the decoders' prompt where it is not the text before the mask
        if causal is not None:
            out["causal_input"] = causal
    else:
        out = {"id": rec["id"], "input": rec["input"], "answers": list(rec["answers"])}
        for key in ("relation", "is_uhn", "is_hard", "lang"):
            if key in rec:
                out[key] = rec[key]
    return out


def task_examples(name: str, folder: str | os.PathLike, tokenizer=None, n_samples: int | None = None,
                  per_group: int | None = None,
                  registry: Mapping[str, Task] | str | os.PathLike | None = None) -> list[dict]:
    """The evaluated examples of task ``name`` read from ``folder`` (see the module docstring).

    ``n_samples`` overrides ``sampling.n_samples``; for grouped tasks it sets ``per_group = n_samples // 3`` as the
    original ``Task`` does (3000 -> 1000), unless ``per_group`` is given. ``n_samples=0`` keeps everything in file
    order. ``tokenizer`` is required for LAMA (n-gram buckets; the paper's is roberta-large's).
    """
    task = resolve_task(name, registry)
    examples = [_example(task, r) for r in load_task_records(task, folder)]
    if task.group_by == "bucket":
        if tokenizer is None:
            raise ValueError(f"task {name}: LAMA n-gram buckets need the tokenizer (paper-map §5.1)")
        for ex in examples:
            ex["bucket"] = ngram_bucket(ex["answers"], tokenizer)
    if task.group_by is not None:
        for ex in examples:
            ex["group"] = ex[task.group_by]
    if n_samples == 0:
        return examples
    if task.group_by is None:
        idx = sample_indices(len(examples), task.n_samples if n_samples is None else n_samples, seed=SAMPLING_SEED)
    else:
        if per_group is None:
            per_group = task.per_group if n_samples is None else max(1, n_samples // 3)
        idx = sample_by_group([ex["group"] for ex in examples], per_group, seed=SAMPLING_SEED)
    return [examples[i] for i in idx.tolist()]
