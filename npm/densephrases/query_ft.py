"""Query-side fine-tuning (Lee et al. 2021, section 6; docs/paper-map.md §D1.6).

The phrase side (phrase encoder, filter head), the dump and the index stay frozen; only the two query encoders learn,
so a question format never seen in phrase training (slot-filling probes, another dataset's questions) can be adapted
to without re-indexing. For each training question the top ``k`` phrases S(q) come from the real index
(``npm.densephrases.search``); their scores f(s) = q_start . h_i + q_end . h_j are recomputed with gradient through
q_start and q_end from the dump's stored vectors, and

    L_query = -log( sum over s in S(q) whose text matches a gold answer of exp f(s) / sum over s in S(q) of exp f(s) )

(``objective="paper"``), with Adam (AdamW, weight decay 0) over every query-encoder parameter. ``objective="code"``
is the original code's ``train-query``: it adds two terms, the same marginal likelihood over the start scores alone
and over the end scores alone, freezes the query encoders' word embeddings and decays the other weights by 0.01
(biases and LayerNorm not), as its hard-coded AdamW (``query_optimizer``). A question none of whose candidates
matches is skipped (counted, as in the original). Answers match after SQuAD normalisation
(``npm.tasks.metrics.exact_match``). Linear decay, gradient norm clipped at 1; the epoch with the best dev EM is kept
when dev questions are given (paper), else the last. Not reproduced from the code: its candidates are the top k
starts and the top k ends (here the top k phrases) and their vectors come back from its index (here from the dump).
"""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from npm import tracking
from npm.densephrases.evaluate import open_domain
from npm.densephrases.search import search
from npm.densephrases.searcher import PhraseSearcher
from npm.io import atomic_dir, write_json
from npm.progress import bar as progress_bar
from npm.settings import DensePhrasesQueryFt
from npm.tasks.metrics import exact_match

log = logging.getLogger("npm-repro.densephrases")
OBJECTIVES = ("paper", "code")


