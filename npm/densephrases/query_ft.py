"""Query-side fine-tuning (Lee et al. 2021, section 6; docs/paper-map.md §D1.6).

The phrase side (phrase encoder, filter head), the dump and the index stay frozen; only the two query encoders learn,
so a question format never seen in phrase training (slot-filling probes, another dataset's questions) can be adapted
to without re-indexing. For each training question the top ``k`` phrases S(q) come from the real index
(``npm.densephrases.search``); their scores f(s) = q_start . h_i + q_end . h_j are recomputed with gradient through
q_start and q_end from the dump's stored vectors, and

    L_query = -log( sum over s in S(q) whose text matches a gold answer of exp f(s) / sum over s in S(q) of exp f(s) )

(``objective="paper"``), with Adam (AdamW, weight decay 0) over every query-encoder parameter. ``objective="code"``
is the original code's ``train-query``: it adds two terms, the same marginal likelihood over the start scores alone
and over the end scores alone, clamps each likelihood at 1e-7 (no gradient below), freezes the query encoders' word
embeddings and decays the other weights by 0.01 (biases and LayerNorm not), as its hard-coded AdamW
(``query_optimizer``). A question none of whose candidates matches is skipped (counted, as in the original); the
batch's loss is the mean over the others. Answers match after SQuAD normalisation (``npm.tasks.metrics.exact_match``).
Linear decay, gradient norm clipped at 1; the epoch with the best dev EM is kept when dev questions are given (paper),
else the last. The dev EM searches as the open-domain evaluation does (``search_form``), with ``dev_k`` starts and
ends (default ``k``; the code's: 10, its evaluation's ``top_k``).

The candidates S(q) follow ``search_form``: ``paper``, the top k phrases of eq. 10 (``npm.densephrases.search``)
searched with the query vectors of the step itself; ``code``, the original's (``train_query.py`` with
``MIPS.search_phrase``): each of the top k start rows with its best end and each of the top k end rows with its best
start (``PhraseSearcher.code_candidates``), 2 k groups with duplicates kept, padded to 2 k with zero vectors (logit 0,
in the softmax), searched with the query encoders as they were when the epoch began (the code's
``pretrained_encoder``, in eval mode), a phrase's text running over whole whitespace words. Both score from
``vectors``: the dump's fp16 vectors, or (``index``, the code's ``reconstruct``) the index's own codes. Not
reproduced: the code's regex match for CuratedTREC and its ``doc`` targets (``label_strat``, off by default).
"""

from __future__ import annotations

import copy
import logging
import math
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
from npm.densephrases.truecase import truecase_records
from npm.io import atomic_dir, write_json
from npm.model import autocast
from npm.progress import bar as progress_bar
from npm.settings import SEARCH_FORMS, DensePhrasesQueryFt, DensePhrasesSettings
from npm.tasks.metrics import exact_match

log = logging.getLogger("npm-repro.densephrases")
OBJECTIVES = ("paper", "code")
MAX_NLL = -math.log(1e-7)  # the code's MIN_PROB clamp


def marginal_nll(scores: torch.Tensor, positive: torch.Tensor, clamp: bool = False) -> torch.Tensor:
    """-log sum_{positive} exp(score) + log sum_all exp(score) over one candidate list [P]; ``clamp``: at most
    -log 1e-7 and no gradient beyond, the code's ``-log(p.clamp(1e-7, 1))``."""
    nll = torch.logsumexp(scores, 0) - torch.logsumexp(scores[positive], 0)
    return torch.clamp(nll, max=MAX_NLL) if clamp else nll


