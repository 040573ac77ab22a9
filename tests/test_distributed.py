"""Multi-process candidate pool and loss (paper-map §2.4, §9 item 18): real gloo process groups on CPU.

Each spawned rank holds its own batch line, wraps a tiny BERT in DistributedDataParallel and runs the real
``step_loss`` + backward. A single-process reference holds the pooled batch (the pool's ranks' sequences in rank
order) and computes the mean of the per-rank losses (each rank's queries against its pool) with the same loss
functions; losses and parameter gradients must agree.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import BertConfig, BertModel

from npm.model import encode
from npm.training.collate import collate_phrase, collate_single
from npm.training.gather import candidate_pool, pool_ranks
from npm.training.loop import step_loss
from npm.training.loss import phrase_loss, phrase_positives, single_loss, single_positives

VOCAB, MASK, CLS, SEP = 120, 119, 1, 2
CROSS_RANK_PHRASE = [90, 91, 92]  # occurs only in rank 0's and rank 1's first sequence
BIG_IDS = [50264, 50263, 30001, 257]  # not exactly representable in bf16 (but 257 is close to)
TIMEOUT_S = 120
# forkserver: a clean single-threaded server imports torch/transformers/this module once, then forks every rank
# (spawn would import them again in each rank; fork from pytest itself can deadlock on inherited thread state).
START_METHOD = "forkserver"


def tiny_bert() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertModel(config, add_pooling_layer=False).train()


def _occurs(tokens: list[int], row: np.ndarray) -> bool:
    row = row.tolist()
    return any(row[p : p + len(tokens)] == tokens for p in range(len(row) - len(tokens) + 1))


def grow_row(ids: list[int], length: int, b: int, bank: list[list[int]], rng, spans: list) -> np.ndarray:
    """Row ``b``: ``ids`` grown to ``length`` with phrases of ``bank`` (each appended to ``spans``) and filler tokens,
    then SEP."""
    while len(ids) < length:
        if rng.random() < 0.5:
            phrase = bank[int(rng.integers(len(bank)))]
            spans.append((b, len(ids), len(phrase)))
            ids += phrase
        else:
            ids.append(int(rng.integers(60, 90)))
    return np.array(ids + [SEP], dtype=np.int64)


def cooccurring(rows: list[np.ndarray], spans: list, pooled: list, me: int) -> np.ndarray:
    """The spans [n, 3] of line ``me`` whose tokens occur in another row of ``pooled`` ((line, row index, row))."""
    kept = [(b, s, n) for b, s, n in spans
            if any(_occurs(rows[b][s : s + n].tolist(), row) for q, k, row in pooled if (q, k) != (me, b))]
    return np.array(kept, dtype=np.int64).reshape(-1, 3)


def world_lines(world: int, pool: str, seed: int = 0) -> list[tuple[list[np.ndarray], np.ndarray]]:
    """One batch line per rank: ranks differ in sequence count and length; every span co-occurs in its pool."""
    rng = np.random.default_rng(seed)
    bank = [rng.integers(10, 60, size=n).tolist() for n in (1, 2, 3, 2, 1)]
    raw = []
    for r in range(world):
        rows, spans = [], []
        for b in range(3 if r % 2 == 0 else 2):
            ids, length = [CLS], int(rng.integers(14, 22)) + 4 * r
            if b == 0 and r < 2:
                if r == 0:
                    spans.append((b, len(ids), len(CROSS_RANK_PHRASE)))
                ids += CROSS_RANK_PHRASE
            rows.append(grow_row(ids, length, b, bank, rng, spans))
        raw.append((rows, spans))
    lines = []
    for r, (rows, spans) in enumerate(raw):
        pooled = [(q, k, row) for q in pool_ranks(r, world, pool) for k, row in enumerate(raw[q][0])]
        lines.append((rows, cooccurring(rows, spans, pooled, r)))
    return lines


def _worker(rank: int, world: int, init_file: str, out_dir: str, pool: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = tiny_bert()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        rows, spans = world_lines(world, pool)[rank]
        result = {}
        for model_type, collate in (("npm", collate_phrase), ("npm_single", collate_single)):
            loss, stats = step_loss(ddp, collate(rows, spans, MASK), model_type, pool, torch.device("cpu"))
            loss.backward()
            result[model_type] = {"loss": loss.detach(), "stats": stats,
                                  "grads": {k: p.grad.clone() for k, p in model.named_parameters()}}
            model.zero_grad(set_to_none=True)
        # "half" of this world, and token ids next to bf16 vectors (paper-map §9 item 18)
        n = 3 + rank % 2  # rows of different lengths on the two ranks of a pair
        targets = torch.randn(2, n, 4).bfloat16()
        ids = torch.tensor([BIG_IDS[: n - 1] + [7], BIG_IDS[::-1][:n]])
        valid = torch.ones(2, n, dtype=torch.bool)
        vectors, pool_ids, pool_valid, offset = candidate_pool(targets, ids, valid, "all")
        half = candidate_pool(targets, ids, valid, "half")
        result["bf16"] = {"targets": targets, "ids": ids, "pool_vectors": vectors, "pool_ids": pool_ids,
                          "pool_valid": pool_valid, "offset": offset,
                          "half": {"shape": tuple(half[0].shape), "offset": half[3], "ids": half[1]}}
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(worker, world: int, args: tuple, tmp: Path, start_method: str = START_METHOD) -> list[dict]:
    """``worker(rank, *args)`` in ``world`` processes, each saving its result as ``tmp/rank{rank}.pt``; the results in
    rank order (the test fails when they take more than TIMEOUT_S)."""
    if start_method == "forkserver":
        mp.get_context(start_method).set_forkserver_preload([worker.__module__])
    ctx = mp.start_processes(worker, args=args, nprocs=world, join=False, start_method=start_method)
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} gloo processes did not finish in {TIMEOUT_S} s")
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]


def spawn(world: int, pool: str, tmp: Path) -> list[dict]:
    return run_ranks(_worker, world, (world, str(tmp / "init"), str(tmp), pool), tmp)


def reference(world: int, pool: str, model_type: str) -> tuple[list[torch.Tensor], dict]:
    """Single process: per-rank losses against each rank's pool and the gradient of their mean."""
    model = tiny_bert()
    lines = world_lines(world, pool)
    collate = collate_phrase if model_type == "npm" else collate_single
    batches = [collate(rows, spans, MASK) for rows, spans in lines]
    targets = [encode(model, b["target_ids"], b["target_valid"].long()) for b in batches]
    losses = []
    for r, batch in enumerate(batches):
        members = pool_ranks(r, world, pool)
        width = max(batches[q]["target_ids"].shape[1] for q in members)

        def widen(x, width=width):
            return torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[1])) if x.dim() == 3 else \
                torch.nn.functional.pad(x, (0, width - x.shape[1]))

        pool_vectors = torch.cat([widen(targets[q]) for q in members])
        pool_ids = torch.cat([widen(batches[q]["target_ids"]) for q in members])
        pool_valid = torch.cat([widen(batches[q]["target_valid"].long()) for q in members]).bool()
        offset = sum(len(batches[q]["target_ids"]) for q in members[: members.index(r)])
        queries = encode(model, batch["query_ids"], batch["query_attention"])
        if model_type == "npm":
            seq = batch["span_seq"] + offset
            pos = phrase_positives(batch["span_tokens"], batch["span_lengths"], seq, pool_ids, pool_valid)
            loss, _ = phrase_loss(queries[batch["span_seq"], batch["q_start_pos"]],
                                  queries[batch["span_seq"], batch["q_end_pos"]], pool_vectors, pool_valid, *pos, seq)
        else:
            seq = batch["query_seq"] + offset
            pos = single_positives(batch["query_tokens"], seq, pool_ids, pool_valid)
            loss, _ = single_loss(queries[batch["query_seq"], batch["query_pos"]], pool_vectors, pool_valid, pos, seq)
        losses.append(loss)
    torch.stack(losses).mean().backward()
    return [loss.detach() for loss in losses], {k: p.grad for k, p in model.named_parameters()}


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    return spawn(2, "all", tmp_path_factory.mktemp("world2"))


