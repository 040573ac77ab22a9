"""Readers of the evaluation files, one per format of docs/task-formats.md (paper-map §4.2, §5.1).

Every loader has the signature ``load_x(folder, files, where="") -> list[dict]``: ``folder`` is the task folder,
``files`` the task's file names from config/tasks.yaml in the order its loader documents (a name may be a glob,
e.g. ``TREx/*.jsonl``), ``where`` a sentence saying where the files come from (the registry's url/source), put into
the error of a missing file. Only local files are read.

Closed-set loaders return the raw fields the templates of ``npm.tasks.templates`` read (agn ``title``/
``description``; yahoo ``question_title``/``question_content``/``best_answer``; rte ``sentence1``/``sentence2``;
subj, sst2, mr, rt, cr ``text``; amazon ``title``/``content``) plus ``id`` (a string) and ``label`` (the label id in
the order of config/tasks.yaml ``verbalizer.words``). Open-set loaders return ``id``, ``input`` (with one ``<mask>``)
and ``answers`` (a list of gold strings, order kept, exact duplicates dropped), plus ``relation``/``is_uhn``/
``is_hard`` (LAMA), ``relation`` (KAMEL) and ``lang`` (entity translation).

LAMA records with ``masked_sentences`` (Google-RE's) are kept only when those sentences, joined with spaces, hold
exactly one ``[MASK]``, as the original's loader does (paper silent; docs/paper-map.md §5.1): ``load_lama``'s
``require_one_mask``, the registry key of the same name; the number dropped is logged per file.

Errors: a missing file is a ``FileNotFoundError`` naming the file and ``where``; a malformed row is a ``ValueError``
starting with ``{file}:{line}:``, and so is a file cut short inside its last record (a CSV quoted field still open at
the end of the file, a JSONL last line without its newline that is not complete JSON).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from npm.tasks.templates import MASK_PLACEHOLDER, kamel_input, lama_input, qa_input

PathLike = str | os.PathLike
log = logging.getLogger("npm-repro.tasks")
LAMA_MASK = "[MASK]"  # the mask of LAMA's masked_sentences
CUT_SHORT_FIX = "delete the file and download it again"

# ------------------------------------------------------------------------------------------------ helpers


def _where(where: str) -> str:
    return f"; {where}" if where else ""


def require_file(folder: PathLike, name: str, where: str = "") -> Path:
    """``folder/name`` if it is a file, else a FileNotFoundError naming it and where to get it."""
    path = Path(folder) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist{_where(where)}")
    return path


def require_glob(folder: PathLike, pattern: str, where: str = "") -> list[Path]:
    """The files matching ``pattern`` under ``folder``, sorted; none is a FileNotFoundError."""
    paths = sorted(p for p in Path(folder).glob(pattern) if p.is_file())
    if not paths:
        raise FileNotFoundError(f"no file matches {Path(folder) / pattern}{_where(where)}")
    return paths


def _expect_files(files: Sequence[str], n: int, loader: str) -> None:
    if len(files) < n:
        raise ValueError(f"{loader} needs {n} file names in config/tasks.yaml `files`, got {list(files)}")


def _bad(path: Path, line: int | str, msg: str) -> ValueError:
    return ValueError(f"{path}:{line}: {msg}")


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) of a JSON-lines file; blank lines skipped; a bad line or a non-object is file:line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("\n"):  # the last line, cut: a download or copy that stopped mid-record
                    raise _bad(path, lineno, f"the file is cut short: its last line is not a complete JSON record "
                                             f"({e.msg}); {CUT_SHORT_FIX}") from None
                raise _bad(path, lineno, f"not a JSON record ({e.msg})") from None
            if not isinstance(rec, dict):
                raise _bad(path, lineno, f"expected a JSON object, got {type(rec).__name__}")
            yield lineno, rec


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise _bad(path, e.lineno, f"not valid JSON ({e.msg})") from None


def _csv_rows(path: Path, delimiter: str = ",") -> Iterator[tuple[int, list[str]]]:
    """(line number where the row starts, fields) of a CSV file; blank rows skipped. Strict: a quoted field still open
    at the end of the file (a file cut inside its last record, which the lenient csv module would close and keep) is
    an error at the line where that record starts, as is text after a closing quote."""
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter, strict=True)
        start = 1
        try:
            for row in reader:
                if row and any(cell.strip() for cell in row):
                    yield start, row
                start = reader.line_num + 1
        except csv.Error as e:
            if str(e) == "unexpected end of data":
                raise _bad(path, start, f"the file is cut short: it ends inside a quoted field of the record that "
                                        f"starts here; {CUT_SHORT_FIX}") from None
            raise _bad(path, reader.line_num, f"malformed CSV ({e})") from None


def _field(path: Path, line: int, rec: dict, key: str, kind: type | tuple[type, ...] = str):
    if key not in rec:
        raise _bad(path, line, f"missing field {key!r} (fields: {sorted(rec)})")
    value = rec[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise _bad(path, line, f"field {key!r} must be {name}, got {value!r}")
    return value


def _int_label(path: Path, line: int, value, lo: int, hi: int, what: str = "label") -> int:
    try:
        label = int(str(value).strip())
    except ValueError:
        raise _bad(path, line, f"{what} {value!r} is not an integer") from None
    if not lo <= label <= hi:
        raise _bad(path, line, f"{what} {label} is outside {lo}..{hi}")
    return label


def _answers(path: Path, line: int, values: Iterable) -> list[str]:
    """Gold strings in order, exact duplicates dropped; each must be a non-empty string."""
    out: list[str] = []
    for a in values:
        if not isinstance(a, str) or not a.strip():
            raise _bad(path, line, f"answer {a!r} is not a non-empty string")
        if a not in out:
            out.append(a)
    if not out:
        raise _bad(path, line, "no gold answer")
    return out


def _answer_list(path: Path, line: int, rec: dict, key: str) -> list[str]:
    return _answers(path, line, _field(path, line, rec, key, list))


def _one_mask(path: Path, line: int, text: str) -> str:
    if text.count(MASK_PLACEHOLDER) != 1:
        raise _bad(path, line, f"input must contain exactly one {MASK_PLACEHOLDER}: {text!r}")
    return text


# ------------------------------------------------------------------------------------------------ closed set


def load_agn(folder: PathLike, files: Sequence[str] = ("test.csv",), where: str = "") -> list[dict]:
    """files[0]: CSV with header ``Class Index,Title,Description``; label = Class Index - 1."""
    _expect_files(files, 1, "load_agn")
    path = require_file(folder, files[0], where)
    header, out = None, []
    for line, row in _csv_rows(path):
        if header is None:
            header = [h.strip() for h in row]
            missing = {"Class Index", "Title", "Description"} - set(header)
            if missing:
                raise _bad(path, line, f"header {row} lacks {sorted(missing)} (expected Class Index,Title,Description)")
            continue
        if len(row) != len(header):
            raise _bad(path, line, f"{len(row)} fields, the header has {len(header)}")
        rec = dict(zip(header, row, strict=True))
        out.append({"id": str(len(out)), "title": rec["Title"], "description": rec["Description"],
                    "label": _int_label(path, line, rec["Class Index"], 1, 4, "Class Index") - 1})
    return out


def load_yahoo(folder: PathLike, files: Sequence[str] = ("test.jsonl",), where: str = "") -> list[dict]:
    """files[0]: JSON lines with id, topic (0-9), question_title, question_content, best_answer."""
    _expect_files(files, 1, "load_yahoo")
    path = require_file(folder, files[0], where)
    out = []
    for line, rec in _jsonl(path):
        out.append({"id": str(_field(path, line, rec, "id", (str, int))),
                    "question_title": _field(path, line, rec, "question_title"),
                    "question_content": _field(path, line, rec, "question_content"),
                    "best_answer": _field(path, line, rec, "best_answer"),
                    "label": _int_label(path, line, _field(path, line, rec, "topic", int), 0, 9, "topic")})
    return out


RTE_LABELS = {"entailment": 0, "not_entailment": 1}


def load_rte(folder: PathLike, files: Sequence[str] = ("dev.tsv",), where: str = "") -> list[dict]:
    """files[0]: GLUE TSV with header index, sentence1, sentence2, label; entailment -> 0, not_entailment -> 1."""
    _expect_files(files, 1, "load_rte")
    path = require_file(folder, files[0], where)
    out, header = [], None
    with open(path, encoding="utf-8") as f:
        for line, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            row = raw.rstrip("\r\n").split("\t")
            if header is None:
                header = row
                missing = {"index", "sentence1", "sentence2", "label"} - set(header)
                if missing:
                    raise _bad(path, line, f"header {row} lacks {sorted(missing)}")
                continue
            if len(row) != len(header):
                raise _bad(path, line, f"{len(row)} tab-separated fields, the header has {len(header)}")
            rec = dict(zip(header, row, strict=True))
            if rec["label"] not in RTE_LABELS:
                raise _bad(path, line, f"label {rec['label']!r} is not one of {sorted(RTE_LABELS)}")
            if not rec["sentence1"].strip() or not rec["sentence2"].strip():
                raise _bad(path, line, "empty sentence1 or sentence2")
            out.append({"id": rec["index"], "sentence1": rec["sentence1"], "sentence2": rec["sentence2"],
                        "label": RTE_LABELS[rec["label"]]})
    return out


def load_label_text_csv(folder: PathLike, files: Sequence[str] = ("test.csv",), where: str = "") -> list[dict]:
    """files[0]: LM-BFF CSV without header, ``label,text`` with label 0/1 (subj, mr, cr)."""
    _expect_files(files, 1, "load_label_text_csv")
    path = require_file(folder, files[0], where)
    out = []
    for line, row in _csv_rows(path):
        if len(row) != 2:
            raise _bad(path, line, f"expected 2 fields label,text, got {len(row)}")
        out.append({"id": str(len(out)), "text": row[1], "label": _int_label(path, line, row[0], 0, 1)})
    return out


_SST_LABEL = re.compile(r"__label__([1-5])")


def load_sst2(folder: PathLike, files: Sequence[str] = ("test.tsv",), where: str = "") -> list[dict]:
    """files[0]: ``__label__k\\ttext`` lines, k = 1..5; label = k - 3, neutral (k = 3) dropped, > 0 positive.

    ``id`` is the 0-based row of the file (neutral rows count), so ids point back into the file.
    """
    _expect_files(files, 1, "load_sst2")
    path = require_file(folder, files[0], where)
    out, row = [], -1
    with open(path, encoding="utf-8") as f:
        for line, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            row += 1
            parts = raw.rstrip("\r\n").split("\t")
            if len(parts) != 2:
                raise _bad(path, line, f"expected __label__k<TAB>text, got {len(parts)} tab-separated fields")
            m = _SST_LABEL.fullmatch(parts[0].strip())
            if m is None:
                raise _bad(path, line, f"label {parts[0]!r} is not __label__1 .. __label__5")
            k = int(m.group(1)) - 3
            if k == 0:
                continue
            out.append({"id": str(row), "text": parts[1], "label": int(k > 0)})
    return out


def load_rt(folder: PathLike, files: Sequence[str] = ("test.jsonl",), where: str = "") -> list[dict]:
    """files[0]: JSON lines with the HF rotten_tomatoes fields text, label (0/1); id = 0-based row."""
    _expect_files(files, 1, "load_rt")
    path = require_file(folder, files[0], where)
    out = []
    for line, rec in _jsonl(path):
        label = _int_label(path, line, _field(path, line, rec, "label", int), 0, 1)
        out.append({"id": str(rec.get("id", len(out))), "text": _field(path, line, rec, "text"), "label": label})
    return out


def load_amazon(folder: PathLike, files: Sequence[str] = ("test.csv",), where: str = "") -> list[dict]:
    """files[0]: amazon_polarity CSV without header, ``label,title,content``; label 1/2 -> 0/1."""
    _expect_files(files, 1, "load_amazon")
    path = require_file(folder, files[0], where)
    out = []
    for line, row in _csv_rows(path):
        if len(row) != 3:
            raise _bad(path, line, f"expected 3 fields label,title,content, got {len(row)}")
        out.append({"id": str(len(out)), "title": row[1], "content": row[2],
                    "label": _int_label(path, line, row[0], 1, 2) - 1})
    return out


# ------------------------------------------------------------------------------------------------ open set


def _read_ids(path: Path) -> set[str]:
    return {s.strip() for s in path.read_text(encoding="utf-8").splitlines() if s.strip()}


def _lama_relations(path: Path) -> dict[str, str]:
    templates: dict[str, str] = {}
    for line, rec in _jsonl(path):
        rel, template = _field(path, line, rec, "relation"), _field(path, line, rec, "template")
        if template.count("[X]") != 1 or template.count("[Y]") != 1:
            raise _bad(path, line, f"template of {rel} must contain [X] and [Y] once each: {template!r}")
        templates[rel] = template
    return templates


def one_mask(path: Path, line: int, rec: dict) -> bool:
    """Whether a LAMA record's ``masked_sentences``, joined with spaces, hold exactly one ``[MASK]`` (True without
    that field): the original's filter (docs/paper-map.md §5.1)."""
    if "masked_sentences" not in rec:
        return True
    sentences = _field(path, line, rec, "masked_sentences", list)
    if not all(isinstance(s, str) for s in sentences):
        raise _bad(path, line, f"field 'masked_sentences' must be a list of strings, got {sentences!r}")
    return " ".join(sentences).count(LAMA_MASK) == 1


