"""Benchmark: NPM inference speed on a built embedded world (`make demo` outputs): queries/s of open-set NPM
(BM25-restricted and unrestricted FAISS) and closed-set kNN scoring (k = 4096 over the union of the enwiki and
cc_news datastores, as AGN in the tables), at batch sizes 1, 16 and 64 and threads 1 and 2, with the share of time
spent encoding queries, searching and scoring, the encoder-only rate (the floor), peak memory and the datastore's
RAM / disk per token.

Queries are the embedded tasks' real inputs (open set: LAMA T-REx, Google-RE, KAMEL, NQ, TriviaQA; closed set:
AGN). Each (threads) setting runs in a fresh process (`--threads` sets npm.threads's policy), so that thread pools
and peak memory are its own; BM25 hits are not cached across repetitions. Writes
results/benchmarks/predict-<device>.json. It measures; it asserts nothing.

Closed set against the original (issue 42, ``closed_vs_original``): NPM over the enwiki and cc_news datastores and
NPM-single over its own two, the project's scoring (an exact search in torch over the Flat index,
``npm.datastore.exact_knn``) against a stand-in of the original's algorithm (``original_closed_set``: one example at
a time, as the original has no batched path; a masked-LM forward with its logits and hidden states; one FAISS Flat
search per query vector and datastore at the same k with FAISS's own settings; a Python token lookup per neighbour),
in the same process on the same encoder weights, datastores and queries, at each batch size of the project's (the
original's time does not depend on it): medians of interleaved runs, the ratio, and how many predictions agree.
``encoder_floor`` is the ratio the project would reach if its search and scoring took no time: the original's time
over the project's encoder pass alone.

Open set against the original (``open_vs_original``): BM25-restricted NPM over enwiki, the project's batched span
search against a stand-in of the original's ``predict_span`` (``original_open_set``: one example at a time, a
masked-LM forward, one BM25 search per query, the spans walked and scored in Python dicts), both with the code's span
score, the same way: medians of interleaved runs, the ratio, the agreeing predictions and the encoder floor.

    .venv/bin/python benchmarks/predict.py [--root .] [--threads 1 2] [--batch-sizes 1 16 64]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

OPEN_TASKS = ("lama_trex", "lama_google_re", "kamel", "nq", "triviaqa")
CLOSED_TASK = "agn"


def _queries(predictor, tasks, root: Path, n: int) -> list[str]:
    from npm.tasks.registry import task_examples

    out = []
    for t in tasks:
        out += [e["input"] for e in task_examples(t, root / "data" / "tasks" / t, n_samples=0,
                                                  tokenizer=predictor.tokenizer)]
    return out[:n]


class Clock:
    """Seconds spent per stage, by wrapping the Predictor's stage methods."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def wrap(self, obj, name: str, stage: str):
        inner = getattr(obj, name)

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t

        setattr(obj, name, timed)


def _run(fn, queries: list[str], batch: int, clock: Clock, clear) -> dict:
    clock.seconds.clear()
    clear()
    t = time.perf_counter()
    for a in range(0, len(queries), batch):
        fn(queries[a:a + batch])
    seconds = time.perf_counter() - t
    shares = {k: round(v / seconds, 3) for k, v in clock.seconds.items()}
    shares["scoring"] = round(max(0.0, 1 - sum(shares.values())), 3)
    return {"queries": len(queries), "seconds": round(seconds, 3), "queries_per_s": round(len(queries) / seconds, 1),
            "share": shares}


