"""Evaluation tasks (paper 4, A.2; paper-map §4.2, §5.1-§5.2; §9 items 27-30).

* ``metrics``: answer normalisation, exact match, the LAMA n-gram bucket, seed-0 subsampling and averaging.
* ``templates``: detokenisation, closed-set templates and label words, open-set templates, fuzzy verbalizers.
* ``loaders``: one reader per file format of docs/task-formats.md (local files only).
* ``registry``: config/tasks.yaml (load_registry) and the sampled, templated examples of a task (task_examples).
* ``embedded``: the embedded default's small evaluation sets, written in those formats.
"""
