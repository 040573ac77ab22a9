"""REPLUG LSR: LM-supervised training of the dense retriever (Shi et al. 2023, section 4; docs/paper-map.md §R2.3).

For a training text, x = its first ``x_len`` LM tokens and y = the next ``y_len``. The retriever (one shared
encoder, mean pooling, cosine by default) finds the top ``k`` corpus blocks for x in an index of **stale** block
vectors; their scores s(d, x) are then recomputed with gradient (query and document through the current encoder),
and the frozen LM scores each of them: score_LM(d) = log p(y | d o x), summed over y's tokens (``lm_score="sum"``)
or averaged (``"mean"``), cached per (query, block). With

    P_R(d | x) = softmax(s / gamma),    Q(d | x, y) = softmax(score_LM / beta)    over the k retrieved blocks,

the loss is KL(P_R || Q) (paper; ``kl="retriever_lm"``) or KL(Q || P_R) (the authors' code, ``KLDivLoss(log P_R,
Q)``; ``kl="lm_retriever"``), averaged over the batch. Only the retriever's parameters are in the optimiser (Adam,
linear warm-up over ``warmup_ratio`` of the steps, then linear decay); the LM runs in eval mode without gradient.
Every ``refresh_every`` steps the whole corpus is re-embedded and the index rebuilt (paper: every 3k of 25k steps).
A query never retrieves a block of its own source document (``source_doc``, a corpus document id).

Resumable (``npm.checkpoints``): every ``checkpoint_every`` steps ``step-N/`` (the retriever in ``save_pretrained``
format, its tokenizer, ``state.pt`` with optimiser, scheduler, RNG, data position and the LM-score cache) is written
atomically inside ``run-<id>``, whose id hashes the settings and the inputs' fingerprints: a run resumes only its own
checkpoints, and an unreadable or changed one is set aside and the previous one resumed.
``train_log.csv`` has one row per step; the same rows (with the learning rate and queries per second) and the
checkpoint steps go to the job's ``npm.tracking`` run.
"""

from __future__ import annotations

import csv
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from npm import checkpoints, tracking
from npm.baselines.decoder import BlockTexts
from npm.baselines.dense import DEFAULT_INDEX, SCORES, BlockIndex, block_vectors, blocks_with_text, mean_pool
from npm.baselines.lm import load_causal_lm, target_logprobs
from npm.data.blocks import load_blocks, pad_blocks
from npm.fingerprint import file_fingerprint, model_fingerprint
from npm.io import atomic_dir, folder_lock, read_jsonl, write_json
from npm.model import encode, load_encoder, load_tokenizer
from npm.progress import bar as progress_bar
from npm.replug.lm_eval import begin_token
from npm.settings import LsrSettings, ReplugSettings

log = logging.getLogger("npm-repro.replug.lsr")
KL_DIRECTIONS = ("retriever_lm", "lm_retriever")
CHECKPOINTS = checkpoints.Layout(prefix="step", state_file="state.pt", rule="replug_train_lsr",
                                 command="npm-repro replug train-lsr")
LOG_COLUMNS = ["step", "loss", "top1_share_retriever", "top1_share_lm", "lm_scores_computed", "refreshed", "seconds"]


@dataclass
class LsrConfig:
    encoder: str  # the retriever to start from (REPLUG: Contriever; embedded: model.encoder)
    lm: str  # the frozen LM
    blocks: list[str]  # retrieval corpus blocks files, tokenized with the encoder's tokenizer
    queries: str  # JSONL {id, text, source_doc (corpus document id or null)}
    out_dir: str
    checkpoint_dir: str
    steps: int = 25_000
    batch_size: int = 64
    k: int = 20
    gamma: float = 0.1
    beta: float = 0.1
    lm_score: str = "sum"  # "sum" | "mean" of log p(y | d o x) over y's tokens
    kl: str = "retriever_lm"  # KL(P_R || Q) (paper) | "lm_retriever": KL(Q || P_R) (authors' code)
    lr: float = 2e-5
    warmup_ratio: float = 0.1
    refresh_every: int = 3_000
    x_len: int = 128
    y_len: int = 128
    doc_len: int = 128
    score: str = "cosine"
    index: str = DEFAULT_INDEX  # FAISS factory string of the stale index (REPLUG: exact)
    checkpoint_every: int = 1_000
    seed: int = 0
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ the loss

