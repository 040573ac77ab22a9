"""REPLUG (Shi et al. 2023) as its own system: language-modelling evaluation with the ensemble
(docs/paper-map.md §R3)."""
