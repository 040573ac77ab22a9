"""Download one evaluation set into its task folder (paper 4.2 and 5.1; docs/task-formats.md, docs/paper-scale.md §2).

``fetch_task(name, out)`` follows the task's entry of config/tasks.yaml:

* its public ``url`` files are downloaded once into a cache (``cache_path``: ``{cache}/{host}/{path}``), shared by
  the tasks that read one archive (Subj/MR/CR: LM-BFF's datasets.tar; the LAMA tasks: data.zip), with the resumable
  ``npm.data.download.download``; a file already in the cache is reused;
* its ``fetch`` steps (kinds and keys: the header of config/tasks.yaml, validated by ``npm.tasks.registry``) turn
  them, or the task's ``hf_dataset`` split (HF ``datasets``), into the contract files of docs/task-formats.md;
* the folder is built under a temporary name and loaded with the task's loader (``load_task_records``) before it is
  renamed onto ``out`` (``npm.io.atomic_dir``): a download that does not load never leaves a folder that looks good,
  and on any error ``out`` is left as it was.

Checksums: no publisher gives one. A download is checked against the registry's ``checksums`` when it lists the URL,
else against the sha256 that ``out/SOURCE.json`` recorded when the folder was first built (a changed file is
refused); an HF export is checked the same way. ``SOURCE.json`` records every download (url or HF dataset, bytes,
sha256) with the date; ``.complete`` (``COMPLETE``) marks a folder built here, the output of rule download_task.

Archive members: a recipe's glob also finds its members below one extra top folder, and a member named ``test*``
falls back to ``dev*`` (the original's ``load_data`` reads a task folder's ``test*`` file, else its ``dev*`` one); macOS
metadata (``__MACOSX/``, ``._*``) is ignored. A member that is not there is an error listing what the archive holds.

The fuzzy verbalizers (``fetch_fuzzy_verbalizers``, ``fetch_task("fuzzy_verbalizers", ...)``): the registry's
``fuzzy_verbalizers.url`` (Google Drive's direct download of Shi et al.'s zip) into the same cache, its files (at the
top of the zip or below one top folder) checked with the readers of ``npm.tasks.templates`` against the label count of
every task that names them, with the same ``SOURCE.json`` checksums and ``.complete`` marker (rule
download_fuzzy_verbalizers).

LAMA: ``SOURCE.json`` and the summary say how many records the loader's ``require_one_mask`` filter dropped.

HF datasets that cannot be reached are a one-line error saying what to place where by hand.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fnmatch
import io
import json
import logging
import os
import shutil
import tarfile
import time
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath

from npm.data.download import download, sha256_of
from npm.io import atomic_dir, folder_lock, read_json, read_jsonl, write_json, write_jsonl
from npm.model import load_masked_lm, load_tokenizer
from npm.tasks.loaders import require_glob
from npm.tasks.registry import (
    DEFAULT_REGISTRY,
    Task,
    download_checksums,
    download_name,
    fetch_kind,
    fuzzy_verbalizer_info,
    hf_columns,
    load_fuzzy_words,
    load_registry,
    load_task_records,
)

log = logging.getLogger("npm-repro.tasks")

DEFAULT_CACHE = Path("data/raw/tasks")
SOURCE = "SOURCE.json"
COMPLETE = ".complete"

# LAMA-UHN's person-name filter (Poerner et al. 2019) as the original's task/create_lama_uhn.py runs it (paper-map
# §5.1): a fact of these relations is dropped when its object is among the top-k fillers of the template for any
# whitespace token of its subject.
UHN_TEMPLATE = "[CLS] [X] is a common name in the following [Y] : [MASK] . [SEP]"
UHN_NOUNS = {"/people/person/place_of_birth": "city", "/people/deceased_person/place_of_death": "city",
             "P19": "city", "P20": "city", "P27": "country", "P1412": "language", "P103": "language"}
UHN_BATCH = 64
HOLDING_LISTED = 20  # an error lists every file of an archive up to this many, else its folders


def cache_path(url: str, cache: str | os.PathLike = DEFAULT_CACHE) -> Path:
    """Where the download of ``url`` is kept: ``{cache}/{host}/{path}``, one file per URL. The query is dropped but
    for an ``id`` parameter, which names the file below the path (Google Drive's ``download?id=ID``)."""
    parts = urllib.parse.urlsplit(url)
    rel = PurePosixPath(parts.netloc, urllib.parse.unquote(parts.path).strip("/"))
    file_id = urllib.parse.parse_qs(parts.query).get("id")
    if file_id:
        rel = rel / file_id[0]
    if len(rel.parts) < 2 or any(p in (".", "..") for p in rel.parts):
        raise ValueError(f"cannot keep the download of {url!r} in the cache: its path has no file name")
    return Path(cache, *rel.parts)


def _matches(pattern: str, name: str) -> bool:
    """``name`` matches the glob ``pattern`` part by part (``*`` does not cross a ``/``)."""
    p, n = pattern.split("/"), name.split("/")
    return len(p) == len(n) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(n, p, strict=True))


