"""CC-News records -> one document per date (paper-map §2.1, original process_cc_news.py)."""

import gzip
import json
import logging

from npm.data.ccnews import date_from_name, date_from_record, read_ccnews
from npm.data.documents import Stats, extract_documents
from npm.io import read_jsonl


def article(title, text, language="en", date="2019-02-01 10:00:00", key="text"):
    return {"title": title, key: text, "language": language, "date_publish": date, "url": f"https://x/{title}"}


def write_gz(path, records, extra_lines=()):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")


def test_date_comes_from_the_file_name_like_the_original():
    assert date_from_name("CC-NEWS-20190201000000-00000.json.gz") == "20190201"
    assert date_from_name("news.json") is None
    assert date_from_name("my-news-file.json") is None


def test_date_comes_from_date_publish_otherwise():
    assert date_from_record({"date_publish": "2019-02-03 12:00:00"}) == "20190203"
    assert date_from_record({"date_publish": None}) is None
    assert date_from_record({}) is None


def test_one_document_per_date_with_units_in_file_order(tmp_path):
    write_gz(tmp_path / "CC-NEWS-20190201000000-00001.json.gz", [article("B", "Second file.")])
    write_gz(tmp_path / "CC-NEWS-20190201000000-00000.json.gz", [article("A", " First. "), article("A2", "Then.")])
    write_gz(tmp_path / "CC-NEWS-20190202000000-00002.json.gz", [article("C", "Next day.", date="2019-01-01")])
    docs = list(read_ccnews(tmp_path))
    assert docs == [
        {"id": "20190201", "title": "20190201", "units": ["A. First.", "A2. Then.", "B. Second file."],
         "date": "20190201", "source": "cc_news"},
        {"id": "20190202", "title": "20190202", "units": ["C. Next day."], "date": "20190202", "source": "cc_news"},
    ]


def test_only_english_records_with_text_are_kept(tmp_path):
    write_gz(tmp_path / "CC-NEWS-20190201000000-00000.json.gz", [
        article("En", "Kept."), article("De", "Nein.", language="de"), article("Empty", None),
        article("Main", "From maintext.", key="maintext"), article(None, "No title.")])
    stats = Stats()
    docs = list(read_ccnews(tmp_path, stats))
    assert docs[0]["units"] == ["En. Kept.", "Main. From maintext.", "No title."]
    assert stats.counts["non_english"] == 1 and stats.counts["no_text"] == 1 and stats.counts["skipped"] == 0


def test_single_object_files_and_dates_from_records(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(article("One", "Pretty.", date="2019-02-05 01:00:00"), indent=2))
    (tmp_path / "b.json").write_text(json.dumps(article("Two", "Lines.", date="2019-02-04")) + "\n"
                                     + json.dumps(article("Three", "Too.", date="2019-02-05")) + "\n")
    (tmp_path / "notes.txt").write_text("not a record file")
    docs = list(read_ccnews(tmp_path))
    assert [(d["id"], d["units"]) for d in docs] == [("20190204", ["Two. Lines."]),
                                                    ("20190205", ["One. Pretty.", "Three. Too."])]


def test_malformed_records_are_logged_with_file_and_line_and_skipped(tmp_path, caplog):
    path = tmp_path / "CC-NEWS-20190201000000-00000.json.gz"
    write_gz(path, [article("Ok", "Fine."), {"title": "No language", "text": "x"}, ["a", "list"]],
             extra_lines=["{truncated", json.dumps({"language": "en", "title": "No text"})])
    undated = tmp_path / "undated.json"
    undated.write_text(json.dumps(article("Undated", "No date.", date=None)) + "\n")
    stats = Stats()
    with caplog.at_level(logging.WARNING):
        docs = list(read_ccnews(tmp_path, stats))
    assert [d["units"] for d in docs] == [["Ok. Fine."]]
    assert stats.counts["skipped"] == 5
    for where in (f"{path}:2", f"{path}:3", f"{path}:4", f"{path}:5", f"{undated}:1"):
        assert where in caplog.text


def test_extract_documents_cc_news_summary(tmp_path):
    src = tmp_path / "raw"
    src.mkdir()
    write_gz(src / "CC-NEWS-20190201000000-00000.json.gz", [article("A", "x."), article("B", "yy.")])
    write_gz(src / "CC-NEWS-20190203000000-00000.json.gz", [article("C", "z.", language="fr")])
    summary = extract_documents("cc_news", src, tmp_path / "docs.jsonl.gz")
    assert {k: summary[k] for k in ("documents", "units", "characters", "skipped", "non_english")} == {
        "documents": 1, "units": 2, "characters": len("A. x.") + len("B. yy."), "skipped": 0, "non_english": 1}
    assert [d["id"] for d in read_jsonl(tmp_path / "docs.jsonl.gz")] == ["20190201"]