def load_lama(folder: PathLike, files: Sequence[str], where: str = "", require_one_mask: bool = True) -> list[dict]:
    """LAMA T-REx / Google-RE. files: [relation glob (``TREx/*.jsonl``), ``relations.jsonl``, ``uhn.txt``,
    optional ``hard.txt``].

    input = relation template with [X] -> sub_label, [Y] -> <mask>, " ." -> "." (``lama_input``); the relation is
    the record's ``predicate_id``, else the file's stem. answers = obj_label + every evidence obj_surface (order
    kept, deduplicated). ``is_uhn`` / ``is_hard`` = uuid listed in uhn.txt / hard.txt (``is_hard`` None without
    hard.txt, as for Google-RE). Relation files are read in sorted name order. A uuid of uhn.txt / hard.txt that
    is not in the data is an error (as the original's assertion). ``require_one_mask``: drop the records that fail
    ``one_mask`` (the original's loader), logging how many per file; False keeps them.
    """
    _expect_files(files, 3, "load_lama")
    data_files = require_glob(folder, files[0], where)
    relations_path = require_file(folder, files[1], where)
    templates = _lama_relations(relations_path)
    uhn_path = require_file(folder, files[2], where)
    hard_path = require_file(folder, files[3], where) if len(files) > 3 else None
    out: list[dict] = []
    ids: set[str] = set()  # every uuid of the data, dropped records included (their subsets are filtered alike)
    for path in data_files:
        read = dropped = 0
        for line, rec in _jsonl(path):
            uuid = str(_field(path, line, rec, "uuid", (str, int)))
            ids.add(uuid)
            read += 1
            if require_one_mask and not one_mask(path, line, rec):
                dropped += 1
                continue
            sub = _field(path, line, rec, "sub_label")
            rel = rec.get("predicate_id") or path.stem
            if rel not in templates:
                raise _bad(path, line, f"relation {rel!r} has no template in {relations_path}")
            evidences = rec.get("evidences") or []
            if not isinstance(evidences, list):
                raise _bad(path, line, "field 'evidences' must be a list")
            surfaces = [e["obj_surface"] for e in evidences if isinstance(e, dict) and e.get("obj_surface")]
            answers = _answers(path, line, [_field(path, line, rec, "obj_label"), *surfaces])
            out.append({"id": uuid, "relation": rel, "sub_label": sub, "input": lama_input(templates[rel], sub),
                        "answers": answers})
        if dropped:
            log.info("%s: dropped %d of %d records whose masked_sentences do not hold exactly one %s (require_one_mask,"
                     " the original's loader; docs/paper-map.md §5.1)", path, dropped, read, LAMA_MASK)
    flags = {"is_uhn": uhn_path, "is_hard": hard_path}
    for key, path in flags.items():
        subset = _read_ids(path) if path is not None else None
        if subset is not None and not subset <= ids:
            unknown = sorted(subset - ids)
            raise ValueError(f"{path}: {len(unknown)} uuid(s) not in the data, e.g. {unknown[:3]}")
        for r in out:
            r[key] = None if subset is None else r["id"] in subset
    return out


