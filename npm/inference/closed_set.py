"""Closed-set label scores from the k nearest corpus tokens (paper 3.3, A.3-A.4; paper-map §4.1, §9 items 25-26).

Every retrieved neighbour votes for the token id stored at its position with its probability
p = softmax(s / tau) over the neighbour list, s = q . e / sqrt(h) recomputed exactly from the stored vectors;
a label's score is the summed probability of the tokens of its (fuzzy) verbalizer, each id as often as the verbalizer
lists it (the original's ``prob[ids].sum()``); the prediction is the argmax.

* NPM-single: the k neighbours of the one mask vector.
* NPM: the start-query and the end-query neighbours are concatenated (per datastore) under one softmax.
  ``tau_twice=True`` reproduces the original code, which divides the NPM logits by tau twice (s / tau^2);
  the paper (default) divides once (CODE != PAPER, paper-map §4.1 step 3).
"""

from __future__ import annotations

import numpy as np

from npm.settings import Settings


def label_scores(neighbour_ids: np.ndarray, sims: np.ndarray, verbalizers: list[np.ndarray], tau: float,
                 tau_twice: bool = Settings.tau_twice) -> np.ndarray:
    """Scores float64 [n_labels] of one query; ``neighbour_ids`` / ``sims`` [K] list every neighbour (start and
    end lists concatenated for NPM), ``verbalizers[l]`` the token ids of label l."""
    logits = np.asarray(sims, dtype=np.float64) / (tau * tau if tau_twice else tau)
    if len(logits) == 0:
        raise ValueError("no neighbour to vote: the datastore returned nothing for this query")
    p = np.exp(logits - logits.max())
    p /= p.sum()
    size = max([int(np.max(neighbour_ids)), *(int(np.max(w, initial=0)) for w in verbalizers)]) + 1
    mass = np.bincount(neighbour_ids, weights=p, minlength=size)  # probability per token id
    return np.array([mass[words].sum() for words in verbalizers])  # ids as listed: a repeated one counts again