def original_closed_set(predictors, texts: list[str], verbalizers, tau: float, mlm):
    """The stand-in of the original's closed-set scoring (issue 42), which has no batched path: one example at a time
    (facebookresearch/NPM ``npm/npm_single.py`` ``evaluate`` loops over the examples; ``npm/model.py`` ``Model.forward``
    asserts a single sequence). Per example: one forward of the masked-LM model (``mlm``, from ``_masked_lm``: the
    project's encoder weights under a masked-LM head) with its logits over every position and all hidden states, as the
    original's ``forward``; the query vectors from the final hidden layer at the mask(s); per query vector (the start,
    then the end for NPM: ``npm/npm.py`` ``get_all_scores``) one FAISS Flat search per datastore at the same k with
    FAISS's own settings (the original sets no BLAS threshold; ``npm/dstore.py`` ``DataStoreUnion``); the exact scores
    from the stored vectors; each neighbour's token looked up one at a time in Python; one softmax over all the
    neighbours (``label_scores``). Label scores float64 [n, n_labels]."""
    import numpy as np
    import torch

    from npm.datastore.faiss_index import exact_scores
    from npm.inference.closed_set import label_scores
    from npm.inference.query import query_ids

    first = predictors[0]
    n_masks = 2 if first.model == "npm" else 1
    out = []
    for text in texts:
        ids, pos = query_ids(first.tokenizer, text, n_masks)
        with torch.inference_mode():
            outputs = mlm(torch.from_numpy(ids)[None], output_hidden_states=True, return_dict=True)
        vectors = outputs.hidden_states[-1][0, pos:pos + n_masks].float().numpy()
        tokens, sims = [], []
        for v in vectors:
            for p in predictors:
                _, rows = p._faiss_index().search(v[None], min(p.settings.k, p.ds.n_rows))
                sims.append(exact_scores(v[None], rows, p.ds.vectors)[0])
                row_tokens = p.ds.row_tokens
                tokens.append(np.array([int(row_tokens[r]) for r in rows[0]]))
        out.append(label_scores(np.concatenate(tokens), np.concatenate(sims), verbalizers, tau=tau))
    return np.stack(out)


def _masked_lm(encoder):
    """A masked-LM model around ``encoder`` (the same weights), as the original loads (``AutoModelForMaskedLM``):
    its head costs what the original's does; its logits are computed and not used, as in the original's closed set."""
    from transformers import AutoModelForMaskedLM

    mlm = AutoModelForMaskedLM.from_config(encoder.config)
    setattr(mlm, mlm.base_model_prefix, encoder)
    return mlm.eval()


class OriginalLayout:
    """What the original's open-set ``DataStore`` (facebookresearch/NPM ``npm/dstore.py``) holds in memory after it
    loads, built from the predictor's datastore before any query is timed: per block its token ids (a list) and its
    valid start and end positions (numpy uint8 arrays of positions in the block, stop words removed), and per
    embedding index (the stored non-stop-word vectors, in corpus order) its block, its position in the block
    (``token_idx_to_block_idx`` / ``token_idx_to_local_idx``) and its datastore row; ``offsets[b]`` is block b's
    first embedding index (``orig_block_idx_to_emb_token_idx``)."""

    def __init__(self, predictor):
        import numpy as np

        view = predictor._view(np.arange(predictor.ds.n_blocks))
        cuts = view["offsets"]
        blocks = list(zip(cuts[:-1], cuts[1:], strict=True))
        self.input_ids = [view["ids"][a:e].tolist() for a, e in blocks]
        local = np.arange(len(view["ids"])) - cuts[view["block"]]
        self.valid_start = [local[a:e][view["valid_start"][a:e]].astype(np.uint8) for a, e in blocks]
        self.valid_end = [local[a:e][view["valid_end"][a:e]].astype(np.uint8) for a, e in blocks]
        emb = np.flatnonzero(view["rows"] >= 0)
        self.token_idx_to_block_idx = view["block"][emb]
        self.token_idx_to_local_idx = local[emb].astype(np.uint8)
        self.rows = view["rows"][emb]
        self.offsets = np.searchsorted(emb, cuts).tolist()
        self.specials = list(predictor.tokenizer.all_special_ids)
        stop = np.zeros(len(predictor.tokenizer), bool)
        stop[predictor.ds.stopword_ids] = True
        self.stopword_mask = stop  # the original's get_stopword_mask()

    def token_position(self, token_idx: int, ngram_before: int = 1, ngram_after: int = 1):
        """The original's ``_get_token_position``: (block, positions, token ids) of the tokens from an embedding
        index forward (or backward) up to a special token, at most ``ngram_after`` (``ngram_before``) of them."""
        import numpy as np

        block_i, token_i = self.token_idx_to_block_idx[token_idx], int(self.token_idx_to_local_idx[token_idx])
        input_ids = self.input_ids[block_i]
        assert token_i < len(input_ids)
        token_range = [token_i]
        if ngram_before == 1:
            for j in range(token_i + 1, min(len(input_ids), token_i + ngram_after)):
                if input_ids[j] in self.specials:
                    break
                token_range.append(j)
        else:
            for j in range(token_i - 1, max(0, token_i - ngram_before + 1), -1):
                if input_ids[j] in self.specials:
                    break
                token_range = [j] + token_range
        assert np.all([i + 1 == j for i, j in zip(token_range, token_range[1:], strict=False)])
        return block_i, token_range, [input_ids[i] for i in token_range]