@pytest.fixture(scope="module")
def world4_half(tmp_path_factory):
    return spawn(4, "half", tmp_path_factory.mktemp("world4"))


def assert_matches_reference(results: list[dict], world: int, pool: str, model_type: str) -> None:
    losses, grads = reference(world, pool, model_type)
    for r in range(world):
        got = results[r][model_type]
        torch.testing.assert_close(got["loss"], losses[r], atol=1e-5, rtol=1e-5)
        for name, g in grads.items():
            torch.testing.assert_close(got["grads"][name], g, atol=1e-5, rtol=1e-4, msg=f"rank {r} {name}")


def test_test_data_has_a_span_whose_only_positive_is_on_another_rank():
    (rows0, spans0), (rows1, _) = world_lines(2, "all")
    assert CROSS_RANK_PHRASE == rows0[0][1:4].tolist() == rows1[0][1:4].tolist()
    assert [0, 1, 3] in spans0.tolist()
    assert not any(_occurs(CROSS_RANK_PHRASE, row) for row in rows0[1:] + [rows1[1]])


def test_ddp_phrase_loss_and_gradients_equal_the_pooled_single_process_reference(world2):
    assert_matches_reference(world2, 2, "all", "npm")


def test_ddp_single_loss_and_gradients_equal_the_pooled_single_process_reference(world2):
    assert_matches_reference(world2, 2, "all", "npm_single")


