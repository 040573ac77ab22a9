"""Resumable training state, one module for every trainer: NPM pretraining (``npm.training.loop``; paper 4.1,
docs/paper-map.md §2.5), DensePhrases' teacher and student (``npm.densephrases.train``; paper-map §D1.3) and REPLUG
LSR (``npm.replug.lsr``; paper-map §R2.3).

Run folder: ``<root>/run-<id>``, the id the sha256 of what produces the weights (``run_id``: the settings that change
them and the fingerprints of the inputs), its ``run.json`` the trainer's record of them. A run resumes only its own
checkpoints, so a changed setting or rebuilt input starts fresh in a new run folder and the old run stays resumable.
The trainer holds ``npm.io.folder_lock`` on ``root`` while it trains (one writer); that makes it safe for
``run_folder`` to remove the half-built checkpoints a killed earlier run left (``npm.io.remove_atomic_leftovers``).

Checkpoint: a folder ``<prefix>-<N>`` (N the step or the epoch; ``Layout``) holding the model (the trainer's
``write_model``: ``save_pretrained`` or its own), ``state_file`` (``torch.save`` of a plain dict: optimiser,
scheduler, ``rng_state()``, data position, ...; its sha256 taken as ``torch.save`` writes it, the model's files
hashed once written) and ``sha256.json`` (``npm.checksums``), built under a temporary
name and renamed (``npm.io.atomic_dir``), so a job killed mid-write (SIGTERM, kill -9) leaves the previous checkpoint
intact. ``latest`` returns the newest one that reads back and matches its checksums; one that does not is set aside
as ``<prefix>-<N>.corrupt-<time>`` and the previous one tried. ``restore_rng`` puts back the torch (CPU, CUDA) and
Python generators, so a resumed run continues bit for bit on CPU.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import npm.checksums as checksums
from npm.io import atomic_dir, bytes_under, remove_atomic_leftovers, write_json

log = logging.getLogger(__name__)
RUN_FILE = "run.json"


@dataclass(frozen=True)
class Layout:
    """A trainer's checkpoint names: ``<prefix>-<N>/`` holding ``state_file``; ``rule`` and ``command`` (its workflow
    rule and ``npm-repro`` command) name the trainer in the checkpoint's checksum record."""

    prefix: str
    state_file: str
    rule: str
    command: str

    def name(self, n: int) -> str:
        """The name of checkpoint N, ``<prefix>-<N>``."""
        return f"{self.prefix}-{n}"

    def number(self, path: Path) -> int | None:
        """N of a checkpoint folder ``<prefix>-<N>``, else None."""
        head, _, n = path.name.partition("-")
        return int(n) if head == self.prefix and n.isdigit() else None


def run_id(hashed: dict) -> str:
    """The sha256 (hex) of ``hashed``, a JSON-able record of what produces a run's weights."""
    return hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()


def run_folder(root: str | os.PathLike, record: dict, layout: Layout, create: bool = True) -> Path:
    """The run folder ``root/run-<record["run_id"][:16]>``. With ``create`` (the one process that writes, holding
    ``root``'s lock): made with ``record`` as its run.json (kept if there), the half-built checkpoints of a killed
    earlier run removed and logged, and the other runs of ``root`` and checkpoints of ``layout`` directly in ``root``
    (made before run folders existed) logged as not resumed."""
    root = Path(root)
    folder = root / f"run-{record['run_id'][:16]}"
    if not create:
        return folder
    others = sorted(p.name for p in root.glob("run-*") if p.is_dir() and p != folder)
    if others:
        log.info("checkpoint folder %s also holds runs %s made by other settings or data; they are kept but not "
                 "resumed (see their %s)", root, others, RUN_FILE)
    legacy = checkpoints(root, layout)
    if legacy:
        log.warning("%s holds checkpoints %s that do not record what produced them; they are not resumed",
                    root, [p.name for p in legacy])
    if not (folder / RUN_FILE).exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / RUN_FILE, record)
    for name, size in remove_atomic_leftovers(folder):
        log.warning("removed %s (%.1f MB) from %s: a checkpoint write cut short when an earlier run was killed",
                    name, size / 1e6, folder)
    return folder


def checkpoints(folder: str | os.PathLike, layout: Layout) -> list[Path]:
    """The complete checkpoints of ``folder`` (those holding their state file), oldest first."""
    done = [p for p in Path(folder).glob(f"{layout.prefix}-*")
            if layout.number(p) is not None and (p / layout.state_file).exists()]
    return sorted(done, key=layout.number)


