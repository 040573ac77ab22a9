"""NPM and NPM-single inference (paper 3.1, 3.3, A.3-A.4; paper-map §3.6-§3.8, §4.1).

* ``query``: [MASK][MASK] / [MASK] query encoding with the checks the original lacks.
* ``phrase``: span candidates walked over the reference corpus, span scores and their aggregation.
* ``closed_set``: token votes of the k nearest neighbours and label scores with (fuzzy) verbalizers.
"""
