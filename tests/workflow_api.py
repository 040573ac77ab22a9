"""Run the Snakefile through Snakemake's Python API (used by the end-to-end tests)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.cpus import on_whole_machine

ROOT = Path(__file__).resolve().parent.parent


def run_workflow(workdir: Path, targets: list[str], config: dict | None = None, configfile: Path | None | bool = None,
                 dryrun: bool = False, cores: int = 2) -> None:
    """Execute (or dry-run) ``targets`` of the repository's Snakefile with ``workdir`` as working directory, its jobs
    side by side on the whole machine (tests/cpus.py)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        OutputSettings,
        ResourceSettings,
        StorageSettings,
    )

    # Rules call the `npm-repro` console script of this environment.
    bindir = str(Path(os.sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    # configfile=False: none, so that the Snakefile picks its default (and the working directory's config/config.yaml).
    configfiles = [] if configfile is False else [configfile or ROOT / "config" / "config.yaml"]
    with on_whole_machine(), SnakemakeApi(OutputSettings(quiet=None, printshellcmds=True,
                                                         show_failed_logs=True)) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=cores),
            config_settings=ConfigSettings(config=config or {}, configfiles=configfiles),
            storage_settings=StorageSettings(),
            snakefile=ROOT / "Snakefile",
            workdir=workdir,
        )
        dag = workflow.dag(DAGSettings(targets=targets))
        dag.execute_workflow(executor="dryrun" if dryrun else "local")
