"""Experiment tracking with Weights & Biases: one wandb run per training or evaluation job (docs/paper-map.md §8.3).
Not part of the paper: it records what a job did, and never changes what it computes (a training with tracking on or
off writes bit-identical weights, tests/test_tracking.py).

Config ``tracking``: ``wandb`` or ``none`` (the default of every entry point and of the Python API). The rules pass
``--tracking`` and ``--tracking-group`` (common.smk ``tracking_args``: the hash of the workflow's config, so the jobs of
one configuration form one wandb group); ``job_type`` is the job's kind (``pretrain``, ``densephrases_teacher``,
``evaluate``, ...). Offline unless the user says otherwise: ``WANDB_MODE`` defaults to ``offline``, so nothing leaves
the machine without ``WANDB_MODE=online`` and a key (``wandb login`` or ``WANDB_API_KEY``); ``WANDB_MODE=disabled``
turns every run off as ``none`` does (the test suite's default, tests/conftest.py). Runs are written under
``DIR/wandb/`` (``results/wandb/offline-run-<time>-<id>/`` relative to the working directory; ``WANDB_DIR`` moves
them); upload them later with ``wandb sync results/wandb/offline-run-*``. wandb's console output is silenced to one
log line per run.

Tracking never stops or holds up a job: an online run that cannot start (no key; no server within ``INIT_TIMEOUT``
seconds, ``WANDB_INIT_TIMEOUT``) is an offline run instead, a run folder without space no run, an error while
logging ends the run, and a run file left incomplete (the disk filled up) is named at the end: one warning line each.

``read_run`` reads an offline run back from its transaction log (``run-<id>.wandb``: LevelDB-log records of wandb's
``Record`` protocol buffers), wandb's own format, so that tests and users can check what was logged without a server.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import zlib
from pathlib import Path

from npm.edge_errors import first_line
from npm.options import option

CHOICES = ("wandb", "none")
PROJECT = "npm-repro"
DIR = "results"  # runs go to DIR/wandb/ (wandb adds the `wandb` folder)
FULL = 1 << 20  # bytes: less free space than this where a run file stopped short is "no space left"
INIT_TIMEOUT = 20.0  # seconds an online run waits for the server before going offline (wandb's: 90; WANDB_INIT_TIMEOUT)

log = logging.getLogger("npm-repro.tracking")


class Run:
    """A started wandb run, or a run that records nothing (tracking ``none``, ``WANDB_MODE=disabled``, ranks > 0).
    A context manager: leaving it finishes the run, marked failed when an exception left it.

    Tracking never stops a job: an error of wandb while logging is one warning line and the run records nothing
    more; at the end, a run file that does not hold the whole run (a full disk) is one warning line naming it."""

    def __init__(self, wandb_run=None):
        self._run = wandb_run

    @property
    def on(self) -> bool:
        return self._run is not None

    @property
    def folder(self) -> Path | None:
        """The run's folder (``offline-run-<time>-<id>``), None for a run that records nothing."""
        return Path(self._run.settings.sync_dir) if self._run is not None else None

    def _call(self, what: str, *args, **kwargs) -> None:
        """``what`` (a method of the wandb run, dotted: ``config.update``) called; a failure warns and stops the run."""
        if self._run is None:
            return
        target = self._run
        for part in what.split("."):
            target = getattr(target, part)
        try:
            target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - tracking must not kill the job
            log.warning("wandb: run %s stopped recording (%s failed: %s); the job goes on", self._run.id, what,
                        first_line(e) or type(e).__name__)
            self.finish(failed=True, warn=False)

    def update(self, **config) -> None:
        """Add ``config`` to the run's config (values known only once the job has started: the run id)."""
        self._call("config.update", config, allow_val_change=True)

    def log(self, step: int | None = None, **metrics) -> None:
        """One row of the run's history at ``step`` (None: the next row); rows logged at the same step merge."""
        self._call("log", metrics, step=step)

    def log_table(self, name: str, rows) -> None:
        """``rows`` (a pandas DataFrame or a list of dicts, the union of their keys as columns; a list or dict value
        as JSON text) as wandb Table ``name``."""
        if self._run is None:
            return
        import wandb

        rows = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
        columns = list(dict.fromkeys(k for row in rows for k in row))
        table = wandb.Table(columns=columns, data=[[_cell(row.get(c)) for c in columns] for row in rows],
                            allow_mixed_types=True)
        self._call("log", {name: table})

    def finish(self, failed: bool = False, warn: bool = True) -> None:
        """Finish the run and stop wandb's service, which writes the run's files: they are complete on return, or
        (``warn``) one warning line says which run file is not and why."""
        if self._run is None:
            return
        import wandb

        folder, error = Path(self._run.settings.sync_dir), None
        try:
            self._run.finish(exit_code=1 if failed else 0)
            wandb.teardown()
        except Exception as e:  # noqa: BLE001 - e.g. OSError ENOSPC closing wandb's debug.log
            error = first_line(e) or type(e).__name__
        self._run = None
        problem = incomplete(folder)
        if warn and (problem or error):
            log.warning("wandb: %s%s; the job's own outputs are not affected", problem or f"finishing the run in "
                        f"{folder} failed", f" ({error})" if error and problem is None else "")

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.finish(failed=kind is not None)


