"""The parametric MLM baseline (paper Table 1 "RoBERTa" row; paper-map §4.1 step 7, §6): BERT-style
on-the-fly masking, plain MLM training through the pretraining loop (loss falls, resume is bit-for-bit, a newly
initialised head is logged, the output loads as a masked LM, DDP runs), vocabulary-softmax label scores, and the
closed-set evaluation's output contract and errors."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForMaskedLM, BertConfig, BertForMaskedLM

from npm.baselines.mlm import mlm_label_scores
from npm.cli import main as cli_main
from npm.evaluation.harness import evaluate
from npm.evaluation.systems import Inputs
from npm.io import read_jsonl, write_jsonl
from npm.model import load_masked_lm, max_input_length
from npm.settings import MaskingSettings, Settings
from npm.tasks.registry import label_verbalizers
from npm.training.collate import IGNORE_INDEX, collate_mlm
from npm.training.loop import MaskedTokensMLM, mlm_generator, mlm_step_loss, train
from tests.conftest import WORDPIECE, lee_corpus_lines, save_tiny_bert, train_config
from tests.test_distributed import run_ranks

SST2_ROWS = ["__label__5\tThessaloniki is a great city", "__label__1\tthe plot is dull", "__label__4\ta fine film",
             "__label__3\tneutral, dropped", "__label__2\tan awful waste of time", "__label__5\tshe meets her brother",
             "__label__1\the goes to Greece"]


def save_tiny_masked_lm(path, seed: int = 0) -> str:
    """A small random BERT *with* an MLM head (hidden 32, 2 layers, 128 positions) and the MiniLM WordPiece."""
    from npm.model import load_tokenizer

    tok = load_tokenizer(WORDPIECE)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertForMaskedLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A BERT encoder without an MLM head, like the embedded default's MiniLM."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory):
    return save_tiny_masked_lm(tmp_path_factory.mktemp("tiny-mlm"))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Real tiny training data: news paragraphs -> 64-token blocks -> batch lines of 4 -> span-masked lines (NPM's)."""
    from npm.data.batches import build_batches
    from npm.data.blocks import build_blocks
    from npm.masking import mask_shard

    d = tmp_path_factory.mktemp("mlm-data")
    write_jsonl(d / "docs.jsonl", [{"id": str(i), "units": [line]} for i, line in enumerate(lee_corpus_lines()[:40])])
    build_blocks(d / "docs.jsonl", d / "blocks.npz", WORDPIECE, max_seq_length=64)
    build_batches(d / "blocks.npz", d / "batches.npz", batch_size=4)
    mask_shard(d / "blocks.npz", d / "batches.npz", d / "masked.npz", mode="span", masking=MaskingSettings(seed=0))
    return [(str(d / "blocks.npz"), str(d / "masked.npz"))]


def config(tmp_path, encoder, shards, name, **kw):
    base = dict(model="mlm", encoder=encoder, tokenizer=encoder, shards=shards, out_dir=str(tmp_path / name),
                checkpoint_dir=str(tmp_path / f"{name}-ckpt"), steps=6, warmup_steps=2, lr=1e-3, pool="all",
                checkpoint_every=3, seed=0)
    base.update(kw)
    return train_config(**base)


# ------------------------------------------------------------------------------------------------ masking

def test_collate_mlm_masks_15_percent_of_non_special_tokens_80_10_10(wordpiece_tokenizer):
    tok = wordpiece_tokenizer
    rng = np.random.default_rng(0)
    rows = [np.array([tok.cls_token_id, *rng.integers(2000, 3000, size=n), tok.sep_token_id]) for n in
            rng.integers(100, 200, size=60)]
    specials = tok.all_special_ids
    batch = collate_mlm(rows, tok.mask_token_id, specials, len(tok), mlm_generator(0, 5))
    ids = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(r) for r in rows], batch_first=True)
    selected = batch["labels"] != IGNORE_INDEX
    eligible = batch["attention_mask"].bool() & ~torch.isin(ids, torch.tensor(specials))
    assert not (selected & ~eligible).any()  # never [CLS] / [SEP] / padding
    assert torch.equal(batch["labels"][selected], ids[selected])
    assert torch.equal(batch["input_ids"][~selected], ids[~selected])
    share = selected.sum().item() / eligible.sum().item()
    assert 0.13 < share < 0.17
    masked = (batch["input_ids"] == tok.mask_token_id) & selected
    kept = (batch["input_ids"] == ids) & selected
    n = selected.sum().item()
    assert 0.76 < masked.sum().item() / n < 0.84
    assert 0.07 < kept.sum().item() / n < 0.13  # ~10% kept (+ the rare random draw of the same id)
    assert 0.07 < (n - masked.sum().item() - kept.sum().item()) / n < 0.13  # ~10% random ids
    again = collate_mlm(rows, tok.mask_token_id, specials, len(tok), mlm_generator(0, 5))
    other = collate_mlm(rows, tok.mask_token_id, specials, len(tok), mlm_generator(0, 6))
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # seeded by (seed, step) only
    assert not torch.equal(batch["labels"], other["labels"])