def batch_losses(searcher, questions: list[dict], k: int, max_words: int, objective: str,
                 search_form: str, search_encoders=None) -> list[torch.Tensor | None]:
    """L_query of each {question, answers} record (with gradient into the query encoders), None where no candidate
    matches: one forward pass of the query encoders and one search for the whole batch. ``search_form`` (module
    docstring): ``paper``, the top-k phrases searched with the encoders' own vectors; ``code``, the original's
    2 k start and end groups searched with ``search_encoders`` (the query encoders as they were when the epoch began,
    in eval mode), padded to 2 k with zero vectors."""
    texts = [q["question"] for q in questions]
    q_start, q_end = searcher.query_vectors(texts)
    if search_form == "code":
        with torch.inference_mode(), autocast(searcher.device, searcher.precision):
            enc = searcher.tokenize(texts)
            qs, qe = (v.float().cpu().numpy() for v in
                      searcher.model.query_vectors(enc["input_ids"], enc["attention_mask"], search_encoders))
        found, width = searcher.code_candidates(qs, qe, k, max_words), 2 * k
    else:
        qs, qe = q_start.detach().float().cpu().numpy(), q_end.detach().float().cpu().numpy()
        found = [pairs for pairs, _ in search(searcher.index, searcher.vectors, searcher.dump.tokens, qs, qe, k,
                                              max_words, top_n=k)]  # S(q): the top-k phrases of each question
        width = 0
    losses = []
    for n, (record, pairs) in enumerate(zip(questions, found, strict=True)):
        positive = [exact_match(searcher.phrase(i, j, 0.0, whole_words=search_form == "code")["text"],
                                record["answers"]) for i, j in pairs.tolist()]
        if not any(positive):
            losses.append(None)
            continue
        pad = max(width - len(pairs), 0)  # the code's dummy groups: zero vectors, logit 0
        positive = torch.as_tensor(positive + [False] * pad, dtype=torch.bool, device=q_start.device)
        h_i, h_j = (torch.as_tensor(np.asarray(searcher.vectors[pairs[:, c]], dtype=np.float32),
                                    device=q_start.device) for c in (0, 1))
        zeros = torch.zeros(pad, device=q_start.device)
        s_start = torch.cat([h_i @ q_start[n].float(), zeros])
        s_end = torch.cat([h_j @ q_end[n].float(), zeros])
        clamp = objective == "code"
        loss = marginal_nll(s_start + s_end, positive, clamp)
        if objective == "code":
            loss = loss + marginal_nll(s_start, positive, clamp) + marginal_nll(s_end, positive, clamp)
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


def _optimizer_step(kept: list[torch.Tensor], params: list[torch.nn.Parameter], optimizer) -> float:
    """One step on the mean loss of a batch's questions that have a matching candidate, the gradient norm clipped at
    1; returns that loss."""
    loss = torch.stack(kept).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _check_choices(**values: tuple[str, tuple]) -> None:
    for name, (value, allowed) in values.items():
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, not {value!r}")


def _query_state(model) -> dict:
    """A copy of the query encoders' weights (the best epoch's, restored at the end)."""
    return {part: {k: v.clone() for k, v in getattr(model, part).state_dict().items()}
            for part in ("query_start", "query_end")}


def exact_match_at_1(searcher, questions: list[dict], k: int, max_words: int, search_form: str) -> float:
    """EM (percent) of the top phrase over {question, answers} records."""
    return open_domain(searcher, questions, k, max_words, search_form=search_form)["em"]


