"""Causal-LM baselines (npm.baselines; paper-map §6, §R2.2): prompts, greedy decoding, REPLUG, PMI.

A tiny randomly initialised Llama with the tiny byte-level BPE of conftest (RoBERTa layout: "<s>" prefix, "</s>"
suffix), saved and loaded like a real checkpoint, stands in for the LM; a scripted fake LM makes stopping and
truncation observable. The real SmolLM2 GGUF is converted by the workflow's rule convert_smollm2 in the .test run
(tests/test_workflow.py checks its model).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from npm.baselines.lm import (
    encode_prompt,
    first_line,
    greedy_continuations,
    greedy_generate,
    load_causal_lm,
    open_set_prompt,
    prepend_passages,
    retrieve_passages,
    special_prefix,
    task_family,
)
from npm.baselines.pmi import causal_prompt, label_logprobs, plain_scores, pmi_scores, predict
from npm.baselines.replug import mix_next_token, mixture_weights, replug_continuations, replug_generate
from npm.tasks.registry import resolve_task
from tests.conftest import REFERENCE_EXAMPLES, lee_corpus_lines, train_tiny_bpe

PROMPTS = ["Question: Who won the election in Australia?\nAnswer:", "The prime minister said",
           "Fire crews were still fighting the blaze on"]


def save_tiny_llama(path, seed: int = 0) -> str:
    """A randomly initialised 2-layer Llama (hidden 32) with the tiny byte-level BPE, saved with
    ``save_pretrained`` at ``path`` like a real checkpoint; returns the path."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    train_tiny_bpe(path, lee_corpus_lines() + REFERENCE_EXAMPLES * 20, vocab_size=1000)
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return load_causal_lm(save_tiny_llama(tmp_path_factory.mktemp("tiny_llama")))


def manual_greedy(model, tok, prompt: str, steps: int = 30) -> str:
    """Reference decoding: full recomputation, no cache, no padding, argmax each step."""
    ids = encode_prompt(tok, prompt, 1024 - steps)
    new = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
            if nxt == tok.eos_token_id:
                break
            new.append(nxt)
            if "\n" in tok.decode(new, skip_special_tokens=True):
                break
    return first_line(tok.decode(new, skip_special_tokens=True))


class ScriptedLM(torch.nn.Module):
    """Fake causal LM: the next token is ``script[last token]`` (``default`` otherwise); records what it saw."""

    def __init__(self, vocab: int, script: dict[int, int], default: int):
        super().__init__()
        self.vocab, self.script, self.default = vocab, script, default
        self.config = SimpleNamespace(eos_token_id=None)
        self.calls = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True):
        self.calls.append(input_ids.clone())
        seen = input_ids if past_key_values is None else torch.cat([past_key_values, input_ids], dim=1)
        logits = torch.zeros(*input_ids.shape, self.vocab)
        for i in range(input_ids.shape[0]):
            for t in range(input_ids.shape[1]):
                logits[i, t, self.script.get(int(input_ids[i, t]), self.default)] = 10.0
        return SimpleNamespace(logits=logits, past_key_values=seen)


def one_token(tok, text: str) -> int:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


# ------------------------------------------------------------------------------------------------ prompts

def test_question_prompts_nq_and_kamel():
    nq = "Who wrote Hamlet? The answer is: <mask>."
    assert open_set_prompt("nq", nq) == "Question: Who wrote Hamlet?\nAnswer:"
    assert open_set_prompt("triviaqa", nq) == open_set_prompt("question", nq)
    kamel = "What is the capital of France? Answer: <mask>."
    assert open_set_prompt("kamel", kamel) == "Question: What is the capital of France?\nAnswer:"
    # the original's latent bug: KAMEL is split at "The answer is: <mask>" only, which it does not contain
    assert (open_set_prompt("kamel", kamel, kamel_prompt="code")
            == "Question: What is the capital of France? Answer: <mask>.\nAnswer:")
    assert open_set_prompt("nq", nq, kamel_prompt="code") == "Question: Who wrote Hamlet?\nAnswer:"