def load_kamel(folder: PathLike, files: Sequence[str] = ("P*/dev.jsonl", "question-templates.csv"),
               where: str = "") -> list[dict]:
    """KAMEL. files: [``P*/dev.jsonl`` glob (the relation is the folder name), ``question-templates.csv``].

    input = ``kamel_input(question, sub_label, obj_label)``; answers = obj_label (a list); id = ``{relation}-{row}``.
    """
    _expect_files(files, 2, "load_kamel")
    data_files = require_glob(folder, files[0], where)
    qpath = require_file(folder, files[1], where)
    questions: dict[str, str] = {}
    for line, row in _csv_rows(qpath):
        if len(row) != 2:
            raise _bad(qpath, line, f"expected 2 fields relation,question, got {len(row)}")
        if "[S]" not in row[1]:
            raise _bad(qpath, line, f"question of {row[0]} has no [S]: {row[1]!r}")
        questions[row[0].strip()] = row[1]
    out = []
    for path in data_files:
        rel = path.parent.name
        if rel not in questions:
            raise FileNotFoundError(f"relation {rel} of {path} has no question in {qpath}{_where(where)}")
        row = 0
        for line, rec in _jsonl(path):
            answers = _answer_list(path, line, rec, "obj_label")
            sub = _field(path, line, rec, "sub_label")
            out.append({"id": f"{rel}-{row}", "relation": rel, "input": kamel_input(questions[rel], sub, answers),
                        "answers": answers})
            row += 1
    return out


