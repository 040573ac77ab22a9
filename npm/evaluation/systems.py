"""The registry of evaluated systems: the one place that names them (paper 4-6, Tables 1-4 and 8; docs/paper-map.md
§4.1, §5.2, §6, §R2.2).

Each ``System`` says which model it loads, which corpus artefacts a closed- or open-set task needs (``None``: the
system does not apply to that family), its row label in the tables, and the function that loads its scorer. A
scorer answers a whole task at once (``npm.evaluation.harness`` samples, scores, times and writes):

* ``closed_set(task, examples, progress) -> dict`` with ``scores`` [n, n_labels] (prediction = argmax);
* ``open_set(task, examples, progress) -> dict`` with ``answers`` (one string per example, before the task's own
  answer rule such as entity translation's first-punctuation cut);

  both dicts may add ``records`` (per-example fields for the predictions file) and ``metrics`` (fields for the
  metrics file): the keys of ``Output``. Scorers import nothing from ``npm.evaluation``, so dependencies point one
  way; ``progress(n)`` advances the harness's progress bar;
* ``tokenizer`` (its own; LAMA's n-gram buckets may use another) and ``info`` (model, parameters, corpus,
  corpus_tokens, retrieval, device and any fixed setting worth recording).

Adding a system = one entry below + its scorer. The CLI's ``--system`` choices, the workflow's DAG (common.smk) and
the tables' row labels are read from here. This module imports nothing heavy: scorers load on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from npm.settings import Settings
from npm.tasks.registry import DEFAULT_TASKS_ROOT
from npm.tasks.templates import has_causal_form

# Corpus artefacts a system can need, as the workflow builds them per (model, corpus) or per corpus.
ARTEFACTS = ("datastore", "faiss", "bm25", "blocks", "encoder", "phrase_dump", "phrase_index")
# config `models` (trained or released), `baselines.lm` (the decoder), and DensePhrases (config `densephrases`)
MODELS = ("npm", "npm_single", "mlm", "lm", "densephrases")


@dataclass
class Inputs:
    """What a scorer is loaded from: the system's checkpoint and the reference corpus's artefacts (in corpus order;
    closed-set tasks may name several corpora, whose union is searched)."""

    checkpoint: str | None = None  # folder or hub id of the system's model (System.model)
    datastore: list[str] = field(default_factory=list)
    faiss: list[str] = field(default_factory=list)
    bm25: list[str] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    encoder: str | None = None
    phrase_dump: list[str] = field(default_factory=list)  # DensePhrases: the corpus's phrase dump folder
    phrase_index: list[str] = field(default_factory=list)  # and its FAISS index
    corpus: str | None = None
    device: str | None = None
    tasks_root: str = str(DEFAULT_TASKS_ROOT)  # the task folders (and fuzzy_verbalizers/)
    control: str | None = None  # negative control: "shuffled_vectors" (NEGATIVE_CONTROLS)
    phrase_search: dict = field(default_factory=dict)  # DensePhrases: how it searches (config densephrases's keys)


NEGATIVE_CONTROLS = ("shuffled_vectors",)  # Datastore.shuffle_vectors: every vector decoupled from its token


@dataclass
class Output:
    """A scorer's answer for one task (returned as a dict of these keys): ``scores`` (closed set) or ``answers``
    (open set), per-example fields added to the predictions records, and task-level fields added to the metrics."""

    scores: np.ndarray | None = None
    answers: list[str] | None = None
    records: list[dict] | None = None
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class System:
    name: str
    label: str  # the table row (paper style)
    doc: str  # one line for --help
    model: str  # which checkpoint: one of MODELS
    closed: tuple[str, ...] | None  # artefacts a closed-set task needs; None = not applicable
    open: tuple[str, ...] | None  # artefacts an open-set task needs; None = not applicable
    load: Callable  # (system, Inputs, Settings) -> scorer
    left_to_right: bool = False  # scores what follows the prompt: a closed-set template needs its causal form
    lm_label: str | None = None  # the row label with the decoder's name, "{lm}" standing for it
    options: Mapping = field(default_factory=dict)  # fixed arguments of the scorer
    retriever_encoder: str = "npm"  # the dense retriever's encoder: the NPM model, or "replug_lsr" (LSR-trained)
    note: str | None = None  # what every table with its row says about it (npm.report.tables.system_notes)

    def needs(self, closed: bool, retriever: str = Settings.retriever) -> tuple[str, ...]:
        """The artefacts one task family needs; REPLUG-style retrieval with ``retriever="dense"`` reads the blocks
        with the NPM encoder instead of BM25."""
        needs = self.closed if closed else self.open
        if needs is None:
            raise ValueError(f"system {self.name} does not apply to {'closed' if closed else 'open'}-set tasks: "
                             f"closed-set systems are {names(closed=True)}, open-set {names(closed=False)}")
        if retriever == "dense" and self.options.get("retrieval"):
            needs = tuple("encoder" if a == "bm25" else a for a in needs)
        return needs

    @property
    def retrieves(self) -> bool:
        """Whether its open-set answers come from a reference corpus (Table 2 runs it on the outdated corpus too)."""
        return bool(self.open)

    def applies(self, closed: bool, template: str) -> bool:
        """Whether the system answers a task of this family and template."""
        needs = self.closed if closed else self.open
        return needs is not None and not (self.left_to_right and closed and not has_causal_form(template))

    def display_name(self, lm: str | None = None) -> str:
        return self.lm_label.format(lm=lm) if lm and self.lm_label else self.label


def _npm(system: System, inputs: Inputs, settings):
    from npm.inference.scoring import NpmScorer  # deferred: loads torch, when the registry's entry is chosen

    return NpmScorer(system, inputs, settings)


def _mlm(system: System, inputs: Inputs, settings):
    from npm.baselines.mlm import MlmScorer  # deferred: loads torch, when the registry's entry is chosen

    return MlmScorer(system, inputs, settings)


def _densephrases(system: System, inputs: Inputs, settings):
    from npm.densephrases.scorer import DensePhrasesScorer  # deferred: loads torch, when the registry's entry is chosen

    return DensePhrasesScorer(system, inputs, settings)


def _decoder(system: System, inputs: Inputs, settings):
    from npm.baselines.decoder import DecoderScorer  # deferred: loads torch, when the registry's entry is chosen

    return DecoderScorer(system, inputs, settings)


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("npm", "NPM", "NPM: kNN label scores over the union of datastores (closed set); BM25-restricted phrase "
           "search (open set)", model="npm", closed=("datastore", "faiss"), open=("datastore", "bm25"), load=_npm),
    System("npm_single", "NPM-single", "NPM-single: one mask vector, token-level retrieval", model="npm_single",
           closed=("datastore", "faiss"), open=("datastore", "bm25"), load=_npm),
    System("npm_faiss", "NPM w/o BM25 (FAISS)", "NPM's open-set search over the whole datastore, without sparse "
           "retrieval (paper 6.4)", model="npm", closed=None, open=("datastore", "faiss"), load=_npm,
           options={"mode": "faiss"}),
    System("mlm", "MLM (same encoder)", "the parametric masked LM: softmax over the vocabulary at the mask (Table 1's "
           "RoBERTa row)", model="mlm", closed=(), open=None, load=_mlm),
    System("lm", "LM", "a causal LM without retrieval: label-word log-probabilities (closed set), greedy answer "
           "(open set)", model="lm", closed=(), open=(), load=_decoder, left_to_right=True, lm_label="LM ({lm})"),
    System("lm_pmi", "LM + PMI", "the causal LM's label scores with domain-conditional PMI (Holtzman et al. 2021)",
           model="lm", closed=(), open=None, load=_decoder, left_to_right=True, lm_label="LM ({lm}) + PMI",
           options={"pmi": True}),
    System("bm25_lm", "BM25 + LM", "the retrieved passages prepended to the causal LM's prompt (paper 6.2)",
           model="lm", closed=None, open=("bm25", "blocks"), load=_decoder, lm_label="BM25 + LM ({lm})",
           options={"retrieval": True}),
    System("replug", "REPLUG", "REPLUG's ensemble: one LM pass per passage, next-token distributions mixed by "
           "retrieval score (Shi et al. 2023, 3.2)", model="lm", closed=None, open=("bm25", "blocks"),
           load=_decoder, lm_label="REPLUG ({lm})", options={"retrieval": True, "ensemble": True}),
    System("replug_lsr", "REPLUG LSR", "REPLUG's ensemble over the dense retriever trained by LSR from the LM's "
           "preferences (Shi et al. 2023, 4; rule replug_train_lsr)", model="lm", closed=None,
           open=("encoder", "blocks"), load=_decoder, lm_label="REPLUG LSR ({lm})",
           options={"retrieval": True, "ensemble": True, "retriever": "dense"}, retriever_encoder="replug_lsr"),
    System("densephrases", "DensePhrases", "DensePhrases (Lee et al. 2021): the top phrase of the corpus's phrase "
           "index for the input asked as a question (config densephrases)", model="densephrases", closed=None,
           open=("phrase_dump", "phrase_index"), load=_densephrases,
           note="DensePhrases is trained on question answering about the knowledge tasks' own relations (the "
           "embedded route: reading comprehension on questions generated per relation, query-side fine-tuning on "
           "cloze questions in LAMA T-REx's templates, other subjects than the evaluation's; the paper's route: NQ "
           "and SQuAD), so its numbers are in-distribution, not zero-shot like NPM's and the other rows'. Its own "
           "table (results/tables/densephrases.md) asks all of each task's questions, this table the seeded sample "
           "of evaluation.max_examples (n above): the same model's numbers differ between the two by that sampling."),
)}


def get(name: str) -> System:
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; the registry has {list(SYSTEMS)}")
    return SYSTEMS[name]


def names(closed: bool | None = None) -> list[str]:
    """System names in registry (display) order; ``closed`` keeps those applicable to one task family."""
    return [s.name for s in SYSTEMS.values()
            if closed is None or (s.closed if closed else s.open) is not None]


__all__ = ["ARTEFACTS", "Inputs", "MODELS", "NEGATIVE_CONTROLS", "Output", "SYSTEMS", "System", "get", "names"]
