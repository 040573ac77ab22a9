"""Every inference and evaluation switch, with its one default (paper 3.3, 4-6; docs/paper-map.md §3.7-§6, §R2.2).

``Settings`` is the single source of these defaults and of their allowed values: the config's ``inference:`` section
(the config schema documents the keys, without defaults), the ``npm-repro evaluate`` options (generated from the
fields below, so a flag, its default and its help cannot drift apart) and the Python API all read it. Where the
paper and the original code differ, the default is the paper's and the help names the code's value.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields


def _setting(default, help: str, choices: tuple | None = None, minimum: float | None = None,
             exclusive: bool = False):
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                            "exclusive": exclusive})


@dataclass(frozen=True)
class Settings:
    """Inference and evaluation switches; ``Settings()`` is the paper's setting. Invalid values raise ValueError."""

    closed_set_tau: float = _setting(5.0, "temperature of the closed-set kNN label scores (paper A.3-A.4)",
                                     minimum=0, exclusive=True)
    open_set_tau: float = _setting(1.0, "temperature of open-set phrase prediction (paper 3.3)",
                                   minimum=0, exclusive=True)
    tau_twice: bool = _setting(False, "NPM closed set: divide the scores by tau twice (s/tau^2), as the original "
                                      "code does; the paper divides once")
    span_score: str = _setting("paper", "open-set span score: the paper's exp(s_start/tau) + exp(s_end/tau) over all "
                                        "occurrences (3.1), or the original code's P_start + P_end (two softmaxes)",
                               choices=("paper", "code"))
    k: int = _setting(4096, "nearest neighbours per query vector and datastore (paper 3.3)", minimum=1)
    fuzzy_verbalizers: bool = _setting(True, "closed set with a datastore: the fuzzy verbalizers of Shi et al. "
                                             "(2022) where the task has one, else the single label word")
    restricted_blocks: int = _setting(3, "NPM open set: BM25 top blocks the phrase search is restricted to "
                                         "(paper 3.3)", minimum=1)
    lama_average: str = _setting("macro", "LAMA T-REx / Google-RE: macro over n-gram buckets (Table 8 caption and "
                                          "the original code) or micro (the text of paper 6.3)",
                                 choices=("macro", "micro"))
    passages: int = _setting(5, "retrieved passages of BM25 + LM and REPLUG (paper 6.2: up to five; the original "
                                "code: 3)", minimum=1)
    retriever: str = _setting("bm25", "retriever of BM25 + LM and REPLUG: BM25 (the paper's NPM comparison) or "
                                      "REPLUG's dense mean-pooled encoder (needs --encoder)", choices=("bm25", "dense"))
    replug_temperature: float = _setting(1.0, "REPLUG ensemble weights softmax(score / T); the paper uses T = 1",
                                         minimum=0, exclusive=True)
    replug_ensemble: str = _setting("mixture", "REPLUG open set: the paper's token-level mixture of the passages' "
                                               "next-token distributions (3.2), or `vote`, the authors' QA code: each "
                                               "passage decodes its own answer, weighted by softmax(score / T) x "
                                               "exp(mean answer-token log-prob), the heaviest answer wins",
                                    choices=("mixture", "vote"))
    max_new_tokens: int = _setting(30, "greedy decoding length of the decoder baselines (original code: 30)",
                                   minimum=1)
    skip_blank_lines: bool = _setting(False, "decoder answer = the first non-empty generated line (instruction-tuned "
                                             "LMs); false = the first line, as the original code")
    batch_size: int = _setting(8, "examples per decoder-LM batch (REPLUG: each with `passages` rows)", minimum=1)
    lm_precision: str = _setting("fp32", "decoder baselines' arithmetic: fp32, or bf16 / fp16 autocast (the original "
                                         "code: fp16 weights, int8 linear layers); on CPU bf16 only where native "
                                         "(AVX512-BF16 or AMX), else fp32; the metrics record the precision used",
                                 choices=("fp32", "bf16", "fp16"))
    phrase_k: int = _setting(10, "DensePhrases: start and end vectors retrieved per question (the original's top_k "
                                 "of 10)", minimum=1)
    phrase_max_words: int = _setting(20, "DensePhrases: longest phrase in words (paper 20; the original code 10)",
                                     minimum=1)

    def __post_init__(self):
        for f in fields(self):
            check(f.name, getattr(self, f.name))

    @classmethod
    def from_mapping(cls, values: Mapping | None, where: str = "inference") -> Settings:
        """Settings from a config section: unknown keys are an error naming them; missing keys take the default."""
        values = dict(values or {})
        unknown = sorted(set(values) - set(NAMES))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {list(NAMES)}")
        return cls(**values)

    def as_dict(self) -> dict:
        return asdict(self)