def test_cloze_and_translation_prompts():
    assert (open_set_prompt("lama", "Dante was born in <mask>.")
            == "Dante was born in _____. Fill in the blank. Answer:")
    assert open_set_prompt("lama_trex", "<mask> is the capital of <mask>.") == (
        "_____ is the capital of _____. Fill in the blank. Answer:")
    assert (open_set_prompt("translation", "The Korean translation of Seoul is: <mask>.")
            == "The Korean translation of Seoul is:")
    assert task_family("templama") == "cloze" and task_family("translation_ko") == "translation"
    with pytest.raises(ValueError):
        task_family("sst2")


def test_passages_prepended_top1_last():
    passages = ["<s>first best</s>", "second", "third"]
    expected = "third\nsecond\nfirst best\nQuestion: Who?\nAnswer:"
    assert open_set_prompt("nq", "Who? The answer is: <mask>.", passages) == expected
    assert prepend_passages("P", None) == "P" and prepend_passages("P", []) == "P"


def test_retrieve_passages_reads_blocks_best_first():
    class Searcher:
        def search(self, query, k):
            assert query == "Who wrote Hamlet?" and k == 2
            return np.array([7, 3]), np.array([12.5, 9.0], dtype=np.float32)

    texts, scores = retrieve_passages(Searcher(), {7: "<s>seven</s>", 3: "three"}.__getitem__, "Who wrote Hamlet?", 2)
    assert texts == ["seven", "three"] and scores.tolist() == [12.5, 9.0]


# ------------------------------------------------------------------------------------------------ decoding

def test_special_prefix_and_left_truncation(bpe_tokenizer):
    tok = bpe_tokenizer
    assert special_prefix(tok) == [tok.bos_token_id]  # "<s>" kept before the text, "</s>" never appended
    text = " ".join(f"word{i}" for i in range(60))
    plain = tok(text, add_special_tokens=False)["input_ids"]
    ids = encode_prompt(tok, text, 20)
    assert len(ids) == 20 and ids[0] == tok.bos_token_id and ids[1:] == plain[-19:]  # the END is kept


def test_greedy_stops_at_newline_and_truncates_left(bpe_tokenizer):
    tok = bpe_tokenizer
    a, b, nl, c = one_token(tok, " police"), one_token(tok, " said"), one_token(tok, "\n"), one_token(tok, " cat")
    long_prompt = " ".join(["the"] * 100) + " of"
    last = tok(long_prompt, add_special_tokens=False)["input_ids"][-1]
    model = ScriptedLM(len(tok), {last: a, a: b, b: nl, nl: c}, default=c)
    out = greedy_generate(model, tok, [long_prompt], max_new_tokens=10, max_length=40)
    assert out == ["police said"]
    assert len(model.calls) == 3  # stopped at the newline, not after 10 tokens
    first = model.calls[0][0].tolist()
    assert len(first) == 30 and first[0] == tok.bos_token_id  # 40 - 10 tokens, prefix kept, beginning cut
    assert first[1:] == tok(long_prompt, add_special_tokens=False)["input_ids"][-29:]


def test_greedy_generate_equals_manual_argmax_loop(tiny_lm):
    model, tok = tiny_lm
    batched = greedy_generate(model, tok, PROMPTS, max_new_tokens=12, batch_size=2)  # left padding + KV cache
    assert batched == [manual_greedy(model, tok, p, steps=12) for p in PROMPTS]
    assert all("\n" not in s and s == s.strip() for s in batched)


# ------------------------------------------------------------------------------------------------ REPLUG

