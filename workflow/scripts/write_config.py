"""Write the resolved configuration of this run (rule resolved_config) with its provenance, atomically."""

import yaml

from npm.io import atomic_path, provenance

record = {"config": dict(snakemake.params.config), "provenance": provenance()}  # noqa: F821 (Snakemake script)
with atomic_path(snakemake.output[0]) as tmp:  # noqa: F821
    tmp.write_text(yaml.safe_dump(record, sort_keys=False, allow_unicode=True), encoding="utf-8")
