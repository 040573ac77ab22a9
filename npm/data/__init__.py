"""Data stages: raw sources -> documents -> shards -> blocks -> batches (paper-map §2.1)."""
