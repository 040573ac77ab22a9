"""Reference-corpus datastore: flat token arrays, fp16 vectors, BM25 and FAISS indexes (paper-map §3)."""
