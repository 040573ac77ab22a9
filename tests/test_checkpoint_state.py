"""The contract of ``npm.checkpoints``, the resumable state every trainer shares (NPM pretraining, DensePhrases'
teacher and student, REPLUG LSR): run folders keyed by their record, atomic checkpoints kept N at a time, the newest
valid one found, a changed one set aside, a killed write's leftovers removed, RNG states restored. Tiny tensors."""

import json
import random

import torch

from npm import checkpoints
from npm.io import atomic_dir

LAYOUT = checkpoints.Layout(prefix="step", state_file="state.pt", rule="test", command="pytest")


def write_weights(value: float):
    def write(tmp):
        torch.save({"w": torch.full((3,), value)}, tmp / "weights.pt")

    return write


def read_weights(ckpt):
    return torch.load(ckpt / "weights.pt", weights_only=True)["w"]


def test_save_is_atomic_keeps_the_newest_and_latest_returns_the_newest_with_its_state(tmp_path):
    for step in (1, 2, 3):
        final = checkpoints.save(tmp_path, step, {"step": step, "x": torch.arange(step)}, LAYOUT,
                                 write_weights(step), keep=2)
        assert final == tmp_path / f"step-{step}"
    assert [p.name for p in checkpoints.checkpoints(tmp_path, LAYOUT)] == ["step-2", "step-3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-3"]  # no build folder left
    assert (tmp_path / "step-3" / "sha256.json").exists()
    ckpt, state, weights = checkpoints.latest(tmp_path, LAYOUT, read_weights)
    assert ckpt.name == "step-3" and state["step"] == 3 and torch.equal(state["x"], torch.arange(3))
    assert torch.equal(weights, torch.full((3,), 3.0))
    ckpt, state, _ = checkpoints.latest(tmp_path, LAYOUT, read_weights, at_most=2)
    assert ckpt.name == "step-2" and state["step"] == 2
    assert checkpoints.latest(tmp_path / "nothing", LAYOUT, read_weights) is None


def test_keep_none_keeps_every_checkpoint_and_epochs_sort_by_number(tmp_path):
    epochs = checkpoints.Layout(prefix="epoch", state_file="state.pt", rule="test", command="pytest")
    for epoch in (1, 2, 10):
        checkpoints.save(tmp_path, epoch, {"epoch": epoch}, epochs, write_weights(epoch))
    assert [p.name for p in checkpoints.checkpoints(tmp_path, epochs)] == ["epoch-1", "epoch-2", "epoch-10"]
    assert checkpoints.latest(tmp_path, epochs, read_weights)[1]["epoch"] == 10


def test_a_changed_or_unreadable_checkpoint_is_set_aside_and_the_previous_one_returned(tmp_path, caplog):
    for step in (1, 2, 3):
        checkpoints.save(tmp_path, step, {"step": step}, LAYOUT, write_weights(step))
    weights = tmp_path / "step-3" / "weights.pt"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # a byte of a file that may still load
    weights.write_bytes(bytes(data))
    (tmp_path / "step-2" / "state.pt").write_bytes(b"truncated")
    with caplog.at_level("WARNING"):
        ckpt, state, _ = checkpoints.latest(tmp_path, LAYOUT, read_weights)
    assert ckpt.name == "step-1" and state["step"] == 1
    assert sorted(p.name.split(".")[0] for p in tmp_path.glob("step-*.corrupt-*")) == ["step-2", "step-3"]
    assert "falling back to checkpoint step-1" in caplog.text and "corrupt checkpoint" in caplog.text


def test_run_folder_is_named_by_the_record_keeps_its_run_json_and_removes_a_killed_writes_leftovers(tmp_path,
                                                                                                    caplog):
    record = {"run_id": checkpoints.run_id({"lr": 1e-3, "data": "abc"}), "settings": {"out": "a"}}
    folder = checkpoints.run_folder(tmp_path, record, LAYOUT)
    assert folder == tmp_path / f"run-{record['run_id'][:16]}" and len(record["run_id"]) == 64
    again = checkpoints.run_folder(tmp_path, {**record, "settings": {"out": "b"}}, LAYOUT)
    assert again == folder and json.loads((folder / "run.json").read_text())["settings"] == {"out": "a"}
    other = {"run_id": checkpoints.run_id({"lr": 2e-3, "data": "abc"})}
    assert checkpoints.run_folder(tmp_path, other, LAYOUT, create=False) != folder
    assert not (tmp_path / f"run-{other['run_id'][:16]}").exists()  # create=False: only the name

    killed = atomic_dir(folder / "step-4")  # a write whose process died (kill -9): its block never finished
    build = killed.__enter__()
    build.mkdir()
    (build / "weights.pt").write_bytes(b"\0" * 2_000_000)
    (leftover,) = [p.name for p in folder.glob(".step-4.*.tmp")]
    with caplog.at_level("WARNING"):
        checkpoints.run_folder(tmp_path, record, LAYOUT)
    assert not list(folder.glob(".*.tmp")) and not (folder / "step-4").exists()
    assert leftover in caplog.text and "2.0 MB" in caplog.text


def test_restored_rng_states_draw_the_same_numbers(tmp_path):
    torch.manual_seed(0)
    random.seed(0)
    checkpoints.save(tmp_path, 1, {"step": 1, **checkpoints.rng_state()}, LAYOUT, write_weights(0))
    expected = (torch.rand(4), random.random())
    torch.rand(100)
    random.random()
    _, state, _ = checkpoints.latest(tmp_path, LAYOUT, read_weights)
    checkpoints.restore_rng(state)
    got = (torch.rand(4), random.random())
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]