def original_open_set(predictor, texts: list[str], mlm, layout: OriginalLayout) -> list[str]:
    """The stand-in of the original's open-set evaluation (facebookresearch/NPM ``npm/npm.py`` ``evaluate_open`` and
    ``predict_span``, restricted mode, as every open-set result; paper-map §3.7), one example at a time as the original,
    over ``layout`` (its loaded datastore): a masked-LM forward (``mlm``, from ``_masked_lm``) with its logits and
    hidden states, q_start and q_end at the two masks; the BM25 top blocks of the query searched alone
    (``Predictor.retrieve_blocks``: the same Lucene index and query string); every embedding index of those blocks a
    start and an end candidate and its exact scores; per candidate its token positions
    (``OriginalLayout.token_position``) and a walk that tests each position against the block's valid starts and ends
    (numpy arrays) and each span with the stop-word check ``np.sum(mask[tokens]) == 0``, into sets and a dict from index
    pair to token tuple; a softmax per side over all candidates at ``open_set_tau`` and the span score P_start + P_end
    (the code's form) looked up in dicts; the scores gathered per token tuple in a ``defaultdict(list)`` and the best
    one taken with ``min`` over ``-np.sum(x) * len(x) ** alpha`` for each of the original's alphas (0, 0.5, 1; 0 is the
    reported one). Returns the phrase of alpha 0 for each text as the project's surface text of its best occurrence
    (empty: none)."""
    from collections import defaultdict

    import numpy as np
    import torch

    from npm.inference.phrase import softmax
    from npm.inference.query import query_ids

    p, lay, out = predictor, layout, []
    tau, l_max = p.settings.open_set_tau, p.l_max

    def valid_func(tokens):
        return np.sum(lay.stopword_mask[tokens]) == 0

    for text in texts:
        ids, pos = query_ids(p.tokenizer, text, 2)
        with torch.inference_mode():
            outputs = mlm(torch.from_numpy(ids)[None], output_hidden_states=True, return_dict=True)
        q_start, q_end = outputs.hidden_states[-1][0, pos:pos + 2].float().numpy()
        block_ids = p.retrieve_blocks(text)
        candidates = []
        for block_id in block_ids.tolist():
            candidates += list(range(lay.offsets[block_id], lay.offsets[block_id + 1]))
        vectors = p.ds.vectors(lay.rows[candidates])
        pos2ngram: dict = {}
        spans = set()
        for idx in candidates:  # forward from each valid start
            block_i, token_indices, vocabs = lay.token_position(idx, ngram_after=l_max)
            if token_indices[0] not in lay.valid_start[block_i]:
                continue
            end_idx = idx
            for j in range(len(token_indices)):
                is_start = token_indices[j] in lay.valid_start[block_i]
                is_end = token_indices[j] in lay.valid_end[block_i]
                if not (is_start or is_end):
                    continue
                if is_end and valid_func(vocabs[:j + 1]):
                    pos2ngram.setdefault((idx, end_idx), tuple(vocabs[:j + 1]))
                    spans.add((idx, end_idx))
                end_idx += 1
        for idx in candidates:  # backward from each valid end
            block_i, token_indices, vocabs = lay.token_position(idx, ngram_before=l_max)
            if token_indices[-1] not in lay.valid_end[block_i]:
                continue
            start_idx = idx
            for j in range(len(token_indices)):
                is_start = token_indices[-j - 1] in lay.valid_start[block_i]
                is_end = token_indices[-j - 1] in lay.valid_end[block_i]
                if not (is_start or is_end):
                    continue
                if is_start and valid_func(vocabs[-j - 1:]):
                    pos2ngram.setdefault((start_idx, idx), tuple(vocabs[-j - 1:]))
                    spans.add((start_idx, idx))
                start_idx -= 1
        probs = [dict(zip(candidates, softmax((vectors @ q * p.scale).astype(np.float64) / tau).tolist(), strict=True))
                 for q in (q_start, q_end)]
        pos2score, ngram2score = {}, defaultdict(list)
        for span in spans:
            pos2score[span] = probs[0][span[0]] + probs[1][span[1]]
            ngram2score[pos2ngram[span]].append(pos2score[span])
        if not ngram2score:
            out.append("")
            continue
        best = {alpha: min(ngram2score.items(), key=lambda x, a=alpha: -np.sum(x[1]) * np.power(len(x[0]), a))[0]
                for alpha in (0.0, 0.5, 1.0)}
        s, e = min((span for span in spans if pos2ngram[span] == best[0.0]), key=lambda x: (-pos2score[x], x))
        out.append(p.surface(int(lay.token_idx_to_block_idx[s]), int(lay.token_idx_to_local_idx[s]),
                             int(lay.token_idx_to_local_idx[e])).strip())
    return out