def marginal_nll(scores: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """-log sum_{positive} exp(score) + log sum_all exp(score) over one candidate list [P]."""
    return torch.logsumexp(scores, 0) - torch.logsumexp(scores[positive], 0)


def batch_losses(searcher, questions: list[dict], k: int, max_words: int,
                 objective: str) -> list[torch.Tensor | None]:
    """L_query of each {question, answers} record (with gradient into the query encoders), None where no candidate
    matches: one forward pass of the query encoders and one search for the whole batch."""
    q_start, q_end = searcher.query_vectors([q["question"] for q in questions])
    qs, qe = q_start.detach().float().cpu().numpy(), q_end.detach().float().cpu().numpy()
    found = search(searcher.index, searcher.dump.vectors, searcher.dump.tokens, qs, qe, k, max_words,
                   top_n=k)  # S(q): the top-k phrases of each question
    losses = []
    for n, (record, (pairs, _)) in enumerate(zip(questions, found, strict=True)):
        positive = torch.as_tensor([exact_match(searcher.phrase(i, j, 0.0)["text"], record["answers"])
                                    for i, j in pairs.tolist()], dtype=torch.bool, device=q_start.device)
        if not positive.any():
            losses.append(None)
            continue
        h_i = torch.as_tensor(np.asarray(searcher.dump.vectors[pairs[:, 0]], dtype=np.float32), device=q_start.device)
        h_j = torch.as_tensor(np.asarray(searcher.dump.vectors[pairs[:, 1]], dtype=np.float32), device=q_start.device)
        s_start, s_end = h_i @ q_start[n].float(), h_j @ q_end[n].float()
        loss = marginal_nll(s_start + s_end, positive)
        if objective == "code":
            loss = loss + marginal_nll(s_start, positive) + marginal_nll(s_end, positive)
        losses.append(loss)
    return losses


def query_optimizer(model, lr: float, objective: str) -> tuple[torch.optim.AdamW, list[torch.nn.Parameter]]:
    """AdamW over the query encoders of ``model`` and the parameters it trains (module docstring): every one without
    weight decay (``paper``), or (``code``) all but the word embeddings, which it freezes, with weight decay 0.01 except
    on biases and LayerNorm weights."""
    encoders = (model.query_start, model.query_end)
    if objective == "paper":
        params = [p for enc in encoders for p in enc.parameters()]
        return torch.optim.AdamW(params, lr=lr, eps=1e-8, weight_decay=0.0), params
    for enc in encoders:
        enc.get_input_embeddings().weight.requires_grad_(False)
    groups = [{"params": [], "weight_decay": 0.01}, {"params": [], "weight_decay": 0.0}]
    for enc in encoders:
        for name, p in enc.named_parameters():
            if p.requires_grad:
                flat = name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name
                groups[flat]["params"].append(p)
    return torch.optim.AdamW(groups, lr=lr, eps=1e-8), groups[0]["params"] + groups[1]["params"]


def exact_match_at_1(searcher, questions: list[dict], k: int, max_words: int) -> float:
    """EM (percent) of the top phrase over {question, answers} records."""
    return open_domain(searcher, questions, k, max_words)["em"]


def query_finetune(model_dir: str | os.PathLike, dump_dir: str | os.PathLike, index_path: str | os.PathLike,
                   train: list[dict], out_dir: str | os.PathLike, dev: list[dict] | None = None,
                   k: int = DensePhrasesQueryFt.k, max_words: int = 20, epochs: int = DensePhrasesQueryFt.epochs,
                   batch_size: int = DensePhrasesQueryFt.batch_size, lr: float = DensePhrasesQueryFt.lr,
                   objective: str = DensePhrasesQueryFt.objective, *, seed: int, progress: bool = True,
                   precision: str = "fp32", device: str | None = None, run: tracking.Run | None = None) -> dict:
    """Fine-tune the query encoders of ``model_dir`` on ``train`` [{question, answers}] and write the whole model
    (phrase side unchanged) to ``out_dir``; returns a summary with EM per epoch. ``run`` (``npm.tracking``; the
    caller finishes it) gets each step's loss and learning rate and each epoch's row (dev EM, questions per
    second)."""
    from transformers import get_linear_schedule_with_warmup

    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, not {objective!r}")
    if not train:
        raise ValueError("no training question for query-side fine-tuning")
    random.seed(seed)
    torch.manual_seed(seed)
    searcher = PhraseSearcher(model_dir, dump_dir, index_path, device=device, precision=precision)
    model = searcher.model
    for p in [*model.phrase.parameters(), *model.filter_head.parameters()]:
        p.requires_grad_(False)
    optimizer, params = query_optimizer(model, lr, objective)
    n_batches = -(-len(train) // batch_size)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, max(1, epochs * n_batches))
    history, best_em, best_state = [], -1.0, None
    before = exact_match_at_1(searcher, dev, k, max_words) if dev else None
    run = run or tracking.Run()
    run.update(dev_em_before=before)
    step = 0  # optimizer steps so far (the run's x axis)
    bar = progress_bar(total=epochs * n_batches, desc="query-side fine-tuning", unit="step", show=progress)
    for epoch in range(epochs):
        t0 = time.perf_counter()
        model.query_start.train()
        model.query_end.train()
        order = np.random.default_rng([seed, epoch]).permutation(len(train))
        losses, skipped = [], 0
        for a in range(0, len(order), batch_size):
            batch = batch_losses(searcher, [train[i] for i in order[a:a + batch_size]], k, max_words, objective)
            kept = [x for x in batch if x is not None]
            skipped += len(batch) - len(kept)
            step += 1
            if kept:
                loss = torch.stack(kept).mean()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
                run.log(step, loss=losses[-1], lr=scheduler.get_last_lr()[0])
            scheduler.step()
            bar.update(1)
        model.eval()
        em = exact_match_at_1(searcher, dev, k, max_words) if dev else None
        history.append({"epoch": epoch + 1, "loss": float(np.mean(losses)) if losses else None,
                        "skipped": skipped, "dev_em": em, "seconds": round(time.perf_counter() - t0, 2)})
        run.log(step, epoch=epoch + 1, epoch_loss=history[-1]["loss"], skipped=skipped, dev_em=em,
                questions_per_s=round(len(train) / history[-1]["seconds"], 2) if history[-1]["seconds"] else None)
        if dev is None or em > best_em:
            best_em = em if em is not None else best_em
            best_state = {part: {k_: v.clone() for k_, v in getattr(model, part).state_dict().items()}
                          for part in ("query_start", "query_end")}
    bar.close()
    for part, state in best_state.items():
        getattr(model, part).load_state_dict(state)
    summary = {"epochs": history, "dev_em_before": before, "dev_em_best": best_em if dev else None,
               "k": k, "max_words": max_words, "objective": objective, "train_questions": len(train),
               "base_model": str(model_dir), "dump": str(dump_dir)}
    with atomic_dir(out_dir) as tmp:
        model.save(tmp)
        write_json(Path(tmp) / "query_ft_summary.json", summary)
    return summary
