"""CC-News (news-please) records -> one document per date (paper section 4.1; paper-map §2.1).

Original ``process_cc_news.py``: files are grouped by the date in their name, ``fn.split("-")[-2][:8]``
(``CC-NEWS-20190201000000-00000.json.gz`` -> ``20190201``); only ``language == "en"`` records with a
non-null text are kept; a unit is ``"{title}. {text}"`` (both stripped; the text alone when the title is
null); all articles of a date form one document, so blocks may cross article boundaries.

Here a file whose name has no such date takes each record's date from ``date_publish`` (YYYY-MM-DD...,
normalised to YYYYMMDD). ``text`` or, failing that, news-please's ``maintext`` is the text. Documents come
in ascending date order, a date's files in name order (the original walks both in reverse name order; only
the article order within a date differs). A malformed record (not JSON, no ``language``, no ``title``, no
``text``/``maintext``, no usable date) is logged with file:line and skipped. Dates must be calendar dates: a
record whose ``date_publish`` is not one (month 13, day 45) is skipped and counted as ``records_bad_date``, a
file whose name's date is not one (``20191399``) is skipped whole and counted as ``files_bad_date``. Bytes that
are not UTF-8 are an error naming the file, line and byte offset.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from npm.data.stats import Stats
from npm.io import read_jsonl

logger = logging.getLogger(__name__)

SOURCE = "cc_news"
SUFFIXES = (".json.gz", ".jsonl.gz", ".json", ".jsonl")
_YYYYMMDD = re.compile(r"\d{8}")


def news_files(source: str | Path) -> list[Path]:
    """The record files of a CC-News folder (``*.json.gz``, ``*.jsonl.gz``, ``*.json``, ``*.jsonl``), by name."""
    source = Path(source)
    if source.is_file():
        return [source]
    return sorted((p for p in source.iterdir() if p.is_file() and p.name.endswith(SUFFIXES)), key=lambda p: p.name)


def valid_date(date: str) -> bool:
    """Whether ``date`` (YYYYMMDD) is a calendar date: 20191399 (month 13) or 20190245 (day 45) is not."""
    try:
        datetime.strptime(date, "%Y%m%d")
    except ValueError:
        return False
    return True


def date_from_name(name: str) -> str | None:
    """The original's ``fn.split("-")[-2][:8]`` when it is 8 digits (YYYYMMDD, not checked), else None."""
    parts = name.split("-")
    date = parts[-2][:8] if len(parts) >= 2 else ""
    return date if _YYYYMMDD.fullmatch(date) else None


def date_from_record(record: dict) -> str | None:
    """``date_publish`` ("2019-02-01 10:00:00") -> "20190201"; None if absent, not a date or not a calendar date."""
    value = record.get("date_publish")
    date = str(value)[:10].replace("-", "") if value else ""
    return date if _YYYYMMDD.fullmatch(date) and valid_date(date) else None


def _json_records(path: Path, stats: Stats) -> Iterator[tuple[str, dict]]:
    """(file:line, record) of a file holding one JSON object per line, or a single (pretty-printed) object."""
    lines = read_jsonl(path, parse=False)  # bytes that are not UTF-8: a ValueError naming file, line and offset
    first = next(lines, None)
    if first is None:
        return
    try:
        json.loads(first[1])
        items = itertools.chain([first], lines)
    except json.JSONDecodeError:
        items = [first, *lines]
        with contextlib.suppress(json.JSONDecodeError):
            items = [(first[0], json.loads("".join(line for _, line in items)))]
    for lineno, item in items:
        where = f"{path}:{lineno}"
        if isinstance(item, str):
            try:
                item = json.loads(item)
            except json.JSONDecodeError as e:
                stats.skip(f"line {lineno}", where, f"not JSON ({e.msg})")
                continue
        if not isinstance(item, dict):
            stats.skip(f"line {lineno}", where, "not a JSON object")
            continue
        yield where, item


def news_units(path: Path, stats: Stats, date: str | None = None) -> Iterator[tuple[str, str]]:
    """(date, unit) of the kept records of one file; ``date`` (from the file name) overrides the records'."""
    for where, record in _json_records(path, stats):
        rec_id = record.get("url") or where
        text = record["text"] if record.get("text") is not None else record.get("maintext")
        missing = [k for k in ("language", "title") if k not in record]
        if "text" not in record and "maintext" not in record:
            missing.append("text/maintext")
        if missing:
            stats.skip(rec_id, where, f"missing field(s) {missing}")
            continue
        if not isinstance(record["title"], (str, type(None))) or not isinstance(text, (str, type(None))):
            stats.skip(rec_id, where, "title and text must be strings (or null)")
            continue
        if record["language"] != "en":
            stats.counts["non_english"] += 1
            continue
        if text is None:
            stats.counts["no_text"] += 1
            continue
        record_date = date or date_from_record(record)
        if record_date is None and record.get("date_publish"):
            stats.counts["records_bad_date"] += 1
            stats.skip(rec_id, where, f"field date_publish {record['date_publish']!r} is not a calendar date "
                                      "(YYYY-MM-DD ...) and the file name has no date; fix the record's date")
            continue
        if record_date is None:
            stats.skip(rec_id, where, f"no date in the file name and no usable date_publish "
                                      f"({record.get('date_publish')!r})")
            continue
        title = record["title"]
        yield record_date, (f"{title.strip()}. {text.strip()}" if title is not None else text.strip())


def read_ccnews(source: str | Path, stats: Stats | None = None) -> Iterator[dict]:
    """One document per date, {"id": date, "title": date, "units", "date": date, "source": "cc_news"}.

    Files named with a date are read one date at a time (memory: one date's articles); files without one
    are read first and grouped by each record's ``date_publish`` (memory: those files' articles). A date's
    units are those of its named files, then those of the unnamed files.
    """
    stats = stats if stats is not None else Stats()
    stats.counts.update(records_bad_date=0, files_bad_date=0)  # in every summary, also when 0
    files = news_files(source)
    by_date: dict[str, list[Path]] = {}
    undated: dict[str, list[str]] = {}
    for path in files:
        date = date_from_name(path.name)
        if date and not valid_date(date):
            logger.warning("%s: skipped the file: the date %s in its file name (YYYYMMDD, the original's "
                           "fn.split('-')[-2][:8]) is not a calendar date; rename it with the real date", path, date)
            stats.counts["files_bad_date"] += 1
        elif date:
            by_date.setdefault(date, []).append(path)
        else:
            for record_date, unit in news_units(path, stats):
                undated.setdefault(record_date, []).append(unit)
    for date in sorted(set(by_date) | set(undated)):
        units = [unit for path in by_date.get(date, []) for _, unit in news_units(path, stats, date)]
        units += undated.get(date, [])
        if units:
            yield {"id": date, "title": date, "units": units, "date": date, "source": SOURCE}
        else:
            stats.counts["empty_dates"] += 1