def load_nq(folder: PathLike, files: Sequence[str] = ("nqopen-test.json", "test_id2answers.json"),
            where: str = "") -> list[dict]:
    """NQ-open. files: [JSON list of {id, question}, JSON object id -> answers]; input = ``qa_input``."""
    _expect_files(files, 2, "load_nq")
    qpath, apath = require_file(folder, files[0], where), require_file(folder, files[1], where)
    questions, id2answers = _json(qpath), _json(apath)
    if not isinstance(questions, list):
        raise _bad(qpath, 1, "expected a JSON list of {id, question}")
    if not isinstance(id2answers, dict):
        raise _bad(apath, 1, "expected a JSON object id -> list of answers")
    out = []
    for i, rec in enumerate(questions):
        where_i = f"item {i}"
        if not isinstance(rec, dict) or "id" not in rec or not isinstance(rec.get("question"), str):
            raise _bad(qpath, where_i, f"expected {{id, question}}, got {rec!r}")
        qid = str(rec["id"])
        if qid not in id2answers:
            raise _bad(apath, qid, f"no answers for id {qid!r} of {qpath}")
        if not isinstance(id2answers[qid], list):
            raise _bad(apath, qid, "answers must be a list")
        out.append({"id": qid, "input": qa_input(rec["question"]),
                    "answers": _answers(apath, qid, id2answers[qid])})
    return out


