# Input functions and names of the rules in index.smk (included at its top), out of its rules for `snakemake --lint`.
def retrieval_targets():
    """Datastore, FAISS index and BM25 index of every reference corpus, for both models."""
    corpora = config["evaluation"]["reference_corpora"]
    return (
        expand("data/datastore/{model}/{corpus}/meta.json", model=MODELS, corpus=corpora)
        + expand("data/index/{model}/{corpus}.faiss", model=MODELS, corpus=corpora)
        + expand("data/bm25/{corpus}", corpus=corpora)
    )