def test_half_pool_with_four_ranks_equals_the_per_half_reference(world4_half):
    assert_matches_reference(world4_half, 4, "half", "npm")
    assert_matches_reference(world4_half, 4, "half", "npm_single")


def test_half_pool_with_world_two_keeps_only_the_own_rank(world2):
    for r, res in enumerate(world2):
        half = res["bf16"]["half"]
        assert half["offset"] == 0 and half["shape"] == (2, 3 + r, 4)
        assert torch.equal(half["ids"], res["bf16"]["ids"])


def test_token_ids_survive_a_gather_next_to_bf16_vectors(world2):
    assert torch.tensor(50263.0).bfloat16().long().item() != 50263  # ids inside a bf16 tensor would be corrupted
    width = max(res["bf16"]["ids"].shape[1] for res in world2)
    want_ids = torch.cat([torch.nn.functional.pad(res["bf16"]["ids"], (0, width - res["bf16"]["ids"].shape[1]))
                          for res in world2])
    for r, res in enumerate(world2):
        got = res["bf16"]
        assert got["pool_ids"].dtype == torch.int64 and torch.equal(got["pool_ids"], want_ids)
        assert got["pool_vectors"].dtype == torch.bfloat16
        assert got["offset"] == 2 * r
        for q, other in enumerate(world2):
            n = other["bf16"]["targets"].shape[1]
            assert torch.equal(got["pool_vectors"][2 * q : 2 * q + 2, :n], other["bf16"]["targets"])
            assert got["pool_valid"][2 * q : 2 * q + 2, :n].all() and not got["pool_valid"][2 * q : 2 * q + 2, n:].any()
            assert not got["pool_vectors"][2 * q : 2 * q + 2, n:].any()


def test_single_process_pool_is_the_input_with_offset_zero():
    targets, ids, valid = torch.randn(2, 5, 4), torch.arange(10).view(2, 5), torch.ones(2, 5, dtype=torch.bool)
    for pool in ("all", "half"):
        vectors, pool_ids, pool_valid, offset = candidate_pool(targets, ids, valid, pool)
        assert vectors is targets and torch.equal(pool_ids, ids) and torch.equal(pool_valid, valid) and offset == 0


def test_pool_ranks_of_all_and_half_and_errors():
    assert pool_ranks(3, 4, "all") == [0, 1, 2, 3]
    assert pool_ranks(1, 4, "half") == [0, 1] and pool_ranks(2, 4, "half") == [2, 3]
    assert pool_ranks(0, 1, "half") == [0]
    with pytest.raises(ValueError, match="even number of ranks"):
        pool_ranks(0, 3, "half")
    with pytest.raises(ValueError, match="pool must be 'all', 'half' or a positive number of sequences"):
        candidate_pool(torch.zeros(1, 1, 2), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "quarter")


def test_one_encoder_call_equals_two_passes():
    """step_loss encodes the masked and unmasked views in one call (DDP); the loss is that of two passes."""
    model = tiny_bert()
    rows, spans = world_lines(1, "all")[0]
    batch = collate_phrase(rows, spans, MASK)
    loss, stats = step_loss(model, batch, "npm", "all", torch.device("cpu"))
    queries = encode(model, batch["query_ids"], batch["query_attention"])
    targets = encode(model, batch["target_ids"], batch["target_valid"].long())
    seq = batch["span_seq"]
    pos = phrase_positives(batch["span_tokens"], batch["span_lengths"], seq, batch["target_ids"], batch["target_valid"])
    want, _ = phrase_loss(queries[seq, batch["q_start_pos"]], queries[seq, batch["q_end_pos"]], targets,
                          batch["target_valid"], *pos, seq)
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    assert stats["queries"] == len(spans) and math.isfinite(stats["loss_start"])

