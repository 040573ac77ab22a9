"""GPU paths (``pytest -m gpu``): each test runs a real step on the GPU, in the precision it is given, and checks it
against the same step on the CPU. A test that needs CUDA is skipped where torch sees no CUDA device; the FAISS one is
skipped where FAISS has no GPU support (the pinned faiss-cpu). Paper-map §2.4-§2.5 (training), §3.3 (embedding),
§3.5 (index) and §D1 (DensePhrases)."""

from __future__ import annotations

import math

import faiss
import numpy as np
import pytest
import torch
from transformers import AutoConfig, BertModel

from tests.test_densephrases_train import _examples

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=f"no CUDA device (torch {torch.__version__} "
                                                                       "sees none)")
needs_faiss_gpu = pytest.mark.skipif(faiss.get_num_gpus() == 0, reason="faiss has no GPU support "
                                     "(faiss.get_num_gpus() == 0): install faiss-gpu in place of faiss-cpu")


@needs_cuda
def test_densephrases_trains_dumps_and_answers_on_the_gpu(tmp_path):
    from npm.data.blocks import build_blocks
    from npm.densephrases.dump import build_index, dump_phrases, shard_dir
    from npm.densephrases.evaluate import rc_evaluate
    from npm.densephrases.model import DensePhrases
    from npm.densephrases.rc import write_squad
    from npm.densephrases.searcher import PhraseSearcher
    from npm.densephrases.train import PhraseTrainConfig, TeacherConfig, train_densephrases, train_teacher
    from npm.io import write_jsonl
    from tests.conftest import WORDPIECE, save_tiny_bert

    write_squad(tmp_path / "train.json", _examples(), "test")
    encoder = save_tiny_bert(tmp_path / "encoder")
    common = dict(encoder=encoder, train=str(tmp_path / "train.json"), max_passage_tokens=64, max_question_tokens=24,
                  precision="bf16", device="cuda")
    train_teacher(TeacherConfig(**common, out_dir=str(tmp_path / "teacher"), checkpoint_dir=str(tmp_path / "ck_t"),
                                epochs=1, batch_size=4), progress=False)
    train_densephrases(PhraseTrainConfig(**common, out_dir=str(tmp_path / "model"),
                                         checkpoint_dir=str(tmp_path / "ck"), teacher=str(tmp_path / "teacher"),
                                         epochs=2, pre_batch_epochs=1, batch_size=4, lr=1e-3), progress=False)
    write_jsonl(tmp_path / "docs.jsonl", [{"id": ex["id"], "units": [ex["context"]]} for ex in _examples()])
    build_blocks(tmp_path / "docs.jsonl", tmp_path / "blocks.npz", WORDPIECE, max_seq_length=64)
    for device in ("cuda", "cpu"):
        dump_phrases(tmp_path / "model", [str(tmp_path / "blocks.npz")], tmp_path / f"dump_{device}", progress=False,
                     precision="fp32", device=device)
    on_gpu = np.fromfile(shard_dir(tmp_path / "dump_cuda", 0) / "vectors.f16", dtype=np.float16).astype(np.float32)
    on_cpu = np.fromfile(shard_dir(tmp_path / "dump_cpu", 0) / "vectors.f16", dtype=np.float16).astype(np.float32)
    assert on_gpu.shape == on_cpu.shape and np.allclose(on_gpu, on_cpu, atol=2e-2)
    build_index(tmp_path / "dump_cuda", tmp_path / "flat.faiss")
    searcher = PhraseSearcher(tmp_path / "model", tmp_path / "dump_cuda", tmp_path / "flat.faiss", device="cuda",
                              precision="bf16")
    assert searcher.model.phrase.device.type == "cuda"
    assert len(searcher.search(["What is the capital of Greece?"], k=4, max_words=3, top_n=2)[0]) >= 1
    model = DensePhrases.load(tmp_path / "model").to("cuda")
    assert 0 <= rc_evaluate(model, _examples(), 64, 24, precision="bf16")["em"] <= 100


