"""GPU paths (``pytest -m gpu``; skipped where torch sees no CUDA device): DensePhrases' steps run on the device they
are given, in the precision they are given, and agree with the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_densephrases_train import _examples

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def test_densephrases_trains_dumps_and_answers_on_the_gpu(tmp_path):
    from npm.data.blocks import build_blocks
    from npm.densephrases.dump import build_index, dump_phrases
    from npm.densephrases.evaluate import rc_evaluate
    from npm.densephrases.model import DensePhrases
    from npm.densephrases.rc import write_squad
    from npm.densephrases.searcher import PhraseSearcher
    from npm.densephrases.train import TeacherConfig, TrainConfig, train_densephrases, train_teacher
    from npm.io import write_jsonl
    from tests.conftest import WORDPIECE, save_tiny_bert

    write_squad(tmp_path / "train.json", _examples(), "test")
    encoder = save_tiny_bert(tmp_path / "encoder")
    common = dict(encoder=encoder, train=str(tmp_path / "train.json"), max_passage_tokens=64, max_question_tokens=24,
                  precision="bf16", device="cuda")
    train_teacher(TeacherConfig(**common, out_dir=str(tmp_path / "teacher"), checkpoint_dir=str(tmp_path / "ck_t"),
                                epochs=1, batch_size=4), progress=False)
    train_densephrases(TrainConfig(**common, out_dir=str(tmp_path / "model"), checkpoint_dir=str(tmp_path / "ck"),
                                   teacher=str(tmp_path / "teacher"), epochs=2, pre_batch_epochs=1, batch_size=4,
                                   lr=1e-3), progress=False)
    write_jsonl(tmp_path / "docs.jsonl", [{"id": ex["id"], "units": [ex["context"]]} for ex in _examples()])
    build_blocks(tmp_path / "docs.jsonl", tmp_path / "blocks.npz", WORDPIECE, max_seq_length=64)
    for device in ("cuda", "cpu"):
        dump_phrases(tmp_path / "model", [str(tmp_path / "blocks.npz")], tmp_path / f"dump_{device}", progress=False,
                     precision="fp32", device=device)
    on_gpu = np.fromfile(tmp_path / "dump_cuda" / "vectors.f16", dtype=np.float16).astype(np.float32)
    on_cpu = np.fromfile(tmp_path / "dump_cpu" / "vectors.f16", dtype=np.float16).astype(np.float32)
    assert on_gpu.shape == on_cpu.shape and np.allclose(on_gpu, on_cpu, atol=2e-2)
    build_index(tmp_path / "dump_cuda", tmp_path / "flat.faiss")
    searcher = PhraseSearcher(tmp_path / "model", tmp_path / "dump_cuda", tmp_path / "flat.faiss", device="cuda",
                              precision="bf16")
    assert searcher.model.phrase.device.type == "cuda"
    assert len(searcher.search(["What is the capital of Greece?"], k=4, max_words=3, top_n=2)[0]) >= 1
    model = DensePhrases.load(tmp_path / "model").to("cuda")
    assert 0 <= rc_evaluate(model, _examples(), 64, 24, precision="bf16")["em"] <= 100