def _interleaved(fns: dict, queries: list[str], batch_sizes, reps: int, clear=lambda: None) -> dict:
    """``fns`` (name -> fn(queries) -> predictions; ``original``, ``project`` and ``encoder`` = the project's encoder
    pass alone) run on the same queries at each batch size, interleaved ``reps`` times (``clear`` before each run):
    per batch size the medians (seconds for all the queries), ``ratio`` = the original's time over the project's,
    ``encoder_floor`` = the original's over the encoder's, and how many predictions are the same."""
    import numpy as np

    for fn in fns.values():  # warm-up: indexes loaded, the exact search's blocks, the row tokens, the JVM
        fn(queries[:2])
    out: dict = {}
    for batch in batch_sizes:
        seconds: dict = {k: [] for k in fns}
        predicted = {}
        for _ in range(reps):
            for who, fn in fns.items():
                clear()
                t = time.perf_counter()
                predicted[who] = [x for a in range(0, len(queries), batch) for x in fn(queries[a:a + batch])]
                seconds[who].append(time.perf_counter() - t)
        med = {k: float(np.median(v)) for k, v in seconds.items()}
        same = sum(a == b for a, b in zip(predicted["original"], predicted["project"], strict=True))
        out[str(batch)] = {
            "original_s": round(med["original"], 3), "project_s": round(med["project"], 3),
            "ratio": round(med["original"] / med["project"], 2),
            "encoder_floor": round(med["original"] / med["encoder"], 2),
            "same_predictions": f"{same}/{len(queries)}"}
    return out


