"""Released checkpoints (config `models`, docs/released-checkpoints.md; paper-map §0 and §2.5).

facebook/npm and facebook/npm-single are roberta-large checkpoints saved as RobertaForMaskedLM. The hub is out of
reach here, so a small random checkpoint of the same architecture and layout stands in for them: RobertaForMaskedLM
weights (``roberta.*`` and ``lm_head.*``) and a byte-level BPE tokenizer in RoBERTa's layout, saved with
``save_pretrained``. It must load as the encoder, replace rule pretrain in the workflow, and build a datastore
that records it.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors import safe_open
from transformers import RobertaConfig, RobertaForMaskedLM, RobertaModel

from npm.data.blocks import build_blocks
from npm.datastore.store import load_datastore, model_fingerprint
from npm.io import write_jsonl
from npm.model import encode, load_encoder, load_tokenizer
from tests.conftest import REFERENCE_EXAMPLES, lee_corpus_lines, train_tiny_bpe

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")


def save_masked_lm(path, seed):
    """A 2-layer RoBERTa masked LM with the tiny BPE's vocabulary, saved like the released checkpoints."""
    train_tiny_bpe(path, lee_corpus_lines() + REFERENCE_EXAMPLES * 20, vocab_size=2000)
    tok = load_tokenizer(str(path))
    config = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    RobertaForMaskedLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_masked_lm(tmp_path_factory.mktemp("released") / "npm", seed=0)


def masked_lm_last_hidden(checkpoint, ids, attention):
    mlm = RobertaForMaskedLM.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        return mlm(input_ids=ids, attention_mask=attention, output_hidden_states=True).hidden_states[-1]


# ------------------------------------------------------------------------------------------- loading


def test_fixture_has_the_masked_lm_layout_of_the_released_checkpoints(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["RobertaForMaskedLM"] and config["model_type"] == "roberta"
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        prefixes = {key.split(".")[0] for key in f.keys()}
    assert prefixes == {"roberta", "lm_head"}
    assert config["vocab_size"] == len(load_tokenizer(str(checkpoint)))


def test_masked_lm_checkpoint_loads_as_the_encoder(checkpoint):
    """load_encoder maps the roberta.* weights into the base model and drops the LM head: its final hidden states
    are RobertaForMaskedLM's hidden_states[-1] (paper 3.1: vectors are the last hidden layer, not the head)."""
    encoder = load_encoder(str(checkpoint)).eval()
    assert isinstance(encoder, RobertaModel) and encoder.pooler is None
    tok = load_tokenizer(str(checkpoint))
    batch = tok(["The cat's hat.", "Thessaloniki is the second largest city in <mask>."], padding=True,
                return_tensors="pt")
    with torch.no_grad():
        got = encode(encoder, batch["input_ids"], batch["attention_mask"])
    want = masked_lm_last_hidden(checkpoint, batch["input_ids"], batch["attention_mask"])
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)


