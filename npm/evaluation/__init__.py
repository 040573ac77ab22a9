"""Zero-shot evaluation (paper 4-6; docs/paper-map.md §4-§6): one harness and a registry of systems.

* ``systems``: ``SYSTEMS``, the one place that names the evaluated systems, what each needs and how it is loaded.
* ``npm.settings.Settings`` (one level down, shared with inference): every switch with its one default.
* ``harness``: ``evaluate(task, system, inputs, settings)``: sample, run, score, time, write with provenance.
* ``cli``: ``npm-repro evaluate``.
"""
