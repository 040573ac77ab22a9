"""Contrastive pretraining of NPM and NPM-single (paper 3.2-3.3 and 4.1; paper-map §2.3-§2.5), and the plain
MLM training of the parametric baseline (paper Table 1 "RoBERTa" row; paper-map §6).

One step: each rank takes ``lines_per_rank`` batch lines (the original: one), encodes the masked view (queries) and
the unmasked view (targets) of all of them with the same encoder, both with gradient; the targets of a group of
ranks form the candidate pool (``training.pool``: all ranks, this rank's half of the world as the original, or a
number of sequences; ``npm.training.gather``); each line's loss is the multi-positive InfoNCE of
``npm.training.loss`` of its queries against the whole pool, and the rank's loss is the mean over its lines. With
``accumulate`` > 1 a step is that many such micro-steps, their gradients accumulated (DDP synchronises on the last),
so the step's gradient is that of the mean over all its lines' losses, as the original's DDP average over 32 GPUs of
one line each (docs/paper-scale.md, "The paper's pool on fewer GPUs"). AdamW (weight decay on all parameters), linear
warm-up then linear decay to zero (transformers' scheduler), gradient clipping, mixed precision
(``npm.model.effective_precision``: on a GPU, and bf16 on a CPU that has it natively).

Resumable (``npm.checkpoints``): every ``checkpoint_every`` steps a checkpoint folder (``save_pretrained`` weights plus
optimiser, scheduler, RNG and data-position state) is written under a temporary name and renamed, so a
killed job leaves the previous checkpoint intact; ``resume`` continues bit-for-bit on CPU. Checkpoints live in a run
folder ``<checkpoint_dir>/run-<id>`` whose ``run.json`` records what produces the result (the settings that change
it, the encoder's and tokenizer's fingerprints, the training files' fingerprints; ``run_record``): a run resumes
only its own checkpoints, so a changed setting or rebuilt data starts fresh in a new run folder and the old run
stays resumable. A lock on ``checkpoint_dir`` keeps a second training out; an unreadable newest checkpoint, or one
whose files differ from the checksums recorded when it was saved (``sha256.json``, ``npm.checksums``), is set aside
(``step-N.corrupt-<time>``) and the previous one resumed. The final model folder records its checksums too.

``model="mlm"``: the parametric baseline. At paper scale it is the released roberta-large (not trained); the
embedded default's encoder (MiniLM, a sentence-transformers BERT) ships without an MLM head, so the head (newly
initialised, logged) and the encoder are trained with plain masked-LM cross-entropy (``AutoModelForMaskedLM``) on
**the same batch lines** (unmasked view; ``collate.collate_mlm`` masks 15% BERT-style on the fly with a generator
seeded from (seed, step, rank)), for the same steps, with the same optimiser, schedule, clipping, precision,
checkpointing and DDP as NPM, so that the comparison of Table 1 is fair. There is no candidate pool.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import get_linear_schedule_with_warmup

import npm.checksums as checksums
from npm import checkpoints, progress, tracking
from npm.fingerprint import file_fingerprint, model_fingerprint, tokenizer_fingerprint
from npm.io import atomic_dir, folder_lock, write_summary
from npm.model import (
    autocast,
    effective_precision,
    encode,
    load_encoder,
    load_masked_lm,
    load_tokenizer,
    max_input_length,
)
from npm.settings import TrainingSettings
from npm.training.collate import IGNORE_INDEX, MLM_RATIO, collate_mlm, collate_phrase, collate_single
from npm.training.data import BatchLines
from npm.training.gather import candidate_pool, parse_pool, ranks_per_pool
from npm.training.loss import phrase_loss, phrase_positives, single_loss, single_positives
from npm.training.packing import encode_packed, is_packed, use_packed_attention

log = logging.getLogger(__name__)
CHECKPOINTS = checkpoints.Layout(prefix="step", state_file="training_state.pt", rule="pretrain",
                                 command="npm-repro train")
# TrainConfig and TrainingSettings fields that change the trained weights (besides the encoder, tokenizer and data,
# fingerprinted); steps and schedule_steps enter as the schedule horizon, packed only when on (run_record).
# checkpoint_every, compile, keep_checkpoints, paths and resume don't.
RESULT_FIELDS = ("model_type", "warmup_steps", "lr", "weight_decay", "betas", "eps", "grad_clip", "pool", "pad_to",
                 "mlm_ratio", "attention", "seed", "lines_per_rank", "accumulate")
TRAINABLE = ("npm", "npm_single", "mlm")  # the model variants training makes
# model "mlm": loss_start = loss, loss_end = positives_per_span = 0, queries = tokens predicted.
LOG_FILE = "train_log.csv"  # in the run folder, copied into the final model folder
LOG_COLUMNS = ["step", "loss", "loss_start", "loss_end", "positives_per_span", "queries", "lr", "tokens_per_s"]


@dataclass
class TrainConfig:
    """One training run: what to train on and where to write it, and the config's ``training`` section
    (``npm.settings.TrainingSettings``, which holds each setting's default, range and help)."""

    model: str  # "npm" (phrase, span masking), "npm_single" (token) or "mlm" (parametric baseline)
    encoder: str
    shards: list[tuple[str, str]]  # (blocks .npz, masked .npz) per training shard
    out_dir: str  # final save_pretrained folder
    checkpoint_dir: str  # resumable checkpoints (kept outside the rule's output)
    tokenizer: str | None = None
    training: TrainingSettings = field(default_factory=TrainingSettings)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    mlm_ratio: float = MLM_RATIO  # model "mlm": share of non-special tokens selected (BERT's 15%)
    keep_checkpoints: int = 2
    resume: bool = True
    extra: dict = field(default_factory=dict)


def _init_distributed() -> tuple[int, int, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # as the original (paper-map §2.4)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


def run_record(cfg: TrainConfig, world: int, device: torch.device) -> dict:
    """What a checkpoint's weights depend on, and the run id (sha256 of it) naming its run folder.

    Settings of ``RESULT_FIELDS``, the schedule horizon, the effective precision (``effective_precision``) and the
    world size (it deals the batch lines to ranks); the content fingerprints of the encoder, the tokenizer and every
    training file. Paths and names are recorded for the reader but not hashed: the same files elsewhere are the
    same run."""
    t = cfg.training
    # TrainConfig.model is hashed under its old name "model_type", so that existing runs keep resuming
    values = {**vars(cfg), **t.as_dict(), "model_type": cfg.model}
    settings = {name: values[name] for name in RESULT_FIELDS}
    if t.packed:  # recorded only when on, so that the runs from before the switch keep their ids
        settings["packed"] = True
    settings.update(betas=list(cfg.betas), schedule_steps=t.schedule_steps or t.steps, world_size=world,
                    precision=effective_precision(device, t.precision))
    tokenizer = cfg.tokenizer or cfg.encoder
    hashed = {"settings": settings, "encoder_fingerprint": model_fingerprint(cfg.encoder),
              "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
              "data": [[file_fingerprint(b), file_fingerprint(m)] for b, m in cfg.shards]}
    return {"run_id": checkpoints.run_id(hashed), **hashed, "encoder": cfg.encoder, "tokenizer": tokenizer,
            "shards": [list(pair) for pair in cfg.shards]}


def _check_lengths(cfg: TrainConfig, data: BatchLines, model, tokenizer) -> None:
    """Every row must fit the encoder's positions (RoBERTa large: 512; the embedded MiniLM: 512)."""
    limit = max_input_length(model, tokenizer)
    if cfg.training.pad_to and cfg.training.pad_to > limit:
        raise ValueError(f"pad_to={cfg.training.pad_to} exceeds the encoder's {limit} positions; lower --pad-to")
    for (blocks_path, _), (_, offsets, masked, path) in zip(cfg.shards, data.shards, strict=True):
        used = np.unique(masked["batches"])
        lengths = offsets[used + 1] - offsets[used] if len(used) else np.zeros(0, np.int64)
        if len(lengths) and lengths.max() > limit:
            b = int(used[int(np.argmax(lengths))])
            raise ValueError(f"{blocks_path}: block {b} (a row of the batch lines of {path}) has "
                             f"{int(lengths.max())} tokens, more than the encoder's {limit} positions; re-tokenize the "
                             f"blocks with --max-seq-length {limit} or use an encoder with more positions")


def _resume_point(folder: Path, steps: int, load_model, rank: int):
    """(checkpoint, state, weights) of the newest readable checkpoint at or before ``steps``, or None
    (``npm.checkpoints.latest``; rank 0 sets the unreadable ones aside)."""
    return checkpoints.latest(folder, CHECKPOINTS, lambda ckpt: load_model(str(ckpt)).state_dict(), at_most=steps,
                              set_aside=rank == 0)


def _save_checkpoint(root: Path, step: int, model, tokenizer, optimizer, scheduler, position, keep: int) -> Path:
    def write_model(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             **checkpoints.rng_state(), "position": position}
    return checkpoints.save(root, step, state, CHECKPOINTS, write_model, keep)


def make_optimizer(parameters, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW of ``cfg`` (weight decay on all parameters, paper-map §2.5). On CUDA its fused kernel: one launch per
    step instead of a few per parameter tensor, the same update up to rounding."""
    return torch.optim.AdamW(parameters, lr=cfg.training.lr, betas=cfg.betas, eps=cfg.eps,
                             weight_decay=cfg.training.weight_decay, fused=device.type == "cuda")


def compile_encoder(model: torch.nn.Module, enabled: bool, dynamic: bool | None = None) -> str:
    """``torch.compile`` ``model`` in place when ``enabled`` (its state_dict and ``save_pretrained`` are unchanged);
    returns ``compiled`` or ``eager``. A graph that cannot be compiled (no C++ compiler, an unsupported operation)
    runs eagerly with a warning from torch._dynamo instead of failing the job: the same loss up to rounding.
    ``dynamic``: torch.compile's; True compiles shape-generic code at once, for inputs whose shape changes every step
    (packed rows), where the default compiles once for the first shape and again, shape-generic, at the second."""
    if not enabled:
        return "eager"
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # fall back to eager per graph, logged, rather than fail
    model.compile(dynamic=dynamic)
    return "compiled"


def _encode_both(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Query (masked view) and target (unmasked view) vectors from ONE encoder call.

    Paper-map §2.4 runs the shared encoder twice per step (masked queries, unmasked targets; both in train
    mode with dropout, both with gradient). Two forward calls of a DistributedDataParallel module before one
    backward break DDP (a parameter may be marked ready only once), so the two views are stacked along the
    batch dimension (padded to a common length with id 0 / attention 0) and encoded together, then split.
    Rows never attend to each other and padding is masked, so this is still the two passes of the original.
    A packed encoder (``training.packed``, ``npm.training.packing``) encodes the same rows without their padding.
    """
    q_ids, q_att = batch["query_ids"], batch["query_attention"].long()
    t_ids, t_att = batch["target_ids"], batch["target_valid"].long()
    rows, lq, lt = q_ids.shape[0], q_ids.shape[1], t_ids.shape[1]
    width = max(lq, lt)

    def widen(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=0)

    ids, attention = torch.cat([widen(q_ids), widen(t_ids)]), torch.cat([widen(q_att), widen(t_att)])
    vectors = encode_packed(model, ids, attention) if is_packed(model) else encode(model, ids, attention)
    return vectors[:rows, :lq], vectors[rows:, :lt]


class MaskedTokensMLM(torch.nn.Module):
    """A masked LM whose vocabulary head runs on the selected tokens only; the loss is ``AutoModelForMaskedLM``'s
    (mean cross-entropy over the tokens whose label is not ``IGNORE_INDEX``), but the head's cost falls from every
    position to the 15 % that are scored: with MiniLM's 30,522-word head on 384 dimensions the full head costs more
    than the encoder. The wrapped model keeps the parameters (``save_pretrained`` saves it as before)."""

    def __init__(self, mlm):
        super().__init__()
        heads = [m for m in mlm.children() if m is not mlm.base_model]
        if len(heads) != 1:
            raise ValueError(f"{type(mlm).__name__}: expected one head module beside the base model, found "
                             f"{[type(m).__name__ for m in heads]}")
        self.encoder, self.head = mlm.base_model, heads[0]

    def forward(self, input_ids, attention_mask, labels):
        encoder = encode_packed if is_packed(self.encoder) else encode
        hidden = encoder(self.encoder, input_ids, attention_mask)
        chosen = labels != IGNORE_INDEX
        return torch.nn.functional.cross_entropy(self.head(hidden[chosen]).float(), labels[chosen])


def to_device(batch: dict, device) -> dict:
    """``batch``'s tensors on ``device``; on CUDA each host tensor goes through pinned memory without the host waiting
    (``non_blocking``: the copy queues behind the work already on the device, which a copy from pageable memory
    would wait for)."""
    if torch.device(device).type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: (v.pin_memory() if v.device.type == "cpu" else v).to(device, non_blocking=True)
            for k, v in batch.items()}


def mlm_step_loss(model, batch: dict, device) -> tuple[torch.Tensor, dict]:
    """Masked-LM cross-entropy of one ``collate_mlm`` batch (MLM baseline): mean over the selected tokens of
    -log softmax(vocabulary logits)[original id]. ``model`` is a ``MaskedTokensMLM`` (or its DDP wrapper: one
    forward, DDP-safe)."""
    batch = to_device(batch, device)
    loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    return loss, {"queries": int((batch["labels"] != IGNORE_INDEX).sum())}


def mlm_generator(seed: int, step: int, rank: int = 0) -> torch.Generator:
    """The masking generator of one step of the MLM baseline (with ``accumulate`` > 1 the training loop passes the
    micro-step, step x accumulate + micro): seeded from (seed, step, rank) only, so a resumed run draws the same
    masks, and ranks draw independent ones."""
    state = np.random.SeedSequence([seed, step, rank]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def collate_lines(collate, lines: list[tuple[list[np.ndarray], np.ndarray]], mask_id: int,
                  pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """One batch of a rank's batch lines (``collate_phrase`` or ``collate_single``): their sequences stacked in line
    order, each line's spans renumbered to its rows, and ``sequence_line`` [rows], the line of each sequence (the rank's
    loss is the mean of its lines' losses, ``step_loss``)."""
    sequences, spans, sequence_line = [], [], []
    for k, (rows, line_spans) in enumerate(lines):
        line_spans = np.asarray(line_spans, dtype=np.int64).reshape(-1, 3).copy()
        line_spans[:, 0] += len(sequences)
        spans.append(line_spans)
        sequences += list(rows)
        sequence_line += [k] * len(rows)
    batch = collate(sequences, np.concatenate(spans), mask_id, pad_to)
    batch["sequence_line"] = torch.tensor(sequence_line, dtype=torch.int64)
    return batch


def _mean_over_lines(loss_of, query_line: torch.Tensor, lines: int) -> tuple[torch.Tensor, dict]:
    """Mean over the batch lines of ``loss_of(rows)`` (rows: the queries of one line) and of its stats, queries
    summed: each line weighs the same whatever its number of spans, as one GPU's line in the original. One line's
    rows are all the queries (no wait for the device to find them)."""
    results = []
    for k in range(lines):
        rows = (torch.arange(len(query_line), device=query_line.device) if lines == 1 else
                torch.nonzero(query_line == k).flatten())
        try:
            results.append(loss_of(rows))
        except ValueError as e:
            raise ValueError(f"line {k + 1} of this rank's {lines}: {e}" if lines > 1 else str(e)) from None
    loss = torch.stack([r[0] for r in results]).mean()
    stats = {key: sum(r[1][key] for r in results) / (1 if key == "queries" else lines) for key in results[0][1]}
    return loss, stats


def step_loss(trainee, batch: dict, model: str, pool: str | int, device) -> tuple[torch.Tensor, dict]:
    """Loss of a rank's batch lines: two views through the same encoder, then the pooled contrastive loss of each line,
    averaged over the lines (paper-map §2.4).

    The masked (query) and unmasked (target) views of all the rank's lines go through the encoder in one call
    (``_encode_both``: DDP allows one forward per backward); the targets of the pool's ranks form the candidates
    (``candidate_pool``). ``batch["sequence_line"]`` (``collate_lines``) names each sequence's line; without it the
    batch is one line. ``trainee``: the encoder (its DDP wrapper), or ``MaskedTokensMLM`` for ``model="mlm"``: the
    masked-LM loss of ``mlm_step_loss`` (``pool`` unused).
    """
    if model == "mlm":
        return mlm_step_loss(trainee, batch, device)
    lines = int(batch["sequence_line"].max()) + 1 if "sequence_line" in batch else 1  # before the copy: no wait
    batch = to_device(batch, device)
    queries, targets = _encode_both(trainee, batch)
    pool_vectors, pool_ids, pool_valid, offset = candidate_pool(
        targets, batch["target_ids"], batch["target_valid"], pool
    )
    sequence_line = batch.get("sequence_line", torch.zeros(len(targets), dtype=torch.int64, device=targets.device))
    if model == "npm":
        seq = batch["span_seq"] + offset
        q_start = queries[batch["span_seq"], batch["q_start_pos"]]
        q_end = queries[batch["span_seq"], batch["q_end_pos"]]
        pos_start, pos_end = phrase_positives(batch["span_tokens"], batch["span_lengths"], seq, pool_ids, pool_valid)
        return _mean_over_lines(
            lambda i: phrase_loss(q_start[i], q_end[i], pool_vectors, pool_valid, pos_start[i], pos_end[i], seq[i],
                                  span_tokens=batch["span_tokens"][i]),
            sequence_line[batch["span_seq"]], lines)
    seq = batch["query_seq"] + offset
    q = queries[batch["query_seq"], batch["query_pos"]]
    positives = single_positives(batch["query_tokens"], seq, pool_ids, pool_valid)
    return _mean_over_lines(lambda i: single_loss(q[i], pool_vectors, pool_valid, positives[i], seq[i]),
                            sequence_line[batch["query_seq"]], lines)


def accumulate_gradients(trainee, batches: list[dict], model: str, pool: str | int, device,
                         precision: str = "fp32", scaler=None, where: list[str] | None = None) -> tuple[float, dict]:
    """Forward and backward of the micro-batches of one optimizer step (one per micro-step, ``accumulate`` of them).

    Each micro-step's loss (``step_loss``) is divided by their number, so the accumulated gradient is that of their
    mean; a DistributedDataParallel ``trainee`` synchronises only on the last backward (``no_sync`` before), and its
    average over the ranks then makes the step's gradient that of the mean over all the step's lines. ``scaler``: the
    fp16 GradScaler (None: plain backward). ``where`` names each micro-batch's lines for errors. Returns the mean loss
    and the stats summed over the micro-steps ("queries") or averaged (the others).
    """
    losses, stats = [], []
    for m, batch in enumerate(batches):
        last = m == len(batches) - 1
        sync = contextlib.nullcontext() if last or not hasattr(trainee, "no_sync") else trainee.no_sync()
        with sync:
            with autocast(device, precision):
                try:
                    loss, micro_stats = step_loss(trainee, batch, model, pool, device)
                except ValueError as e:
                    raise ValueError(f"{where[m]}: {e}" if where else str(e)) from None
            scaled = loss / len(batches)
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        losses.append(loss.detach())
        stats.append(micro_stats)
    n = len(batches)
    merged = {key: sum(float(st[key]) for st in stats) / (1 if key == "queries" else n) for key in stats[0]}
    return float(torch.stack(losses).mean()), merged


def train(cfg: TrainConfig, run: tracking.Run | None = None) -> dict:
    """Run (or resume) pretraining; returns a summary. Writes the final model to ``cfg.out_dir``. ``run``
    (``npm.tracking``, rank 0's; the caller finishes it) gets the run id, each step's row of ``train_log.csv`` (loss,
    learning rate, throughput) and the step of each checkpoint."""
    if cfg.model not in TRAINABLE:
        raise ValueError(f"model must be one of {list(TRAINABLE)}, not {cfg.model!r}")
    rank, world, device = _init_distributed()
    ckpt_root = Path(cfg.checkpoint_dir)
    ckpt_root.mkdir(parents=True, exist_ok=True)
    with folder_lock(ckpt_root, "training") if rank == 0 else contextlib.nullcontext():
        return _train(cfg, rank, world, device, ckpt_root, run or tracking.Run())


def _model_loader(model: str, attention: str):
    """``load(name)`` of the trained model: a masked LM (new head allowed) for ``mlm``, else the encoder."""
    if model == "mlm":
        def load_model(name: str):
            return load_masked_lm(name, allow_new_head=True, attn_implementation=attention)
    else:
        def load_model(name: str):
            return load_encoder(name, attn_implementation=attention)
    return load_model


def _shared_record(cfg: TrainConfig, rank: int, world: int, device: torch.device) -> dict:
    """``run_record``, made by rank 0 (it hashes the training files once) and broadcast, so that every rank resumes
    from the same run folder."""
    record = run_record(cfg, world, device) if rank == 0 else None
    if world > 1:
        shared = [record]
        dist.broadcast_object_list(shared, src=0)
        record = shared[0]
    return record


def _resume(cfg: TrainConfig, run_dir: Path, load_model, rank: int, model, optimizer, scheduler,
            record: dict) -> tuple[int, int, int]:
    """(step, epoch, cursor) to start from: a fresh run's zeros, or the newest readable checkpoint's, whose weights,
    optimiser, scheduler and RNG states are then restored."""
    found = _resume_point(run_dir, cfg.training.steps, load_model, rank) if cfg.resume else None
    if found is None:
        log.info("starting run %s in %s", record["run_id"][:16], run_dir)
        return 0, 0, 0
    ckpt, state, weights = found
    model.load_state_dict(weights)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    checkpoints.restore_rng(state)
    step, (epoch, cursor) = state["step"], state["position"]
    log.info("resuming from %s (step %d)", ckpt, step)
    return step, epoch, cursor


def _open_log(log_path: Path, step: int):
    """(file, csv writer) of the run's ``train_log.csv``, kept open for the whole run: the header, then the rows of
    a resumed run up to ``step`` (the ones logged after its checkpoint are dropped)."""
    kept_rows = []
    if step and log_path.exists():
        with open(log_path, newline="") as f:
            kept_rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]
    log_file = open(log_path, "w", newline="")
    writer = csv.DictWriter(log_file, fieldnames=LOG_COLUMNS)
    writer.writeheader()
    writer.writerows(kept_rows)
    return log_file, writer


def _micro_batches(cfg: TrainConfig, data: BatchLines, order, cursor: int, tokenizer, mlm_vocab: int, step: int,
                   rank: int) -> tuple[list[dict], list[str], int]:
    """The ``accumulate`` micro-batches of one step, each of this rank's next ``lines_per_rank`` lines of ``order``
    from ``cursor``; returns them, the names of their lines (for errors) and the cursor after them. ``mlm_vocab``:
    the ids a random replacement may take (model ``mlm``)."""
    t = cfg.training
    batches, where = [], []
    for micro in range(t.accumulate):
        lines = [data.line(int(i)) for i in order[cursor : cursor + t.lines_per_rank]]
        cursor += t.lines_per_rank
        where.append(", ".join(name for _, _, name in lines))
        if cfg.model == "mlm":  # the unmasked view, masked BERT-style with this micro-step's generator
            try:
                batches.append(collate_mlm([s for seqs, _, _ in lines for s in seqs], tokenizer.mask_token_id,
                                           tokenizer.all_special_ids, mlm_vocab,
                                           mlm_generator(t.seed, step * t.accumulate + micro, rank),
                                           cfg.mlm_ratio, t.pad_to))
            except ValueError as e:
                raise ValueError(f"{where[-1]}: {e}") from None
        else:
            collate = collate_phrase if cfg.model == "npm" else collate_single
            batches.append(collate_lines(collate, [(seqs, spans) for seqs, spans, _ in lines],
                                         tokenizer.mask_token_id, t.pad_to))
    return batches, where, cursor


def _optimizer_step(model, optimizer, scheduler, scaler, grad_clip: float) -> None:
    """Unscale (fp16), clip, step and clear the gradients, then advance the learning-rate schedule."""
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()


def _log_row(step: int, loss: float, stats: dict, lr: float, tokens: int, seconds: float) -> dict:
    """One row of ``train_log.csv`` (LOG_COLUMNS); model ``mlm`` has no start/end losses nor positives."""
    return {
        "step": step,
        "loss": round(loss, 6),
        "loss_start": round(float(stats.get("loss_start", stats.get("loss", loss))), 6),
        "loss_end": round(float(stats.get("loss_end", 0.0)), 6),
        "positives_per_span": round(float(stats.get("positives_per_span", 0.0)), 3),
        "queries": int(stats["queries"]),
        "lr": lr,
        "tokens_per_s": round(tokens / seconds, 1),
    }


def _save_final(cfg: TrainConfig, model, tokenizer, run_dir: Path, summary: dict) -> None:
    """The final model folder (weights, tokenizer, training log, run record and their checksums) and its summary."""
    out = Path(cfg.out_dir)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.copy(run_dir / LOG_FILE, tmp / LOG_FILE)
        shutil.copy(run_dir / checkpoints.RUN_FILE, tmp / checkpoints.RUN_FILE)
        checksums.write_folder_record(tmp, "pretrain", f"npm-repro train --out {out}")
    write_summary(out / "training_summary.json", summary, config=asdict(cfg))


def _train(cfg: TrainConfig, rank: int, world: int, device: torch.device, ckpt_root: Path,
           run: tracking.Run) -> dict:
    t = cfg.training
    random.seed(t.seed)
    torch.manual_seed(t.seed)
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.encoder)
    data = BatchLines(cfg.shards)
    if cfg.model != "mlm":  # the pool's arithmetic fails here, before the model loads (npm.training.gather)
        ranks_per_pool(t.pool, world, t.lines_per_rank * data.sequences_per_line()
                       if isinstance(parse_pool(t.pool), int) else None)
    load_model = _model_loader(cfg.model, t.attention)
    model = load_model(cfg.encoder).to(device)
    model.train()
    if t.packed:
        use_packed_attention(model)
    _check_lengths(cfg, data, model, tokenizer)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    scheduler = get_linear_schedule_with_warmup(optimizer, t.warmup_steps, t.schedule_steps or t.steps)
    mlm_vocab = min(len(tokenizer), model.get_input_embeddings().num_embeddings)  # random replacements (MLM)
    record = _shared_record(cfg, rank, world, device)
    run_dir = checkpoints.run_folder(ckpt_root, record, CHECKPOINTS, create=rank == 0)
    step, epoch, cursor = _resume(cfg, run_dir, load_model, rank, model, optimizer, scheduler, record)
    trainee = MaskedTokensMLM(model) if cfg.model == "mlm" else model
    kernels = {"compile": compile_encoder(trainee, t.compile, dynamic=True if t.packed else None),
               "adamw": "fused" if optimizer.defaults.get("fused") else "foreach"}
    ddp = torch.nn.parallel.DistributedDataParallel(trainee) if world > 1 else trainee
    precision = record["settings"]["precision"]  # the precision the run id records (effective_precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    run.update(run_id=record["run_id"], run_folder=str(run_dir), start_step=step, world_size=world,
               precision=precision, **kernels)
    log_file, writer = _open_log(run_dir / LOG_FILE, step) if rank == 0 else (None, None)
    split = dict(rank=rank, world=world, lines_per_rank=t.lines_per_rank, accumulate=t.accumulate)
    order = data.order(t.seed, epoch, **split)
    losses = []
    bar = progress.bar(total=t.steps, initial=step, desc=f"train {cfg.model}", unit="step", show=rank == 0)
    while step < t.steps:
        if cursor >= len(order):  # an epoch's order holds whole steps (BatchLines.order)
            epoch, cursor = epoch + 1, 0
            order = data.order(t.seed, epoch, **split)
        start = time.perf_counter()
        batches, where, cursor = _micro_batches(cfg, data, order, cursor, tokenizer, mlm_vocab, step, rank)
        loss, stats = accumulate_gradients(ddp, batches, cfg.model, t.pool, device, precision, scaler, where)
        _optimizer_step(model, optimizer, scheduler, scaler, t.grad_clip)
        step += 1
        tokens = sum(int(b["attention_mask" if cfg.model == "mlm" else "target_valid"].sum()) for b in batches)
        row = _log_row(step, loss, stats, scheduler.get_last_lr()[0], tokens * world, time.perf_counter() - start)
        losses.append(row["loss"])
        if rank == 0:
            writer.writerow(row)
            log_file.flush()
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['lr']:.2e}")
            run.log(step, **{k: v for k, v in row.items() if k != "step"})
            if step % t.checkpoint_every == 0 or step == t.steps:
                _save_checkpoint(run_dir, step, model, tokenizer, optimizer, scheduler, (epoch, cursor),
                                 cfg.keep_checkpoints)
                run.log(step, checkpoint_step=step)
    bar.close()
    if log_file is not None:
        log_file.close()
    summary = {"model": cfg.model, "steps": step, "batch_lines": len(data), "world_size": world,
               "run_id": record["run_id"], "run_folder": str(run_dir), **kernels,
               "first_losses": losses[:5], "last_losses": losses[-5:]}
    if rank == 0:
        _save_final(cfg, model, tokenizer, run_dir, summary)
    if world > 1:
        dist.destroy_process_group()
    return summary
