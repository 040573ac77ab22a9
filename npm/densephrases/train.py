"""Training DensePhrases (Lee et al. 2021, section 4 and appendix D; docs/paper-map.md §D1.3).

1. :func:`train_teacher`: the cross-attention reader, an ``AutoModelForQuestionAnswering`` over
   ``[CLS] question [SEP] passage [SEP]`` (the paper: SpanBERT-base QA), fine-tuned on the same RC examples with
   start/end cross-entropy. Frozen afterwards: its start/end logits, aligned to the student's passage tokens
   (``npm.densephrases.features.teacher_inputs``), are the distillation target.
2. :func:`train_densephrases`: per batch the phrase encoder's passage vectors h and the query encoders' q_start,
   q_end, and eq. 9, ``lambda_single`` L_single + ``lambda_distill`` L_distill (with a teacher) + ``lambda_neg``
   L_neg + ``lambda_filter`` L_filter (``npm.densephrases.losses``). ``negatives``: ``none``, ``in_batch`` (the
   other gold vectors of the batch), or ``pre_batch`` (paper): in-batch, plus the detached gold vectors of the last C
   batches in the last ``pre_batch_epochs`` epochs (the paper: 4 epochs, pre-batch in the last 2; the queue starts
   empty each epoch). Generated questions (``generated``, the code's question-generation file) join the RC training
   set (paper 4.1), or, with ``generated_first``, train alone first, as the code's ``run-rc`` does: the first
   ``epochs - pre_batch_epochs`` epochs on the generated questions with in-batch negatives, then ``pre_batch_epochs``
   epochs on the RC training set from those encoders, pre-batch negatives from its first epoch, each stage with a
   new optimiser and schedule (docs/paper-map.md §D1.7).

Adam (AdamW with weight decay 0), a linear decay, gradient norm clipped at 1 (appendix D). Shuffling is seeded per
epoch. Both trainings are resumable per epoch (``npm.checkpoints``): ``run-<id>/epoch-N/`` (the model and ``state.pt``
with optimiser, schedule and RNG) is written atomically, and the run id hashes the settings and the fingerprints of
the encoder, the training file and the teacher, so a run resumes only its own epochs; an unreadable or changed epoch
is set aside and the previous one resumed. ``train_log.csv`` has a row per step; the
same rows (loss, learning rate, examples per second) and the epoch checkpoints go to the job's ``npm.tracking`` run.
"""

from __future__ import annotations

import csv
import json
import logging
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from npm import checkpoints, tracking
from npm.densephrases.features import rc_features, teacher_inputs
from npm.densephrases.losses import (
    PreBatchQueue,
    distill_loss,
    filter_loss,
    gold_vectors,
    in_batch_loss,
    single_passage_loss,
    token_logits,
    total_loss,
)
from npm.densephrases.model import DensePhrases, model_fingerprint_all
from npm.densephrases.rc import read_squad
from npm.fingerprint import file_fingerprint, model_fingerprint
from npm.io import atomic_dir, folder_lock, write_json
from npm.model import autocast, effective_precision, load_tokenizer, model_path, torch_device
from npm.progress import bar as progress_bar

log = logging.getLogger("npm-repro.densephrases")
NEGATIVES = ("none", "in_batch", "pre_batch")


@dataclass
class PhraseTrainConfig:
    """A DensePhrases training run (eq. 9): the phrase and question encoders; NPM's own training is
    npm.training.loop.TrainConfig."""

    encoder: str  # the checkpoint of the three encoders (paper: SpanBERT-base-cased)
    train: str  # SQuAD v1.1 JSON
    out_dir: str
    checkpoint_dir: str
    teacher: str | None = None  # a train_teacher folder; None = no distillation
    generated: str | None = None  # SQuAD v1.1 JSON of generated questions (the code's QG file); None = none
    generated_first: bool = False  # the code's two stages: the generated questions alone first (module docstring)
    init: str | None = None  # a DensePhrases model folder to start from instead of ``encoder`` (the code's --load_dir)
    negatives: str = "pre_batch"
    epochs: int = 4
    pre_batch_epochs: int = 2
    pre_batch: int = 2  # C (paper: 2)
    batch_size: int = 84
    lr: float = 3e-5
    lambda_single: float = 1.0
    lambda_distill: float = 2.0
    lambda_neg: float = 4.0
    lambda_filter: float = 0.0  # the original code: 1.0
    max_passage_tokens: int = 384
    max_question_tokens: int = 64
    doc_stride: int | None = None  # None: passages cut; N: the code's windows (npm.densephrases.features)
    seed: int = 0
    precision: str = "bf16"  # autocast: bf16 | fp16 | fp32 on CUDA; on CPU bf16 where native, else fp32
    device: str | None = None  # None: CUDA when available, else the CPU