def _tiny_bert_without_dropout(path) -> str:
    """``save_tiny_bert`` with dropout off, so that a training step is the same computation on every device."""
    from tests.conftest import save_tiny_bert

    save_tiny_bert(path)
    config = AutoConfig.from_pretrained(path)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    config.save_pretrained(path)
    return str(path)


def _parameters(path) -> dict[str, torch.Tensor]:
    return {k: p.detach() for k, p in BertModel.from_pretrained(path, add_pooling_layer=False).named_parameters()}


@needs_cuda
def test_one_npm_training_step_on_cuda_in_bf16_agrees_with_the_cpu(tmp_path):
    """``train`` takes the GPU when there is one: one step of the real loop (bf16 autocast, the candidate pool "all"
    of a single device, AdamW) has the fp32 CPU loss of the same batch line within bf16 rounding, and moves every
    parameter."""
    from npm.model import load_encoder, load_tokenizer
    from npm.training.collate import collate_phrase
    from npm.training.data import BatchLines
    from npm.training.loop import step_loss, train
    from tests.test_training import config, write_shard

    encoder = _tiny_bert_without_dropout(tmp_path / "encoder")
    shards = write_shard(tmp_path)
    torch.cuda.reset_peak_memory_stats()
    summary = train(config(tmp_path, encoder, shards, "run", steps=1, warmup_steps=0, precision="bf16", pool="all"))
    assert torch.cuda.max_memory_allocated() > 0, "the training step did not run on the GPU"
    (logged,) = summary["first_losses"]

    data = BatchLines(shards)
    sequences, spans, _ = data.line(int(data.order(0, 0)[0]))  # the line step 1 took (seed 0, epoch 0, one rank)
    batch = collate_phrase(sequences, spans, load_tokenizer(encoder).mask_token_id)
    on_cpu, _ = step_loss(load_encoder(encoder).train(), batch, "npm", "all", torch.device("cpu"))
    assert math.isfinite(logged) and logged == pytest.approx(float(on_cpu), rel=2e-2, abs=2e-2)

    before, after = _parameters(encoder), _parameters(tmp_path / "run")
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged and all(torch.isfinite(p).all() for p in after.values())


@needs_faiss_gpu
def test_faiss_builds_an_ivf_index_on_the_gpu_that_finds_what_the_cpu_one_finds(tmp_path):
    """``build_faiss_index(use_gpu=True)`` trains and fills an IVF index on the GPU (fp16 storage, as the original)
    and writes it for the CPU; probing every list, it returns the neighbours of the CPU-built index."""
    from npm.datastore.faiss_index import build_faiss_index, load_faiss_index, search

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(4000, 32)).astype(np.float16)  # fp16, as a datastore stores them
    vectors.tofile(tmp_path / "shard0.f16")
    shards = [(tmp_path / "shard0.f16", len(vectors))]
    queries = rng.normal(size=(50, 32)).astype(np.float32)
    found = {}
    for where in ("gpu", "cpu"):
        record = build_faiss_index(shards, 32, tmp_path / f"{where}.faiss", factory="IVF16,Flat", nprobe=16,
                                   use_gpu=where == "gpu")
        assert record["built_on"] == where and record["ntotal"] == len(vectors)
        found[where], valid = search(load_faiss_index(tmp_path / f"{where}.faiss"), queries, k=10)
        assert valid.all()
    exact = np.argsort(-(queries @ vectors.astype(np.float32).T), axis=1, kind="stable")[:, :10]
    assert np.array_equal(found["gpu"], found["cpu"])
    assert np.mean([len(np.intersect1d(f, e)) / 10 for f, e in zip(found["gpu"], exact, strict=True)]) >= 0.99