def test_collate_mlm_always_predicts_at_least_one_token_and_rejects_an_all_special_line(wordpiece_tokenizer):
    tok = wordpiece_tokenizer
    short = [np.array([tok.cls_token_id, 2000, tok.sep_token_id])]
    for step in range(20):
        batch = collate_mlm(short, tok.mask_token_id, tok.all_special_ids, len(tok), mlm_generator(0, step))
        assert (batch["labels"] != IGNORE_INDEX).sum() >= 1
    with pytest.raises(ValueError, match="no non-special token"):
        collate_mlm([np.array([tok.cls_token_id, tok.sep_token_id])], tok.mask_token_id, tok.all_special_ids,
                    len(tok), mlm_generator(0, 0))


# ------------------------------------------------------------------------------------------------ training

@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_encoder, shards):
    """30 MLM steps of a head-less tiny BERT on the real blocks; the log records are captured."""
    tmp = tmp_path_factory.mktemp("mlm-run")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep(level=logging.WARNING)
    logging.getLogger("npm-repro.model").addHandler(handler)
    try:
        summary = train(config(tmp, tiny_encoder, shards, "run", steps=30, warmup_steps=3, lr=1e-2,
                               checkpoint_every=10))
    finally:
        logging.getLogger("npm-repro.model").removeHandler(handler)
    return tmp, summary, records


def test_mlm_training_loss_falls_and_log_is_written(trained):
    tmp, summary, _ = trained
    rows = list(csv.DictReader(open(next((tmp / "run-ckpt").glob("run-*/train_log.csv")))))
    assert [int(r["step"]) for r in rows] == list(range(1, 31)) and summary["model"] == "mlm"
    losses = [float(r["loss"]) for r in rows]
    assert losses[0] > 9.0  # about ln(30522): an untrained head
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.5  # ~10.3 -> ~8.1 nats (unigram statistics first)
    assert all(int(r["queries"]) > 0 for r in rows) and all(float(r["tokens_per_s"]) > 0 for r in rows)


def test_newly_initialised_head_is_logged(trained):
    _, _, records = trained
    assert any("NEWLY INITIALISED" in m and "cls.predictions" in m for m in records)


def test_saved_folder_is_a_masked_lm_with_its_tokenizer(trained, wordpiece_tokenizer):
    tmp, _, _ = trained
    out = tmp / "run"
    model, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert isinstance(model, BertForMaskedLM) and not info["missing_keys"]
    assert load_masked_lm(str(out)) is not None  # has a head: no error
    assert (out / "tokenizer.json").exists() and (out / "training_summary.json").exists()
    assert (out / "train_log.csv").exists()


