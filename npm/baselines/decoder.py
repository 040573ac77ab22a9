"""The decoder-LM systems of NPM's tables: lm, lm_pmi, bm25_lm and replug (paper 6.2, Tables 1-3 and 8;
docs/paper-map.md §6, §R2.1-§R2.2). ``DecoderScorer`` answers one task for ``npm.evaluation.harness``.

* open set, ``lm``: the prompt of ``npm.baselines.lm.open_set_prompt`` alone, greedy decoding (§6);
* open set, ``bm25_lm``: the top-``passages`` blocks prepended, each followed by "\\n", the top-1 passage right
  before the question (§6). ``inference.passages`` is the switch: 3 = the original code, 5 = the paper's 6.2;
* open set, ``replug``: each of the top-``passages`` blocks prepended *separately*; next-token distributions mixed
  with softmax(retrieval score / ``replug_temperature``) and decoded greedily over the mixture (REPLUG 3.2,
  ``npm.baselines.replug``). The paper mixes with softmax of the raw scores (temperature 1);
  ``inference.replug_ensemble: vote`` swaps the mixture for the authors' QA answer vote (``replug_vote``);
* closed set, ``lm``: log P(label word | prompt) (``npm.baselines.pmi.label_logprobs``), argmax; the prompt is the
  text before the mask, or the task's causal form with the label word last (RTE: Shi et al. 2022,
  ``npm.tasks.templates.CAUSAL_TEMPLATES``, label words " true" / " false");
* closed set, ``lm_pmi``: domain-conditional PMI log P(y | x) - log P(y | domain premise) (Holtzman et al. 2021).

Retrieval: the corpus's pyserini BM25 index (docid = global block id) over its blocks files in global order, whose
exact block text is what gets prepended. The query string is NPM's restricted-search query
(``npm.datastore.bm25.bm25_query``) with the task's ``is_question``, so the baselines read the blocks NPM reads.
``inference.retriever: dense`` swaps BM25 for REPLUG's own retriever kind, mean-pooled vectors of NPM's encoder in
an exact inner-product FAISS index (``npm.baselines.dense``, cosine as in the paper).

Answer rules (§6): greedy, at most ``max_new_tokens`` new tokens, the continuation cut at its first "\\n" (the first
non-empty line with ``skip_blank_lines``) and stripped. Prompts are cut from the left to 1024 - ``max_new_tokens``
LM tokens (the original's ``--max_sequence_length``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npm.baselines.dense import DenseBlockSearcher
from npm.baselines.lm import clean_passage, first_line, greedy_continuations, load_causal_lm, open_set_prompt
from npm.baselines.pmi import causal_prompt, label_logprobs
from npm.baselines.replug import mixture_weights, replug_continuations, replug_vote
from npm.data.blocks import block_text, load_blocks
from npm.datastore.bm25 import Bm25Searcher, block_slice, bm25_query, marked_texts, unit_markers
from npm.fingerprint import CorpusHasher
from npm.model import autocast, effective_precision, torch_device
from npm.tasks.templates import causal_label_words

log = logging.getLogger("npm-repro.baselines")

PROMPT_CHARS = 2000  # characters of the prompt kept in a predictions record


TOKEN_KEYS = ("input_ids", "flags", "block_offsets", "token_spans")  # what a block's BM25 contents are made from


class BlockTexts:
    """Global block id -> exact block text over blocks files given in global order (``npm.data.blocks``).
    ``corpus_fingerprint``: the blocks' content fingerprint (``npm.fingerprint``), what a BM25 index over them
    records. ``contents=True`` also keeps each file's tokens, for ``contents(block)``."""

    def __init__(self, paths: Sequence[str | os.PathLike], contents: bool = False):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [str(p) for p in paths]
        if not self.paths:
            raise ValueError("no blocks files given: the retrieved passages are read from the corpus blocks")
        self._files, firsts, self.tokens = [], [0], 0
        hasher = CorpusHasher()
        for p in self.paths:
            if not Path(p).is_file():
                raise FileNotFoundError(f"blocks file {p} does not exist; run the tokenize_blocks rule first")
            arrays = load_blocks(p, text=True)
            hasher.update(arrays["input_ids"], arrays["block_offsets"], arrays["token_spans"])
            keep = ("text", "text_offsets") + (TOKEN_KEYS if contents else ())
            self._files.append({k: arrays[k] for k in keep})
            firsts.append(firsts[-1] + len(arrays["block_doc"]))
            self.tokens += int(len(arrays["input_ids"]))
        self._firsts = np.asarray(firsts, dtype=np.int64)
        self.n_blocks = int(self._firsts[-1])
        self.corpus_fingerprint = hasher.hexdigest()

    def __len__(self) -> int:
        return self.n_blocks

    def _locate(self, block: int) -> tuple[dict, int]:
        block = int(block)
        if not 0 <= block < self.n_blocks:
            raise IndexError(f"block {block} is outside the {self.n_blocks} blocks of {self.paths}: the retrieval "
                             "index was built from other blocks files (give --blocks in the index's order)")
        f = int(np.searchsorted(self._firsts, block, side="right") - 1)
        return self._files[f], block - int(self._firsts[f])

    def __call__(self, block: int) -> str:
        return block_text(*self._locate(block))

    def contents(self, block: int) -> str:
        """The block's passage as the original code prepends it (paper-map §6, ``inference.passage_text:
        contents``): its BM25 contents, each unit as ``<s>...</s>`` (``npm.datastore.bm25.marked_texts``), with
        the markers removed and stripped, so that the units stand glued as the tokens decode."""
        arrays, b = self._locate(block)
        if "input_ids" not in arrays:
            raise ValueError("BlockTexts(contents=True) keeps the tokens that contents() reads")
        return clean_passage(marked_texts(block_slice(arrays, b), *unit_markers(arrays))[0]).strip()


