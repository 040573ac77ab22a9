"""Evaluation tasks (paper 4, A.2; reference npm.md 4.2, 5.1-5.2; section 9 items 27-30).

* ``metrics``: answer normalisation, exact match, the LAMA n-gram bucket, seed-0 subsampling and averaging.
* ``templates``: detokenisation, closed-set templates and label words, open-set templates, fuzzy verbalizers.
"""
