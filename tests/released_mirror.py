"""A local copy of every download of the released route (config/released.yaml), in exactly the original's layouts,
laid out as ``ROOT/HOST/PATH`` for ``npm-repro mirror`` / npm.data.mirror (docs/paper-scale.md section 1).

* checkpoints: ``huggingface.co/{facebook/npm, facebook/npm-single, roberta-large}/`` in the hub's legacy layout
  (``pytorch_model.bin``, ``config.json``, ``vocab.json``, ``merges.txt``): a tiny randomly initialised
  RobertaForMaskedLM (hidden 32, 2 layers) with roberta-large's own vocabulary (tests/data/roberta-large);
* corpora: ``dl.fbaipublicfiles.com/NPM/{enwiki,enwiki-0,new-enwiki,corpus}.tar.gz`` holding, below a top folder
  ``corpus/``, per shard ``X.npy`` (flat ids), ``X_blocks.npy`` (block starts), ``X_valid.pkl`` (the original's
  valid positions, its decoded-string rule) and, for Wikipedia, ``X.jsonl`` (decoded blocks with ``<s>``/``</s>``);
* task sets: the public files each task of config/tasks.yaml downloads (csv, tsv, json, the LM-BFF tarball, LAMA's
  and OptiPrompt's archives, kamel.zip, the NPM task tarballs), made from the embedded default's real-format task
  files (npm.embedded.tasks) so that their contents load; and the fuzzy verbalizers' zip with its own top folder.
"""

from __future__ import annotations

import io
import json
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np

from npm.data.blocks import tokenize_documents
from npm.data.mirror import mirror_path
from npm.tasks.registry import load_registry

ROOT = Path(__file__).resolve().parents[1]
HUB = "huggingface.co"
NPM_DL = "dl.fbaipublicfiles.com/NPM"
CHECKPOINTS = {"facebook/npm": 1, "facebook/npm-single": 2, "roberta-large": 3}  # hub id -> seed


def local(url: str) -> Path:
    """``HOST/PATH`` of a URL, the place of its copy under a mirror root (npm.data.mirror.mirror_path)."""
    return mirror_path(url)


def save_checkpoint(folder: Path, tokenizer_dir: Path, vocab_size: int, seed: int) -> None:
    """A tiny RobertaForMaskedLM in the hub's legacy layout: pytorch_model.bin, config.json, vocab.json, merges.txt."""
    import shutil

    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(seed)
    config = RobertaConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
                           eos_token_id=2, architectures=["RobertaForMaskedLM"])
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    torch.save(RobertaForMaskedLM(config).state_dict(), folder / "pytorch_model.bin")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tokenizer_dir / name, folder / name)


