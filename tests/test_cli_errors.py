"""`npm-repro` errors at the edges, said in one line: real errors of FAISS, safetensors and the JVM (pyserini's
Lucene through pyjnius) become ``npm-repro CMD: error: LIBRARY: gist`` with exit status 1; ``-v`` adds the traceback.

``main()`` runs here with a stand-in parser (``npm.cli.build_parser`` monkeypatched) whose one subcommand calls the
real library on a corrupt file, so the error handling of ``main()`` itself is what is tested.
"""

from __future__ import annotations

import argparse

import pytest

from npm import cli
from tests.conftest import require_jvm


def _run_main(monkeypatch, capsys, func, verbose: bool = False) -> tuple[int, str]:
    def build_parser():
        parser = argparse.ArgumentParser(prog="npm-repro")
        parser.add_argument("-v", "--verbose", action="store_true")
        sub = parser.add_subparsers(dest="command", required=True)
        sub.add_parser("load-it").set_defaults(func=func)
        return parser

    monkeypatch.setattr(cli, "build_parser", build_parser)
    code = cli.main((["-v"] if verbose else []) + ["load-it"])
    return code, capsys.readouterr().err


def _last_line(err: str) -> str:
    lines = err.strip().splitlines()
    return lines[-1] if lines else ""


# ------------------------------------------------------------------------------------------------------ FAISS


def _read_corrupt_faiss(path):
    def func(args):
        import faiss

        faiss.read_index(str(path))

    return func


def test_faiss_error_is_one_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "x.faiss"
    path.write_bytes(b"junk" + bytes(range(256)) * 4)
    code, err = _run_main(monkeypatch, capsys, _read_corrupt_faiss(path))
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    line = err.strip()
    assert line.startswith("npm-repro load-it: error: FAISS: "), line
    assert "not recognized" in line
    assert "Error in" not in line and ".cpp" not in line  # the C++ location is dropped
    assert "Traceback" not in err


def test_faiss_error_verbose_has_traceback(tmp_path, monkeypatch, capsys):
    path = tmp_path / "x.faiss"
    path.write_bytes(b"junk" * 64)
    code, err = _run_main(monkeypatch, capsys, _read_corrupt_faiss(path), verbose=True)
    assert code == 1
    assert "Traceback (most recent call last)" in err and "RuntimeError: Error in" in err
    assert _last_line(err).startswith("npm-repro load-it: error: FAISS: ")


def test_faiss_message_parsing():
    e = RuntimeError("Error in faiss::FileIOReader::FileIOReader(const char*) at /project/faiss/impl/io.cpp:69: "
                     "Error: 'f' failed: could not open x.faiss for reading: No such file or directory\nmore")
    assert cli.edge_error(e) == ("FAISS: Error: 'f' failed: could not open x.faiss for reading: No such file or "
                                 "directory")
    assert cli.edge_error(RuntimeError("Error in something at nowhere")) is None
    assert cli.edge_error(RuntimeError("CUDA out of memory")) is None


def test_other_errors_still_raise(monkeypatch, capsys):
    def func(args):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        _run_main(monkeypatch, capsys, func)


def test_value_error_is_one_line(monkeypatch, capsys):
    def func(args):
        raise ValueError("bad input")

    code, err = _run_main(monkeypatch, capsys, func)
    assert (code, err.strip()) == (1, "npm-repro load-it: error: bad input")


# ------------------------------------------------------------------------------------------------ safetensors


def test_safetensors_error_is_one_line(tmp_path, monkeypatch, capsys):
    import torch
    from safetensors.torch import load_file, save_file

    good = tmp_path / "model.safetensors"
    save_file({"weight": torch.zeros(64, 8)}, str(good))
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])

    def func(args):
        load_file(str(truncated))

    code, err = _run_main(monkeypatch, capsys, func)
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert err.strip().startswith("npm-repro load-it: error: safetensors: "), err
    assert "deserializing header" in err

    code, err = _run_main(monkeypatch, capsys, func, verbose=True)
    assert code == 1 and "Traceback (most recent call last)" in err
    assert _last_line(err).startswith("npm-repro load-it: error: safetensors: ")


# -------------------------------------------------------------------------------------------- JVM (Lucene)


def test_lucene_error_is_one_line(tmp_path, monkeypatch, capsys):
    """A folder that looks like a Lucene index (a ``segments_1`` file) but holds junk: Lucene's own exception
    crosses the Java bridge as ``jnius.JavaException``. Read with pyserini directly, it is the generic edge line;
    through ``Bm25Searcher`` (what every command uses) a ValueError naming the folder and saying to rebuild it."""
    require_jvm()
    from pyserini.search.lucene import LuceneSearcher

    from npm.datastore.bm25 import Bm25Searcher

    index = tmp_path / "bm25"
    index.mkdir()
    (index / "segments_1").write_bytes(b"not a Lucene commit point " * 8)

    def func(args):
        LuceneSearcher(str(index))

    code, err = _run_main(monkeypatch, capsys, func)
    assert code == 1
    line = _last_line(err)
    assert "Traceback" not in err
    assert line.startswith("npm-repro load-it: error: Java (pyserini/Lucene): org.apache.lucene."), line
    assert "Exception: " in line and "\n" not in line
    assert "SegmentInfos.java" not in line  # no Java stack frames

    def func(args):
        Bm25Searcher(index)

    code, err = _run_main(monkeypatch, capsys, func)
    line = _last_line(err)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert line.startswith(f"npm-repro load-it: error: {index} is not a readable Lucene index (Java: "
                           "org.apache.lucene."), line
    assert "delete it and rebuild it with `npm-repro build-bm25-index" in line and "SegmentInfos.java" not in line
