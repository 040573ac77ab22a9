"""Padding-free training (``training.packed``, ``npm.training.packing``): the rows of a batch packed into one row with
per-row attention and positions give the padded path's loss and gradients up to fp32 rounding, for NPM, NPM-single
and the MLM baseline, on a BERT (positions from 0) and a RoBERTa (positions from padding_idx + 1); the run id records
the switch only when it is on."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from transformers import RobertaConfig, RobertaForMaskedLM, RobertaModel

from npm.model import autocast
from npm.training.collate import collate_mlm, collate_phrase, collate_single
from npm.training.loop import MaskedTokensMLM, compile_encoder, step_loss, train
from npm.training.packing import PACKED, use_packed_attention
from tests.conftest import save_tiny_bert
from tests.test_distributed import MASK, VOCAB, tiny_bert, world_lines
from tests.test_training import config, write_shard

CPU = torch.device("cpu")
LOSS_RTOL = 1e-5  # fp32: the packed and padded paths sum the same products in other orders
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6


def tiny_roberta_config() -> RobertaConfig:
    """pad_token_id 3 (an id the rows never hold), so the padded path's positions of real tokens start at 4."""
    return RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, pad_token_id=3, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)


def tiny_roberta() -> RobertaModel:
    torch.manual_seed(0)
    return RobertaModel(tiny_roberta_config(), add_pooling_layer=False).train()


def tiny_roberta_mlm() -> RobertaForMaskedLM:
    torch.manual_seed(0)
    return RobertaForMaskedLM(tiny_roberta_config()).train()


@pytest.fixture(scope="module")
def line():
    rows, spans = world_lines(1, "all")[0]
    assert len({len(r) for r in rows}) > 1, "the rows must differ in length (padding)"
    return rows, spans


def _batch(kind: str, rows, spans) -> dict:
    if kind == "npm":
        return collate_phrase(rows, spans, MASK)
    if kind == "npm_single":
        return collate_single(rows, spans, MASK)
    return collate_mlm(rows, MASK, [1, 2], VOCAB, torch.Generator().manual_seed(0))


def padded_and_packed_steps(make, batch: dict, kind: str, device=CPU, precision: str = "fp32",
                            compiled: bool = False) -> list[tuple[float, dict, dict]]:
    """(loss, gradients on the CPU, stats) of one training step of ``batch`` through the model ``make()`` gives, on
    ``device`` under ``precision``'s autocast: first padded, then a copy of it packed (compiled shape-generic when
    ``compiled``, as the training loop compiles a packed encoder)."""
    padded = make().to(device)
    packed = copy.deepcopy(padded)
    use_packed_attention(packed)
    assert packed.config._attn_implementation == PACKED and padded.config._attn_implementation != PACKED
    compile_encoder(packed, compiled, dynamic=True)
    if kind == "mlm":
        padded, packed = MaskedTokensMLM(padded), MaskedTokensMLM(packed)
    steps = []
    for model in (padded, packed):
        with autocast(device, precision):
            loss, stats = step_loss(model, batch, kind, "all", device)
        loss.backward()
        steps.append((float(loss.detach()), {name: p.grad.float().cpu() for name, p in model.named_parameters()
                                             if p.grad is not None}, stats))
    return steps


def assert_same_step(padded, packed, loss_rtol: float, grad_rtol: float | None = None,
                     grad_atol: float | None = None) -> None:
    """Two results of ``padded_and_packed_steps`` agree: the loss within ``loss_rtol``, the same stats, the same
    parameters with gradients, and (unless ``grad_rtol`` is None) each gradient within the tolerances."""
    (loss_p, grads_p, stats_p), (loss_k, grads_k, stats_k) = padded, packed
    assert math.isfinite(loss_p) and loss_k == pytest.approx(loss_p, rel=loss_rtol)
    assert stats_k.keys() == stats_p.keys()
    assert grads_k.keys() == grads_p.keys() and len(grads_p) > 10
    if grad_rtol is None:
        return
    for name, g in grads_p.items():
        torch.testing.assert_close(grads_k[name], g, rtol=grad_rtol, atol=grad_atol, msg=name)


@pytest.mark.parametrize("kind, make", [("npm", tiny_bert), ("npm_single", tiny_bert), ("npm", tiny_roberta),
                                        ("npm_single", tiny_roberta), ("mlm", tiny_roberta_mlm)])
def test_the_packed_step_equals_the_padded_step(line, kind, make):
    assert_same_step(*padded_and_packed_steps(make, _batch(kind, *line), kind), LOSS_RTOL, GRAD_RTOL, GRAD_ATOL)


def test_wrong_positions_would_show(line, monkeypatch):
    """The equality above sees the positions: a RoBERTa whose packed rows counted from 0 gives another loss."""
    from npm.training import packing

    padded = tiny_roberta()
    packed = copy.deepcopy(padded)
    use_packed_attention(packed)
    batch = _batch("npm", *line)
    right = float(step_loss(packed, batch, "npm", "all", CPU)[0].detach())
    monkeypatch.setattr(packing, "first_position", lambda model: 0)
    wrong = float(step_loss(packed, batch, "npm", "all", CPU)[0].detach())
    assert right == pytest.approx(float(step_loss(padded, batch, "npm", "all", CPU)[0].detach()), rel=LOSS_RTOL)
    assert abs(wrong - right) > 1e-3


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def test_packed_training_runs_and_keys_its_run(tmp_path, tiny_encoder):
    """``training.packed`` trains, the run record holds it (dropout draws differ from the padded run's), an unpacked
    run's record does not name it (its run id is the one from before the switch), and the saved model loads with the
    default attention."""
    import npm.model

    shards = write_shard(tmp_path)
    summaries = {name: train(config(tmp_path, tiny_encoder, shards, name, steps=2, packed=name == "packed"))
                 for name in ("packed", "padded")}
    records = {name: json.loads(next((tmp_path / f"{name}-ckpt").glob("run-*/run.json")).read_text())
               for name in summaries}
    assert records["packed"]["settings"]["packed"] is True and "packed" not in records["padded"]["settings"]
    assert records["packed"]["run_id"] != records["padded"]["run_id"]
    assert all(np.isfinite(summaries["packed"]["first_losses"]))
    assert npm.model.load_encoder(str(tmp_path / "packed")).config._attn_implementation == "sdpa"