def test_mlm_resume_continues_bit_for_bit(tmp_path, tiny_encoder, shards):
    train(config(tmp_path, tiny_encoder, shards, "straight", steps=6, schedule_steps=6))
    train(config(tmp_path, tiny_encoder, shards, "stopped", steps=3, schedule_steps=6))
    train(config(tmp_path, tiny_encoder, shards, "stopped", steps=6, schedule_steps=6))
    a = BertForMaskedLM.from_pretrained(tmp_path / "straight").state_dict()
    b = BertForMaskedLM.from_pretrained(tmp_path / "stopped").state_dict()
    assert any(k.startswith("cls.") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    log_a = [r["loss"] for r in csv.DictReader(open(next((tmp_path / "straight-ckpt").glob("run-*/train_log.csv"))))]
    log_b = [r["loss"] for r in csv.DictReader(open(next((tmp_path / "stopped-ckpt").glob("run-*/train_log.csv"))))]
    assert log_a == log_b


def test_unknown_model_is_rejected(tmp_path, tiny_encoder, shards):
    with pytest.raises(ValueError, match="model must be one of .*'mlm'"):
        train(config(tmp_path, tiny_encoder, shards, "run", model="clm"))


def test_masked_tokens_mlm_has_the_full_heads_loss_and_gradients(tiny_mlm):
    """The head on the selected tokens only gives AutoModelForMaskedLM's loss and the same gradients."""
    from npm.model import load_tokenizer

    tok = load_tokenizer(tiny_mlm)
    full = load_masked_lm(tiny_mlm)
    cheap = load_masked_lm(tiny_mlm)
    full.eval(), cheap.eval()  # no dropout: both passes see the same activations
    rows = [np.array([tok.cls_token_id, *range(2000, 2000 + n), tok.sep_token_id]) for n in (20, 13)]
    batch = collate_mlm(rows, tok.mask_token_id, tok.all_special_ids, len(tok), mlm_generator(0, 0))
    ref = full(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
    loss, stats = mlm_step_loss(MaskedTokensMLM(cheap), batch, torch.device("cpu"))
    torch.testing.assert_close(loss, ref)
    assert stats["queries"] == int((batch["labels"] != IGNORE_INDEX).sum()) > 0
    ref.backward(), loss.backward()
    grads = dict(full.named_parameters())
    for name, p in cheap.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, atol=1e-6, rtol=1e-4, msg=name)


def test_masked_tokens_mlm_needs_one_head(tiny_encoder):
    with pytest.raises(ValueError, match="one head module"):
        MaskedTokensMLM(load_masked_lm(tiny_encoder, allow_new_head=True).base_model)


# ------------------------------------------------------------------------------------------------ DDP

def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str, encoder: str, shards) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(encoder)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                       attention_probs_dropout_prob=0.0))
    rows = [np.array([tok.cls_token_id, *range(2000 + 10 * rank, 2010 + 13 * rank), tok.sep_token_id])] * 2
    batch = collate_mlm(rows, tok.mask_token_id, tok.all_special_ids, len(tok), mlm_generator(0, 0, rank))
    ddp = torch.nn.parallel.DistributedDataParallel(MaskedTokensMLM(model))  # alive until backward all-reduced
    loss, _ = mlm_step_loss(ddp, batch, torch.device("cpu"))
    loss.backward()
    torch.save({"batch": batch, "loss": loss.detach(), "grads": {k: p.grad.clone() for k, p in
                                                                 model.named_parameters()}},
               Path(out_dir) / f"rank{rank}.pt")
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    # train destroys the process group at the end
    train(train_config(model="mlm", encoder=encoder, shards=shards, out_dir=str(Path(out_dir) / "model"),
                      checkpoint_dir=str(Path(out_dir) / "ckpt"), steps=2, warmup_steps=1, checkpoint_every=2))


def test_ddp_mlm_gradients_are_the_mean_of_the_ranks_and_train_runs(tmp_path, tiny_encoder, shards):
    world = 2
    results = run_ranks(_ddp_worker, world, (world, str(tmp_path / "init"), str(tmp_path), tiny_encoder, shards),
                        tmp_path, start_method="spawn")
    torch.manual_seed(0)
    ref = BertForMaskedLM(BertConfig(vocab_size=results[0]["grads"]["bert.embeddings.word_embeddings.weight"].shape[0],
                                     hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=128, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0))
    losses = [mlm_step_loss(MaskedTokensMLM(ref), res["batch"], torch.device("cpu"))[0] for res in results]
    torch.testing.assert_close(losses[0], results[0]["loss"])
    torch.stack(losses).mean().backward()
    for name, p in ref.named_parameters():
        for r in range(world):
            torch.testing.assert_close(results[r]["grads"][name], p.grad, atol=1e-6, rtol=1e-4, msg=f"{r} {name}")
    rows = list(csv.DictReader(open(next((tmp_path / "ckpt").glob("run-*/train_log.csv")))))
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert json.loads((tmp_path / "model" / "training_summary.json").read_text())["world_size"] == 2
    assert not AutoModelForMaskedLM.from_pretrained(tmp_path / "model", output_loading_info=True)[1]["missing_keys"]