@needs_cuda
def test_the_datastore_embedding_loop_on_cuda_stores_the_cpu_vectors(tmp_path):
    """``embed_corpus`` on the GPU at fp16 (the datastore default) writes the rows the CPU writes at fp32, within fp16
    rounding, and records the device it ran on."""
    from npm.data.blocks import build_blocks
    from npm.datastore.embed import embed_corpus
    from npm.datastore.store import load_datastore
    from npm.io import write_jsonl
    from tests.conftest import WORDPIECE, save_tiny_bert

    encoder = save_tiny_bert(tmp_path / "encoder")
    write_jsonl(tmp_path / "docs.jsonl", [{"id": ex["id"], "units": [ex["context"]]} for ex in _examples()])
    build_blocks(tmp_path / "docs.jsonl", tmp_path / "blocks.npz", WORDPIECE, max_seq_length=16)
    stores = {}
    for device, precision in (("cuda", "fp16"), ("cpu", "fp32")):
        embed_corpus(encoder, [tmp_path / "blocks.npz"], tmp_path / device, batch_blocks=4, shards=2, device=device,
                     precision=precision, progress=False)
        stores[device] = load_datastore(tmp_path / device)
    assert stores["cuda"].meta["devices"] == ["cuda"] and stores["cuda"].meta["precision"] == "fp16"
    rows = np.arange(stores["cpu"].n_rows)
    assert stores["cuda"].n_rows == len(rows) > 0
    on_gpu, on_cpu = stores["cuda"].vectors(rows), stores["cpu"].vectors(rows)
    assert np.isfinite(on_gpu).all()
    np.testing.assert_allclose(on_gpu, on_cpu, atol=2e-2, rtol=1e-2)


@needs_cuda
def test_exact_knn_on_cuda_gives_faiss_flats_neighbours_on_the_cpu():
    """Closed-set kNN on the GPU without faiss-gpu (``npm.datastore.exact_knn``, issue 43): fp16 vectors on the device,
    fp32 scores, the same neighbours as FAISS Flat on the CPU, for one query and a batch, with ties (the k-th place
    to the lower row) across blocks, and on random vectors the same list wherever the k-th and (k+1)-th scores are
    more than an fp32 rounding apart."""
    from npm.datastore.exact_knn import ExactKnn
    from tests.test_exact_knn import defined, distinct_world, flat, tied_world

    x, q = distinct_world(3000)
    knn = ExactKnn([(0, x)], device="cuda", block_rows=1000)
    assert knn.blocks[0][1].device.type == "cuda" and knn.blocks[0][1].dtype == torch.float16
    for nq in (1, 2, 64):
        scores, expected = flat(x).search(q[:nq], 1000)
        rows, got = knn.search(q[:nq], 1000)
        assert np.array_equal(rows, expected) and np.array_equal(got, scores)
    x, q = tied_world(2000)
    rows, _ = ExactKnn([(0, x)], device="cuda", block_rows=37).search(q, 150)
    assert np.array_equal(rows, defined(x, q, 150))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50_000, 384), dtype=np.float32).astype(np.float16)
    q = rng.standard_normal((64, 384), dtype=np.float32)
    k = 4096
    rows, _ = ExactKnn([(0, x)], device="cuda").search(q, k)
    _, expected = flat(x).search(q, k)
    exact = np.sort(q.astype(np.float64) @ x.astype(np.float64).T, axis=1)[:, ::-1]
    clear = exact[:, k - 1] - exact[:, k] > 1e-3  # fp32 rounding: ~1e-5 here; TF32's: ~1e-2
    assert clear.sum() > 16
    for i in np.flatnonzero(clear):
        assert set(rows[i]) == set(expected[i])


@needs_cuda
@pytest.mark.parametrize("compiled, precision", [(False, "fp32"), (True, "fp32"), (False, "bf16")])
def test_the_packed_step_on_cuda_equals_the_padded_step(compiled, precision):
    """Padding-free training on the GPU (``training.packed``: torch's variable-length attention through a jagged
    nested tensor; compiled shape-generic, as the training loop compiles a packed encoder): the padded step's loss and
    gradients on the same device, no dropout; within fp32 rounding, or bf16's for the loss under bf16 autocast."""
    from tests.test_distributed import world_lines
    from tests.test_packed import _batch, assert_same_step, padded_and_packed_steps, tiny_roberta

    batch = _batch("npm", *world_lines(1, "all")[0])
    padded, packed = padded_and_packed_steps(tiny_roberta, batch, "npm", torch.device("cuda"), precision, compiled)
    if precision == "bf16":
        assert_same_step(padded, packed, loss_rtol=2e-2)
    else:
        assert_same_step(padded, packed, loss_rtol=1e-4, grad_rtol=1e-3, grad_atol=1e-5)