def _dev_of(pattern: str) -> str | None:
    """The ``dev*`` glob standing in for a ``test*`` one (last part), as the original's load_data; else None."""
    folder, _, name = pattern.rpartition("/")
    if not name.startswith("test"):
        return None
    return f"{folder}/dev{name[4:]}" if folder else f"dev{name[4:]}"


def _find(pattern: str, names: list[str]) -> tuple[list[str], int]:
    """(the members matching ``pattern``, how many extra top folders they lie below): ``pattern`` itself, else its
    ``dev*`` form (``_dev_of``), else either below one top folder; ([], 0) when none matches."""
    own = [pattern, *filter(None, [_dev_of(pattern)])]
    for glob, extra in [(g, 0) for g in own] + [(f"*/{g}", 1) for g in own]:
        found = [n for n in names if _matches(glob, n)]
        if found:
            return found, extra
    return [], 0


def _holding(names: list[str]) -> str:
    """What an archive holds, for an error: every file of a small one, else its folders with their file counts."""
    if len(names) <= HOLDING_LISTED:
        return f"it holds {len(names)} files: {names}"
    folders: dict[str, int] = {}
    for name in names:
        folder = name.rpartition("/")[0] + "/" if "/" in name else "./"
        folders[folder] = folders.get(folder, 0) + 1
    shown = ", ".join(f"{f} ({n})" for f, n in list(folders.items())[:HOLDING_LISTED])
    more = f" and {len(folders) - HOLDING_LISTED} more folders" if len(folders) > HOLDING_LISTED else ""
    return f"it holds {len(names)} files in {len(folders)} folders: {shown}{more}; e.g. {names[:5]}"


@contextlib.contextmanager
def _archive(path: Path, url: str) -> Iterator[tuple[list[str], Callable]]:
    """(file members in archive order, ``open(member) -> binary file``) of a zip or tar(.gz/.bz2/.xz) archive;
    member names lose a leading ``./``."""
    def norm(name: str) -> str:
        return name[2:] if name.startswith("./") else name

    def wanted(name: str) -> bool:  # not macOS metadata
        return not (name.startswith("__MACOSX/") or PurePosixPath(name).name.startswith("._"))

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            infos = {norm(i.filename): i for i in z.infolist() if not i.is_dir() and wanted(norm(i.filename))}
            yield list(infos), lambda m: z.open(infos[m])
    elif tarfile.is_tarfile(path):
        with tarfile.open(path, "r:*") as t:
            infos = {norm(m.name): m for m in t.getmembers() if m.isfile() and wanted(norm(m.name))}
            yield list(infos), lambda m: t.extractfile(infos[m])
    else:
        raise ValueError(f"{path} (the download of {url}) is neither a zip nor a tar archive, but the `fetch` recipe "
                         "reads members of it; delete it to download it again, or fix the recipe")


def _no_match(task: Task, pattern: str, url: str, names: list[str]) -> ValueError:
    dev = _dev_of(pattern)
    tried = f"nor {dev!r}, nor either below one top folder" if dev else "nor below one top folder"
    return ValueError(f"task {task.name}: no member of {download_name(url)} ({url}) matches {pattern!r} ({tried}); "
                      f"{_holding(names)}; fix the `fetch` recipe in config/tasks.yaml")