def closed_vs_original(systems: dict, queries: list[str], verbalizers, batch_sizes, reps: int = 3) -> dict:
    """Closed-set scoring of each system (name -> its predictors, one per datastore) against
    ``original_closed_set`` on the same queries (``_interleaved``; a prediction is the argmax label)."""
    from npm.inference.scoring import closed_set_scores

    out: dict = {}
    for name, predictors in systems.items():
        mlm = _masked_lm(predictors[0].encoder)
        fns = {"original": lambda qs, ps=predictors, m=mlm: original_closed_set(ps, qs, verbalizers, 5.0, m)
               .argmax(axis=1).tolist(),
               "project": lambda qs, ps=predictors: closed_set_scores(ps, qs, verbalizers, tau=5.0)
               .argmax(axis=1).tolist(),
               "encoder": lambda qs, ps=predictors: ps[0].encode(qs)}
        out[name] = _interleaved(fns, queries, batch_sizes, reps)
    return out


def open_vs_original(predictor, queries: list[str], batch_sizes, reps: int = 3) -> dict:
    """BM25-restricted open-set NPM against ``original_open_set`` on the same queries (``_interleaved``; a
    prediction is the top phrase's text), with the span score of the original's code (``span_score: code``) and
    the BM25 cache emptied before each run, as in an evaluation where every query is new."""
    from dataclasses import replace

    p = copy.copy(predictor)
    p.settings = replace(p.settings, span_score="code")
    mlm, layout = _masked_lm(p.encoder), OriginalLayout(p)  # the original's model and datastore, loaded
    fns = {"original": lambda qs: original_open_set(p, qs, mlm, layout),
           "project": lambda qs: [r[0]["text"] if r else "" for r in p.predict_batch(qs, top=1,
                                                                                     batch_size=len(qs))],
           "encoder": lambda qs: p.encode(qs)}
    return _interleaved(fns, queries, batch_sizes, reps, clear=p._bm25_searcher()._cache.clear)


def _ratios_line(what: str, by_batch: dict) -> str:
    """One printed line of a comparison with the original (``_interleaved``'s result)."""
    return f"{what}, speed over the original: " + ", ".join(
        f"batch {b} {v['ratio']}x ({v['same_predictions']} same; encoder floor {v['encoder_floor']}x)"
        for b, v in by_batch.items())


