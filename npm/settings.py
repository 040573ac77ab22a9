"""Every setting of a stage, with its one default, range and help (paper 3.3, 4-6; docs/paper-map.md §2.5, §3.7-§6,
§R2.2).

A frozen dataclass per config section is the single source of its keys' defaults and allowed values: ``Settings``
(the config's ``inference:`` section) and ``TrainingSettings`` (``training:``). The config schema documents the keys,
without defaults; the stage's options (``npm-repro evaluate``, ``npm-repro train``) are generated from the fields
below (``add_arguments``), so a flag, its default and its help cannot drift apart; the workflow passes a section with
``to_args`` and the Python API reads the same classes. Where the paper and the original code differ, the default is
the paper's and the help names the code's value. A nullable key (default None) is 0 on the command line.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields


def _setting(default, help: str, choices: tuple | None = None, minimum: float | None = None,
             exclusive: bool = False, kinds: tuple | None = None, option: bool = True):
    """A field: ``kinds`` the allowed types (default: the default's; None is allowed where the default is None),
    ``choices`` the allowed strings, ``minimum`` (``exclusive``: strictly above) the lowest number; ``option`` False
    for a key the workflow reads itself (no option of the stage)."""
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                            "exclusive": exclusive, "kinds": kinds or (type(default),),
                                            "option": option})


class Section:
    """What every settings dataclass shares: each field checked on construction (``check``), built from a config
    section (``from_mapping``), passed on as command-line options (``to_args``). ``SECTION``: the config key;
    ``TITLE``: the heading of its options in ``--help``."""

    SECTION = ""
    TITLE = ""

    def __post_init__(self):
        for f in fields(self):
            check(f.name, getattr(self, f.name), type(self))

    @classmethod
    def from_mapping(cls, values: Mapping | None, where: str | None = None):
        """Settings from a config section: unknown keys are an error naming them; missing keys take the default."""
        values = dict(values or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"{where or cls.SECTION}: unknown key(s) {unknown}; allowed: {names}")
        return cls(**values)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Settings(Section):
    """Inference and evaluation switches; ``Settings()`` is the paper's setting. Invalid values raise ValueError."""

    SECTION = "inference"
    TITLE = "inference and evaluation settings"

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


@dataclass(frozen=True)
class TrainingSettings(Section):
    """Contrastive pretraining (paper 4.1; docs/paper-map.md §2.5, docs/paper-scale.md); ``TrainingSettings()`` is the
    paper's setting on the paper's hardware. Invalid values raise ValueError."""

    SECTION = "training"
    TITLE = "training settings"

    steps: int = _setting(100_000, "training steps (paper 4.1: 100,000)", minimum=1)
    warmup_steps: int = _setting(4_000, "linear learning-rate warm-up steps (the original code: 4,000)", minimum=0)
    schedule_steps: int | None = _setting(None, "step at which the linear decay reaches 0 (null = steps)", minimum=1,
                                          kinds=(int,))
    lr: float = _setting(3e-5, "peak learning rate of AdamW (the original code: 3e-5)", minimum=0, exclusive=True)
    weight_decay: float = _setting(0.01, "AdamW weight decay, on every parameter", minimum=0)
    grad_clip: float = _setting(2.0, "gradient norm clipping threshold", minimum=0, exclusive=True)
    precision: str = _setting("bf16", "mixed precision on GPU (the original uses fp16 with a scaler); on CPU bf16 "
                                      "autocast where the CPU has native bf16 (AVX512-BF16 or AMX), else fp32. The "
                                      "run records the precision it really used",
                              choices=("bf16", "fp16", "fp32"))
    attention: str = _setting("sdpa", "attention kernels of the trained encoder: sdpa (transformers' default, "
                                      "fastest on a GPU) or eager (plain matrix products, as the original code's "
                                      "transformers; on CPU its backward pass is faster: 0.56 s against 0.68 s per "
                                      "MiniLM forward + backward of 16 x 128 tokens in bf16). The run id records it",
                              choices=("sdpa", "eager"))
    compile: bool = _setting(False, "torch.compile the encoder (npm.training.loop.compile_encoder): fused kernels "
                                    "on a GPU after about a minute of compiling; the loss and gradients equal the "
                                    "eager ones up to rounding, so the run id does not record it (the training "
                                    "summary does). A graph that cannot compile runs eagerly with a warning")
    pool: str | int = _setting("half", "candidate pool of the contrastive loss (paper 3.2) = targets of all ranks, "
                                       "of this rank's half of the world (original), or a number of sequences: a "
                                       "group of consecutive ranks holding that many (a multiple of lines_per_rank x "
                                       "data.batch_size whose number of ranks divides the world; the paper's 32 GPUs "
                                       "x 16 with half = 256; docs/paper-scale.md)",
                               choices=("all", "half"), minimum=1, kinds=(str, int))
    lines_per_rank: int = _setting(1, "batch lines each rank encodes together per micro-step (original 1); the "
                                      "rank's loss is the mean of its lines' losses, each line's queries scored "
                                      "against the whole pool. The run id records it", minimum=1)
    accumulate: int = _setting(1, "micro-steps per optimizer step, their gradients accumulated (original 1): the "
                                  "step's gradient is that of the mean over all its lines' losses; a pool never "
                                  "spans two micro-steps. The run id records it", minimum=1)
    pad_to: int | None = _setting(None, "fixed padded row length (original 320); null pads to the longest row (same "
                                        "loss, less compute)", minimum=1, kinds=(int,))
    checkpoint_every: int = _setting(10_000, "steps between resumable checkpoints", minimum=1)
    gpus_per_node: int = _setting(1, "torchrun processes on one node (read by the workflow's launcher; no option "
                                     "of train)", minimum=1, option=False)
    seed: int = _setting(0, "seed of the run (new weights, the mlm baseline's on-the-fly masking)")


NAMES = tuple(f.name for f in fields(Settings))
FIELDS = {f.name: f for f in fields(Settings)}


def _fields(section: type[Section]) -> dict:
    return {f.name: f for f in fields(section)}


def _is(kind: type, value) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, kind)


