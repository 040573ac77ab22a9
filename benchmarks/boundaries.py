"""Measurement: how much the two word-boundary rules differ with roberta-large's vocabulary (paper-map §3.2, §2.2).

``data.word_boundaries: text`` reads each token's place in the source text; ``code`` (the paper routes') decodes each
vocabulary id on its own, as the original code did (``npm.boundaries``). On the demo's reference corpus (the embedded
Wikipedia leads of config/config.yaml's ``enwiki``, built as the workflow builds them, tokenized with roberta-large,
one shard, no shuffle) this script reports, per rule: the valid starts and ends, the stored vectors (their union,
``stored_mask``), the tokens that may start a masked span (``npm.masking.span_starts``), the tokenization time; and
where the rules disagree, with the most frequent tokens involved.

Writes results/benchmarks/boundaries.json with provenance (``npm.io.write_summary``). It measures; it asserts nothing.

    .venv/bin/python benchmarks/boundaries.py [--vocab /path/to/roberta-large] [--max-articles 2000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import yaml
from stopwords import roberta_tokenizer  # this folder's script: roberta-large's tokenizer from its vocab files

from npm.boundaries import SPECIAL, valid_ends, valid_starts
from npm.data.blocks import build_blocks, load_blocks
from npm.data.documents import extract_documents
from npm.datastore.store import stored_mask
from npm.embedded.corpora import prepare_embedded_wikipedia
from npm.io import write_summary
from npm.masking import span_starts

ROOT = Path(__file__).resolve().parents[1]
RULES = ("text", "code")


def classes(blocks: dict) -> dict[str, np.ndarray]:
    """Bool [T] per class of a blocks file: valid starts, valid ends, stored vectors, span starts."""
    ids, flags, bo = blocks["input_ids"], blocks["flags"], blocks["block_offsets"]
    return {"valid_starts": valid_starts(flags, bo), "valid_ends": valid_ends(flags, bo),
            "stored_vectors": stored_mask(ids, flags, bo), "span_starts": span_starts(flags, np.diff(bo))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default=str(ROOT / "tests" / "data" / "roberta-large"),
                        help="folder (or pypi:PACKAGE/SUBDIR) with roberta-large's vocab.json and merges.txt "
                             "(default: the test data, tests/data/roberta-large/SOURCE.md)")
    demo = yaml.safe_load((ROOT / "config" / "config.yaml").read_text(encoding="utf-8"))
    parser.add_argument("--max-articles", type=int, default=demo["embedded"]["max_articles"],
                        help="Wikipedia leads of the demo's enwiki (default: config/config.yaml embedded.max_articles)")
    parser.add_argument("--max-seq-length", type=int, default=256, help="block length (paper-map §2.1: 256)")
    parser.add_argument("--top", type=int, default=15, help="most frequent disagreeing tokens listed per class")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/boundaries.json"))
    args = parser.parse_args()

    blocks, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok = roberta_tokenizer(args.vocab, tmp / "tokenizer")
        prepare_embedded_wikipedia(tmp / "wiki.xml.bz2", max_articles=args.max_articles)
        extract_documents("mediawiki", tmp / "wiki.xml.bz2", tmp / "docs.jsonl.gz")
        for rule in RULES:
            start = time.perf_counter()
            build_blocks(tmp / "docs.jsonl.gz", tmp / f"{rule}.npz", str(tmp / "tokenizer"),
                         max_seq_length=args.max_seq_length, word_boundaries=rule)
            seconds[rule] = round(time.perf_counter() - start, 2)
            blocks[rule] = load_blocks(tmp / f"{rule}.npz")
    ids = blocks["text"]["input_ids"]
    assert np.array_equal(ids, blocks["code"]["input_ids"])  # the rule changes flags only
    counted = int(((blocks["text"]["flags"] & SPECIAL) == 0).sum())
    got = {rule: classes(blocks[rule]) for rule in RULES}
    result = {"corpus": {"source": "config/config.yaml enwiki (embedded Wikipedia leads)",
                         "max_articles": args.max_articles, "max_seq_length": args.max_seq_length,
                         "blocks": len(blocks["text"]["block_offsets"]) - 1, "tokens": len(ids),
                         "non_special_tokens": counted},
              "tokenize_seconds": seconds, "classes": {}}
    for name in got["text"]:
        text, code = got["text"][name], got["code"][name]
        only_text, only_code = np.flatnonzero(text & ~code), np.flatnonzero(code & ~text)
        top = Counter(tok.convert_ids_to_tokens(ids[np.r_[only_text, only_code]].tolist())).most_common(args.top)
        result["classes"][name] = {
            "text": int(text.sum()), "code": int(code.sum()), "only_text": len(only_text), "only_code": len(only_code),
            "disagreements_per_1000_tokens": round(1000 * (len(only_text) + len(only_code)) / max(counted, 1), 3),
            "top_tokens": [{"token": t, "count": c} for t, c in top]}
    write_summary(args.out, result, vars(args) | {"out": str(args.out)})
    print(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