def worker(args) -> dict:
    """One thread setting, in this process."""
    from npm.threads import describe, set_threads

    set_threads(args.worker)
    import numpy as np

    from npm.inference.predictor import Predictor
    from npm.inference.scoring import closed_set_scores

    root = args.root
    paths = {name: dict(checkpoint=str(root / "results/models/npm"), datastore=str(root / f"data/datastore/npm/{name}"),
                        faiss=str(root / f"data/index/npm/{name}.faiss"), bm25=str(root / f"data/bm25/{name}"))
             for name in ("enwiki", "cc_news")}
    enwiki = Predictor(model="npm", root=root, **paths["enwiki"])
    news = Predictor(model="npm", root=root, **{k: v for k, v in paths["cc_news"].items() if k != "bm25"})
    open_q = _queries(enwiki, OPEN_TASKS, root, args.queries)
    closed_q = _queries(enwiki, (CLOSED_TASK,), root, args.queries)
    clock = Clock()
    for p in (enwiki, news):
        clock.wrap(p, "encode", "encode")
        clock.wrap(p, "retrieve_blocks_batch", "search")
        clock.wrap(p, "_faiss_candidates", "search")
        clock.wrap(p, "knn_vectors", "search")
    bm25 = enwiki._bm25_searcher()
    verbalizers = [np.array(enwiki.tokenizer.convert_tokens_to_ids([w])) for w in ("world", "sports", "business",
                                                                                    "science")]
    # Warm-up: model, indexes, JVM, blocks text.
    enwiki.predict_batch(open_q[:8])
    enwiki.predict_batch(open_q[:8], mode="faiss")
    closed_set_scores([enwiki, news], closed_q[:8], verbalizers, tau=5.0)

    result: dict = {"threads": describe(), "runs": {}}
    for batch in args.batch_sizes:
        runs = {
            "open_restricted": _run(lambda qs: enwiki.predict_batch(qs, top=1), open_q, batch, clock,
                                    bm25._cache.clear),
            "open_unrestricted": _run(lambda qs: enwiki.predict_batch(qs, top=1, mode="faiss"),
                                      open_q[:args.unrestricted_queries], batch, clock, lambda: None),
            "closed_knn": _run(lambda qs: closed_set_scores([enwiki, news], qs, verbalizers, tau=5.0), closed_q,
                               batch, clock, lambda: None),
        }
        result["runs"][str(batch)] = runs
    systems = {"npm": [enwiki, news]}
    single = [dict(checkpoint=str(root / "results/models/npm_single"), model="npm_single", root=root,
                   datastore=str(root / f"data/datastore/npm_single/{name}"),
                   faiss=str(root / f"data/index/npm_single/{name}.faiss")) for name in ("enwiki", "cc_news")]
    if all(Path(s["datastore"]).exists() for s in single):
        systems["npm_single"] = [Predictor(**s) for s in single]
    result["closed_vs_original"] = closed_vs_original(systems, closed_q[:args.closed_queries], verbalizers,
                                                      args.batch_sizes, args.reps)
    result["open_vs_original"] = open_vs_original(enwiki, open_q[:args.open_queries], args.batch_sizes, args.reps)
    encode = {}
    for name, qs in (("open", open_q), ("closed", closed_q)):
        t = time.perf_counter()
        enwiki.encode(qs)
        encode[name] = round(len(qs) / (time.perf_counter() - t), 1)
    result["encoder_only_queries_per_s"] = encode
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ds = enwiki.ds
    vectors = sum(a.nbytes for a in ds.shards)
    result["datastore"] = {
        "tokens": ds.n_tokens, "rows": ds.n_rows, "hidden_size": ds.hidden_size,
        "vector_bytes_per_token": vectors / ds.n_tokens,
        "non_vector_ram_bytes_per_token": ds.nbytes_non_vector / ds.n_tokens,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="the workflow's working directory")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--queries", type=int, default=200, help="queries per open-set / closed-set run")
    parser.add_argument("--unrestricted-queries", type=int, default=64,
                        help="queries of the unrestricted runs (k = 4096 neighbours per vector: slow)")
    parser.add_argument("--closed-queries", type=int, default=64,
                        help="queries of the closed-set runs against the original's stand-in (FAISS Flat, same k)")
    parser.add_argument("--open-queries", type=int, default=200,
                        help="queries of the open-set runs against the original's stand-in (BM25-restricted)")
    parser.add_argument("--reps", type=int, default=3,
                        help="interleaved runs per comparison with the original (median)")
    parser.add_argument("--out-dir", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.root = args.root.resolve()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    import torch

    from npm.io import atomic_path, provenance

    result = {"k": 4096, "open_tasks": OPEN_TASKS, "closed_task": CLOSED_TASK, "settings": {}}
    for n in args.threads:
        cmd = [sys.executable, __file__, "--worker", str(n), "--root", str(args.root), "--batch-sizes",
               *map(str, args.batch_sizes), "--queries", str(args.queries), "--unrestricted-queries",
               str(args.unrestricted_queries), "--closed-queries", str(args.closed_queries), "--open-queries",
               str(args.open_queries), "--reps", str(args.reps)]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
        if out.returncode:
            sys.exit(f"worker with {n} threads failed:\n{out.stderr[-3000:]}")
        result["settings"][f"threads={n}"] = json.loads(out.stdout.strip().splitlines()[-1])
    result["provenance"] = provenance({k: str(v) for k, v in vars(args).items()})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with atomic_path(args.out_dir / f"predict-{device}.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=2))
    for setting, r in result["settings"].items():  # the issue-42 table: project speed over the original's
        for name, by_batch in r["closed_vs_original"].items():
            print(_ratios_line(f"closed set {name} ({setting})", by_batch))
        print(_ratios_line(f"open set npm ({setting})", r["open_vs_original"]))


if __name__ == "__main__":
    main()