def _kind_name(kind: type, choices) -> str:
    if kind is str and choices:
        return f"one of {list(choices)}"
    return "a finite number" if kind is float else f"a {kind.__name__}"


def check(name: str, value, section: type[Section] = Settings) -> None:
    """A ValueError unless ``value`` is allowed for setting ``name`` of ``section`` (type, choices, range; finite
    numbers only; None where the default is None)."""
    f = _fields(section)[name]
    meta = f.metadata
    if value is None and f.default is None:
        return
    if not any(_is(kind, value) for kind in meta["kinds"]):
        kinds = " or ".join(_kind_name(kind, meta["choices"]) for kind in meta["kinds"])
        raise ValueError(f"setting {name} must be {kinds}{' or null' if f.default is None else ''}, got {value!r}")
    if isinstance(value, str):
        if meta["choices"] and value not in meta["choices"]:
            raise ValueError(f"setting {name} must be one of {list(meta['choices'])}, got {value!r}")
        return
    low = meta["minimum"]
    if low is not None and (value <= low if meta["exclusive"] else value < low):
        raise ValueError(f"setting {name} must be {'>' if meta['exclusive'] else '>='} {low}, got {value!r}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def arg_type(name: str, section: type[Section] = Settings):
    """The argparse ``type=`` of setting ``name``: parses the text and applies ``check``, so every option that sets
    it (``evaluate --open-set-tau``, ``predict --tau``) has the one range defined here; a bad value is argparse's
    usage error (exit status 2) naming the option. A nullable setting reads 0 as None (null)."""
    f = _fields(section)[name]
    kinds = f.metadata["kinds"]
    numeric = next((kind for kind in kinds if kind in (int, float)), None)

    def parse(text: str):
        if numeric is not None:
            try:
                value = numeric(text)
            except ValueError:
                if str not in kinds:
                    raise argparse.ArgumentTypeError(f"setting {name} must be "
                                                     f"{'an integer' if numeric is int else 'a number'}, "
                                                     f"got {text!r}") from None
                value = text
        else:
            value = text
        if f.default is None and value == 0:
            return None
        try:
            check(name, value, section)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value

    parse.__name__ = name  # argparse names the type in its messages
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


def options(section: type[Section] = Settings) -> list:
    """The fields of ``section`` that are options of its stage (all but those the workflow reads itself)."""
    return [f for f in fields(section) if f.metadata["option"]]


def add_arguments(parser: argparse.ArgumentParser, section: type[Section] = Settings) -> None:
    """One option per setting (``--open-set-tau``, ``--tau-twice/--no-tau-twice``, ...) with its default and help."""
    group = parser.add_argument_group(f"{section.TITLE} (config `{section.SECTION}:`)")
    for f in options(section):
        help_text = f.metadata["help"] + (" (0 = null)" if f.default is None else "")
        if type(f.default) is bool:
            group.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=f.default,
                               help=help_text)
        else:
            closed = f.metadata["kinds"] == (str,) and f.metadata["choices"]
            group.add_argument(_flag(f.name), type=arg_type(f.name, section), default=f.default, help=help_text,
                               choices=closed or None, metavar=None if closed else f.name.upper())


def from_args(args: argparse.Namespace, section: type[Section] = Settings) -> Section:
    """The settings of parsed options (``add_arguments``); a key that is no option takes its default."""
    return section(**{f.name: getattr(args, f.name) for f in options(section)})


def to_args(values: Mapping | None, section: type[Section] = Settings) -> str:
    """The command-line options of a config section (every option, defaults filled in, null as 0): how the workflow
    passes ``config["inference"]`` to ``npm-repro evaluate`` and ``config["training"]`` to ``npm-repro train``."""
    settings = section.from_mapping(values)
    out = []
    for f in options(section):
        value = getattr(settings, f.name)
        if isinstance(value, bool):
            out.append(_flag(f.name) if value else "--no-" + _flag(f.name)[2:])
        else:
            out.append(f"{_flag(f.name)} {0 if value is None else value}")
    return " ".join(out)


__all__ = ["NAMES", "Section", "Settings", "TrainingSettings", "add_arguments", "arg_type", "bounded", "check",
           "from_args", "nonneg_float", "nonneg_int", "options", "positive_float", "positive_int", "positive_share",
           "sha256_hex", "to_args", "unit_interval"]
