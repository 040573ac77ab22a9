"""torch.compile of the encoder (``npm.training.loop.compile_encoder``, docs/paper-scale.md): the compiled training step
gives the eager step's loss and gradients up to rounding (fp32 on CPU), the state_dict keeps its names, and a graph
that cannot compile (here: no working C++ compiler) runs eagerly instead of failing the job."""

from __future__ import annotations

import copy

import pytest
import torch

from npm.settings import TrainingSettings
from npm.training.collate import collate_phrase
from npm.training.loop import TrainConfig, compile_encoder, make_optimizer, step_loss
from tests.test_distributed import tiny_bert, world_lines

CPU = torch.device("cpu")


def _loss_and_grads(model, batch):
    loss, _ = step_loss(model, batch, "npm", "all", CPU)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


@pytest.fixture(scope="module")
def batch():
    rows, spans = world_lines(1, "all")[0]
    assert len(spans), "the line needs spans with a positive in another row"
    return collate_phrase(rows, spans, 119)


def test_compiled_step_equals_the_eager_step(batch):
    eager = tiny_bert()
    compiled = copy.deepcopy(eager)
    assert compile_encoder(compiled, True) == "compiled"
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints keep their names
    for _ in range(2):  # the second call runs the cached graph
        loss_e, grads_e = _loss_and_grads(eager, batch)
        loss_c, grads_c = _loss_and_grads(compiled, batch)
        assert loss_c == pytest.approx(loss_e, rel=1e-5)
        assert grads_c.keys() == grads_e.keys()
        for name, g in grads_e.items():
            torch.testing.assert_close(grads_c[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_a_graph_that_cannot_compile_runs_eagerly(batch, monkeypatch, caplog):
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", ("/nonexistent/c++",))
    eager = tiny_bert()
    fallback = copy.deepcopy(eager)
    assert compile_encoder(fallback, True) == "compiled"
    loss_e, grads_e = _loss_and_grads(eager, batch)
    loss_f, grads_f = _loss_and_grads(fallback, batch)
    torch._dynamo.reset()
    assert "No working C++ compiler" in caplog.text  # the fallback was taken, and said so
    assert loss_f == loss_e
    for name, g in grads_e.items():
        torch.testing.assert_close(grads_f[name], g, rtol=0, atol=0, msg=name)


def test_eager_is_the_default_and_the_cpu_optimizer_is_not_fused():
    model = tiny_bert()
    assert compile_encoder(model, TrainingSettings.compile) == "eager"
    optimizer = make_optimizer(model.parameters(), TrainConfig("npm", "x", [], "o", "c"), CPU)
    assert not optimizer.defaults["fused"]
