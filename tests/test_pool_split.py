"""The paper's candidate pool on fewer, larger GPUs (docs/paper-scale.md, "The paper's pool on fewer GPUs").

The original's step is 32 GPUs x one batch line with pools of half the world (paper-map §2.4, §2.5). The same lines
split as (a) 4 ranks x 1 line, pool "half"; (b) 2 ranks x 2 lines, pool = 2 lines' sequences; (c) 1 rank x 2 lines x
2 accumulated micro-steps, the same pool; (d) 2 ranks x 1 line x 2 micro-steps, give the same step loss, the same
gradients and the same pool for every line; likewise the whole step as one pool ("all" on 4 ranks, 2 ranks x 2 lines,
1 rank x 4 lines). Real gloo process groups on CPU, the real ``accumulate_gradients`` (DDP ``no_sync`` on all but the
last micro-step).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from transformers import BertModel

from npm.training.collate import collate_phrase, collate_single
from npm.training.data import BatchLines
from npm.training.gather import candidate_pool, parse_pool, pool_ranks, ranks_per_pool
from npm.training.loop import accumulate_gradients, collate_lines, train
from tests.conftest import save_tiny_bert, train_config
from tests.test_distributed import CLS, MASK, _occurs, cooccurring, grow_row, run_ranks, tiny_bert
from tests.test_training import write_shard

SEQUENCES_PER_LINE = 2
CROSS_LINE = {0: [90, 91, 92], 2: [93, 94]}  # in the first row of lines 0/1 and 2/3; a span only in lines 0 and 2
# (name, world, lines_per_rank, accumulate, pool): runs of the same 4 lines; pools of 2 lines (4 sequences) or all 4
SPLITS = {
    "two-line pools": [("a", 4, 1, 1, "half"), ("b", 2, 2, 1, 4), ("c", 1, 2, 2, 4), ("d", 2, 1, 2, 4)],
    "one pool": [("a", 4, 1, 1, "all"), ("b", 2, 2, 1, 8), ("c", 1, 4, 1, 8)],
}


def step_lines(seed: int = 0) -> list[tuple[list[np.ndarray], np.ndarray]]:
    """Four batch lines of two sequences; every span occurs in another sequence of its two-line pool, and the span
    of CROSS_LINE only in the other line of that pool."""
    rng = np.random.default_rng(seed)
    bank = [rng.integers(10, 60, size=n).tolist() for n in (1, 2, 3, 2)]
    raw = []
    for line in range(4):
        rows, spans = [], []
        for b in range(SEQUENCES_PER_LINE):
            ids = [CLS]
            cross = CROSS_LINE.get(line - line % 2)
            if b == 0:
                if line % 2 == 0:
                    spans.append((b, 1, len(cross)))
                ids += cross
            rows.append(grow_row(ids, 14 + 3 * b + line, b, bank, rng, spans))
        raw.append((rows, spans))
    lines = []
    for line, (rows, spans) in enumerate(raw):
        pool = [(q, k, row) for q in (line - line % 2, line - line % 2 + 1) for k, row in enumerate(raw[q][0])]
        lines.append((rows, cooccurring(rows, spans, pool, line)))
    return lines


def run_split(rank: int, world: int, lines_per_rank: int, accumulate: int, pool) -> dict:
    """One optimizer step's forward and backward on this rank, as the training loop runs it: for each model type the
    loss, the gradients and, per global line, the sequences of the pool it was scored against."""
    lines, out = step_lines(), {}
    for model_type, collate in (("npm", collate_phrase), ("npm_single", collate_single)):
        model = tiny_bert()
        trainee = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        micro = [[m * world * lines_per_rank + rank * lines_per_rank + i for i in range(lines_per_rank)]
                 for m in range(accumulate)]  # BatchLines.order's layout of one step
        batches = [collate_lines(collate, [lines[i] for i in ids], MASK) for ids in micro]
        loss, stats = accumulate_gradients(trainee, batches, model_type, pool, torch.device("cpu"))
        pools = {}
        for ids, batch in zip(micro, batches, strict=True):
            _, pool_ids, pool_valid, _ = candidate_pool(torch.zeros(*batch["target_ids"].shape, 1),
                                                        batch["target_ids"], batch["target_valid"], pool)
            seen = sorted(tuple(r[v].tolist()) for r, v in zip(pool_ids, pool_valid, strict=True) if v.any())
            pools.update({i: seen for i in ids})
        out[model_type] = {"loss": loss, "queries": stats["queries"], "pools": pools,
                           "grads": {k: p.grad.clone() for k, p in model.named_parameters()}}
    return out


def _worker(rank: int, world: int, init_file: str, out_dir: str, runs: list) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        result = {name: run_split(rank, world, lines_per_rank, accumulate, pool)
                  for name, lines_per_rank, accumulate, pool in runs}
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def spawn(world: int, runs: list, tmp: Path) -> list[dict]:
    return run_ranks(_worker, world, (world, str(tmp / "init"), str(tmp), runs), tmp)


@pytest.fixture(scope="module")
def splits(tmp_path_factory) -> dict:
    """{(case, name): [per-rank results]} of every split of SPLITS."""
    runs = {world: [((case, name), lines, acc, pool) for case, cases in SPLITS.items()
                    for name, w, lines, acc, pool in cases if w == world] for world in (1, 2, 4)}
    results = {key: [run_split(0, 1, lines, acc, pool)] for key, lines, acc, pool in runs[1]}
    for world in (2, 4):
        ranks = spawn(world, runs[world], tmp_path_factory.mktemp(f"world{world}"))
        results.update({key: [res[key] for res in ranks] for key, *_ in runs[world]})
    return results


def step_result(per_rank: list[dict], model_type: str) -> tuple[torch.Tensor, dict, dict, float]:
    """The step's loss (DDP's mean over ranks), its gradients (rank 0's: DDP gives every rank the same), the pool
    of every line, and the queries."""
    loss = torch.tensor(np.mean([r[model_type]["loss"] for r in per_rank]))
    pools = {i: p for r in per_rank for i, p in r[model_type]["pools"].items()}
    return loss, per_rank[0][model_type]["grads"], pools, sum(r[model_type]["queries"] for r in per_rank)


def test_test_lines_have_a_span_whose_only_positive_is_in_the_other_line_of_its_pool():
    lines = step_lines()
    assert [len(rows) for rows, _ in lines] == [SEQUENCES_PER_LINE] * 4
    for first, phrase in CROSS_LINE.items():
        (rows, spans), (other, _) = lines[first], lines[first + 1]
        assert [0, 1, len(phrase)] in spans.tolist() and rows[0][1 : 1 + len(phrase)].tolist() == phrase
        assert other[0][1 : 1 + len(phrase)].tolist() == phrase and not _occurs(phrase, rows[1])


@pytest.mark.parametrize("case", list(SPLITS))
@pytest.mark.parametrize("model_type", ["npm", "npm_single"])
def test_the_same_step_split_over_ranks_lines_and_micro_steps_has_the_same_loss_gradients_and_pools(
        splits, case, model_type):
    (_, *rest) = SPLITS[case]
    want_loss, want_grads, want_pools, want_queries = step_result(splits[(case, "a")], model_type)
    assert sorted(want_pools) == [0, 1, 2, 3]
    sizes = {len(p) for p in want_pools.values()}
    assert sizes == ({2 * SEQUENCES_PER_LINE} if case == "two-line pools" else {4 * SEQUENCES_PER_LINE})
    for name, *_ in rest:
        loss, grads, pools, queries = step_result(splits[(case, name)], model_type)
        torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6, msg=f"{case} {name} loss")
        assert pools == want_pools and queries == want_queries, f"{case} {name}"
        for key, g in want_grads.items():
            torch.testing.assert_close(grads[key], g, rtol=1e-5, atol=1e-6, msg=f"{case} {name} {key}")


def test_a_line_pooled_alone_loses_the_positive_of_its_cross_line_span():
    """Guards the test above: the pool really matters (line 0's span occurs only in line 1)."""
    batch = collate_lines(collate_phrase, [step_lines()[0]], MASK)
    with pytest.raises(ValueError, match=r"no positive .* tokens \[90, 91, 92\]"):
        accumulate_gradients(tiny_bert(), [batch], "npm", SEQUENCES_PER_LINE, torch.device("cpu"))


def test_the_loss_of_two_lines_is_the_mean_of_their_losses_not_of_their_spans():
    lines = step_lines()
    (rows0, spans0), (rows1, spans1) = lines[:2]
    assert len(spans0) != len(spans1)  # lines with different span counts weigh the same
    rows = list(rows0) + list(rows1)
    shifted1 = spans1 + [SEQUENCES_PER_LINE, 0, 0]

    def loss(batch):  # one rank, the two lines' four sequences as its pool
        return accumulate_gradients(tiny_bert(), [batch], "npm", 2 * SEQUENCES_PER_LINE, torch.device("cpu"))[0]

    per_line = [loss(collate_phrase(rows, spans, MASK)) for spans in (spans0, shifted1)]  # one line's spans each
    by_spans = loss(collate_phrase(rows, np.concatenate([spans0, shifted1]), MASK))  # no sequence_line: one line
    by_lines = loss(collate_lines(collate_phrase, lines[:2], MASK))
    assert by_lines == pytest.approx(np.mean(per_line), rel=1e-5)
    assert abs(by_lines - by_spans) > 1e-4


# ----------------------------------------------------------------------------------------- the pool's arithmetic


def test_integer_pools_are_groups_of_consecutive_ranks():
    assert ranks_per_pool(256, 32, 16) == 16 and ranks_per_pool("half", 32) == 16  # the paper's
    assert ranks_per_pool(256, 8, 32) == 8 and ranks_per_pool(256, 4, 64) == 4 and ranks_per_pool(256, 16, 16) == 16
    assert pool_ranks(5, 8, 64, 16) == [4, 5, 6, 7] and pool_ranks(1, 4, 32, 16) == [0, 1]
    assert pool_ranks(0, 1, 16, 16) == [0] and pool_ranks(3, 4, "all") == [0, 1, 2, 3]
    assert [parse_pool(v) for v in ("all", "half", "256", 256)] == ["all", "half", 256, 256]


@pytest.mark.parametrize("pool, world, per_rank, message", [
    (24, 4, 16, r"pool=24 sequences .* each of the 4 ranks holds 16 sequences .* pools of \[16, 32, 64\]"),
    (48, 4, 16, r"pools of \[16, 32, 64\] sequences fit"),  # 3 ranks do not divide 4
    (8, 2, 16, r"holds 16 sequences"),  # smaller than one rank's lines
    (256, 1, 64, r"pools of \[64\] sequences fit"),
    ("half", 3, 16, "even number of ranks"),
])
def test_a_pool_that_is_not_a_whole_group_of_ranks_names_the_numbers_and_what_fits(pool, world, per_rank, message):
    with pytest.raises(ValueError, match=message):
        ranks_per_pool(pool, world, per_rank)


@pytest.mark.parametrize("value", ["quarter", 0, -16, "1.5", True])
def test_a_pool_that_is_not_all_half_or_a_positive_integer_is_rejected(value):
    with pytest.raises(ValueError, match="pool must be 'all', 'half' or a positive number of sequences"):
        parse_pool(value)


def test_the_cli_takes_a_pool_in_sequences_and_the_split_options():
    from npm.cli import build_parser

    args = build_parser().parse_args(["train", "--model", "npm", "--encoder", "e", "--blocks", "b", "--masked",
                                      "m", "--out", "o", "--checkpoint-dir", "c", "--pool", "256",
                                      "--lines-per-rank", "2", "--accumulate", "2"])
    assert (args.pool, args.lines_per_rank, args.accumulate) == (256, 2, 2)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--model", "npm", "--encoder", "e", "--blocks", "b", "--masked",
                                   "m", "--out", "o", "--checkpoint-dir", "c", "--pool", "quarter"])


