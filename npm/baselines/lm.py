"""Causal-LM open-set baselines, with or without BM25 passages (paper 6.2, Table 8; paper-map §6).

Clean-room re-implementation of the original ``clm_prompt.py`` as paper-map §6 describes it:

* prompts per task family (:func:`open_set_prompt`): question tasks (NQ, TriviaQA, KAMEL) become
  "Question: {question}\\nAnswer:"; LAMA-style cloze inputs become "{input, <mask> -> '_____'} Fill in the blank.
  Answer:"; entity translation keeps the text before "<mask>", stripped;
* retrieval (:func:`retrieve_passages`, :func:`prepend_passages`): the BM25 top-k blocks (k=3 in the original code,
  "up to five" in the paper's section 6.2), "<s>"/"</s>" removed, each prepended followed by "\\n", so that the
  top-1 passage ends up right before the question;
* decoding (:func:`greedy_generate`; its loop :func:`decode_greedy` is REPLUG's too): greedy (HF ``generate``
  defaults), at most 30 new tokens, the continuation cut at its first "\\n" and stripped; prompts longer than
  1024 - 30 tokens are cut from the left.

Not reproduced: the original's fp16 + weight-only int8 quantisation of every ``nn.Linear`` except ``lm_head``
(paper-map §6); models are loaded in float32 and ``npm.baselines.decoder.DecoderScorer`` runs them under the autocast
of ``inference.lm_precision`` (fp32 = none; bf16 / fp16 as ``npm.model.autocast``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

# torch and transformers are imported inside the functions that run a model: the prompt helpers of this module serve
# torch-free paths too (npm.densephrases.questions for the DensePhrases data and evaluation commands).
from npm.io import resolve_package_path
from npm.model import model_path
from npm.settings import Settings
from npm.tasks.registry import load_registry
from npm.tasks.templates import MASK_PLACEHOLDER as MASK

CLOZE_BLANK = "_____"
MAX_NEW_TOKENS = 30  # paper-map §6: HF generate with max 30 new tokens
MAX_LENGTH = 1024  # paper-map §6: --max_sequence_length 1024; prompts cut from the left to 1024 - 30 tokens
QUESTION_SPLIT = "The answer is: <mask>"  # NQ / TriviaQA inputs (npm.tasks.templates.qa_input)
KAMEL_SPLIT = "Answer: <mask>"  # KAMEL inputs (npm.tasks.templates.kamel_input)

FAMILIES = ("question", "cloze", "translation")
# Short names of a family that some callers pass instead of a task; a task of config/tasks.yaml has its own family
# (``Task.prompt_family``: its is_question and template).
FAMILY_ALIASES = {"lama": "cloze", "trex": "cloze", "googlere": "cloze", "templama": "cloze",
                  "translation": "translation"}


# ------------------------------------------------------------------------------------------------ prompts

@functools.cache
def _registry_families() -> dict[str, str]:
    """``{task: prompt family}`` of the open-set tasks of config/tasks.yaml (read once)."""
    return {name: t.prompt_family for name, t in load_registry().items() if not t.closed}


def task_family(task: str) -> str:
    """The prompt family of a task name (config/tasks.yaml) or family name ("question", "cloze", "translation")."""
    if task in FAMILIES:
        return task
    if task in _registry_families():
        return _registry_families()[task]
    key = task.lower()
    if key in FAMILY_ALIASES:
        return FAMILY_ALIASES[key]
    for prefix, family in (("lama", "cloze"), ("templama", "cloze"), ("translation", "translation")):
        if key.startswith(prefix):  # e.g. "lama_trex", "translation_ko"
            return family
    raise ValueError(f"unknown task or family {task!r}; families: {FAMILIES}, open-set tasks: "
                     f"{sorted(_registry_families())}")


def clean_passage(text: str) -> str:
    """A retrieved block's text with "<s>" and "</s>" removed (paper-map §6, ``--ret bm25``)."""
    return text.replace("<s>", "").replace("</s>", "")


def prepend_passages(prompt: str, passages: Sequence[str] | None) -> str:
    """Prepend ``passages`` (best first, as retrieved) to ``prompt``, each followed by "\\n".

    The original prepends passage after passage in retrieval order, so the *last* prepended, i.e. the top-1
    passage, sits right before the question (paper-map §6): the result is "p_k\\n...p_2\\np_1\\n{prompt}".
    """
    out = prompt
    for passage in passages or ():
        out = clean_passage(passage) + "\n" + out
    return out


