"""Quiet libraries by default: the commands that load models and indexes (``predict``, ``evaluate``, ``serve``) call
:func:`set_library_output` first, so that a run prints its answers and its own log lines, not transformers'
"Loading weights" bars and info lines or Lucene's INFO lines; ``--verbose`` keeps all of them.

The libraries' own switches do it: transformers' progress bar and logging verbosity (``transformers.utils.logging``:
errors only; its warnings are mostly the load report of weights a loader drops on purpose, such as the masked-LM
head of an encoder, and npm.model checks the weights that matter itself), and the level of Lucene's
``java.util.logging`` logger (warnings and errors), set in the JVM when :func:`npm.datastore.java.ensure_jvm` starts
it. Code that never calls :func:`set_library_output` (the Python API) gets the libraries' defaults.
"""

from __future__ import annotations

HELP = ("show the libraries' own output (transformers' weight-loading bars and info lines, Lucene's INFO lines), "
        "debug logging, and the full traceback of an error")
LUCENE_LOGGER = "org.apache.lucene"  # java.util.logging; its INFO lines name the index input Lucene chose

_quiet: bool | None = None  # None: not chosen (library defaults)


def set_library_output(verbose: bool) -> None:
    """Keep the libraries' output (``verbose``) or quiet it to warnings and errors; call before loading anything."""
    global _quiet
    _quiet = not verbose
    if verbose:
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def lucene_quiet() -> bool:
    """Whether the JVM should log Lucene's warnings only (the command chose quiet)."""
    return bool(_quiet)