# ------------------------------------------------------------------------------------ which lines each rank takes


def test_one_line_per_rank_deals_the_permutation_round_robin_as_before(tmp_path):
    data = BatchLines(write_shard(tmp_path, n_lines=10))
    perm = np.random.default_rng([3, 1]).permutation(10)
    for world in (1, 2, 3, 4):
        usable = 10 - 10 % world
        for rank in range(world):
            assert np.array_equal(data.order(3, 1, rank, world), perm[rank:usable:world])


def test_the_lines_of_a_step_and_their_pools_do_not_depend_on_the_split(tmp_path):
    """8 lines per step, pools of 4 lines: 8 ranks x 1 line, 4 x 2, 2 x 2 x 2 micro-steps, 1 x 4 x 2, 4 x 1 x 2."""
    data = BatchLines(write_shard(tmp_path, n_lines=21))  # 2 whole steps; 5 lines dropped at the epoch's end

    def step_pools(world, lines_per_rank, accumulate):
        orders = [data.order(7, 0, r, world, lines_per_rank, accumulate) for r in range(world)]
        per_rank = lines_per_rank * accumulate
        k = ranks_per_pool(4 * 4, world, lines_per_rank * data.sequences_per_line())  # 4 lines of 4 sequences
        steps = []
        for t in range(len(orders[0]) // per_rank):
            pools = []
            for m in range(accumulate):
                for first in range(0, world, k):
                    pools.append(sorted(int(i) for r in range(first, first + k) for i in
                                        orders[r][t * per_rank + m * lines_per_rank:][:lines_per_rank]))
            steps.append(sorted(pools))
        return steps

    want = step_pools(8, 1, 1)
    assert len(want) == 2 and all(len(pools) == 2 for pools in want)
    for split in ((4, 2, 1), (2, 2, 2), (1, 4, 2), (4, 1, 2)):
        assert step_pools(*split) == want, split


def test_sequences_per_line_come_from_the_data_and_must_agree(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    (one,) = write_shard(tmp_path / "a", batch=4)
    (two,) = write_shard(tmp_path / "b", batch=3)
    assert BatchLines([one]).sequences_per_line() == 4
    with pytest.raises(ValueError, match=r"batch lines of different sizes .* data.batch_size"):
        BatchLines([one, two]).sequences_per_line()


def test_too_few_lines_for_one_step_says_so(tmp_path):
    data = BatchLines(write_shard(tmp_path, n_lines=6))
    with pytest.raises(ValueError, match=r"6 batch lines cannot feed one step of 2 ranks x 2 lines per rank x 2"):
        data.order(0, 0, 0, 2, 2, 2)


# ----------------------------------------------------------------------------------------------- the training loop


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def _config(tmp_path, encoder, shards, name, **kw):
    base = dict(model="npm", encoder=encoder, tokenizer=encoder, shards=shards, out_dir=str(tmp_path / name),
                checkpoint_dir=str(tmp_path / f"{name}-ckpt"), warmup_steps=1, lr=1e-3, pool=8, lines_per_rank=2,
                accumulate=2, checkpoint_every=2, seed=0)
    base.update(kw)
    return train_config(**base)


def test_resume_with_lines_per_rank_and_accumulate_continues_bit_for_bit(tmp_path, tiny_encoder):
    shards = write_shard(tmp_path, n_lines=8)  # 2 steps of 4 lines per epoch: the resumed run starts epoch 1
    train(_config(tmp_path, tiny_encoder, shards, "straight", steps=4, schedule_steps=4))
    train(_config(tmp_path, tiny_encoder, shards, "stopped", steps=2, schedule_steps=4))
    summary = train(_config(tmp_path, tiny_encoder, shards, "stopped", steps=4, schedule_steps=4))
    a = BertModel.from_pretrained(tmp_path / "straight", add_pooling_layer=False).state_dict()
    b = BertModel.from_pretrained(tmp_path / "stopped", add_pooling_layer=False).state_dict()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    (log,) = Path(summary["run_folder"]).glob("train_log.csv")
    rows = list(csv.DictReader(open(log)))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    run = (Path(summary["run_folder"]) / "run.json").read_text()
    assert '"lines_per_rank": 2' in run and '"accumulate": 2' in run and '"pool": 8' in run


def test_an_integer_pool_that_does_not_fit_the_data_fails_before_training(tmp_path, tiny_encoder):
    shards = write_shard(tmp_path)  # lines of 4 sequences
    with pytest.raises(ValueError, match=r"pool=12 sequences .* holds 8 sequences .* pools of \[8\]"):
        train(_config(tmp_path, tiny_encoder, shards, "run", steps=1, pool=12))


def test_the_mlm_baseline_trains_with_lines_per_rank_and_accumulate(tmp_path, tiny_encoder):
    summary = train(_config(tmp_path, tiny_encoder, write_shard(tmp_path), "mlm", model="mlm", steps=1))
    assert summary["steps"] == 1 and np.isfinite(summary["last_losses"]).all()


@pytest.mark.parametrize("pool, valid", [(256, True), ("half", True), ("all", True), (0, False), ("quarter", False)])
def test_the_config_takes_a_pool_in_sequences(pool, valid):
    import yaml
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    root = Path(__file__).resolve().parent.parent
    config = yaml.safe_load((root / "config" / "config.yaml").read_text())
    config["training"].update(pool=pool, lines_per_rank=2, accumulate=2)
    if valid:
        validate(config, str(root / "workflow" / "schemas" / "config.schema.yaml"))
    else:
        with pytest.raises(WorkflowError, match="pool"):
            validate(config, str(root / "workflow" / "schemas" / "config.schema.yaml"))
