"""Data stages: raw sources -> documents -> shards -> blocks -> batches (reference npm.md section 2.1)."""