def test_mix_next_token_is_weighted_sum_of_softmaxes():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 11, generator=g) * 4
    w = mixture_weights([2.0, 0.5, -1.0], temperature=0.5)
    assert torch.allclose(w, torch.softmax(torch.tensor([4.0, 1.0, -2.0], dtype=torch.float64), 0))
    expected = sum(w[i] * torch.softmax(logits[i].double(), -1) for i in range(3))
    mixed = mix_next_token(logits, w)
    assert torch.allclose(mixed, expected, atol=1e-12) and abs(float(mixed.sum()) - 1) < 1e-12
    assert torch.allclose(mixture_weights([5.0, 1.0], weighting="uniform"), torch.tensor([0.5, 0.5]).double())
    with pytest.raises(ValueError):
        mix_next_token(logits, w[:2])


def test_replug_single_passage_equals_greedy_on_concatenation(tiny_lm):
    model, tok = tiny_lm
    passage, prompt = "The bushfires burned near Sydney on Christmas Day.", PROMPTS[0]
    expected = greedy_generate(model, tok, [passage + "\n" + prompt], max_new_tokens=10)[0]
    assert replug_generate(model, tok, prompt, [passage], [3.0], max_new_tokens=10) == expected


def test_replug_follows_the_dominant_passage(tiny_lm):
    model, tok = tiny_lm
    p1, p2, prompt = "Police said the man was arrested.", "The company reported a profit.", PROMPTS[1]
    only1 = replug_generate(model, tok, prompt, [p1], [0.0], max_new_tokens=10)
    only2 = replug_generate(model, tok, prompt, [p2], [0.0], max_new_tokens=10)
    assert replug_generate(model, tok, prompt, [p1, p2], [60.0, 0.0], max_new_tokens=10) == only1
    assert replug_generate(model, tok, prompt, [p1, p2], [0.0, 60.0], max_new_tokens=10) == only2


# ------------------------------------------------------------------------------------------------ one decoding loop

RECORDED = Path(__file__).parent / "data" / "decoding_loops.json"
REPLUG_PASSAGES = [["The bushfires burned near Sydney on Christmas Day.", "Police said the man was arrested."], [],
                   ["The company reported a profit.", "Fire crews were still fighting the blaze.",
                    "Australia won the match."], ["Dante was born in Florence."]]
REPLUG_SCORES = [[3.0, 1.5], [], [2.0, 1.9, 0.5], [7.0]]
LOOP_PROMPTS = PROMPTS + ["Dante was born in _____. Fill in the blank. Answer:"]


def scripted_lm(tok) -> tuple[ScriptedLM, list[str]]:
    """A ScriptedLM whose four prompts end in " police said\\n" (a newline after text), "\\n police said\\n" (a blank
    line first), EOS at once, and " cat" until ``max_new_tokens``; returns (model, prompts)."""
    a, b, nl, c = one_token(tok, " police"), one_token(tok, " said"), one_token(tok, "\n"), one_token(tok, " cat")
    prompts = ["The fire started in the north of", "Question: Who was arrested?\nAnswer:",
               "The prime minister said that", "Crews were fighting the blaze on"]
    last = [tok(p, add_special_tokens=False)["input_ids"][-1] for p in prompts]
    assert len({*last, a, b, nl, c, tok.eos_token_id}) == 9
    script = {last[0]: a, last[1]: nl, last[2]: tok.eos_token_id, a: b, b: nl, nl: a}
    return ScriptedLM(len(tok), script, default=c), prompts


def decode_both_loops(model, tok, prompts: list[str], max_new_tokens: int) -> list[dict]:
    """The raw continuations (and, for a ScriptedLM, the number of forward passes) of plain greedy decoding and of
    REPLUG (REPLUG_PASSAGES / REPLUG_SCORES, one prompt without passages) at batch sizes 1 and 3, with and without
    ``skip_blank_lines``."""
    cases = []
    for skip in (False, True):
        for bs in (1, 3):
            for loop in ("greedy", "replug"):
                calls = len(getattr(model, "calls", []))
                if loop == "greedy":
                    raws = greedy_continuations(model, tok, prompts, max_new_tokens=max_new_tokens, batch_size=bs,
                                                skip_blank_lines=skip)
                else:
                    raws = replug_continuations(model, tok, prompts, REPLUG_PASSAGES, REPLUG_SCORES, temperature=0.5,
                                                max_new_tokens=max_new_tokens, batch_size=bs, skip_blank_lines=skip)
                case = {"loop": loop, "batch_size": bs, "skip_blank_lines": skip, "raws": raws}
                if hasattr(model, "calls"):
                    case["forward_passes"] = len(model.calls) - calls
                cases.append(case)
    return cases


