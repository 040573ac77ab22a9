# Input functions and names of the rules in replug.smk (included at its top), out of its rules for `snakemake --lint`.
# REPLUG's dense retriever (config replug.encoder; default model.encoder, which reads the corpus's own blocks).
REPLUG_ENCODER = REPLUG.get("encoder") or config["model"]["encoder"]


def replug_blocks(corpus):
    """Blocks files of a corpus for REPLUG's retriever and the retrievers LSR trains from it (replug_tokenize_blocks
    when that retriever is not model.encoder)."""
    return encoder_blocks(corpus, REPLUG_ENCODER, "data/replug/blocks")