# ------------------------------------------------------------------------------------------------ scoring

def manual_scores(model, tok, text: str, label_ids: list[int]) -> np.ndarray:
    """One unpadded forward of the full masked LM, softmax of the logits at the mask over the whole vocabulary."""
    ids = tok(text.replace("<mask>", tok.mask_token))["input_ids"][-max_input_length(model, tok):]
    pos = ids.index(tok.mask_token_id)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, pos]
    return torch.softmax(logits.double(), -1)[label_ids].numpy()


def test_label_scores_equal_the_vocabulary_softmax_at_the_mask(tiny_mlm, wordpiece_tokenizer):
    tok = wordpiece_tokenizer
    model = load_masked_lm(tiny_mlm)
    assert max_input_length(model, tok) == 128  # the position table, below the tokenizer's 512
    long_text = " ".join(["the film was long"] * 60) + " It was<mask>."  # > 128 tokens: cut from the left
    texts = ["a fine film It was<mask>.", "the plot is dull. It was<mask>.", long_text, "[MASK] is a city."]
    labels = [int(v[0]) for v in label_verbalizers("sst2", tok, fuzzy=False)]
    got = mlm_label_scores(model, tok, texts, labels, batch_size=2)
    assert got.shape == (4, 2) and got.dtype == np.float64
    for text, row in zip(texts, got, strict=True):
        np.testing.assert_allclose(row, manual_scores(model, tok, text, labels), rtol=1e-4, atol=1e-9)
    # label ids given as the verbalizer arrays (one id each) give the same scores
    arrays = label_verbalizers("sst2", tok, fuzzy=False)
    np.testing.assert_allclose(mlm_label_scores(model, tok, texts, arrays, batch_size=3), got, rtol=1e-5)


def test_mlm_max_length_keeps_the_last_tokens_as_the_original(tiny_mlm, wordpiece_tokenizer, tmp_path):
    """inference.mlm_max_length (the original code: 256 for every closed-set model): an input keeps its last N
    tokens, the mask among them; the scorer passes the setting and records it."""
    tok, model = wordpiece_tokenizer, load_masked_lm(tiny_mlm)
    long_text = " ".join(["the film was long"] * 20) + " It was<mask>."  # ~90 tokens, under the model's 128
    labels = [int(v[0]) for v in label_verbalizers("sst2", tok, fuzzy=False)]
    ids = tok(long_text.replace("<mask>", tok.mask_token))["input_ids"][-32:]  # the last 32, [CLS] lost
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, ids.index(tok.mask_token_id)]
    expected = torch.softmax(logits.double(), -1)[labels].numpy()
    short = mlm_label_scores(model, tok, [long_text], labels, max_length=32)
    np.testing.assert_allclose(short[0], expected, rtol=1e-4, atol=1e-9)
    whole = mlm_label_scores(model, tok, [long_text], labels)
    assert not np.allclose(short, whole)
    capped = mlm_label_scores(model, tok, [long_text], labels, max_length=10_000)  # at most the model's limit
    np.testing.assert_allclose(capped, whole)
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "test.tsv").write_text("\n".join(SST2_ROWS) + "\n")
    for limit, expected in ((None, 128), (32, 32)):
        metrics = run_mlm_evaluation("sst2", tiny_mlm, tasks_root=tmp_path, device="cpu",
                                     settings=Settings(mlm_max_length=limit))
        assert metrics["max_length"] == expected


def test_text_without_or_with_two_masks_names_the_example(tiny_mlm, wordpiece_tokenizer):
    model = load_masked_lm(tiny_mlm)
    with pytest.raises(ValueError, match="example ex-2: query has no mask"):
        mlm_label_scores(model, wordpiece_tokenizer, ["a <mask>.", "no mask here"], [2000, 2001],
                         example_ids=["ex-1", "ex-2"])
    with pytest.raises(ValueError, match="example 0: query has 2 masks"):
        mlm_label_scores(model, wordpiece_tokenizer, ["<mask> and <mask>."], [2000, 2001])