def test_one_decoding_loop_reproduces_the_two_old_loops(tiny_lm, bpe_tokenizer):
    """greedy_continuations and replug_continuations give the raw continuations that their two separate KV-cache
    loops gave before they became one (recorded in tests/data/decoding_loops.json from the code of d79cf85): the
    tiny Llama's continuations at every batch size, and a ScriptedLM's stops (newline after text, a blank line first
    with and without skip_blank_lines, EOS, max_new_tokens) with the same number of forward passes."""
    recorded = json.loads(RECORDED.read_text())
    model, tok = tiny_lm
    assert decode_both_loops(model, tok, LOOP_PROMPTS, max_new_tokens=12) == recorded["tiny_llama"]
    scripted, prompts = scripted_lm(bpe_tokenizer)
    assert decode_both_loops(scripted, bpe_tokenizer, prompts, max_new_tokens=6) == recorded["scripted"]


# ------------------------------------------------------------------------------------------------ PMI

def manual_logprob(model, tok, prompt: str, word: str) -> float:
    p = [tok.bos_token_id] + tok(prompt, add_special_tokens=False)["input_ids"]
    w = tok(word, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        log_p = torch.log_softmax(model(input_ids=torch.tensor([p + w])).logits[0].double(), -1)
    return sum(float(log_p[len(p) - 1 + j, t]) for j, t in enumerate(w))


def test_label_logprobs_and_pmi_match_manual_computation(tiny_lm):
    model, tok = tiny_lm
    prompts = ["A wonderful, moving film. It was", "Dull. It was"]
    words = [" great", " terrible", " absolutely unbearable"]  # the last has several tokens
    lp = label_logprobs(model, tok, prompts, words, batch_rows=4)  # right padding across different lengths
    manual = np.array([[manual_logprob(model, tok, p, w) for w in words] for p in prompts])
    assert lp.shape == (2, 3) and np.allclose(lp, manual, atol=1e-5)
    assert np.allclose(plain_scores(model, tok, prompts, words), manual, atol=1e-5)
    domain = np.array([manual_logprob(model, tok, resolve_task("sst2").pmi_premise, w) for w in words])
    pmi = pmi_scores(model, tok, prompts, words, resolve_task("sst2").pmi_premise)
    assert np.allclose(pmi, manual - domain[None, :], atol=1e-5)
    assert predict(pmi).tolist() == (manual - domain).argmax(1).tolist()
    # Single-token label words take the one-pass path: the same numbers.
    single = [w for w in (tok.decode([i]) for i in range(50, 400))
              if len(tok(w, add_special_tokens=False)["input_ids"]) == 1][:3]
    assert len(single) == 3
    one_pass = label_logprobs(model, tok, prompts, single, batch_rows=4)
    assert np.allclose(one_pass, [[manual_logprob(model, tok, p, w) for w in single] for p in prompts], atol=1e-5)


def test_causal_prompt_from_closed_set_input():
    assert causal_prompt("Great fun. It was<mask>.") == "Great fun. It was"
    assert causal_prompt("Title \n text The text topic is about <mask>.") == "Title \n text The text topic is about"
    with pytest.raises(ValueError):
        causal_prompt("It rains, right?<mask>, it is wet.")


def test_first_nonblank_line_switch():
    from npm.baselines.lm import first_line, line_complete

    assert first_line("\n Paris\nmore") == ""  # paper-map §6: the first line, even when empty
    assert first_line("\n Paris\nmore", skip_blank_lines=True) == "Paris"
    assert line_complete("\n") and not line_complete("\n", skip_blank_lines=True)
    assert line_complete("\n Paris\n", skip_blank_lines=True)