def rng_state() -> dict:
    """The torch (CPU and, where there is one, CUDA) and Python generators' states, to store in a checkpoint."""
    return {"torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "python_rng": random.getstate()}


def restore_rng(state: dict) -> None:
    """Put back the generators of ``rng_state`` (a checkpoint without a CUDA state leaves CUDA's as it is)."""
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    random.setstate(state["python_rng"])


def save(folder: str | os.PathLike, n: int, state: dict, layout: Layout, write_model: Callable[[Path], None],
         keep: int | None = None) -> Path:
    """Write checkpoint ``<prefix>-<n>`` of ``folder`` atomically: ``write_model(build folder)``, ``state`` in the
    state file, the checksums of all; then remove all but the newest ``keep`` checkpoints (None: keep all)."""
    final = Path(folder) / layout.name(n)
    previous = checkpoints(folder, layout)
    size = bytes_under(previous[-1]) if previous else None  # the size of this one, near enough
    if size is not None and size > shutil.disk_usage(folder).free:
        raise _no_space(final, size)  # before writing: the disk is not filled up for other writers
    written = 0
    try:
        with atomic_dir(final) as tmp:
            tmp.mkdir()
            try:
                write_model(tmp)
                with open(tmp / layout.state_file, "wb") as f:  # hashed as written: the state is the largest file
                    sink = checksums.HashingWriter(f)
                    torch.save(state, sink)
                checksums.write_folder_record(tmp, layout.rule, f"{layout.command} (checkpoint {final})",
                                              written={layout.state_file: sink.digest})
            except Exception:
                written = bytes_under(tmp)
                raise
    except Exception as e:  # torch.save's "[enforce fail at inline_container.cc] ... unexpected pos" on a full disk
        need = size or written + _tensor_bytes(state)  # without a previous one: what was written and the state
        if need <= shutil.disk_usage(folder).free:  # the half-written checkpoint is gone: the space before it
            raise
        raise _no_space(final, need, "about" if size else "at least") from e
    if keep is not None:
        for old in checkpoints(folder, layout)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _tensor_bytes(obj) -> int:
    """The bytes of the tensors in a nested state (dicts, lists, tuples): about the size of its torch.save file."""
    if isinstance(obj, torch.Tensor):
        return obj.nelement() * obj.element_size()
    if isinstance(obj, dict):
        return sum(map(_tensor_bytes, obj.values()))
    return sum(map(_tensor_bytes, obj)) if isinstance(obj, (list, tuple)) else 0


def _no_space(final: Path, need: int, how: str = "about") -> OSError:
    """The disk-full error of checkpoint ``final`` (OSError ENOSPC naming its folder: npm.cli's one line)."""
    free = shutil.disk_usage(final.parent).free
    return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: checkpoint {final.name} needs {how} {need:,} bytes "
                                 f"({need / 1e6:,.1f} MB), {free:,} are free there", str(final.parent))


def load_state(path: str | os.PathLike, layout: Layout) -> dict:
    """The state dict of checkpoint ``path``; ValueError when its state file cannot be read."""
    try:
        return torch.load(Path(path) / layout.state_file, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"corrupt checkpoint {path}: cannot read {layout.state_file} ({e}); delete it to "
                         "restart") from None


def latest(folder: str | os.PathLike, layout: Layout, load_model: Callable[[Path], object],
           at_most: int | None = None, set_aside: bool = True):
    """``(checkpoint, state, load_model(checkpoint))`` of the newest checkpoint of ``folder`` (numbered at most
    ``at_most``) whose state and model read back and whose files match their checksums, or None.

    Any other is set aside as ``<prefix>-<N>.corrupt-<time>`` (by the writing process: ``set_aside``) with a
    warning, and the previous one tried."""
    unreadable = []
    found = [c for c in checkpoints(folder, layout) if at_most is None or layout.number(c) <= at_most]
    for ckpt in reversed(found):
        try:
            state = load_state(ckpt, layout)
            model = load_model(ckpt)
            checksums.verify_folder(ckpt)  # bytes changed in a file that still loads
        except Exception as e:  # noqa: BLE001 - any unreadable part makes the checkpoint unusable
            aside = ckpt.with_name(f"{ckpt.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            if set_aside:
                os.rename(ckpt, aside)
            log.warning("checkpoint %s is unreadable (%s: %s); set aside as %s", ckpt, type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "", aside.name)
            unreadable.append(ckpt.name)
            continue
        if unreadable:
            log.warning("falling back to checkpoint %s (%s %d) because %s could not be read", ckpt.name,
                        layout.prefix, layout.number(ckpt), ", ".join(unreadable))
        return ckpt, state, model
    if unreadable:
        log.warning("no readable checkpoint left in %s (%s set aside): starting this run from %s 0", folder,
                    ", ".join(unreadable), layout.prefix)
    return None