def incomplete(folder: Path) -> str | None:
    """Why the run folder's transaction log (``run-<id>.wandb``) does not hold the whole run (missing, cut short, a
    bad record, no exit record: wandb writes it last), with the free space of its file system; None when it does."""
    logs = sorted(folder.glob("run-*.wandb"))
    if not logs:
        why, where = "missing", folder / "run-*.wandb"
    else:
        where = logs[0]
        try:
            kinds = {record.WhichOneof("record_type") for record in _records(where)}
            why = None if "exit" in kinds else "it ends before the run's end"
        except Exception as e:  # noqa: BLE001 - struct.error, a failed checksum, a protocol buffer error
            why = (first_line(e) or type(e).__name__).removeprefix(f"{where}: ")
        if why is None:
            return None
        why = f"{where.stat().st_size:,} bytes; {why}"
    free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    cause = f"no space left on its file system ({free:,} bytes free)" if free < FULL else "a write to it failed"
    return f"the run file {where} is incomplete ({why}): {cause}"


def _cell(value):
    """A table cell: a list or dict as JSON text, anything else as it is."""
    return json.dumps(value) if isinstance(value, (list, tuple, dict)) else value


def numbers(record: dict, prefix: str = "") -> dict:
    """The numeric leaves of a nested metrics record, keyed by their path (``open/nq/em``), for ``Run.log``."""
    out = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out |= numbers(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = value
    return out


def _init(root: Path, mode: str, kind: str, name: str, config: dict, group: str | None):
    """``wandb.init`` of a run under ``root``; on failure wandb's state is torn down, so that another try (offline)
    starts afresh, and the exception raised."""
    import wandb

    timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", INIT_TIMEOUT))
    try:
        root.mkdir(parents=True, exist_ok=True)
        return wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), dir=str(root), mode=mode, group=group,
                          job_type=kind, name=name, config=config, reinit="create_new",
                          settings=wandb.Settings(silent=True, console="off", disable_git=True, init_timeout=timeout))
    except BaseException:
        wandb.teardown()
        raise


