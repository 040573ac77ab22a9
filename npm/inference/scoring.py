"""NPM and NPM-single as evaluated systems (paper 3.3, 4-5; docs/paper-map.md §3.7-§3.8, §4.1, §5.2).

* Closed set (§4.1): every datastore of the reference corpus is searched separately with k neighbours per query
  vector (start and end vectors for NPM); the neighbour token ids and exact scores q . e / sqrt(h) are concatenated
  across datastores (the original's ``DataStoreUnion``) and go through **one** softmax
  (``npm.inference.closed_set.label_scores``, ``closed_set_tau``; ``tau_twice`` = the original code's s / tau^2,
  NPM only). A label's score is the probability mass of its verbalizer tokens (the fuzzy verbalizer when the task
  has one and ``fuzzy_verbalizers`` is on).
* Open set (§3.7-§3.8): the top phrase of ``Predictor.predict(text, top=1)``, restricted to the BM25 top
  ``restricted_blocks`` blocks; system ``npm_faiss`` (option ``mode="faiss"``) searches the whole datastore instead,
  the paper's 6.4 ablation without sparse retrieval.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npm.datastore.faiss_index import sidecar_path
from npm.inference.closed_set import label_scores
from npm.settings import Settings
from npm.tasks.registry import label_verbalizers


def union_knn(predictors: Sequence, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per query, the neighbour token ids and exact scores of every datastore, concatenated in predictor order (the
    original's DataStoreUnion). The queries are encoded once (the predictors share one model) and each datastore
    is searched once for all of them."""
    if not predictors:
        raise ValueError("closed-set scoring needs at least one datastore (predictor)")
    vectors = predictors[0].encode(list(texts))
    per_store = [p.knn_vectors(vectors) for p in predictors]
    return [(np.concatenate([s[i][0] for s in per_store]), np.concatenate([s[i][1] for s in per_store]))
            for i in range(len(texts))]


def closed_set_scores(predictors: Sequence, texts: Sequence[str], verbalizers: list[np.ndarray], tau: float,
                      tau_twice: bool = Settings.tau_twice) -> np.ndarray:
    """Label scores float64 [n, n_labels] of a batch of queries over the union of the predictors' datastores: one
    softmax over all their neighbours per query (paper-map §4.1 steps 2-5). ``tau_twice`` applies to NPM only
    (§4.1 step 3)."""
    if isinstance(texts, str):
        raise TypeError("closed_set_scores takes a list of queries")
    models = {p.model for p in predictors}
    if len(models) > 1:
        raise ValueError(f"predictors of different models {sorted(models)} cannot be scored together")
    if len({p.ds.meta.get("model_fingerprint") for p in predictors}) > 1:
        raise ValueError("the datastores of one closed-set union were embedded by different models: "
                         + ", ".join(str(p.ds.root) for p in predictors))
    return np.stack([label_scores(ids, sims, verbalizers, tau=tau, tau_twice=tau_twice and models == {"npm"})
                     for ids, sims in union_knn(predictors, texts)]).reshape(len(texts), len(verbalizers))


class NpmScorer:
    """Systems npm, npm_single and npm_faiss of ``npm.evaluation.systems``: one ``Predictor`` per datastore."""

    def __init__(self, system, inputs, settings):
        from npm.inference.predictor import Predictor  # deferred: loads torch

        self.settings, self.mode = settings, system.options.get("mode", "restricted")
        self.model = system.model
        faiss = inputs.faiss or [None] * len(inputs.datastore)
        bm25 = inputs.bm25 or [None] * len(inputs.datastore)
        self.predictors = [Predictor(inputs.checkpoint, d, self.model, settings, bm25=b, faiss=f, device=inputs.device)
                           for d, f, b in zip(inputs.datastore, faiss, bm25, strict=True)]
        if inputs.control == "shuffled_vectors":  # negative control: a working NPM must fall to chance
            for p in self.predictors:
                p.ds.shuffle_vectors(seed=0)
        elif inputs.control is not None:
            raise ValueError(f"unknown negative control {inputs.control!r}")
        first = self.predictors[0]
        self.tokenizer, self.tasks_root = first.tokenizer, inputs.tasks_root
        self.info = {
            "model": str(inputs.checkpoint), "datastores": list(inputs.datastore), "k": settings.k,
            "corpus": inputs.corpus or "+".join(Path(d).name for d in inputs.datastore),
            "corpus_tokens": sum(p.ds.n_tokens for p in self.predictors),
            "parameters": sum(p.numel() for p in first.encoder.parameters()),
            "device": str(next(first.encoder.parameters()).device), "negative_control": inputs.control,
            # the datastore settings where the paper and the original code differ (the tables' footers)
            "embedding_precision": _one(p.ds.meta.get("precision") for p in self.predictors),
            "faiss_metric": _one(_faiss_record(f).get("metric") for f in inputs.faiss) if inputs.faiss else None,
        }

    def closed_set(self, task, examples, progress=None):
        s = self.settings
        verbalizers = label_verbalizers(task, self.tokenizer, self.tasks_root, fuzzy=s.fuzzy_verbalizers)
        scores = []
        for batch in _batches(examples, self.predictors[0].batch_size):
            scores.append(closed_set_scores(self.predictors, [ex["input"] for ex in batch], verbalizers,
                                            tau=s.closed_set_tau, tau_twice=s.tau_twice))
            if progress:
                progress(len(batch))
        scores = np.concatenate(scores)
        return dict(scores=scores, metrics={"retrieval": "faiss", "tau": s.closed_set_tau,
                                              "tau_twice": bool(s.tau_twice and self.model == "npm")})

    def open_set(self, task, examples, progress=None):

        if len(self.predictors) != 1:
            raise ValueError(f"open-set task {task.name} is evaluated on one datastore, got {len(self.predictors)}")
        predictor = self.predictors[0]
        predictor.l_max = task.l_max or predictor.l_max
        answers = []
        for batch in _batches(examples, predictor.batch_size):
            tops = predictor.predict_batch([ex["input"] for ex in batch], top=1, mode=self.mode,
                                           is_question=task.is_question)
            answers += [top[0]["text"] if top else "" for top in tops]
            if progress:
                progress(len(batch))
        return dict(answers=answers, metrics={"retrieval": "faiss" if self.mode == "faiss" else "bm25",
                                                "tau": self.settings.open_set_tau})


def _one(values):
    """The one value of ``values``, or the sorted list of the distinct ones."""
    found = sorted({str(v) for v in values if v is not None})
    return found[0] if len(found) == 1 else (found or None)


def _faiss_record(path) -> dict:
    """The sidecar record of a FAISS index (npm.datastore.faiss_index), {} where it has none."""
    try:
        return json.loads(sidecar_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _batches(items: Sequence, size: int):
    for a in range(0, len(items), size):
        yield items[a:a + size]


__all__ = ["NpmScorer", "closed_set_scores", "union_knn"]