def _batches(n: int, size: int):
    for start in range(0, n, size):
        yield start, min(n, start + size)


class DecoderScorer:
    """Systems lm, lm_pmi, bm25_lm, replug and replug_lsr of ``npm.evaluation.systems``: one causal LM, optionally a
    retriever over the corpus's blocks (``system.options``: ``retrieval``, ``ensemble``, ``pmi``, ``retriever``)."""

    def __init__(self, system, inputs, settings):
        self.settings, self.options = settings, dict(system.options)
        self.device = torch_device(inputs.device)
        self.model, self.tokenizer = load_causal_lm(inputs.checkpoint)
        self.model.to(self.device)
        self.texts = self.searcher = self.passage = None
        retrieves = bool(self.options.get("retrieval"))
        retriever = self.options.get("retriever", settings.retriever)  # replug_lsr: always its dense retriever
        if retrieves:
            self.texts = BlockTexts(inputs.blocks, contents=settings.passage_text == "contents")
            self.passage = self.texts.contents if settings.passage_text == "contents" else self.texts
            if retriever == "bm25":
                (bm25,) = inputs.bm25
                # The index's block ids are read as blocks of these files: it must index exactly them, in order.
                self.searcher = Bm25Searcher(bm25, corpus_fingerprint=self.texts.corpus_fingerprint,
                                             corpus="the blocks files given (--blocks, every file of the corpus "
                                                    "in order)", blocks=self.texts.paths)
            else:
                if not inputs.encoder:
                    raise ValueError(f"{system.name} retrieves with a dense encoder: give --encoder")
                self.searcher = DenseBlockSearcher(inputs.encoder, inputs.blocks, device=self.device)
        corpus = inputs.corpus or (Path(inputs.bm25[0]).name if retrieves and inputs.bm25 else None)
        self.info = {
            "model": str(inputs.checkpoint), "corpus": corpus if retrieves else None,
            "corpus_tokens": self.texts.tokens if retrieves else None,
            "retrieval": retriever if retrieves else None,
            "parameters": int(sum(p.numel() for p in self.model.parameters())), "device": str(self.device),
            "passages": settings.passages if retrieves else None,
            "passage_text": settings.passage_text if retrieves else None,
            "precision": effective_precision(self.device, settings.lm_precision),
        }
        if self.options.get("ensemble"):
            self.info["replug_temperature"] = settings.replug_temperature
            self.info["replug_ensemble"] = settings.replug_ensemble

    def _hits(self, task, chunk: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
        if self.searcher is None:
            return [(np.zeros(0, np.int64), np.zeros(0, np.float32))] * len(chunk)
        queries = [bm25_query(ex["input"], task.is_question) for ex in chunk]
        if hasattr(self.searcher, "batch_search"):
            return self.searcher.batch_search(queries, k=self.settings.passages)
        return [self.searcher.search(q, self.settings.passages) for q in queries]

    def open_set(self, task, examples, progress=None):
        with autocast(self.device, self.settings.lm_precision):
            return self._open_set(task, examples, progress)

    def closed_set(self, task, examples, progress=None):
        with autocast(self.device, self.settings.lm_precision):
            return self._closed_set(task, examples, progress)

    def _open_set(self, task, examples, progress=None):
        s, ensemble = self.settings, self.options.get("ensemble")
        answers, records, no_passages = [], [], 0
        for start, end in _batches(len(examples), s.batch_size):
            chunk = examples[start:end]
            hits = self._hits(task, chunk)
            passages = [[clean_passage(self.passage(b)) for b in ids.tolist()] for ids, _ in hits]
            no_passages += sum(self.searcher is not None and not p for p in passages)
            votes = [None] * len(chunk)
            if ensemble:  # REPLUG prepends each passage to the bare prompt itself
                prompts = [open_set_prompt(task.prompt_family, ex["input"], kamel_prompt=s.kamel_prompt)
                           for ex in chunk]
            if ensemble and s.replug_ensemble == "vote":
                raws, votes = replug_vote(self.model, self.tokenizer, prompts, passages, [sc for _, sc in hits],
                                          temperature=s.replug_temperature, max_new_tokens=s.max_new_tokens,
                                          batch_size=s.batch_size, skip_blank_lines=s.skip_blank_lines)
            elif ensemble:
                raws = replug_continuations(self.model, self.tokenizer, prompts, passages, [sc for _, sc in hits],
                                            temperature=s.replug_temperature, max_new_tokens=s.max_new_tokens,
                                            batch_size=s.batch_size, skip_blank_lines=s.skip_blank_lines)
            else:
                prompts = [open_set_prompt(task.prompt_family, ex["input"], p, kamel_prompt=s.kamel_prompt)
                           for ex, p in zip(chunk, passages, strict=True)]
                raws = greedy_continuations(self.model, self.tokenizer, prompts, max_new_tokens=s.max_new_tokens,
                                            batch_size=s.batch_size, skip_blank_lines=s.skip_blank_lines)
            for prompt, raw, (ids, scores), voted in zip(prompts, raws, hits, votes, strict=True):
                answers.append(first_line(raw, s.skip_blank_lines))
                rec = {"prompt": prompt[:PROMPT_CHARS], "raw_prediction": raw,
                       "passages": [int(b) for b in ids.tolist()],
                       "passage_scores": [float(x) for x in scores.tolist()]}
                if ensemble and len(scores):
                    rec["passage_weights"] = mixture_weights(scores, s.replug_temperature).tolist()
                if voted is not None:
                    rec["passage_answers"], rec["votes"] = voted["answers"], voted["votes"]
                    rec["answer_mean_logprobs"] = voted["mean_logprobs"]
                records.append(rec)
            if progress:
                progress(len(chunk))
        metrics = {"max_new_tokens": s.max_new_tokens, "skip_blank_lines": s.skip_blank_lines}
        if self.searcher is not None:
            metrics["no_passages"] = no_passages
            if no_passages:
                log.warning("%d of %d queries retrieved no block (decoded without passages)", no_passages,
                            len(examples))
        return dict(answers=answers, records=records, metrics=metrics)

    def _closed_set(self, task, examples, progress=None):
        s = self.settings
        words = list(causal_label_words(task.template, task.label_words))
        metrics: dict = {"label_words": words, "max_new_tokens": None, "skip_blank_lines": None}
        domain = None
        if self.options.get("pmi"):
            premise = task.pmi_premise  # config/tasks.yaml verbalizer.premise
            domain = label_logprobs(self.model, self.tokenizer, [premise], words)[0]
            metrics.update(domain_premise=premise, domain_logprobs=[float(x) for x in domain])
        prompts = []
        for ex in examples:
            try:
                prompts.append(ex.get("causal_input") or causal_prompt(ex["input"]))
            except ValueError as e:
                raise ValueError(f"task {task.name}, example {ex['id']}: {e}; a causal LM cannot score this "
                                 "template left to right (choose another task)") from None
        scores, records = [], []
        for start, end in _batches(len(examples), s.batch_size):
            logprobs = label_logprobs(self.model, self.tokenizer, prompts[start:end], words,
                                      batch_rows=s.batch_size * len(words))
            scores.append(logprobs - domain[None, :] if domain is not None else logprobs)
            for prompt, lp in zip(prompts[start:end], logprobs, strict=True):
                rec = {"prompt": prompt[:PROMPT_CHARS], "passages": []}
                if domain is not None:
                    rec["logprobs"] = [float(x) for x in lp]
                records.append(rec)
            if progress:
                progress(end - start)
        return dict(scores=np.concatenate(scores), records=records, metrics=metrics)


__all__ = ["BlockTexts", "DecoderScorer"]
