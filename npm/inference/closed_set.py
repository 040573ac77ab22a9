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
    tokens, where = np.unique(np.asarray(neighbour_ids), return_inverse=True)
    mass = np.bincount(where.ravel(), weights=p, minlength=len(tokens))  # probability per retrieved token
    out = []
    for words in verbalizers:  # summed over the verbalizer's ids as listed: a repeated id counts again (original)
        at = np.minimum(np.searchsorted(tokens, words), len(tokens) - 1)
        out.append(mass[at][tokens[at] == words].sum())
    return np.array(out)