def _write_stream(src, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with src, open(dest, "wb") as f:
        shutil.copyfileobj(src, f)


def _add_ids(path: Path) -> int:
    """Give every JSON-lines record of ``path`` without an ``id`` its 0-based record number (blank lines skipped);
    returns how many got one."""
    records, added = [], 0
    for i, rec in enumerate(read_jsonl(path)):
        if "id" not in rec:
            rec["id"] = str(i)
            added += 1
        records.append(rec)
    write_jsonl(path, records)
    return added


class _Build:
    """One run of ``fetch_task``: the task, the folder being built, the cache and the checksums to hold it to."""

    def __init__(self, name: str, task: Task | None, folder: Path, cache: Path, expected: dict[str, tuple[str, str]]):
        self.name, self.task, self.folder, self.cache, self.expected = name, task, folder, cache, expected
        self.downloads: dict[str, dict] = {}  # url or HF dataset -> its record in SOURCE.json

    def check(self, key: str, got: str, what: str) -> None:
        """Refuse a file whose sha256 differs from the one recorded for ``key``."""
        if key in self.expected and self.expected[key][0] != got:
            want, origin = self.expected[key]
            raise ValueError(f"task {self.name}: {what} has sha256 {got}, but {origin} records {want} for "
                             f"{key}; nothing was changed. If the new file is right, delete the recorded sha256 "
                             "(or the task folder) and run again")

    def url_of(self, step: Mapping) -> str:
        if "from" not in step:
            return self.task.urls[0]
        return next(u for u in self.task.urls if download_name(u) == step["from"])

    def fetched(self, url: str) -> Path:
        """The cached download of ``url``, fetched first if absent; its sha256 checked and recorded."""
        path = cache_path(url, self.cache)
        if url in self.downloads:
            return path
        if not path.is_file():
            want, origin = self.expected.get(url, (None, ""))
            with folder_lock(path.parent, "task download"):
                try:
                    download(url, path, sha256=want)
                except ValueError as e:
                    recorded = f" (the expected sha256 is recorded in {origin})" if want else ""
                    raise ValueError(f"task {self.name}: {e}{recorded}") from None
        digest = sha256_of(path)
        self.check(url, digest, f"the download {path}")
        self.downloads[url] = {"url": url, "file": str(path), "bytes": path.stat().st_size, "sha256": digest}
        return path

    # ---------------------------------------------------------------------------------------- step kinds

    def copy(self, step: Mapping) -> None:
        url = self.url_of(step)
        src, dest = self.fetched(url), self.folder / step["file"]
        if "member" not in step:
            _write_stream(open(src, "rb"), dest)
        else:
            with _archive(src, url) as (names, open_member):
                found, _ = _find(step["member"], names)
                if len(found) != 1:
                    if found:
                        raise ValueError(f"task {self.task.name}: {step['member']!r} matches {len(found)} members of "
                                         f"{download_name(url)} ({found[:5]}), the recipe expects one")
                    raise _no_match(self.task, step["member"], url, names)
                _write_stream(open_member(found[0]), dest)
        if step.get("add_ids"):
            added = _add_ids(dest)
            if added:
                log.info("task %s: %d records of %s had no id; numbered by line", self.task.name, added, dest.name)

    def members(self, step: Mapping) -> None:
        url = self.url_of(step)
        src, pattern = self.fetched(url), step["members"]
        keep = next((i for i, part in enumerate(pattern.split("/")) if any(c in part for c in "*?[")),
                    len(pattern.split("/")) - 1)  # leading folders without a wildcard are dropped
        old, new = step.get("rename", ("", ""))
        written = set()
        with _archive(src, url) as (names, open_member):
            found, extra = _find(pattern, names)
            if not found:
                raise _no_match(self.task, pattern, url, names)
            keep += extra  # an extra top folder is dropped too
            for name in found:
                rel = PurePosixPath(*name.split("/")[keep:])
                if old and rel.name.endswith(old):
                    rel = rel.with_name(rel.name[: -len(old)] + new)
                if str(rel) in written:
                    raise ValueError(f"task {self.task.name}: two members of {download_name(url)} become "
                                     f"{step['folder']}/{rel}; fix `rename` in config/tasks.yaml")
                written.add(str(rel))
                _write_stream(open_member(name), self.folder / step["folder"] / rel)

    def uuids(self, step: Mapping) -> None:
        url = self.url_of(step)
        src, ids = self.fetched(url), []
        with _archive(src, url) as (names, open_member):
            found, _ = _find(step["uuids"], names)
            if not found:
                raise _no_match(self.task, step["uuids"], url, names)
            for name in found:
                with open_member(name) as f:
                    for line_no, line in enumerate(io.TextIOWrapper(f, encoding="utf-8"), 1):
                        if line.strip():
                            rec = json.loads(line)
                            if "uuid" not in rec:
                                raise ValueError(f"{download_name(url)}:{name}:{line_no}: no field 'uuid'")
                            ids.append(str(rec["uuid"]))
        (self.folder / step["file"]).write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")

    def records(self, step: Mapping) -> None:
        write_jsonl(self.folder / step["file"], [dict(r) for r in step["records"]])

    def uhn_of(self, step: Mapping) -> None:
        records = [rec for path in require_glob(self.folder, step["uhn_of"]) for rec in read_jsonl(path)]
        try:
            kept = lama_uhn(records, step["model"], step["top_k"])
        except OSError as e:  # FileNotFoundError of npm.model: no such folder, or the hub cannot be reached
            raise ValueError(f"task {self.task.name}: {step['file']} needs the masked LM {step['model']} of "
                             f"LAMA-UHN's person-name filter ({e}); run where the Hugging Face hub can be reached, "
                             "or set `model` in config/tasks.yaml to a local copy") from None
        (self.folder / step["file"]).write_text("".join(f"{r['uuid']}\n" for r in kept), encoding="utf-8")

    def hf(self, step: Mapping) -> None:
        hf = self.task.hf_dataset
        label = f"HF dataset {hf['name']}" + (f" ({hf['config']})" if hf.get("config") else "") + \
            f", split {hf['split']}"
        dest = self.folder / step["file"]
        by_hand = (f"run `npm-repro download-task --task {self.task.name}` where the Hugging Face hub can be "
                   f"reached and copy the folder it makes, or put the split's parquet files in a folder and set "
                   f"hf_dataset.name of task {self.task.name} in config/tasks.yaml to that folder; the export is "
                   f"{self.task.name}/{step['file']} (docs/task-formats.md)")
        try:
            import datasets
        except ImportError:
            raise ValueError(f"task {self.task.name}: exporting the {label} needs the `datasets` package "
                             f"(pip install datasets); or {by_hand}") from None
        try:
            ds = datasets.load_dataset(hf["name"], hf.get("config"), split=hf["split"],
                                       cache_dir=str(self.cache / "hf"))
        except (OSError, ValueError) as e:
            gist = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"task {self.task.name}: cannot load the {label} ({gist}); {by_hand}") from None
        columns = dict(hf_columns(step))
        missing = sorted(set(columns.values()) - set(ds.column_names))
        if missing:
            raise ValueError(f"task {self.task.name}: the {label} has no column {missing} (it has "
                             f"{ds.column_names}); fix `columns` in config/tasks.yaml")
        values = step.get("values") or {}

        def row(rec: dict) -> dict:
            out = {}
            for name, column in columns.items():
                value = rec[column]
                if name in values:
                    if value not in values[name]:
                        raise ValueError(f"task {self.task.name}: the {label} has {column} = {value!r}, which "
                                         f"`values.{name}` in config/tasks.yaml does not map")
                    value = values[name][value]
                out[name] = value
            return out

        rows = (row(rec) for rec in ds.select_columns(list(dict.fromkeys(columns.values()))))
        if step["hf"] == "jsonl":
            write_jsonl(dest, rows)
        else:
            _write_table(dest, rows, list(columns), step["hf"], step.get("header", False))
        digest = sha256_of(dest)
        self.check(label, digest, f"the export {step['file']}")
        self.downloads[label] = {"hf_dataset": label, "file": step["file"], "rows": len(ds),
                                 "bytes": dest.stat().st_size, "sha256": digest}


