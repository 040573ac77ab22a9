"""Progress of a long job, for its log and for the terminal that started it.

A workflow job writes everything to its log (``> {log} 2>&1`` in workflow/rules), so Snakemake's terminal would show
nothing for the minutes a pretraining or an evaluation runs. The long jobs therefore make their bars with :func:`bar`:
the tqdm bar goes to stderr (the log) as before, and when the job was given a terminal stream, one short line every
:data:`SUMMARY_EVERY_S` seconds and one at the end go there too (none for a bar done sooner), e.g.
``progress train npm: 120/1000 step (12%), 3.41 step/s, ETA 04:18``.

The terminal stream is a file descriptor that every job's shell opens on Snakemake's stderr before the rule redirects
the job's output (:data:`SHELL_PREFIX`, common.smk), named by the environment variable :data:`FD_ENV`.
:func:`claim_terminal` takes it when a command starts (npm.cli.main) and removes the variable, so a process the job
starts never mistakes another file for it; a descriptor the process opened itself (not inherited) is never taken.
"""

from __future__ import annotations

import os
import time
from typing import IO

from tqdm import tqdm

FD_ENV = "NPM_PROGRESS_FD"  # the descriptor number of the terminal stream; set by the workflow (common.smk)
TERMINAL_FD = 3  # the descriptor the workflow's job shells open on Snakemake's stderr
SHELL_PREFIX = f"exec {TERMINAL_FD}>&2; "  # the workflow's shell prefix (common.smk), before the rule's command
SUMMARY_EVERY_S = 30.0  # seconds between two progress lines on the terminal
LOG_EVERY_S = 10.0  # the least seconds between two redraws of a bar that goes to a log file (not a terminal)

_terminal: IO[str] | None = None


def claim_terminal() -> None:
    """Take the terminal stream the workflow passed (:data:`FD_ENV`), if it is open and was inherited; call once,
    before anything else opens files."""
    global _terminal
    value = os.environ.pop(FD_ENV, None)
    if value is None or not value.isdigit():
        return
    fd = int(value)
    try:
        if not os.get_inheritable(fd):  # opened by this process, not passed by the rule
            return
        os.set_inheritable(fd, False)
        _terminal = os.fdopen(fd, "w", buffering=1, closefd=False)
    except OSError:  # not open: a process started without it (a subprocess of the job)
        _terminal = None


class _Bar(tqdm):
    """A tqdm bar that also writes a one-line summary to the terminal stream now and then, and when it closes."""

    def __init__(self, *args, terminal: IO[str], **kwargs):
        self._terminal = terminal
        self._last_summary = time.monotonic()
        self._said = False  # a bar shorter than SUMMARY_EVERY_S says nothing: Snakemake's own lines suffice
        super().__init__(*args, **kwargs)

    def update(self, n=1):
        shown = super().update(n)
        if self._terminal is not None and time.monotonic() - self._last_summary >= SUMMARY_EVERY_S:
            self._summarize()
        return shown

    def close(self):
        if self._said and self._terminal is not None:
            self._summarize(done=True)
            self._terminal = None
        super().close()

    def _summarize(self, done: bool = False) -> None:
        self._last_summary, self._said = time.monotonic(), True
        try:
            self._terminal.write(summary_line(self.format_dict, done) + "\n")
        except (OSError, ValueError):  # the terminal went away (Snakemake stopped); the job goes on
            self._terminal = None


def summary_line(d: dict, done: bool = False) -> str:
    """``progress {desc}: {n}/{total} {unit} ({percent}), {rate} {unit}/s, ETA {eta}`` from a tqdm format_dict."""
    n, total, unit, elapsed = d["n"], d["total"], d["unit"].strip(), d["elapsed"]
    done_now = n - (d.get("initial") or 0)
    rate = d["rate"] or (done_now / elapsed if elapsed > 0 else None)
    size = (lambda x: tqdm.format_sizeof(x, divisor=d["unit_divisor"])) if d["unit_scale"] else (lambda x: f"{x:g}")
    count = f"{size(n)}/{size(total)} {unit} ({100 * n / total:.0f}%)" if total else f"{size(n)} {unit}"
    speed = f"{size(rate) if d['unit_scale'] else f'{rate:.3g}'} {unit}/s" if rate else f"? {unit}/s"
    if done:
        tail = f"done in {tqdm.format_interval(elapsed)}"
    elif total and rate:
        tail = f"ETA {tqdm.format_interval((total - n) / rate)}"
    else:
        tail = "ETA ?"
    return f"progress {d['prefix'] or 'job'}: {count}, {speed}, {tail}"


def bar(iterable=None, *, show: bool = True, **kwargs) -> tqdm:
    """A tqdm bar (``kwargs`` as tqdm's: total, desc, unit, initial, disable, ...) for a long job's loop; ``show``
    False (another rank, or progress turned off) makes no bar and no line. With a terminal stream the bar is drawn
    in the log even though the log is not a terminal, at most every :data:`LOG_EVERY_S` seconds."""
    if not show:
        return tqdm(iterable, **{**kwargs, "disable": True})
    if _terminal is None:
        return tqdm(iterable, **{"disable": None, **kwargs})  # tqdm's rule: no bar when stderr is not a terminal
    kwargs["mininterval"] = max(kwargs.get("mininterval", 0.1), LOG_EVERY_S)
    return _Bar(iterable, terminal=_terminal, **{**kwargs, "disable": False})
