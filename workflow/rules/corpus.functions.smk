# Input functions and names of the rules in corpus.smk (included at its top), out of its rules for `snakemake --lint`.
import logging
import sys

from snakemake.logging import logger as snakemake_logger
from snakemake_interface_logger_plugins.common import LogEvent


def datastore_dir(wildcards):
    """The datastore folder of a job's model and corpus (its files are the outputs of the three rules below)."""
    return f"data/datastore/{wildcards.model}/{wildcards.corpus}"


# ---------------------------------------------------------------------------------------- datastore disk cost
# Each datastore holds one fp16 vector per stored token (paper-map §3.3): at most tokens x hidden x 2 bytes. The main
# process (a dry run too) states the cost of every datastore that the requested targets' DAG holds (its embed_corpus
# jobs, done or to do), from the sources' `tokens` (approximate, for this estimate) or the plan of a datastore already
# planned, so that a user sees what a target, system or corpus adds (an NPM-single open-set datastore of Wikipedia:
# another ~1.5 TB). The DAG exists only once built, and `onstart` does not run on dry runs: the lines are printed when
# Snakemake logs the DAG's job stats (LogEvent.RUN_INFO), which it does once the DAG is built, -n included.
def _hidden_size(model):
    """Hidden size of a model's checkpoint where it is on disk (else None: a hub id not downloaded yet)."""
    for name in (*model_input(model), config["model"]["encoder"]):
        try:
            folder = Path(resolve_package_path(name))
        except FileNotFoundError:
            continue
        if (folder / "config.json").is_file():
            return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("hidden_size")
    return None


def datastore_cost_lines(datastores):
    """One line per datastore (model, corpus) of ``datastores`` (name, tokens, GB; from its plan, or its source's
    `tokens`), one for those of unknown size, and the total of the known ones."""
    lines, unknown, total = [], [], 0
    for model, corpus in datastores:
        plan = Path(f"data/datastore/{model}/{corpus}/plan.json")
        if plan.is_file():
            record = json.loads(plan.read_text(encoding="utf-8"))
            tokens, hidden, how = record["n_rows"], record["hidden_size"], "planned: vectors"
        else:
            base = subsample_of(corpus)
            tokens = source(base[0] if base else corpus).get("tokens")
            if not tokens:
                unknown.append(f"{model}/{corpus}")
                continue
            tokens = tokens * base[1] // 100 if base else tokens
            hidden = _hidden_size(model)
            how = "at most" if hidden else "at most; hidden size 1024 assumed: checkpoint not downloaded yet"
            hidden = hidden or 1024
        size = tokens * hidden * 2
        total += size
        lines.append(f"  data/datastore/{model}/{corpus}: {tokens:,} tokens, {size / 1e9:,.1f} GB  ({how})")
    if unknown:
        lines.append(f"  size unknown until planned (no `tokens` in the source): {', '.join(unknown)}")
    lines.append(f"  total: {total / 1e9:,.1f} GB" + (" known" if unknown else ""))
    return lines


class DatastoreCosts(logging.Handler):
    """Prints the datastores of the built DAG with their disk cost, once, at the first job stats Snakemake logs."""

    def emit(self, record):
        if getattr(record, "event", None) != LogEvent.RUN_INFO:
            return
        snakemake_logger.removeHandler(self)
        jobs = [job for job in workflow.dag.jobs if job.rule.name == "embed_corpus"]
        datastores = sorted({(job.wildcards.model, job.wildcards.corpus) for job in jobs})
        if datastores:
            print(
                "npm-repro: datastores the requested targets build (fp16 vectors):",
                *datastore_cost_lines(datastores),
                sep="\n",
                file=sys.stderr,
            )


if workflow.is_main_process:
    snakemake_logger.addHandler(DatastoreCosts())