def question_text(text: str, *, kamel_prompt: str = Settings.kamel_prompt) -> str:
    """The question of a question-family input (NQ, TriviaQA: before "The answer is: <mask>"; KAMEL: before
    "Answer: <mask>", unless ``kamel_prompt="code"``, the original's split), stripped."""
    if kamel_prompt not in ("question", "code"):
        raise ValueError(f"kamel_prompt must be 'question' or 'code', got {kamel_prompt!r}")
    question = text.split(QUESTION_SPLIT)[0]
    if kamel_prompt == "question" and QUESTION_SPLIT not in text:
        question = question.split(KAMEL_SPLIT)[0]
    return question.strip()


def open_set_prompt(task: str, text: str, passages: Sequence[str] | None = None, *,
                    kamel_prompt: str = Settings.kamel_prompt) -> str:
    """The causal-LM prompt of one open-set input (paper-map §6), optionally with passages prepended.

    ``task`` is a family ("question", "cloze", "translation") or a task name (:func:`task_family`); ``text``
    is the NPM-style input with its "<mask>" (npm.tasks.templates); ``passages`` are retrieved texts, best first.

    * question (NQ, TriviaQA, KAMEL): "Question: {text before 'The answer is: <mask>', stripped}\\nAnswer:".
      KAMEL inputs end in "Answer: <mask>." instead, which the original never split off (its prompt keeps
      "Answer: <mask>." inside the question). ``kamel_prompt="question"`` (config ``inference.kamel_prompt``) cuts
      the KAMEL input at "Answer: <mask>" ("Question: {question}\\nAnswer:"); ``"code"`` splits only at
      "The answer is: <mask>", exactly as the original did (the paper routes, whose published cells it made).
    * cloze (LAMA, TempLAMA): "{text with every <mask> -> '_____'} Fill in the blank. Answer:".
    * translation: the text before the first "<mask>", stripped ("The Korean translation of X is:").
    """
    family = task_family(task)
    if family == "question":
        prompt = f"Question: {question_text(text, kamel_prompt=kamel_prompt)}\nAnswer:"
    elif family == "cloze":
        prompt = f"{text.replace(MASK, CLOZE_BLANK)} Fill in the blank. Answer:"
    else:
        prompt = text.split(MASK)[0].strip()
    return prepend_passages(prompt, passages)


def retrieve_passages(searcher, block_text_fn: Callable[[int], str], query: str,
                      k: int) -> tuple[list[str], np.ndarray]:
    """The top-``k`` passages of ``query`` (best first) and their retrieval scores.

    ``searcher`` has ``search(query, k) -> (block ids, scores)`` (npm.datastore.bm25.Bm25Searcher); the query
    string should be ``npm.datastore.bm25.bm25_query(text, is_question)`` as for NPM (paper-map §3.8);
    ``block_text_fn(block id) -> text`` reads a block's surface text (``Predictor.block_text`` or
    ``npm.data.blocks.block_text`` over ``load_blocks(path, text=True)``). Texts get "<s>"/"</s>" removed.
    """
    ids, scores = searcher.search(query, k)
    texts = [clean_passage(block_text_fn(int(b))) for b in np.asarray(ids).tolist()]
    return texts, np.asarray(scores, dtype=np.float64)


# ------------------------------------------------------------------------------------------------ model

def resolve_causal_lm(name: str) -> tuple[str, str | None]:
    """``(folder, gguf file or None)`` for a model name.

    Names: a local ``save_pretrained`` folder; ``pypi:PACKAGE/SUBDIR`` (npm.io.resolve_package_path); or
    ``pypi:PACKAGE/FILE.gguf`` / a path to a ``.gguf`` file, loaded through transformers' GGUF support.
    """
    if name.endswith(".gguf"):
        path = Path(resolve_package_path(name))
        if not path.is_file():
            raise FileNotFoundError(f"model {name!r}: no GGUF file at {path}")
        return str(path.parent), path.name
    return model_path(name), None  # a local folder is checked against its checksum record