def _write_table(path: Path, rows, columns: list[str], fmt: str, header: bool) -> None:
    """CSV (every field quoted, as the amazon_polarity release) or GLUE-style TSV (no quoting; a tab or line break in
    a value is an error)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        if fmt == "csv":
            writer = csv.writer(f, quoting=csv.QUOTE_ALL, lineterminator="\n")
            if header:
                writer.writerow(columns)
            writer.writerows([r[c] for c in columns] for r in rows)
            return
        if header:
            f.write("\t".join(columns) + "\n")
        for i, r in enumerate(rows):
            cells = [str(r[c]) for c in columns]
            bad = next((c for c, v in zip(columns, cells, strict=True) if any(x in v for x in "\t\r\n")), None)
            if bad:
                raise ValueError(f"{path}: row {i}: {bad} holds a tab or line break, which a TSV cannot keep")
            f.write("\t".join(cells) + "\n")


def lama_uhn(records: list[dict], model: str, top_k: int) -> list[dict]:
    """The LAMA records that pass LAMA-UHN's two filters (Poerner et al. 2019; the original's create_lama_uhn.py,
    paper-map §5.1), in order: string match (the lower-cased object is part of the lower-cased subject) and person
    name (``UHN_NOUNS`` relations: the object, lower-cased for an uncased model, is among ``model``'s ``top_k``
    fillers of ``UHN_TEMPLATE`` for a whitespace token of the subject)."""
    import torch

    records = [r for r in records if r["obj_label"].lower() not in r["sub_label"].lower()]
    relation = [r.get("pred") or r.get("predicate_id") for r in records]
    queries = sorted({(UHN_NOUNS[rel], name) for r, rel in zip(records, relation, strict=True) if rel in UHN_NOUNS
                      for name in r["sub_label"].split()})
    if not queries:
        return records
    tokenizer, lm = load_tokenizer(model), load_masked_lm(model).eval()
    lower = tokenizer.tokenize("Paris") == tokenizer.tokenize("paris")  # an uncased vocabulary
    top: dict[tuple[str, str], set[str]] = {}
    for start in range(0, len(queries), UHN_BATCH):
        batch = queries[start:start + UHN_BATCH]
        texts = [UHN_TEMPLATE.replace("[Y]", noun).replace("[X]", name) for noun, name in batch]
        enc = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = lm(**enc).logits
        rows, cols = (enc["input_ids"] == tokenizer.mask_token_id).nonzero(as_tuple=True)
        if rows.tolist() != list(range(len(batch))):
            raise ValueError(f"{model}: the tokenizer does not keep one [MASK] in {UHN_TEMPLATE!r}")
        ids = logits[rows, cols].topk(top_k, dim=-1).indices.tolist()
        for query, best in zip(batch, ids, strict=True):
            top[query] = set(tokenizer.convert_ids_to_tokens(best))

    def guessable(rec: dict, rel: str) -> bool:
        obj = rec["obj_label"].lower() if lower else rec["obj_label"]
        return rel in UHN_NOUNS and any(obj in top[(UHN_NOUNS[rel], n)] for n in rec["sub_label"].split())

    return [r for r, rel in zip(records, relation, strict=True) if not guessable(r, rel)]


def _unknown(name: str, registry: Path) -> ValueError:
    return ValueError(f"unknown task {name!r}; config/tasks.yaml has {list(load_registry(registry))} and "
                      "fuzzy_verbalizers")


def _previous(out: Path) -> dict[str, tuple[str, str]]:
    """sha256 by url / HF dataset that ``out/SOURCE.json`` recorded, with where it was recorded."""
    path = out / SOURCE
    if not path.is_file():
        return {}
    record = read_json(path, f"delete {out} (or its {SOURCE}) and run again")
    return {d.get("url") or d.get("hf_dataset"): (d["sha256"], f"{path} (the first download)")
            for d in record.get("downloads", [])}


def fetch_task(name: str, out: str | os.PathLike, cache: str | os.PathLike = DEFAULT_CACHE,
               registry: str | os.PathLike = DEFAULT_REGISTRY) -> dict:
    """Download task ``name`` into the folder ``out`` (see the module docstring); returns a summary."""
    registry, out, cache = Path(registry), Path(out), Path(cache)
    if name == "fuzzy_verbalizers":
        return fetch_fuzzy_verbalizers(out, cache, registry)
    tasks = load_registry(registry)
    if name not in tasks:
        raise _unknown(name, registry)
    task = tasks[name]
    if not task.fetch:
        raise ValueError(f"task {name} has no `fetch` recipe in {registry}; place its files by hand: {task.where()}")
    started = time.time()
    with atomic_dir(out) as folder:
        folder.mkdir()
        build = _Build(name, task, folder, cache, _expected(out, registry))
        for step in task.fetch:
            getattr(build, fetch_kind(step))(step)
        try:
            n = len(load_task_records(task, folder))
            dropped = {}
            if task.loader == "load_lama" and task.require_one_mask is not False:  # None: the loader's default, on
                every = dataclasses.replace(task, require_one_mask=False)
                dropped = {"dropped_not_one_mask": len(load_task_records(every, folder)) - n}
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"task {name}: the downloaded files do not load with {task.loader} ({e}); nothing was "
                             f"written to {out}. Check the `fetch` recipe in config/tasks.yaml against "
                             "docs/task-formats.md") from None
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        write_json(folder / SOURCE, {"task": name, "date": _now(), "source": task.source,
                                     "downloads": list(build.downloads.values()), "examples": n, **dropped,
                                     "files": files})
        (folder / COMPLETE).write_text(f"task {name}: {n} examples, validated by {task.loader}\n", encoding="utf-8")
    log.info("task %s: %d examples in %s (%.1f s)%s", name, n, out, time.time() - started,
             "".join(f"; {k} {v}" for k, v in dropped.items()))
    return {"task": name, "out": str(out), "examples": n, **dropped, "files": len(files),
            "downloads": list(build.downloads.values())}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _expected(out: Path, registry: Path) -> dict[str, tuple[str, str]]:
    """The sha256 each download is held to: the registry's ``checksums``, else what ``out/SOURCE.json`` recorded."""
    expected = _previous(out)
    expected.update({url: (digest, f"{registry} (checksums)") for url, digest in download_checksums(registry).items()})
    return expected


