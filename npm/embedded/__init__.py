"""The embedded default's demo-data builders (README.md; docs/paper-map.md §2.1, §4.2, §5.1, §D1.3): real data that
installs from PyPI, written in the paper scale's own formats so that the same readers and loaders take it.

* ``corpora``: the Wikipedia leads as MediaWiki XML exports (2019, and 2022 with the GENERATED changed facts of
  ``facts_2022.yaml``) and news as CC-News records.
* ``reviews``: real movie and drug reviews as a KILT knowledge source.
* ``tasks``: a small set of every evaluation task in the task's own file format.
* ``rc``: DensePhrases' reading-comprehension set (SQuAD v1.1) and its cloze questions.

Only the CLI (npm.cli) and the workflow use these builders; no other module of npm imports this package (a test in
tests/test_systems.py checks), so the domain packages never depend on the demo's data.
"""