def load_causal_lm(name: str, dtype=None):
    """Load ``(model, tokenizer)`` of a causal LM in eval mode (float32 unless ``dtype``); see
    :func:`resolve_causal_lm` for the names. A tokenizer without a pad token gets its EOS token as pad."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf = resolve_causal_lm(name)
    kwargs = {"gguf_file": gguf} if gguf else {"local_files_only": Path(folder).is_dir()}
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32, **kwargs)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def special_prefix(tokenizer) -> list[int]:
    """The special ids the tokenizer puts *before* a text (e.g. OPT's "</s>", RoBERTa's "<s>"; none for SmolLM2).

    Prompts are encoded without special tokens and get only this prefix, never a trailing "</s>"/"[SEP]" that
    would sit between the prompt and its continuation.
    """
    probe = "a"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return list(full[:start])
    return []


def encode_prompt(tokenizer, text: str, max_tokens: int) -> list[int]:
    """Token ids of ``text`` (special prefix + plain encoding), cut from the LEFT to at most ``max_tokens`` ids
    (paper-map §6: inputs longer than 1024 - 30 tokens lose their beginning); the special prefix is kept."""
    prefix = special_prefix(tokenizer)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    room = max_tokens - len(prefix)
    if room < 1:
        raise ValueError(f"max_tokens={max_tokens} leaves no room for the prompt after the prefix {prefix}")
    return prefix + list(ids[-room:])


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int):
    """Left-padded ``(input_ids, attention_mask, position_ids)`` LongTensors of a batch of id lists."""
    import torch

    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if len(seq):
            ids[i, width - len(seq):] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[i, width - len(seq):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def first_line(text: str, skip_blank_lines: bool = Settings.skip_blank_lines) -> str:
    """The answer of a generated continuation: up to its first "\\n", stripped (paper-map §6).

    ``skip_blank_lines`` first drops leading whitespace and newlines: the first *non-empty* line. Instruction-tuned
    LMs such as the embedded default's SmolLM2-135M-Instruct often answer "Answer:" with a newline first, which the
    original rule (written for base LMs) turns into an empty answer every time."""
    if skip_blank_lines:
        text = text.lstrip()
    return text.split("\n", 1)[0].strip()


def line_complete(text: str, skip_blank_lines: bool = Settings.skip_blank_lines) -> bool:
    """Whether a growing continuation already holds its answer line (greedy decoding stops there)."""
    return "\n" in (text.lstrip() if skip_blank_lines else text)


def accept_token(token: int, continuation: list[int], tokenizer, eos: set[int],
                 skip_blank_lines: bool = Settings.skip_blank_lines) -> bool:
    """Append a greedy ``token`` to a row's ``continuation``; True when the row is done: EOS (not appended) or a
    complete answer line (:func:`line_complete`)."""
    if token in eos:
        return True
    continuation.append(token)
    return line_complete(tokenizer.decode(continuation, skip_special_tokens=True), skip_blank_lines)


def decoding_setup(model, tokenizer, max_new_tokens: int, batch_size: int) -> tuple[int, set[int], object]:
    """(pad id, EOS ids, device) of a greedy decoding loop, after checking its arguments (clear errors)."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an EOS token")
    return pad, eos_ids(model, tokenizer), model_device(model)


def eos_ids(model, tokenizer) -> set[int]:
    """Token ids that end generation: the generation config's, the model config's and the tokenizer's EOS."""
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else list(eos))
    return ids


def model_device(model):
    """The device of a model's first parameter (CPU for a parameter-less module)."""
    import torch

    param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return param.device if param is not None else torch.device("cpu")


def target_logprobs(model, prefixes: Sequence[Sequence[int]], target: Sequence[int], pad_id: int,
                    batch_size: int = Settings.batch_size) -> np.ndarray:
    """float64 [len(prefixes), len(target)]: log p(target_j | prefix + target[:j]) for each prefix, teacher-forced.

    The rows prefix + target are left-padded into batches (positions count from each row's first real token, so a
    padded row scores as it would alone); only the last len(target) + 1 positions' logits are computed."""
    import torch

    target = [int(t) for t in target]
    if not target:
        raise ValueError("empty target: nothing to score")
    if any(len(p) == 0 for p in prefixes):
        raise ValueError("every row needs a prefix of at least one token (the begin-of-text token)")
    n_t = len(target)
    device = model_device(model)
    out = np.zeros((len(prefixes), n_t), dtype=np.float64)
    want = torch.tensor(target, device=device)
    for a in range(0, len(prefixes), batch_size):
        rows = [list(map(int, p)) + target for p in prefixes[a:a + batch_size]]
        ids, mask, positions = (t.to(device) for t in left_pad(rows, pad_id))
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                           logits_to_keep=n_t + 1).logits[:, -(n_t + 1):-1, :]
            logp = torch.log_softmax(logits.double(), dim=-1)
            out[a:a + len(rows)] = logp.gather(-1, want.expand(len(rows), n_t)[..., None])[..., 0].cpu().numpy()
    return out


def forward_last(model, **inputs):
    """One forward pass that keeps only the last position's logits when the model supports it.

    HF causal LMs take ``logits_to_keep=1``; without it a prefill of B prompts of L tokens materialises a
    [B, L, V] float tensor (8 x 1000 x 49,152 floats = 1.5 GB for SmolLM2) of which decoding reads one row.
    """
    try:
        accepts = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        accepts = False
    if accepts:
        inputs["logits_to_keep"] = 1
    return model(**inputs)


