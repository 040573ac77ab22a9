"""npm-repro: a reproduction of Nonparametric Masked Language Modeling (Min et al., 2023).

Every Snakemake rule calls one small entry point of this package (see ``npm.cli``).
"""

__version__ = "0.1.0"