@dataclass
class TeacherConfig:
    encoder: str  # the cross-attention reader's starting checkpoint
    train: str
    out_dir: str
    checkpoint_dir: str
    epochs: int = 2
    batch_size: int = 16
    lr: float = 3e-5
    max_passage_tokens: int = 384
    max_question_tokens: int = 64
    doc_stride: int | None = None
    seed: int = 0
    precision: str = "bf16"
    device: str | None = None


# ------------------------------------------------------------------------------------------------ run folders

def _layout(kind: str) -> checkpoints.Layout:
    rule, command = {"teacher": ("densephrases_train_teacher", "npm-repro densephrases train-teacher"),
                     "densephrases": ("densephrases_train", "npm-repro densephrases train")}[kind]
    return checkpoints.Layout(prefix="epoch", state_file="state.pt", rule=rule, command=command)


def _run_dir(cfg, kind: str) -> Path:
    """The run folder of these settings (``npm.checkpoints.run_folder``): the id hashes them (the precision as this
    machine runs it, not the device name) and the fingerprints of the encoder, the training file and the teacher."""
    paths = ("out_dir", "checkpoint_dir", "encoder", "train", "teacher", "generated", "init", "device")
    hashed = {k: v for k, v in asdict(cfg).items() if k not in paths}
    hashed.update(kind=kind, encoder=model_fingerprint(cfg.encoder), train=file_fingerprint(cfg.train),
                  teacher=model_fingerprint(cfg.teacher) if getattr(cfg, "teacher", None) else None,
                  precision=effective_precision(torch_device(cfg.device), cfg.precision))
    if hashed["doc_stride"] is None:  # keys only where set: the runs made before them keep their ids
        del hashed["doc_stride"]
    if getattr(cfg, "generated", None):
        hashed["generated"] = file_fingerprint(cfg.generated)
    if getattr(cfg, "init", None):
        hashed["init"] = model_fingerprint_all(cfg.init)
    record = {"run_id": checkpoints.run_id(hashed), "kind": kind, "settings": asdict(cfg)}
    return checkpoints.run_folder(cfg.checkpoint_dir, record, _layout(kind))


def _run_id(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text(encoding="utf-8"))["run_id"]


def _resume(run_dir: Path, kind: str, load_model):
    """(epoch, model, state) of the newest readable epoch of ``run_dir`` (``npm.checkpoints.latest``), or (0, None,
    None)."""
    found = checkpoints.latest(run_dir, _layout(kind), load_model)
    if found is None:
        return 0, None, None
    ckpt, state, model = found
    log.info("resuming %s from %s", run_dir, ckpt.name)
    return state["epoch"], model, state


def _save(run_dir: Path, kind: str, epoch: int, write_model, optimizer, scheduler, rows: list[dict]) -> None:
    state = {"epoch": epoch, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             **checkpoints.rng_state(), "rows": rows}
    checkpoints.save(run_dir, epoch, state, _layout(kind), write_model)


def _restore(state: dict, optimizer, scheduler) -> list[dict]:
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    checkpoints.restore_rng(state)
    return state["rows"]


def _write_log(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["step"])
        writer.writeheader()
        writer.writerows(rows)


def _optimizer(params, lr: float, steps: int):
    from transformers import get_linear_schedule_with_warmup

    optimizer = torch.optim.AdamW(params, lr=lr, eps=1e-8, weight_decay=0.0)
    return optimizer, get_linear_schedule_with_warmup(optimizer, 0, max(1, steps))


