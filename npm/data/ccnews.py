"""CC-News (news-please) records -> one document per date (paper section 4.1; paper-map §2.1).

Original ``process_cc_news.py``: files are grouped by the date in their name, ``fn.split("-")[-2][:8]``
(``CC-NEWS-20190201000000-00000.json.gz`` -> ``20190201``); only ``language == "en"`` records with a
non-null text are kept; a unit is ``"{title}. {text}"`` (both stripped; the text alone when the title is
null); all articles of a date form one document, so blocks may cross article boundaries.

Here a file whose name has no such date takes each record's date from ``date_publish`` (YYYY-MM-DD...,
normalised to YYYYMMDD). ``text`` or, failing that, news-please's ``maintext`` is the text. Documents come
in ascending date order, a date's files in name order (the original walks both in reverse name order; only
the article order within a date differs). A malformed record (not JSON, no ``language``, no ``title``, no
``text``/``maintext``, no usable date) is logged with file:line and skipped.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

from npm.data.documents import Stats

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


def date_from_name(name: str) -> str | None:
    """The original's ``fn.split("-")[-2][:8]`` when it is 8 digits (YYYYMMDD), else None."""
    parts = name.split("-")
    date = parts[-2][:8] if len(parts) >= 2 else ""
    return date if _YYYYMMDD.fullmatch(date) else None


def date_from_record(record: dict) -> str | None:
    """``date_publish`` ("2019-02-01 10:00:00") -> "20190201"; None if absent or not a date."""
    value = record.get("date_publish")
    date = str(value)[:10].replace("-", "") if value else ""
    return date if _YYYYMMDD.fullmatch(date) else None


def _json_records(path: Path, stats: Stats) -> Iterator[tuple[str, dict]]:
    """(file:line, record) of a file holding one JSON object per line, or a single (pretty-printed) object."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        first = f.readline()
        try:
            json.loads(first)
            lines = enumerate([first], 1)
            rest = enumerate(f, 2)
        except json.JSONDecodeError:
            whole = first + f.read()
            try:
                record = json.loads(whole)
            except json.JSONDecodeError:
                lines, rest = enumerate(whole.splitlines(), 1), iter(())
            else:
                lines, rest = iter([(1, record)]), iter(())
        for source in (lines, rest):
            for lineno, item in source:
                where = f"{path}:{lineno}"
                if isinstance(item, str):
                    if not item.strip():
                        continue
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
    files = news_files(source)
    by_date: dict[str, list[Path]] = {}
    undated: dict[str, list[str]] = {}
    for path in files:
        date = date_from_name(path.name)
        if date:
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