def test_head_less_checkpoint_cannot_be_scored(tiny_encoder):
    with pytest.raises(ValueError, match="no trained MLM head.*--model mlm"):
        load_masked_lm(tiny_encoder)


# ------------------------------------------------------------------------------------------------ one task

def run_mlm_evaluation(task, checkpoint, tasks_root, **kw):
    inputs = Inputs(checkpoint=checkpoint, tasks_root=str(tasks_root), device=kw.pop("device", None))
    return evaluate(task, "mlm", inputs, **kw)


def test_run_mlm_evaluation_writes_predictions_and_metrics(tiny_mlm, wordpiece_tokenizer, tmp_path):
    tasks = tmp_path / "tasks"
    (tasks / "sst2").mkdir(parents=True)
    (tasks / "sst2" / "test.tsv").write_text("\n".join(SST2_ROWS) + "\n")
    (tasks / "fuzzy_verbalizers").mkdir()  # present, and ignored: the MLM baseline uses the single label words
    (tasks / "fuzzy_verbalizers" / "sst2.txt").write_text("the, of, is\nand, in, to\n")
    pred_path, metrics_path = tmp_path / "out" / "p.jsonl", tmp_path / "out" / "m.json"
    metrics = run_mlm_evaluation("sst2", tiny_mlm, tasks_root=tasks, predictions_path=pred_path,
                                 metrics_path=metrics_path, device="cpu")
    preds = list(read_jsonl(pred_path))
    assert len(preds) == 6 == metrics["n"]  # the neutral line is dropped
    assert all(set(p) == {"id", "input", "label", "prediction", "scores", "correct"} for p in preds)
    model, tok = load_masked_lm(tiny_mlm), wordpiece_tokenizer
    labels = [int(v[0]) for v in label_verbalizers("sst2", tok, fuzzy=False)]
    for p in preds:
        assert p["input"].endswith(" It was<mask>.")
        np.testing.assert_allclose(p["scores"], manual_scores(model, tok, p["input"], labels), rtol=1e-4)
        assert p["prediction"] == int(np.argmax(p["scores"])) and p["correct"] == (p["prediction"] == p["label"])
    assert metrics["score"] == pytest.approx(100.0 * np.mean([p["correct"] for p in preds]))
    saved = json.loads(metrics_path.read_text())
    for key in ("task", "system", "metric", "score", "n", "average", "seconds", "queries_per_s", "corpus",
                "corpus_tokens", "parameters", "retrieval", "device", "model"):
        assert key in saved, key
    assert saved["task"] == "sst2" and saved["system"] == "mlm" and saved["metric"] == "accuracy"
    assert saved["corpus"] is None and saved["corpus_tokens"] is None and saved["retrieval"] is None
    assert saved["parameters"] == sum(p.numel() for p in model.parameters()) and saved["device"] == "cpu"
    assert saved["model"] == tiny_mlm and saved["queries_per_s"] > 0
    assert saved["label_ids"] == [[i] for i in labels]
    assert saved["provenance"]["config"]["sampling_seed"] == 0


def test_evaluate_command_writes_the_same_outputs(tiny_mlm, tmp_path):
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "test.tsv").write_text("\n".join(SST2_ROWS) + "\n")
    code = cli_main(["evaluate", "--task", "sst2", "--system", "mlm", "--checkpoint", tiny_mlm, "--tasks-root",
                     str(tmp_path), "--predictions", str(tmp_path / "p.jsonl"), "--metrics", str(tmp_path / "m.json"),
                     "--n-samples", "4", "--device", "cpu"])
    assert code == 0
    assert len(list(read_jsonl(tmp_path / "p.jsonl"))) == 4
    assert json.loads((tmp_path / "m.json").read_text())["n"] == 4


def test_open_set_task_and_missing_folder_are_clear_errors(tiny_mlm, tmp_path):
    with pytest.raises(ValueError, match="mlm does not apply to open-set"):
        run_mlm_evaluation("nq", tiny_mlm, tasks_root=tmp_path)
    with pytest.raises(FileNotFoundError, match="task folder"):
        run_mlm_evaluation("sst2", tiny_mlm, tasks_root=tmp_path)
    with pytest.raises(KeyError, match="unknown task"):
        run_mlm_evaluation("nope", tiny_mlm, tasks_root=tmp_path)