NAMES = tuple(f.name for f in fields(Settings))
FIELDS = {f.name: f for f in fields(Settings)}


def check(name: str, value) -> None:
    """A ValueError unless ``value`` is allowed for setting ``name`` (type, choices, range; finite numbers only)."""
    f = FIELDS[name]
    meta, kind = f.metadata, type(f.default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ValueError(f"setting {name} must be a {'finite number' if kind is float else kind.__name__}, "
                         f"got {value!r}")
    if meta["choices"] and value not in meta["choices"]:
        raise ValueError(f"setting {name} must be one of {list(meta['choices'])}, got {value!r}")
    low = meta["minimum"]
    if low is not None and (value <= low if meta["exclusive"] else value < low):
        raise ValueError(f"setting {name} must be {'>' if meta['exclusive'] else '>='} {low}, got {value!r}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def arg_type(name: str):
    """The argparse ``type=`` of setting ``name``: parses the text and applies ``check``, so every option that sets
    it (``evaluate --open-set-tau``, ``predict --tau``) has the one range defined here; a bad value is argparse's
    usage error (exit status 2) naming the option."""
    kind = type(FIELDS[name].default)

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"setting {name} must be {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        try:
            check(name, value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value

    return parse


# ---- argparse types of the options that are not settings (npm.cli, npm.evaluation.cli)

def bounded(kind: type, minimum=None, maximum=None, exclusive_minimum=None, exclusive_maximum=None):
    """An argparse ``type=`` that parses an ``int`` or a finite ``float`` and checks its range, named like the
    keywords of the config schema (tests/test_faults_cli.py checks that every `npm-repro` option a config key feeds
    has the key's range). A bad value is argparse's usage error naming the option: exit status 2 before any work."""
    what = "an integer" if kind is int else "a finite number"
    limits = [f">= {minimum}" if minimum is not None else "", f"> {exclusive_minimum}"
              if exclusive_minimum is not None else "", f"<= {maximum}" if maximum is not None else "",
              f"< {exclusive_maximum}" if exclusive_maximum is not None else ""]
    rule = f"must be {what} " + " and ".join(x for x in limits if x)

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}") from None
        if ((kind is float and not math.isfinite(value)) or (minimum is not None and value < minimum)
                or (exclusive_minimum is not None and value <= exclusive_minimum)
                or (maximum is not None and value > maximum)
                or (exclusive_maximum is not None and value >= exclusive_maximum)):
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


positive_int = bounded(int, minimum=1)
nonneg_int = bounded(int, minimum=0)  # where 0 means "none" / "all" (the config's null)
positive_float = bounded(float, exclusive_minimum=0)
nonneg_float = bounded(float, minimum=0)
unit_interval = bounded(float, minimum=0, maximum=1)  # a probability or share, 0 and 1 included
positive_share = bounded(float, exclusive_minimum=0, maximum=1)  # a share in (0, 1]
SHA256 = re.compile(r"^[0-9a-f]{64}$")  # = workflow/schemas/config.schema.yaml sources.*.sha256


def sha256_hex(text: str) -> str:
    """argparse ``type=`` of ``--sha256``: 64 lowercase hex digits, or '' (not checked)."""
    if text and not SHA256.match(text):
        raise argparse.ArgumentTypeError(f"must be a SHA-256 digest of 64 lowercase hex digits (or '' to skip the "
                                         f"check), got {text!r} ({len(text)} characters); e.g. `sha256sum FILE`")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per setting (``--open-set-tau``, ``--tau-twice/--no-tau-twice``, ...) with its default and help."""
    group = parser.add_argument_group("inference and evaluation settings (config `inference:`)")
    for f in fields(Settings):
        help_text = f.metadata["help"]
        if type(f.default) is bool:
            group.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=f.default,
                               help=help_text)
        else:
            group.add_argument(_flag(f.name), type=arg_type(f.name), default=f.default, help=help_text,
                               choices=f.metadata["choices"], metavar=None if f.metadata["choices"] else f.name.upper())


def from_args(args: argparse.Namespace) -> Settings:
    return Settings(**{name: getattr(args, name) for name in NAMES})


def to_args(values: Mapping | None) -> str:
    """The command-line options of a config section (every setting, defaults filled in): how the workflow passes
    ``config["inference"]`` to ``npm-repro evaluate``."""
    settings = Settings.from_mapping(values)
    out = []
    for name, value in settings.as_dict().items():
        if isinstance(value, bool):
            out.append(_flag(name) if value else "--no-" + _flag(name)[2:])
        else:
            out.append(f"{_flag(name)} {value}")
    return " ".join(out)


__all__ = ["NAMES", "Settings", "add_arguments", "arg_type", "bounded", "check", "from_args", "nonneg_float",
           "nonneg_int", "positive_float", "positive_int", "positive_share", "sha256_hex", "to_args", "unit_interval"]
