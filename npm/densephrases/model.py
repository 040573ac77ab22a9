"""The DensePhrases model (Lee et al. 2021, section 3.2 and appendix E; docs/paper-map.md §D1.2).

Three copies of one pretrained encoder (the paper: SpanBERT-base-cased; the embedded default: MiniLM), not shared:
the **phrase encoder** gives every passage token a vector h_i (the whole last-layer vector serves as start and end
representation: DensePhrases does not split it), and the **query-start** and **query-end encoders** give q_start and
q_end, their [CLS] (first-position) outputs. The **filter head** is a ``Linear(d, 2)`` over h_i: start- and end-filter
logits (appendix E), which the dump uses to drop tokens.

Saved as a folder: ``phrase/``, ``query_start/``, ``query_end/`` (each ``save_pretrained``, with the tokenizer in
``phrase/``), ``filter_head.pt`` and ``densephrases.json`` (what it was made from, and ``filter_trained``: whether a
training with the filter loss ever updated the head; an untrained head's logits are random). :meth:`DensePhrases.load`
reads it back; ``from_encoder`` starts the three copies from one checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from npm.fingerprint import file_fingerprint, model_fingerprint
from npm.model import encode, load_encoder, load_tokenizer

PARTS = ("phrase", "query_start", "query_end")


class DensePhrases(torch.nn.Module):
    def __init__(self, phrase, query_start, query_end, tokenizer, base: str):
        super().__init__()
        self.phrase, self.query_start, self.query_end = phrase, query_start, query_end
        self.filter_head = torch.nn.Linear(phrase.config.hidden_size, 2)
        self.tokenizer, self.base = tokenizer, base
        self.filter_trained = False  # set by a training with train.lambda_filter > 0

    @classmethod
    def from_encoder(cls, name: str) -> DensePhrases:
        """Three copies of the encoder ``name`` (a folder, hub id or pypi:PACKAGE/PATH) and a new filter head."""
        return cls(load_encoder(name), load_encoder(name), load_encoder(name), load_tokenizer(name), str(name))

    @property
    def hidden_size(self) -> int:
        return int(self.phrase.config.hidden_size)

    def phrase_vectors(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """h [B, m, d]: the phrase encoder's last layer over passage tokens."""
        return encode(self.phrase, ids, attention)

    def query_vectors(self, ids: torch.Tensor, attention: torch.Tensor,
                      encoders: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """q_start, q_end [B, d]: the [CLS] outputs of the two query encoders (``encoders``: another (start, end) pair
        in their place, e.g. a frozen copy)."""
        start, end = encoders or (self.query_start, self.query_end)
        return encode(start, ids, attention)[:, 0], encode(end, ids, attention)[:, 0]

    def filter_logits(self, h: torch.Tensor) -> torch.Tensor:
        """[B, m, 2]: start- and end-filter logits of every token vector."""
        return self.filter_head(h)

    def save(self, path: str | Path) -> None:
        """Write the model folder (call inside ``npm.io.atomic_dir`` for an atomic write)."""
        path = Path(path)
        for part in PARTS:
            getattr(self, part).save_pretrained(path / part)
        self.tokenizer.save_pretrained(path / "phrase")
        torch.save(self.filter_head.state_dict(), path / "filter_head.pt")
        meta = {"base": self.base, "parts": list(PARTS), "filter_trained": self.filter_trained}
        (path / "densephrases.json").write_text(json.dumps(meta, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DensePhrases:
        path = Path(path)
        meta = _meta(path)
        model = cls(*(load_encoder(str(path / p)) for p in PARTS), load_tokenizer(str(path / "phrase")),
                    meta["base"])
        model.filter_head.load_state_dict(torch.load(path / "filter_head.pt", weights_only=True))
        model.filter_trained = bool(meta.get("filter_trained", False))
        return model


def model_fingerprint_all(path: str | Path) -> str:
    """The fingerprint of a whole DensePhrases model folder: its three encoders and its filter head."""
    path = Path(path)
    _meta(path)  # a clear error if it is not a model folder
    return ":".join([*(model_fingerprint(str(path / p)) for p in PARTS), file_fingerprint(path / "filter_head.pt")])


def load_filter_head(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(weight [2, d], bias [2], filter_trained) of the filter head of the model folder ``path``, without loading
    its three encoders (what a filter over stored vectors needs)."""
    path = Path(path)
    trained = bool(_meta(path).get("filter_trained", False))
    state = torch.load(path / "filter_head.pt", weights_only=True)
    return state["weight"], state["bias"], trained


def require_trained_filter(trained: bool, model_dir) -> None:
    """Refuse a filter threshold over a filter head that no training with the filter loss updated."""
    if not trained:
        raise ValueError(f"{model_dir}: its filter head was never trained (a training with train.lambda_filter > 0 "
                         "trains it; the code: 1.0), so a filter threshold would drop tokens at random; filter "
                         "without a threshold or train with --lambda-filter")


def _meta(path: Path) -> dict:
    """The model folder's ``densephrases.json``."""
    if not (path / "densephrases.json").is_file():
        raise FileNotFoundError(f"{path} is not a DensePhrases model folder (no densephrases.json); train one "
                                "with `npm-repro densephrases train`")
    return json.loads((path / "densephrases.json").read_text())