def test_hub_id_missing_from_the_cache_fails_clearly(tmp_path, monkeypatch):
    """No network here: a hub id that is not in the local cache names the model and the cache."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))  # an empty cache, wherever the tests run
    with pytest.raises(FileNotFoundError, match=r"'facebook/npm' is neither a local folder nor in the Hugging Face"):
        model_fingerprint("facebook/npm")


# ------------------------------------------------------------------------------------------- workflow


def dry_run(workdir, overlay, *targets):
    """(jobs as (rule, wildcards) pairs, output) of a dry run of the embedded default plus the overlay config."""
    out = subprocess.run([SNAKEMAKE, *targets, "-n", "-p", "--cores", "1", "--directory", str(workdir),
                          "-s", str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config" / "config.yaml"),
                          str(overlay)], cwd=ROOT, capture_output=True, text=True)
    jobs = []
    for block in re.split(r"^(?=(?:local)?rule \w+:)", out.stdout, flags=re.M)[1:]:
        rule = re.match(r"(?:local)?rule (\w+):", block).group(1)
        found = re.search(r"^\s+wildcards: (.*)$", block, flags=re.M)
        wildcards = dict(kv.split("=", 1) for kv in found.group(1).split(", ")) if found else {}
        jobs.append((rule, wildcards, block))
    return out, jobs


def write_overlay(path, models):
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def test_local_checkpoint_replaces_pretraining_of_its_model(tmp_path, checkpoint):
    overlay = write_overlay(tmp_path / "overlay.yaml", {"npm": str(checkpoint)})
    out, jobs = dry_run(tmp_path / "work", overlay, "data/datastore/npm/enwiki/meta.json",
                        "data/datastore/npm_single/enwiki/meta.json")
    assert out.returncode == 0, out.stdout + out.stderr
    trained = {wc["model"] for rule, wc, _ in jobs if rule == "pretrain"}
    assert trained == {"npm_single"}
    embed = {wc["model"]: block for rule, wc, block in jobs if rule == "plan_datastore"}
    assert set(embed) == {"npm", "npm_single"}
    # The local folder is an input of the job (Snakemake tracks it) and what --checkpoint names.
    assert f"input: {checkpoint}," in embed["npm"] and f"--checkpoint {checkpoint} " in embed["npm"]
    assert "--checkpoint results/models/npm_single " in embed["npm_single"]


def test_default_target_trains_no_model_that_has_a_checkpoint(tmp_path, checkpoint):
    """A hub id is fetched by rule download_checkpoint into data/checkpoints/{hub id}: that folder is the job's input
    and what --checkpoint names, so a missing network fails one download job before any GPU job."""
    overlay = write_overlay(tmp_path / "overlay.yaml", {"npm": str(checkpoint), "npm_single": "facebook/npm-single"})
    out, jobs = dry_run(tmp_path / "work", overlay)
    assert out.returncode == 0, out.stdout + out.stderr
    # Only Table 1's parametric MLM baseline (models.mlm: null) is trained; NPM and NPM-single are not.
    assert [wc for rule, wc, _ in jobs if rule == "pretrain"] == [{"model": "mlm"}]
    embed = {(wc["model"], wc["corpus"]): block for rule, wc, block in jobs if rule == "plan_datastore"}
    assert {(m, c) for m in ("npm", "npm_single") for c in ("enwiki", "cc_news")} <= set(embed)
    assert all("--checkpoint data/checkpoints/facebook/npm-single " in b
               for (m, _), b in embed.items() if m == "npm_single")
    single = embed["npm_single", "enwiki"]
    assert "input: data/checkpoints/facebook/npm-single, " in single
    assert [wc for rule, wc, _ in jobs if rule == "download_checkpoint"] == [
        {"checkpoint": "data/checkpoints/facebook/npm-single"}]
    # The shared enwiki blocks (tokenised once for every model of one tokenizer) follow the checkpoint.
    assert re.search(r"input: data/checkpoints/facebook/npm-single, data/blocks/enwiki/shard0.npz, "
                     r"data/blocks/enwiki/shard1.npz\n", single), single


def test_missing_checkpoint_folder_is_a_config_error(tmp_path):
    overlay = write_overlay(tmp_path / "overlay.yaml", {"npm": str(tmp_path / "no-such-folder")})
    out, _ = dry_run(tmp_path / "work", overlay, "data/datastore/npm/enwiki/meta.json")
    assert out.returncode != 0
    message = out.stdout + out.stderr
    assert "models.npm" in message and "neither an existing folder nor a Hugging Face hub id" in message


# ------------------------------------------------------------------------------------------- datastore


def test_datastore_from_a_checkpoint_records_it(tmp_path, checkpoint):
    """`npm-repro embed --checkpoint CHECKPOINT` (the datastore rules) on blocks made with its tokenizer: the datastore
    loads with expected_model=CHECKPOINT, its vectors are the masked LM's last hidden states, and another
    checkpoint is refused."""
    docs = [{"id": f"lee-{i}", "units": [line[:300]]} for i, line in enumerate(lee_corpus_lines()[:12])]
    write_jsonl(tmp_path / "docs.jsonl", docs)
    build_blocks(tmp_path / "docs.jsonl", tmp_path / "blocks.npz", str(checkpoint), max_seq_length=64)
    out = subprocess.run([str(BIN / "npm-repro"), "embed", "--checkpoint", str(checkpoint), "--blocks",
                          str(tmp_path / "blocks.npz"), "--out", str(tmp_path / "ds"), "--batch-blocks", "4",
                          "--shards", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr

    ds = load_datastore(tmp_path / "ds", expected_model=str(checkpoint))
    assert ds.meta["model"] == str(checkpoint) and ds.hidden_size == 32 and ds.n_rows > 0
    rows, positions = ds.block_rows(0)
    ids = torch.as_tensor(ds.input_ids[ds.block_offsets[0]:ds.block_offsets[1]].astype(np.int64))[None]
    want = masked_lm_last_hidden(checkpoint, ids, torch.ones_like(ids))[0, positions].numpy()
    np.testing.assert_allclose(ds.vectors(rows), want, rtol=1e-2, atol=1e-2)  # stored as float16

    other = save_masked_lm(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="re-embed the corpus with this model"):
        load_datastore(tmp_path / "ds", expected_model=str(other))
