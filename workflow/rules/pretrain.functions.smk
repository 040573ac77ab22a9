# Input functions and names of the rules in pretrain.smk (included at its top), out of its rules for `snakemake --lint`.
# The masked batches each model trains on (data.smk masked_batches).
MASKING_OF_MODEL = {"npm": "span", "npm_single": "uniform", "mlm": "span"}  # mlm: NPM's batch lines, unmasked view


def training_shards(model):
    """(blocks, masked batches) of every training shard, in the same order, for ``model``."""
    mode = MASKING_OF_MODEL[model]
    blocks, masked = [], []
    for corpus in config["training_corpora"]:
        blocks += expand("data/blocks/{corpus}/shard{shard}.npz", corpus=corpus, shard=shard_ids(corpus))
        masked += masked_batches(corpus, mode)
    return blocks, masked


def torch_launcher(wildcards):
    """`npm-repro` for one process; torchrun with one process per GPU of the node otherwise."""
    gpus = TRAINING.gpus_per_node
    if gpus == 1:
        return "npm-repro"
    return f"torchrun --standalone --nproc_per_node {gpus} -m npm.cli"