def fetch_fuzzy_verbalizers(out: str | os.PathLike, cache: str | os.PathLike = DEFAULT_CACHE,
                            registry: str | os.PathLike = DEFAULT_REGISTRY) -> dict:
    """The fuzzy verbalizers (Shi et al. 2022; paper-map §4.2) into the folder ``out`` from the zip at the registry's
    ``fuzzy_verbalizers.url`` (see the module docstring); returns a summary."""
    registry, out, cache = Path(registry), Path(out), Path(cache)
    info = fuzzy_verbalizer_info(registry)
    url = info["url"]
    if not url:
        raise ValueError(f"the fuzzy verbalizers have no `url` in {registry}: {info['source']}; place "
                         f"{', '.join(info['files'])} in {out}")
    started = time.time()
    with atomic_dir(out) as folder:
        folder.mkdir()
        build = _Build("fuzzy_verbalizers", None, folder, cache, _expected(out, registry))
        src = build.fetched(url)
        with _archive(src, url) as (names, open_member):
            found = {name: _find(name, names)[0] for name in info["files"]}
            missing = [name for name, members in found.items() if not members]
            if missing:
                raise ValueError(f"task fuzzy_verbalizers: no member of the fuzzy verbalizers' zip ({url}) is "
                                 f"{', '.join(missing)} (at the top or below one top folder); {_holding(names)}")
            for name, members in found.items():
                if len(members) > 1:
                    raise ValueError(f"task fuzzy_verbalizers: {len(members)} members of the zip ({url}) are "
                                     f"{name}: {members}; expected one")
                _write_stream(open_member(members[0]), folder / name)
        try:
            labels = {name: len(load_fuzzy_words(folder / name, registry)) for name in info["files"]}
        except ValueError as e:
            raise ValueError(f"task fuzzy_verbalizers: the zip's files do not read as fuzzy verbalizers ({e}); "
                             f"nothing was written to {out}") from None
        write_json(folder / SOURCE, {"task": "fuzzy_verbalizers", "date": _now(), "source": info["source"],
                                     "downloads": list(build.downloads.values()), "labels": labels,
                                     "files": list(info["files"])})
        (folder / COMPLETE).write_text(f"fuzzy verbalizers: {labels} labels, read by npm.tasks.templates\n",
                                       encoding="utf-8")
    log.info("fuzzy verbalizers: %s in %s (%.1f s)", labels, out, time.time() - started)
    return {"task": "fuzzy_verbalizers", "out": str(out), "labels": labels, "files": len(info["files"]),
            "downloads": list(build.downloads.values())}
