"""npm-repro: a reproduction of Nonparametric Masked Language Modeling (Min et al., 2023).

Every Snakemake rule calls one small entry point of this package (see ``npm.cli``). The Python API of the
trained models is ``npm.Predictor``::

    import npm
    p = npm.Predictor.from_config("npm", "enwiki")   # the workflow's model, datastore and indexes under "."
    p.predict_batch(["Bratislava is the capital of <mask>."], top=3)   # [[{"text", "score", "evidence", ...}]]
"""

__version__ = "0.1.0"


def __getattr__(name):
    """``npm.Predictor`` (the Python API of ``npm-repro predict``: ``from_config``, ``predict``, ``predict_batch``),
    imported on first use: torch and transformers load only when it is asked for."""
    if name == "Predictor":
        from npm.inference.predictor import Predictor  # deferred: loads torch and transformers

        return Predictor
    raise AttributeError(f"module 'npm' has no attribute {name!r}")