def original_valid(tokenizer, ids: np.ndarray, block_offsets: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(starts, ends) per block by the original's rule (paper-map §3.2), as tests/test_released_corpus.py."""
    from tests.test_released_corpus import original_valid as rule

    return rule(tokenizer, ids, block_offsets)


def corpus_shard(tokenizer, texts: list[str], max_seq_length: int = 128, jsonl: bool = False) -> dict[str, bytes]:
    """The released files of one shard of ``texts`` (two units per document): {suffix: bytes}."""
    docs = [{"id": str(i), "units": texts[i:i + 2]} for i in range(0, len(texts), 2)]
    blocks = tokenize_documents(docs, tokenizer, max_seq_length=max_seq_length)
    ids, offsets = blocks["input_ids"].astype(np.int32), blocks["block_offsets"]
    files = {}
    for suffix, array in ((".npy", ids), ("_blocks.npy", offsets[:-1].astype(np.int64))):
        buf = io.BytesIO()
        np.save(buf, array)
        files[suffix] = buf.getvalue()
    files["_valid.pkl"] = pickle.dumps(original_valid(tokenizer, ids, offsets))
    if jsonl:
        files[".jsonl"] = "".join(json.dumps({"id": b, "contents": tokenizer.decode(ids[offsets[b]:offsets[b + 1]])})
                                  + "\n" for b in range(len(offsets) - 1)).encode()
    return files


def write_tar(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def write_zip(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def build_corpora(root: Path, tokenizer, lines: list[str], shards: dict[str, int]) -> None:
    """The four corpus archives of config/released.yaml; ``shards``: enwiki / new-enwiki shard counts."""
    chunks = np.array_split(np.arange(len(lines)), 8)
    part = [[lines[i] for i in c] for c in chunks]
    enwiki = {}
    for s in range(shards["enwiki"]):
        for suffix, data in corpus_shard(tokenizer, part[s % 4], jsonl=True).items():
            enwiki[f"corpus/enwiki/{s}{suffix}"] = data
    write_tar(root / NPM_DL / "enwiki.tar.gz", enwiki)
    write_tar(root / NPM_DL / "enwiki-0.tar.gz", {k: v for k, v in enwiki.items() if "/enwiki/0" in k})
    new = {}
    for s in range(shards["new-enwiki"]):
        for suffix, data in corpus_shard(tokenizer, part[4 + s % 4], jsonl=True).items():
            new[f"corpus/new-enwiki/{s}{suffix}"] = data
    write_tar(root / NPM_DL / "new-enwiki.tar.gz", new)
    closed = {}
    for k, name in enumerate(("cc_news", "subj", "imdb", "amazon")):
        for suffix, data in corpus_shard(tokenizer, part[(2 * k) % 8] + part[(2 * k + 1) % 8]).items():
            closed[f"corpus/{name}/text{suffix}"] = data
    write_tar(root / NPM_DL / "corpus.tar.gz", closed)


def _uuid_records(path: Path, uuids: set[str]) -> bytes:
    keep = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("uuid") in uuids]
    return ("\n".join(keep) + "\n").encode() if keep else b""


def build_task_files(root: Path, tasks: Path) -> None:
    """The public downloads of config/tasks.yaml's URL tasks, made from the task files in ``tasks``
    (npm.embedded.tasks's real formats), in the layouts the fetch recipes read."""
    reg = load_registry(ROOT / "config" / "tasks.yaml")
    url = {name: task.urls for name, task in reg.items()}
    read = lambda task, rel: (tasks / task / rel).read_bytes()  # noqa: E731
    write_file(root / local(url["agn"][0]), read("agn", "test.csv"))
    write_file(root / local(url["sst2"][0]), read("sst2", "test.tsv"))
    write_tar(root / local(url["subj"][0]),
              {f"original/{t}/test.csv": read(t, "test.csv") for t in ("subj", "mr", "cr")})
    trex = tasks / "lama_trex"
    uhn = set((trex / "uhn.txt").read_text(encoding="utf-8").split())
    hard = set((trex / "hard.txt").read_text(encoding="utf-8").split())
    members = {}
    for f in sorted((trex / "TREx").glob("*.jsonl")):
        members[f"data/LAMA-TREx/{f.name}"] = f.read_bytes()
        members[f"data/LAMA-TREx_UHN/{f.name}"] = _uuid_records(f, uhn)
        members[f"data/LAMA-TREx-easy-hard/Hard/{f.name}"] = _uuid_records(f, hard)
    optiprompt, lama = url["lama_trex"]
    write_tar(root / local(optiprompt), members)
    google = {f"data/Google_RE/{f.stem}_test.jsonl": f.read_bytes()
              for f in sorted((tasks / "lama_google_re" / "Google_RE").glob("*.jsonl"))}
    write_zip(root / local(lama), {"data/relations.jsonl": read("lama_trex", "relations.jsonl"), **google})
    kamel_zip, templates = url["kamel"]
    write_zip(root / local(kamel_zip), {f"{p.parent.name}/dev.jsonl": p.read_bytes()
                                        for p in sorted((tasks / "kamel").glob("P*/dev.jsonl"))})
    write_file(root / local(templates), read("kamel", "question-templates.csv"))
    for u, name in zip(url["nq"], ("nqopen-test.json", "test_id2answers.json"), strict=True):
        write_file(root / local(u), read("nq", name))
    write_tar(root / local(url["templama_changed"][0]),
              {"templama/test.jsonl": read("templama_changed", "test.jsonl"),
               "unchanged_templama/test.jsonl": read("templama_unchanged", "test.jsonl")})
    write_tar(root / local(url["entity_translation"][0]),
              {"entity_translation/test.jsonl": read("entity_translation", "test.jsonl")})


def build_verbalizers(root: Path, tasks: Path, zip_url: str, tokenizer) -> None:
    """Shi et al.'s fuzzy verbalizers zip, with its own top folder as published; the words of ``tasks``' files that
    are one token of ``tokenizer`` with their leading space, as the published files' words are of roberta-large's."""
    folder = tasks / "fuzzy_verbalizers"
    one = lambda w: len(tokenizer(" " + w.strip(), add_special_tokens=False)["input_ids"]) == 1  # noqa: E731
    lines = {n: "".join(", ".join(w.strip() for w in line.split(",") if one(w)) + "\n"
                        for line in (folder / n).read_text(encoding="utf-8").splitlines())
             for n in ("agn.txt", "sst2.txt")}
    yahoo = {label: [w for w in words if one(w)]
             for label, words in json.loads((folder / "yahoo.json").read_text(encoding="utf-8")).items()}
    write_zip(root / local(zip_url), {"fuzzy_verbalizers/agn.txt": lines["agn.txt"].encode(),
                                      "fuzzy_verbalizers/sst2.txt": lines["sst2.txt"].encode(),
                                      "fuzzy_verbalizers/yahoo.json": json.dumps(yahoo, indent=1).encode()})


def build_mirror(root: Path, tokenizer_dir: Path, lines: list[str], tasks: Path,
                 shards: dict[str, int], verbalizers_url: str | None = None) -> Path:
    """Every download of the released route under ``root`` (see the module docstring); ``tokenizer_dir`` holds the
    checkpoints' vocab.json and merges.txt (roberta-large's: tests/data/roberta-large); returns ``root``."""
    import shutil
    import tempfile

    from npm.model import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:  # the tokenizer as the checkpoints' legacy layout loads it
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(tokenizer_dir / name, Path(tmp) / name)
        (Path(tmp) / "config.json").write_text(json.dumps({"model_type": "roberta"}), encoding="utf-8")
        tokenizer = load_tokenizer(tmp)
    for repo, seed in CHECKPOINTS.items():
        save_checkpoint(root / HUB / repo, tokenizer_dir, len(tokenizer), seed)
    build_corpora(root, tokenizer, lines, shards)
    build_task_files(root, tasks)
    if verbalizers_url:
        build_verbalizers(root, tasks, verbalizers_url, tokenizer)
    return root