def lsr_loss(retriever_scores: torch.Tensor, lm_scores: torch.Tensor, gamma: float, beta: float,
             kl: str = LsrSettings.kl) -> torch.Tensor:
    """Mean over the batch of KL(P_R || Q) (``retriever_lm``) or KL(Q || P_R) (``lm_retriever``) between
    P_R = softmax(retriever_scores / gamma) and Q = softmax(lm_scores / beta), both [B, k]; Q is a constant."""
    if kl not in KL_DIRECTIONS:
        raise ValueError(f"kl must be one of {KL_DIRECTIONS}, not {kl!r}")
    if gamma <= 0 or beta <= 0:
        raise ValueError(f"gamma and beta must be > 0, got {gamma} and {beta}")
    log_pr = torch.log_softmax(retriever_scores.double() / gamma, dim=-1)
    log_q = torch.log_softmax(lm_scores.detach().double() / beta, dim=-1)
    if kl == "retriever_lm":
        per_query = (log_pr.exp() * (log_pr - log_q)).sum(-1)
    else:
        per_query = (log_q.exp() * (log_q - log_pr)).sum(-1)
    return per_query.mean()


# ------------------------------------------------------------------------------------------------ the retriever

class Retriever:
    """The trainable dual encoder (one shared encoder, mean pooling) and a FAISS index of stale block vectors
    (``npm.baselines.dense.BlockIndex`` from the factory string ``index``: the blocks with surface text)."""

    def __init__(self, encoder: str, blocks: list[str], score: str = ReplugSettings.score, index: str = DEFAULT_INDEX,
                 device=None):
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, not {score!r}")
        self.score, self.factory, self.blocks = score, index, [str(b) for b in blocks]
        self.device = torch.device(device or "cpu")
        self.model = load_encoder(encoder).to(self.device)
        self.tokenizer = load_tokenizer(encoder)
        ids, offsets, docs = [], [0], []
        for path in self.blocks:
            arrays = load_blocks(path)
            bo = arrays["block_offsets"]
            ids.append(arrays["input_ids"])
            offsets.extend((bo[1:] + offsets[-1]).tolist())
            docs.append(arrays["doc_ids"][arrays["block_doc"]])
        self.input_ids = np.concatenate(ids).astype(np.int64)
        self.block_offsets = np.asarray(offsets, dtype=np.int64)
        self.block_docs = np.concatenate(docs).astype(str)  # the document id of every global block
        self.n_blocks = len(self.block_offsets) - 1
        self.has_text = blocks_with_text(self.blocks)
        self.index = None

    def _pool(self, ids, attention) -> torch.Tensor:
        ids, att = torch.as_tensor(ids).to(self.device), torch.as_tensor(attention).long().to(self.device)
        v = mean_pool(encode(self.model, ids, att), att).float()
        return torch.nn.functional.normalize(v, dim=-1) if self.score == "cosine" else v

    def encode_blocks(self, blocks) -> torch.Tensor:
        """Vectors [n, h] of corpus blocks, with gradient (the retrieved documents of a step)."""
        blocks = np.asarray(blocks, dtype=np.int64)
        width = int(max(1, np.diff(self.block_offsets)[blocks].max()))
        return self._pool(*pad_blocks(self.input_ids, self.block_offsets, blocks, width))

    def encode_queries(self, texts: list[str], max_tokens: int = 256) -> torch.Tensor:
        """Vectors [n, h] of query texts, with gradient."""
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=max_tokens, return_tensors="pt")
        return self._pool(enc["input_ids"], enc["attention_mask"])

    def refresh(self, blocks_per_pass: int = 64) -> np.ndarray:
        """Re-embed every block with the current encoder (``npm.baselines.dense.block_vectors``, in eval mode,
        ``blocks_per_pass`` blocks per forward pass) and rebuild the index; returns the vectors [n_blocks, h]."""
        was_training = self.model.training
        self.model.eval()
        vecs = block_vectors(self.model, self.blocks, blocks_per_pass, self.device)
        self.model.train(was_training)
        self.index = BlockIndex(vecs, self.has_text, self.score, self.factory)
        return vecs

    def search(self, q: np.ndarray, k: int, exclude_docs: list[str | None]) -> np.ndarray:
        """Top-``k`` block ids [n, k] of query vectors ``q`` in the (stale) index, no block of ``exclude_docs[i]``."""
        if self.index is None:
            raise RuntimeError("search before refresh(): the index is built by refresh()")
        own = [np.flatnonzero((self.block_docs == d) & self.has_text) if d is not None else np.zeros(0, np.int64)
               for d in exclude_docs]
        depth = k + max(len(o) for o in own)
        if depth > len(self.index):
            raise ValueError(f"k = {k} is larger than the corpus ({len(self.index)} blocks with text, minus a "
                             "query's own document)")
        found, _ = self.index.search(q, depth)
        out = []
        for row, mine in zip(found, own, strict=True):
            mine = set(mine.tolist())
            kept = [b for b in row.tolist() if b >= 0 and b not in mine][:k]
            if len(kept) < k:
                raise RuntimeError(f"the index {self.factory!r} returned {len(kept)} blocks for k = {k}: an IVF "
                                   "index probes too few lists (use more lists per probe or 'Flat')")
            out.append(kept)
        return np.asarray(out, dtype=np.int64)


