"""DensePhrases (Lee et al. 2021): phrase retrieval with start/end token vectors (docs/paper-map.md §D)."""
