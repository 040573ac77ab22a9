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

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npm.inference.closed_set import label_scores


def union_knn(predictors: Sequence, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour token ids and exact scores of every datastore, concatenated (the original's DataStoreUnion)."""
    if not predictors:
        raise ValueError("closed-set scoring needs at least one datastore (predictor)")
    ids, sims = zip(*(p.knn(text) for p in predictors), strict=True)
    return np.concatenate(ids), np.concatenate(sims)


def closed_set_scores(predictors: Sequence, text: str, verbalizers: list[np.ndarray], tau: float,
                      tau_twice: bool = False) -> np.ndarray:
    """Label scores float64 [n_labels] over the union of the predictors' datastores: one softmax over all their
    neighbours (paper-map §4.1 steps 2-5). ``tau_twice`` applies to NPM only (§4.1 step 3)."""
    kinds = {p.kind for p in predictors}
    if len(kinds) > 1:
        raise ValueError(f"predictors of different kinds {sorted(kinds)} cannot be scored together")
    ids, sims = union_knn(predictors, text)
    return label_scores(ids, sims, verbalizers, tau=tau, tau_twice=tau_twice and kinds == {"npm"})


class NpmScorer:
    """Systems npm, npm_single and npm_faiss of ``npm.evaluation.systems``: one ``Predictor`` per datastore."""

    def __init__(self, system, inputs, settings):
        from npm.inference.predictor import Predictor

        self.settings, self.mode = settings, system.options.get("mode", "restricted")
        self.kind = system.model
        faiss = inputs.faiss or [None] * len(inputs.datastore)
        bm25 = inputs.bm25 or [None] * len(inputs.datastore)
        self.predictors = [
            Predictor(inputs.model, d, kind=self.kind, bm25=b, faiss=f, tau=settings.open_set_tau,
                      form=settings.span_score, k=settings.k, n_blocks=settings.restricted_blocks,
                      device=inputs.device)
            for d, f, b in zip(inputs.datastore, faiss, bm25, strict=True)
        ]
        first = self.predictors[0]
        self.tokenizer, self.tasks_root = first.tokenizer, inputs.tasks_root
        self.info = {
            "model": str(inputs.model), "datastores": list(inputs.datastore), "k": settings.k,
            "corpus": inputs.corpus or "+".join(Path(d).name for d in inputs.datastore),
            "corpus_tokens": sum(p.ds.n_tokens for p in self.predictors),
            "parameters": sum(p.numel() for p in first.model.parameters()),
            "device": str(next(first.model.parameters()).device),
        }

    def closed_set(self, task, examples, progress=None):
        from npm.tasks.registry import label_verbalizers

        s = self.settings
        verbalizers = label_verbalizers(task, self.tokenizer, self.tasks_root, fuzzy=s.fuzzy_verbalizers)
        scores = []
        for ex in examples:
            scores.append(closed_set_scores(self.predictors, ex["input"], verbalizers, tau=s.closed_set_tau,
                                            tau_twice=s.tau_twice))
            if progress:
                progress(1)
        scores = np.stack(scores)
        return dict(scores=scores, metrics={"retrieval": "faiss", "tau": s.closed_set_tau,
                                              "tau_twice": bool(s.tau_twice and self.kind == "npm")})

    def open_set(self, task, examples, progress=None):

        if len(self.predictors) != 1:
            raise ValueError(f"open-set task {task.name} is evaluated on one datastore, got {len(self.predictors)}")
        predictor = self.predictors[0]
        predictor.l_max = task.l_max or predictor.l_max
        answers = []
        for ex in examples:
            top = predictor.predict(ex["input"], top=1, mode=self.mode, is_question=task.is_question)
            answers.append(top[0]["text"] if top else "")
            if progress:
                progress(1)
        return dict(answers=answers, metrics={"retrieval": "faiss" if self.mode == "faiss" else "bm25",
                                                "tau": self.settings.open_set_tau})


__all__ = ["NpmScorer", "closed_set_scores", "union_knn"]