def load_triviaqa(folder: PathLike, files: Sequence[str] = ("validation.jsonl",), where: str = "") -> list[dict]:
    """TriviaQA unfiltered.nocontext: question_id, question, answer {value, aliases, normalized_aliases};
    answers = value + aliases + normalized_aliases (deduplicated)."""
    _expect_files(files, 1, "load_triviaqa")
    path = require_file(folder, files[0], where)
    out = []
    for line, rec in _jsonl(path):
        ans = _field(path, line, rec, "answer", dict)
        value = _field(path, line, ans, "value")
        aliases = _field(path, line, ans, "aliases", list) + _field(path, line, ans, "normalized_aliases", list)
        out.append({"id": str(_field(path, line, rec, "question_id", (str, int))),
                    "input": qa_input(_field(path, line, rec, "question")),
                    "answers": _answers(path, line, [value, *aliases])})
    return out


def load_cloze_jsonl(folder: PathLike, files: Sequence[str] = ("test.jsonl",), where: str = "") -> list[dict]:
    """TempLAMA: lines {id, input (one <mask>), answers}; the input is used as given."""
    _expect_files(files, 1, "load_cloze_jsonl")
    path = require_file(folder, files[0], where)
    out = []
    for line, rec in _jsonl(path):
        out.append({"id": str(_field(path, line, rec, "id", (str, int))),
                    "input": _one_mask(path, line, _field(path, line, rec, "input")),
                    "answers": _answer_list(path, line, rec, "answers")})
    return out


def load_entity_translation(folder: PathLike, files: Sequence[str] = ("test.jsonl",), where: str = "") -> list[dict]:
    """Entity translation: lines {id, input, answers, lang}; input "The {Language} translation of {title} is:
    <mask>." is used as given."""
    out = load_cloze_jsonl(folder, files, where)
    path = Path(folder) / files[0]
    for (line, rec), r in zip(_jsonl(path), out, strict=True):
        lang = _field(path, line, rec, "lang")
        if not lang.strip():
            raise _bad(path, line, "empty lang")
        r["lang"] = lang
    return out


LOADERS: dict[str, Callable[..., list[dict]]] = {
    f.__name__: f for f in (load_agn, load_yahoo, load_rte, load_label_text_csv, load_sst2, load_rt, load_amazon,
                            load_lama, load_kamel, load_nq, load_triviaqa, load_cloze_jsonl, load_entity_translation)
}