def start(kind: str, name: str, config: dict, tracking: str = "none", group: str | None = None,
          folder: str | Path = DIR, mode: str | None = None) -> Run:
    """A run of job ``kind`` (wandb's job_type) named ``name`` with ``config``, in wandb group ``group``; a run that
    records nothing when ``tracking`` is ``none`` or ``WANDB_MODE`` is ``disabled``. ``mode``: wandb's (default
    ``WANDB_MODE``, else offline). An online run that cannot start (no server within ``INIT_TIMEOUT`` seconds, no
    key) is an offline run instead, an offline run that cannot start (the folder unwritable) no run: one warning
    line each, and the job goes on."""
    if tracking not in CHOICES:
        raise ValueError(f"tracking must be one of {list(CHOICES)}, not {tracking!r} (config `tracking`, --tracking)")
    mode = mode or os.environ.get("WANDB_MODE", "offline")
    if tracking == "none" or mode == "disabled":
        return Run()
    logging.getLogger("wandb").setLevel(logging.WARNING)  # its INFO lines would fill the job's log
    root = Path(os.environ.get("WANDB_DIR") or folder).resolve()  # wandb's service may run in another directory
    free = shutil.disk_usage(next(p for p in (root, *root.parents) if p.exists())).free
    if free < FULL:  # wandb would write nothing readable, and print a logging traceback per line of its debug.log
        log.warning("wandb: this job is not tracked: no space left in %s (%s bytes free; a run needs %s); free "
                    "space there or set WANDB_DIR", root, f"{free:,}", f"{FULL:,}")
        return Run()
    try:
        run = _init(root, mode, kind, name, config, group)
    except Exception as e:  # noqa: BLE001 - wandb's CommError (no server), UsageError (no key), an OSError, ...
        if mode != "online":
            log.warning("wandb: this job is not tracked: no offline run could be started in %s (%s)", root,
                        first_line(e) or type(e).__name__)
            return Run()
        log.warning("wandb: no online run (%s); logging it offline in %s instead: upload it later with `wandb sync "
                    "%s/offline-run-*`", first_line(e) or type(e).__name__, root / "wandb", root / "wandb")
        return start(kind, name, config, tracking, group, folder, mode="offline")
    for handler in logging.getLogger("wandb").handlers:  # the run's debug.log: a failed write (a full disk) prints
        if isinstance(handler, logging.FileHandler):      # no logging traceback; Run.finish reports the run file
            handler.handleError = lambda record: None
    where = Path(run.settings.sync_dir)
    if run.settings._offline:
        log.info("wandb: offline run %s (%s, group %s) in %s; upload it with `wandb sync %s`", run.id, kind, group,
                 where, where)
    else:
        log.info("wandb: run %s (%s, group %s) at %s", run.id, kind, group, run.url)
    return Run(run)


OPTIONS = (option("--tracking", choices=CHOICES, default="none",
                  help="wandb: log this job as a Weights & Biases run under results/wandb (offline unless "
                       "WANDB_MODE=online); none: no run"),
           option("--tracking-group", metavar="GROUP",
                  help="wandb group of the run (the workflow passes the hash of its config)"))
"""``--tracking`` and ``--tracking-group`` of an entry point that starts a run (npm.options)."""


def from_args(args, kind: str, name: str, **config) -> Run:
    """The run of a command's job: its options (with ``config``) as the run's config; rank 0 only under torchrun."""
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    options = json.loads(json.dumps(options | config, default=str))
    tracking = args.tracking if os.environ.get("RANK", "0") == "0" else "none"
    return start(kind, name, options, tracking=tracking, group=args.tracking_group)


# ------------------------------------------------------------------------------------------ reading a run back

_BLOCK, _HEADER = 32768, 7  # LevelDB log blocks; record header: crc32 (uint32), length (uint16), type (uint8)


def _records(path: Path):
    """The ``Record`` protocol buffers of a ``.wandb`` transaction log, in order (checksums verified)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:_HEADER])
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path} is not a wandb transaction log (header {data[:_HEADER]!r})")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        chunk = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:  # zero padding
            continue
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            raise ValueError(f"{path}: a record at byte {pos - length - _HEADER} fails its checksum")
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


def read_run(folder: str | Path) -> dict:
    """An offline run folder read back: ``id``, ``group``, ``job_type``, ``name``, ``config`` (dict), ``history``
    (one dict per logged step, nested keys joined with dots), ``summary`` (dict) and ``tables`` (name -> the logged
    Table's columns and data)."""
    folder = Path(folder)
    logs = sorted(folder.glob("run-*.wandb"))
    if not logs:
        raise FileNotFoundError(f"{folder} holds no run-*.wandb transaction log: not a wandb run folder")
    out = {"config": {}, "history": [], "summary": {}, "tables": {}}
    for record in _records(logs[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            out.update(id=r.run_id, group=r.run_group, job_type=r.job_type, name=r.display_name)
            out["config"].update({_key(i): json.loads(i.value_json) for i in r.config.update})
        elif kind == "config":
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in record.summary.update})
    out["config"].pop("_wandb", None)
    for row in out["history"]:
        for key, value in row.items():
            if key.endswith("._type") and value == "table-file":
                name = key[: -len("._type")]
                table = json.loads((folder / "files" / row[f"{name}.path"]).read_text(encoding="utf-8"))
                out["tables"][name] = {"columns": table["columns"], "data": table["data"]}
    return out


__all__ = ["CHOICES", "DIR", "OPTIONS", "PROJECT", "Run", "from_args", "numbers", "read_run", "start"]