def decode_greedy(model, tokenizer, groups: Sequence[Sequence[Sequence[int]]],
                  choose: Callable[[int, object], int] | None = None, max_new_tokens: int = MAX_NEW_TOKENS,
                  batch_size: int = Settings.batch_size,
                  skip_blank_lines: bool = Settings.skip_blank_lines) -> list[str]:
    """The one greedy KV-cache decoding loop of the decoder baselines and REPLUG: the raw continuation (decoded,
    special tokens skipped, *not* cut or stripped) of each group of encoded prompt rows.

    ``batch_size`` groups at a time (sorted by their longest row, so that a batch pads little; results come back in
    input order) are left-padded into one batch and decoded with the KV cache on the model's device. At each step
    every row of group g gets the same token: ``choose(g, logits [rows of g, V])`` (REPLUG's mixture,
    ``npm.baselines.replug``), or without ``choose`` the argmax of the group's one row (plain greedy decoding). A
    group stops at an EOS token, once its continuation holds an answer line (:func:`line_complete`; the token that
    brought the "\\n" is kept) or after ``max_new_tokens`` tokens; the loop ends when every group of the batch has.

    This is HF ``generate``'s greedy decoding, with the early stop at "\\n" only saving time (the answer is cut there
    anyway, paper-map §6). It is our own loop rather than ``generate(stop_strings=...)`` because REPLUG mixes the
    next-token distributions of several rows into one token for all of them (``generate`` decodes rows
    independently), the ``skip_blank_lines`` stop ("\\n" after non-blank text) is not a stop string, and ``generate``
    would also apply the checkpoint's ``generation_config`` (sampling, repetition penalty) where greedy is meant.
    """
    import torch

    pad, eos, device = decoding_setup(model, tokenizer, max_new_tokens, batch_size)
    if choose is None and any(len(g) != 1 for g in groups):
        raise ValueError("plain greedy decoding takes one row per group; give `choose` to decode several rows as one")
    order = sorted(range(len(groups)), key=lambda g: max(len(r) for r in groups[g]))
    out: list[str] = [""] * len(groups)
    for start in range(0, len(order), batch_size):
        members = order[start:start + batch_size]
        rows, spans = [], []
        for g in members:
            spans.append((len(rows), len(rows) + len(groups[g])))
            rows.extend(groups[g])
        ids, mask, positions = (t.to(device) for t in left_pad(rows, pad))
        new = [[] for _ in members]
        done = [False] * len(members)
        past = None
        with torch.no_grad():
            for _ in range(max_new_tokens):
                res = forward_last(model, input_ids=ids, attention_mask=mask, position_ids=positions,
                                   past_key_values=past, use_cache=True)
                past = res.past_key_values
                last = res.logits[:, -1, :]
                if choose is None:
                    tokens = last.argmax(-1).tolist()
                else:
                    tokens = [choose(g, last[a:e]) for g, (a, e) in zip(members, spans, strict=True)]
                for j, token in enumerate(tokens):
                    if not done[j]:
                        done[j] = accept_token(token, new[j], tokenizer, eos, skip_blank_lines)
                if all(done):
                    break
                ids = torch.tensor([t for t, (a, e) in zip(tokens, spans, strict=True) for _ in range(e - a)],
                                   dtype=torch.long, device=device)[:, None]
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                positions = positions[:, -1:] + 1
        for g, t in zip(members, new, strict=True):
            out[g] = tokenizer.decode(t, skip_special_tokens=True)
    return out


def greedy_continuations(model, tokenizer, prompts: Sequence[str], max_new_tokens: int = MAX_NEW_TOKENS,
                         max_length: int = MAX_LENGTH, batch_size: int = Settings.batch_size,
                         skip_blank_lines: bool = Settings.skip_blank_lines) -> list[str]:
    """Raw greedy continuations of ``prompts`` (decoded, special tokens skipped, *not* cut or stripped).

    Prompts are encoded by :func:`encode_prompt` (left truncation to ``max_length - max_new_tokens`` tokens) and
    decoded by :func:`decode_greedy`, one row each: a row stops at an EOS token, once its continuation contains a
    "\\n" (with ``skip_blank_lines`` leading newlines do not count, :func:`first_line`) or after ``max_new_tokens``.
    """
    encoded = [[encode_prompt(tokenizer, p, max_length - max_new_tokens)] for p in prompts]
    return decode_greedy(model, tokenizer, encoded, max_new_tokens=max_new_tokens, batch_size=batch_size,
                         skip_blank_lines=skip_blank_lines)


def greedy_generate(model, tokenizer, prompts: Sequence[str], max_new_tokens: int = MAX_NEW_TOKENS,
                    max_length: int = MAX_LENGTH, batch_size: int = Settings.batch_size,
                    skip_blank_lines: bool = Settings.skip_blank_lines) -> list[str]:
    """Greedy answers of ``prompts``: :func:`greedy_continuations` cut at the first "\\n" and stripped
    (paper-map §6)."""
    return [first_line(t, skip_blank_lines) for t in greedy_continuations(
        model, tokenizer, prompts, max_new_tokens, max_length, batch_size, skip_blank_lines)]