# ------------------------------------------------------------------------------------------------ the loop

def lm_scorer(lm, lm_tokenizer, block_text, doc_len: int, reduce: str = "sum", cache: dict | None = None):
    """``scores(query, blocks) -> (score_LM per block, n computed)`` with score_LM(d) = log p(y | d o x) of the frozen
    LM (summed or averaged over y's tokens, teacher-forced, no gradient), the document cut to its first ``doc_len``
    LM tokens; cached per (query id, block) in ``cache``."""
    bos = begin_token(lm_tokenizer)
    pad = lm_tokenizer.pad_token_id if lm_tokenizer.pad_token_id is not None else bos
    cache = {} if cache is None else cache
    doc_tokens: dict[int, list[int]] = {}

    def scores(q: dict, blocks) -> tuple[list[float], int]:
        todo = [int(b) for b in blocks if (q["id"], int(b)) not in cache]
        if todo:
            for b in todo:
                if b not in doc_tokens:
                    doc_tokens[b] = lm_tokenizer(block_text(b), add_special_tokens=False)["input_ids"][:doc_len]
            lp = target_logprobs(lm, [[bos] + doc_tokens[b] + q["x_ids"] for b in todo], q["y_ids"], pad)
            for b, row in zip(todo, lp, strict=True):
                cache[(q["id"], b)] = float(row.sum() if reduce == "sum" else row.mean())
        return [cache[(q["id"], int(b))] for b in blocks], len(todo)

    return scores