def query_finetune(model_dir: str | os.PathLike, dump_dir: str | os.PathLike, index_path: str | os.PathLike,
                   train: list[dict], out_dir: str | os.PathLike, dev: list[dict] | None = None,
                   k: int = DensePhrasesQueryFt.k, max_words: int = 20, epochs: int = DensePhrasesQueryFt.epochs,
                   batch_size: int = DensePhrasesQueryFt.batch_size, lr: float = DensePhrasesQueryFt.lr,
                   objective: str = DensePhrasesQueryFt.objective,
                   dev_k: int | None = DensePhrasesQueryFt.dev_k, *, seed: int, progress: bool = True,
                   precision: str = "fp32", device: str | None = None, vectors: str = DensePhrasesSettings.vectors,
                   search_form: str = DensePhrasesSettings.search_form,
                   truecase: str | None = DensePhrasesSettings.truecase, run: tracking.Run | None = None,
                   provenance: dict | None = None) -> dict:
    """Fine-tune the query encoders of ``model_dir`` on ``train`` [{question, answers}] and write the whole model
    (phrase side unchanged) to ``out_dir``; returns a summary with EM per epoch. ``run`` (``npm.tracking``; the
    caller finishes it) gets each step's loss and learning rate and each epoch's row (dev EM, questions per
    second). ``vectors`` (``npm.densephrases.searcher.PhraseSearcher``): what candidates are found and scored
    from; ``search_form`` and ``dev_k``: module docstring; ``truecase``: the statistics that truecase the
    all-lowercase questions of ``train`` and ``dev`` (``npm.densephrases.truecase``), None: as given;
    ``provenance`` (``npm.io.provenance``: the command, its settings, the git commit) is written into the summary."""
    from transformers import get_linear_schedule_with_warmup

    _check_choices(objective=(objective, OBJECTIVES), search_form=(search_form, SEARCH_FORMS))
    if not train:
        raise ValueError("no training question for query-side fine-tuning")
    (train, truecased), (dev, truecased_dev) = truecase_records(truecase, train), truecase_records(truecase, dev)
    random.seed(seed)
    torch.manual_seed(seed)
    searcher = PhraseSearcher(model_dir, dump_dir, index_path, device=device, precision=precision, vectors=vectors)
    model = searcher.model
    for p in [*model.phrase.parameters(), *model.filter_head.parameters()]:
        p.requires_grad_(False)
    optimizer, params = query_optimizer(model, lr, objective)
    n_batches = -(-len(train) // batch_size)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, max(1, epochs * n_batches))
    history, best_em, best_state = [], -1.0, None
    dev_k = dev_k or k
    before = exact_match_at_1(searcher, dev, dev_k, max_words, search_form) if dev else None
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
        frozen = [copy.deepcopy(e).eval() for e in (model.query_start, model.query_end)] \
            if search_form == "code" else None  # the code searches with the epoch's starting encoders
        for a in range(0, len(order), batch_size):
            batch = batch_losses(searcher, [train[i] for i in order[a:a + batch_size]], k, max_words, objective,
                                 search_form, frozen)
            kept = [x for x in batch if x is not None]
            skipped += len(batch) - len(kept)
            step += 1
            if kept:
                losses.append(_optimizer_step(kept, params, optimizer))
                run.log(step, loss=losses[-1], lr=scheduler.get_last_lr()[0])
            scheduler.step()
            bar.update(1)
        model.eval()
        em = exact_match_at_1(searcher, dev, dev_k, max_words, search_form) if dev else None
        history.append({"epoch": epoch + 1, "loss": float(np.mean(losses)) if losses else None,
                        "skipped": skipped, "dev_em": em, "seconds": round(time.perf_counter() - t0, 2)})
        run.log(step, epoch=epoch + 1, epoch_loss=history[-1]["loss"], skipped=skipped, dev_em=em,
                questions_per_s=round(len(train) / history[-1]["seconds"], 2) if history[-1]["seconds"] else None)
        if dev is None or em > best_em:
            best_em = em if em is not None else best_em
            best_state = _query_state(model)
    bar.close()
    for part, state in best_state.items():
        getattr(model, part).load_state_dict(state)
    summary = {"epochs": history, "dev_em_before": before, "dev_em_best": best_em if dev else None,
               "k": k, "dev_k": dev_k, "max_words": max_words, "objective": objective, "search_form": search_form,
               "vectors": vectors, "truecase": truecase, "truecased": {"train": truecased, "dev": truecased_dev},
               "train_questions": len(train), "base_model": str(model_dir), "dump": str(dump_dir),
               **({"provenance": provenance} if provenance else {})}
    with atomic_dir(out_dir) as tmp:
        model.save(tmp)
        write_json(Path(tmp) / "query_ft_summary.json", summary, default=str)  # paths of the provenance as strings
    return summary