def _batches(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return [order[a:a + batch_size] for a in range(0, n, batch_size)]


def _features(cfg) -> dict:
    """The training features: the RC training set, and the generated questions where ``cfg`` has them."""
    files = [cfg.train, *([cfg.generated] if getattr(cfg, "generated", None) else [])]
    examples = [ex for path in files for ex in read_squad(path)]
    feats = rc_features(examples, load_tokenizer(cfg.encoder), cfg.max_passage_tokens, cfg.max_question_tokens,
                        cfg.doc_stride)
    if feats["dropped"]:
        where = "beyond" if cfg.doc_stride is None else "whole in no window of"
        log.warning("%s: %d of %d answers lie %s %d passage tokens and are left out", " + ".join(files),
                    feats["dropped"], len(examples), where, cfg.max_passage_tokens)
    if cfg.doc_stride is not None:
        log.info("%d training windows of %d examples, %d without their answer", len(feats["start"]), len(examples),
                 int((~feats["answerable"]).sum()))
    return feats


def _sizes(feats: dict) -> dict:
    """The training set's size: its examples, and its feature rows (one per example, or per window with
    ``doc_stride``)."""
    return {"examples": int(len(np.unique(feats["example"]))), "rows": int(len(feats["start"]))}


def _start(cfg, kind: str) -> tuple[Path, dict]:
    """The run folder of these settings, seeded RNGs, and the training features."""
    run_dir = _run_dir(cfg, kind)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    return run_dir, _features(cfg)


def _update(loss: torch.Tensor, model, optimizer, scheduler) -> None:
    """One optimiser step: backward, gradient norm clipped at 1 (appendix D), step, schedule."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def _t(x, rows, width: int | None = None, device=None) -> torch.Tensor:
    """Rows of a feature array as a tensor on ``device``, cut to ``width`` columns (the longest sequence of the
    batch: the features are padded to the longest of the whole set, and every column past the batch's own is
    padding)."""
    return torch.as_tensor(x[rows] if width is None else x[rows, :width], device=device)


def _width(mask: np.ndarray, rows) -> int:
    return max(1, int(mask[rows].sum(axis=1).max()))


# ------------------------------------------------------------------------------------------------ the teacher

def load_teacher(path: str):
    from transformers import AutoModelForQuestionAnswering

    resolved = model_path(path)  # checked against its checksum record
    return AutoModelForQuestionAnswering.from_pretrained(resolved, local_files_only=Path(resolved).is_dir())


def _teacher_forward(teacher, ids, mask, types):
    """The reader on [CLS] q [SEP] p [SEP] (on the teacher's device); segment ids only where the model has two
    segment types (BERT, SpanBERT; not RoBERTa)."""
    device = teacher.device
    extra = {}
    if getattr(teacher.config, "type_vocab_size", 1) > 1:
        extra["token_type_ids"] = torch.as_tensor(types, device=device)
    return teacher(input_ids=torch.as_tensor(ids, device=device), attention_mask=torch.as_tensor(mask, device=device),
                   **extra)


def teacher_logits(teacher, feats: dict, batch_size: int = 32, precision: str = "fp32",
                   n_best: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The teacher's start and end logits float32 [n, Lp] at the student's passage positions, and at its [CLS] where
    that is in the row's softmax ``support`` (the teacher's [CLS]; -inf elsewhere), computed on the teacher's device
    under ``precision``'s autocast. With ``n_best`` a position keeps its start (end) logit only if it is among the
    ``n_best`` best of its row's whole input, question and special tokens included, ties to the earlier position
    (transformers' SQuAD reader, ``n_best_size``); the others are -inf."""
    n, width = feats["passage_ids"].shape
    out_s = np.full((n, width), -np.inf, dtype=np.float32)
    out_e = np.full((n, width), -np.inf, dtype=np.float32)
    teacher.eval()
    with torch.inference_mode(), autocast(teacher.device, precision):
        for a in range(0, n, batch_size):
            rows = np.arange(a, min(n, a + batch_size))
            ids, mask, types, offset = teacher_inputs(feats, rows)
            res = _teacher_forward(teacher, ids, mask, types)
            for k, r in enumerate(rows):
                pn = int(feats["passage_mask"][r].sum())
                dst = np.arange(1 - int(feats["support"][r, 0]), pn)  # from the [CLS] where it is in the support
                src = np.where(dst == 0, 0, offset[k] + dst)
                for out, logits in ((out_s, res.start_logits), (out_e, res.end_logits)):
                    z = logits[k, :int(mask[k].sum())].float().cpu().numpy()
                    out[r, dst] = z[src] if n_best is None else np.where(_n_best(z, n_best)[src], z[src], -np.inf)
    return out_s, out_e


def _n_best(z: np.ndarray, n_best: int) -> np.ndarray:
    """bool [L]: the ``n_best`` highest of ``z``, ties to the earlier position (a stable sort)."""
    keep = np.zeros(len(z), bool)
    keep[np.argsort(-z, kind="stable")[:n_best]] = True
    return keep


def _teacher_targets(feats: dict, rows: np.ndarray, types, mask, offset, device):
    """(gold start, gold end, valid) of the teacher's batch: the answer's passage tokens, or its [CLS] (position 0)
    in a window without the answer (the code's no-answer label); the softmax runs over the passage tokens, and the
    [CLS] where the rows' ``support`` has it."""
    ans = feats["answerable"][rows]
    gold_s = torch.as_tensor(np.where(ans, offset + feats["start"][rows], 0), device=device)
    gold_e = torch.as_tensor(np.where(ans, offset + feats["end"][rows], 0), device=device)
    valid = types.astype(bool) & mask.astype(bool)  # passage tokens
    valid[:, 0] |= feats["support"][rows, 0]
    return gold_s, gold_e, torch.as_tensor(valid, device=device)


def _track(run: tracking.Run, row: dict, scheduler, size: int) -> None:
    """One step's row of ``train_log.csv`` on ``run`` with the learning rate and the throughput (``size`` examples)."""
    run.log(row["step"], **{k: v for k, v in row.items() if k != "step"}, lr=scheduler.get_last_lr()[0],
            examples_per_s=round(size / row["seconds"], 2) if row["seconds"] > 0 else None)


def train_teacher(cfg: TeacherConfig, progress: bool = True, run: tracking.Run | None = None) -> dict:
    """Fine-tune the cross-attention reader (resumable per epoch); writes ``cfg.out_dir`` (``save_pretrained``).
    ``run`` (``npm.tracking``; the caller finishes it) gets the run folder, each step's row and each epoch's step."""
    device = torch_device(cfg.device)
    with folder_lock(Path(cfg.checkpoint_dir), "DensePhrases teacher training"):
        run_dir, feats = _start(cfg, "teacher")
        n, sizes = len(feats["start"]), _sizes(feats)
        start_epoch, teacher, state = _resume(run_dir, "teacher", lambda ckpt: load_teacher(str(ckpt)))
        run = run or tracking.Run()
        run.update(run_id=_run_id(run_dir), run_folder=str(run_dir), start_epoch=start_epoch, **sizes)
        teacher = (load_teacher(cfg.encoder) if teacher is None else teacher).to(device)
        steps = cfg.epochs * len(_batches(n, cfg.batch_size, cfg.seed, 0))
        optimizer, scheduler = _optimizer(teacher.parameters(), cfg.lr, steps)
        rows = [] if state is None else _restore(state, optimizer, scheduler)

        def write_teacher(tmp: Path) -> None:
            teacher.save_pretrained(tmp)
            load_tokenizer(cfg.encoder).save_pretrained(tmp)

        teacher.train()
        bar = progress_bar(total=steps, initial=len(rows), desc="DensePhrases teacher", unit="step",
                            show=progress)
        for epoch in range(start_epoch, cfg.epochs):
            for rows_b in _batches(n, cfg.batch_size, cfg.seed, epoch):
                t0 = time.perf_counter()
                ids, mask, types, offset = teacher_inputs(feats, rows_b)
                with autocast(device, cfg.precision):
                    res = _teacher_forward(teacher, ids, mask, types)
                gold_s, gold_e, valid = _teacher_targets(feats, rows_b, types, mask, offset, device)
                ls = torch.nn.functional.cross_entropy(res.start_logits.float().masked_fill(~valid, -1e4), gold_s)
                le = torch.nn.functional.cross_entropy(res.end_logits.float().masked_fill(~valid, -1e4), gold_e)
                loss = (ls + le) / 2
                _update(loss, teacher, optimizer, scheduler)
                rows.append({"step": len(rows) + 1, "epoch": epoch + 1, "loss": round(float(loss.detach()), 6),
                             "seconds": round(time.perf_counter() - t0, 3)})
                _track(run, rows[-1], scheduler, len(rows_b))
                bar.update(1)
            _save(run_dir, "teacher", epoch + 1, write_teacher, optimizer, scheduler, rows)
            run.log(len(rows), checkpoint_step=len(rows), checkpoint_epoch=epoch + 1)
        bar.close()
        with atomic_dir(cfg.out_dir) as tmp:
            teacher.save_pretrained(tmp)
            load_tokenizer(cfg.encoder).save_pretrained(tmp)
            _write_log(tmp / "train_log.csv", rows)
            write_json(tmp / "train_summary.json", {"run_folder": str(run_dir), **sizes,
                                                    "settings": asdict(cfg)})
    return {"run_folder": str(run_dir), "steps": len(rows), **sizes}


# ------------------------------------------------------------------------------------------------ DensePhrases

def step_loss(model, feats: dict, rows: np.ndarray, cfg: PhraseTrainConfig, queue, teacher_s=None,
              teacher_e=None) -> tuple[torch.Tensor, dict]:
    """Eq. 9 on one batch; returns (loss, the parts' values)."""
    dev = next(model.parameters()).device
    lp, lq = _width(feats["passage_mask"], rows), _width(feats["question_mask"], rows)
    valid, support = _t(feats["valid"], rows, lp, dev), _t(feats["support"], rows, lp, dev)
    start, end = _t(feats["start"], rows, device=dev), _t(feats["end"], rows, device=dev)
    h = model.phrase_vectors(_t(feats["passage_ids"], rows, lp, dev), _t(feats["passage_mask"], rows, lp, dev))
    q_start, q_end = model.query_vectors(_t(feats["question_ids"], rows, lq, dev),
                                         _t(feats["question_mask"], rows, lq, dev))
    parts = {"single": single_passage_loss(h, support, q_start, q_end, start, end)}
    if teacher_s is not None and cfg.lambda_distill:
        parts["distill"] = distill_loss(token_logits(h, q_start), token_logits(h, q_end),
                                        _t(teacher_s, rows, lp, dev), _t(teacher_e, rows, lp, dev), support)
    g_start, g_end = gold_vectors(h, start, end)  # a window without the answer: its [CLS] vector, as the code
    if cfg.negatives != "none" and cfg.lambda_neg:
        parts["neg"] = in_batch_loss(q_start, q_end, g_start, g_end, *(queue.negatives() if queue else (None, None)))
    ans = _t(feats["answerable"], rows, device=dev)
    if cfg.lambda_filter:  # the code trains the filter on the rows with an answer only
        parts["filter"] = (filter_loss(model.filter_logits(h[ans]), valid[ans], start[ans], end[ans]) if ans.any()
                           else h.new_zeros((), dtype=torch.float32))
    lambdas = {"single": cfg.lambda_single, "distill": cfg.lambda_distill, "neg": cfg.lambda_neg,
               "filter": cfg.lambda_filter}
    if queue is not None:
        queue.push(g_start, g_end)
    return total_loss(parts, lambdas), {k: float(v.detach()) for k, v in parts.items()}


def _check(cfg: PhraseTrainConfig) -> None:
    if cfg.negatives not in NEGATIVES:
        raise ValueError(f"negatives must be one of {NEGATIVES}, not {cfg.negatives!r}")
    if not 0 <= cfg.pre_batch_epochs <= cfg.epochs:
        raise ValueError(f"pre_batch_epochs must be between 0 and epochs = {cfg.epochs}, got {cfg.pre_batch_epochs}")
    if cfg.generated_first and not cfg.generated:
        raise ValueError("generated_first trains on the generated questions first: give their file (--generated)")
    if cfg.generated_first and not 0 < cfg.pre_batch_epochs < cfg.epochs:
        raise ValueError(f"generated_first: the generated questions train epochs - pre_batch_epochs epochs and the RC "
                         f"set pre_batch_epochs, so both must be at least 1; got epochs = {cfg.epochs}, "
                         f"pre_batch_epochs = {cfg.pre_batch_epochs}")


def stages(cfg: PhraseTrainConfig) -> list[PhraseTrainConfig]:
    """The runs of a training: ``cfg`` itself, or with ``generated_first`` the code's two (module docstring); the
    second's ``init`` is filled in once the first has trained."""
    if not cfg.generated_first:
        return [cfg]
    first = replace(cfg, train=cfg.generated, generated=None, generated_first=False,
                    epochs=cfg.epochs - cfg.pre_batch_epochs, pre_batch_epochs=0,
                    negatives="none" if cfg.negatives == "none" else "in_batch")
    second = replace(cfg, generated=None, generated_first=False, epochs=cfg.pre_batch_epochs)
    return [first, second]


def _train_stage(cfg: PhraseTrainConfig, device, run: tracking.Run, progress: bool, first_step: int,
                 desc: str) -> tuple[DensePhrases, list[dict], dict]:
    """Train (or resume) one run of ``cfg``; (model, its step rows, {run_folder, examples, dropped}). Its steps are
    tracked from ``first_step`` + 1."""
    run_dir, feats = _start(cfg, "densephrases")
    n, sizes = len(feats["start"]), _sizes(feats)
    teacher_s = teacher_e = None
    if cfg.teacher and cfg.lambda_distill:
        teacher_s, teacher_e = teacher_logits(load_teacher(cfg.teacher).to(device), feats, precision=cfg.precision)
    start_epoch, model, state = _resume(run_dir, "densephrases", DensePhrases.load)
    run.update(run_id=_run_id(run_dir), run_folder=str(run_dir), start_epoch=start_epoch, **sizes)
    if model is None:
        model = DensePhrases.load(cfg.init) if cfg.init else DensePhrases.from_encoder(cfg.encoder)
    model.filter_trained = model.filter_trained or bool(cfg.lambda_filter)
    model.to(device)
    steps = cfg.epochs * len(_batches(n, cfg.batch_size, cfg.seed, 0))
    optimizer, scheduler = _optimizer(model.parameters(), cfg.lr, steps)
    rows = [] if state is None else _restore(state, optimizer, scheduler)
    model.train()
    bar = progress_bar(total=steps, initial=len(rows), desc=desc, unit="step", show=progress)
    for epoch in range(start_epoch, cfg.epochs):
        pre = cfg.negatives == "pre_batch" and epoch >= cfg.epochs - cfg.pre_batch_epochs
        queue = PreBatchQueue(cfg.pre_batch) if pre else None  # a new, empty queue every epoch
        for batch in _batches(n, cfg.batch_size, cfg.seed, epoch):
            t0 = time.perf_counter()
            used = len(queue) if queue else 0  # pre-batch batches this step scores against
            with autocast(device, cfg.precision):
                loss, parts = step_loss(model, feats, batch, cfg, queue, teacher_s, teacher_e)
            _update(loss, model, optimizer, scheduler)
            rows.append({"step": len(rows) + 1, "epoch": epoch + 1, "loss": round(float(loss.detach()), 6),
                         **{f"loss_{k}": round(parts.get(k, float("nan")), 6) for k in
                            ("single", "distill", "neg", "filter")},
                         "pre_batch": used, "seconds": round(time.perf_counter() - t0, 3)})
            _track(run, {**rows[-1], "step": first_step + len(rows)}, scheduler, len(batch))
            bar.update(1)
            bar.set_postfix(loss=f"{rows[-1]['loss']:.3f}")
        _save(run_dir, "densephrases", epoch + 1, model.save, optimizer, scheduler, rows)
        run.log(first_step + len(rows), checkpoint_step=first_step + len(rows), checkpoint_epoch=epoch + 1)
    bar.close()
    return model, rows, {"run_folder": str(run_dir), **sizes, "dropped": feats["dropped"]}


def train_densephrases(cfg: PhraseTrainConfig, progress: bool = True, run: tracking.Run | None = None) -> dict:
    """Train (or resume) the phrase and query encoders, in one run or the code's two (``generated_first``); writes
    the model folder ``cfg.out_dir``, whose ``train_log.csv`` numbers the steps across the runs (column ``stage``).
    ``run`` as for ``train_teacher``."""
    device = torch_device(cfg.device)
    _check(cfg)
    run = run or tracking.Run()
    runs = stages(cfg)
    with folder_lock(Path(cfg.checkpoint_dir), "DensePhrases training"):
        log_rows, summaries, model = [], [], None
        for k, stage in enumerate(runs):
            if k:  # the code's second stage starts from the first stage's encoders (its --load_dir)
                last_epoch = _layout("densephrases").name(runs[k - 1].epochs)
                stage = replace(stage, init=str(Path(summaries[-1]["run_folder"]) / last_epoch))
            desc = "DensePhrases" if len(runs) == 1 else f"DensePhrases, stage {k + 1} of {len(runs)}"
            model, rows, summary = _train_stage(stage, device, run, progress, len(log_rows), desc)
            log_rows += [{**r, "step": len(log_rows) + i + 1, "stage": k + 1} for i, r in enumerate(rows)]
            summaries.append({**summary, "steps": len(rows), "settings": asdict(stage)})
        with atomic_dir(cfg.out_dir) as tmp:
            model.save(tmp)
            _write_log(tmp / "train_log.csv", log_rows)
            write_json(tmp / "train_summary.json", {**summaries[-1], "settings": asdict(cfg),
                                                    "stages": summaries if len(runs) > 1 else None})
    last = summaries[-1]
    return {"run_folder": last["run_folder"], "steps": len(log_rows), "examples": last["examples"],
            "rows": last["rows"], "stages": [{k: s[k] for k in ("run_folder", "steps", "examples", "rows")}
                                             for s in summaries]}