def lsr_step(retriever: Retriever, batch: list[dict], k: int, lm_scores, gamma: float, beta: float,
             kl: str = LsrSettings.kl) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The loss of one batch of queries: top-k blocks from the stale index, their scores recomputed with gradient
    (query and blocks through the current encoder), the frozen LM's scores ``lm_scores(query, blocks) -> (scores,
    n computed)``. Returns (loss, retriever scores [B, k], LM scores [B, k], LM scores computed)."""
    qv = retriever.encode_queries([q["x_text"] for q in batch])
    found = retriever.search(qv.detach().cpu().numpy(), k, [q.get("source_doc") for q in batch])
    dv = retriever.encode_blocks(found.ravel()).view(len(batch), k, -1)
    s = (qv[:, None, :] * dv).sum(-1)
    scored = [lm_scores(q, f) for q, f in zip(batch, found, strict=True)]
    lm_s = torch.tensor([v for v, _ in scored], dtype=torch.float64)
    return lsr_loss(s, lm_s, gamma, beta, kl), s, lm_s, sum(n for _, n in scored)


def _run_id(cfg: LsrConfig) -> str:
    hashed = {k: v for k, v in asdict(cfg).items() if k not in ("out_dir", "checkpoint_dir", "blocks", "queries",
                                                                 "encoder", "lm", "checkpoint_every", "extra")}
    hashed.update(encoder=model_fingerprint(cfg.encoder), lm=model_fingerprint(cfg.lm),
                  blocks=[file_fingerprint(b) for b in cfg.blocks], queries=file_fingerprint(cfg.queries))
    return checkpoints.run_id(hashed)


def load_queries(path: str, lm_tokenizer, x_len: int, y_len: int) -> list[dict]:
    """Training queries: x = the first ``x_len`` LM tokens of each text, y = the next ``y_len`` (at least one)."""
    out = []
    for r in read_jsonl(path):
        ids = lm_tokenizer(r["text"], add_special_tokens=False)["input_ids"]
        if len(ids) <= x_len:
            continue
        out.append({"id": str(r["id"]), "x_ids": ids[:x_len], "y_ids": ids[x_len:x_len + y_len],
                    "x_text": lm_tokenizer.decode(ids[:x_len]), "source_doc": r.get("source_doc")})
    if not out:
        raise ValueError(f"{path}: no query has more than x_len = {x_len} LM tokens")
    return out


def train_lsr(cfg: LsrConfig, progress: bool = True, run: tracking.Run | None = None) -> dict:
    """Train (or resume) the retriever; writes ``cfg.out_dir`` (``save_pretrained``) and returns a summary. ``run``
    (``npm.tracking``; the caller finishes it) gets the run id, each step's row and each checkpoint's step."""
    if cfg.lm_score not in ("sum", "mean"):
        raise ValueError(f"lm_score must be sum or mean, not {cfg.lm_score!r}")
    if min(cfg.steps, cfg.batch_size, cfg.k, cfg.refresh_every, cfg.checkpoint_every) < 1:
        raise ValueError("steps, batch_size, k, refresh_every and checkpoint_every must be >= 1")
    root = Path(cfg.checkpoint_dir)
    with folder_lock(root, "REPLUG LSR training"):
        return _train(cfg, root, progress, run or tracking.Run())


def _train(cfg: LsrConfig, root: Path, progress: bool, run: tracking.Run) -> dict:
    from transformers import get_linear_schedule_with_warmup

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    run_id = _run_id(cfg)
    run_dir = checkpoints.run_folder(root, {"run_id": run_id, "settings": asdict(cfg)}, CHECKPOINTS)
    lm, lm_tok = load_causal_lm(cfg.lm)
    for p in lm.parameters():
        p.requires_grad_(False)
    texts = BlockTexts(cfg.blocks)
    retriever = Retriever(cfg.encoder, cfg.blocks, cfg.score, cfg.index)
    queries = load_queries(cfg.queries, lm_tok, cfg.x_len, cfg.y_len)
    optimizer = torch.optim.Adam(retriever.model.parameters(), lr=cfg.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * cfg.steps), cfg.steps)
    step, cache = 0, {}
    found = checkpoints.latest(run_dir, CHECKPOINTS, lambda ckpt: load_encoder(str(ckpt)).state_dict())
    if found is not None:
        _, state, weights = found
        retriever.model.load_state_dict(weights)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        checkpoints.restore_rng(state)
        step, cache = state["step"], state["cache"]
        log.info("resuming %s from step %d", run_dir, step)

    def write_retriever(tmp: Path) -> None:
        retriever.model.save_pretrained(tmp)
        retriever.tokenizer.save_pretrained(tmp)

    retriever.model.train()
    retriever.refresh()
    lm_scores = lm_scorer(lm, lm_tok, texts, cfg.doc_len, cfg.lm_score, cache)

    rows = []
    if step and (run_dir / "train_log.csv").exists():
        with open(run_dir / "train_log.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]
    run.update(run_id=run_id, run_folder=str(run_dir), start_step=step)
    bar = progress_bar(total=cfg.steps, initial=step, desc="REPLUG LSR", unit="step", show=progress)
    while step < cfg.steps:
        t0 = time.perf_counter()
        batch = [queries[(step * cfg.batch_size + i) % len(queries)] for i in range(cfg.batch_size)]
        loss, s, lm_s, computed = lsr_step(retriever, batch, cfg.k, lm_scores, cfg.gamma, cfg.beta, cfg.kl)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        refreshed = step % cfg.refresh_every == 0 and step < cfg.steps
        if refreshed:
            retriever.refresh()
        rows.append({"step": step, "loss": round(float(loss.detach()), 6),
                     "top1_share_retriever": round(float(torch.softmax(s.detach() / cfg.gamma, -1)[:, 0].mean()), 4),
                     "top1_share_lm": round(float(torch.softmax(lm_s / cfg.beta, -1)[:, 0].mean()), 4),
                     "lm_scores_computed": computed, "refreshed": int(refreshed),
                     "seconds": round(time.perf_counter() - t0, 3)})
        run.log(step, **{k: v for k, v in rows[-1].items() if k != "step"}, lr=scheduler.get_last_lr()[0],
                queries_per_s=round(cfg.batch_size / rows[-1]["seconds"], 2) if rows[-1]["seconds"] else None)
        bar.update(1)
        bar.set_postfix(loss=f"{rows[-1]['loss']:.4f}")
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            checkpoints.save(run_dir, step, {"step": step, "optimizer": optimizer.state_dict(),
                                             "scheduler": scheduler.state_dict(), **checkpoints.rng_state(),
                                             "cache": cache}, CHECKPOINTS, write_retriever)
            with open(run_dir / "train_log.csv", "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=LOG_COLUMNS)
                writer.writeheader()
                writer.writerows(rows)
            run.log(step, checkpoint_step=step)
    bar.close()
    with atomic_dir(cfg.out_dir) as tmp:
        retriever.model.save_pretrained(tmp)
        retriever.tokenizer.save_pretrained(tmp)
        (tmp / "train_log.csv").write_text((run_dir / "train_log.csv").read_text())
        write_json(tmp / "lsr_summary.json", {"run_id": run_id, "run_folder": str(run_dir), "steps": step,
                                              "queries": len(queries), "settings": asdict(cfg),
                                              "first_losses": [float(r["loss"]) for r in rows[:5]],
                                              "last_losses": [float(r["loss"]) for r in rows[-5:]]})
    return {"run_id": run_id, "steps": step, "queries": len(queries), "out_dir": cfg.out_dir}
