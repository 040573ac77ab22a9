"""Outputs are written atomically: an interrupted write leaves the old file intact and no temporary behind; a folder
that a failed step left with only its lock files is removed."""

import pytest

from npm.io import atomic_dir, atomic_path, folder_lock, read_jsonl, remove_lock_leftovers, write_jsonl, write_summary


def test_failed_write_keeps_previous_file(tmp_path):
    out = tmp_path / "docs.jsonl.gz"
    write_jsonl(out, [{"id": 1}])

    def records():
        yield {"id": 2}
        raise KeyboardInterrupt  # a job killed mid-write

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(out, records())
    assert list(read_jsonl(out)) == [{"id": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["docs.jsonl.gz"]


def test_atomic_path_creates_parent_and_renames(tmp_path):
    target = tmp_path / "a" / "b.txt"
    with atomic_path(target) as tmp:
        tmp.write_text("x")
        assert not target.exists()
    assert target.read_text() == "x"


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{broken\n')
    with pytest.raises(ValueError, match=r"x.jsonl:2"):
        list(read_jsonl(path))


def test_summary_carries_provenance(tmp_path):
    write_summary(tmp_path / "s.json", {"blocks": 3}, config={"seed": 1})
    import json

    record = json.loads((tmp_path / "s.json").read_text())
    assert record["blocks"] == 3
    assert record["provenance"]["config"] == {"seed": 1}
    assert "numpy" in record["provenance"]["packages"]


def test_outputs_get_the_usual_permissions(tmp_path):
    import os

    write_jsonl(tmp_path / "x.jsonl", [{"a": 1}])
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "x.jsonl").stat().st_mode & 0o777 == 0o666 & ~umask


def test_atomic_dir_replaces_a_folder_only_when_the_build_succeeds(tmp_path):
    out = tmp_path / "model"
    with atomic_dir(out) as new:
        new.mkdir()
        (new / "weights").write_text("v1")
    assert (out / "weights").read_text() == "v1"
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as new:
            new.mkdir()
            (new / "weights").write_text("half-written")
            raise RuntimeError("killed")
    assert (out / "weights").read_text() == "v1"  # the previous folder is untouched
    with atomic_dir(out) as new:
        new.mkdir()
        (new / "weights").write_text("v2")
    assert (out / "weights").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary folder left behind


def test_a_folder_holding_only_its_locks_is_removed_and_one_holding_anything_else_is_kept(tmp_path):
    """What a step that failed its checks leaves: the folder folder_lock created, with its lock files only."""
    for name in ("empty", "written"):
        with folder_lock(tmp_path / name, "test"), folder_lock(tmp_path / name, "test", name=".shard0.lock"):
            pass
    (tmp_path / "written" / "plan.json").write_text("{}")
    remove_lock_leftovers(tmp_path / "empty")
    remove_lock_leftovers(tmp_path / "written")
    remove_lock_leftovers(tmp_path / "absent")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["written"]
    assert sorted(p.name for p in (tmp_path / "written").iterdir()) == [".lock", ".shard0.lock", "plan.json"]
