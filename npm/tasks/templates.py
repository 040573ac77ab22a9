"""Task templates, label words and fuzzy verbalizers (paper 4.1-4.2, Tables 5 and 7, A.2; paper-map §4.1-§4.2,
§5.1; §9 items 27-28).

Closed set (paper-map §4.2 table): ``CLOSED_SET_TEMPLATES[task](record)`` gives the text before the mask;
``closed_set_text`` passes it through ``closed_set_input``, which appends "<mask>." with no space
when the template has no mask (§9 item 27; RTE has its mask inside). A template is a format, shared by the tasks that
name it; a task's label words, in label-id order, are its config/tasks.yaml ``verbalizer.words``. Record fields
(names chosen here, the loaders must map their sources to them): agn ``title``/``description``; yahoo
``question_title``/``question_content``/``best_answer``; rte ``sentence1``/``sentence2`` (GLUE); subj, sst2, mr, rt,
cr ``text``; amazon ``title``/``content``.

Causal-LM form (the decoder rows of Table 1, ``lm`` and ``lm_pmi``): a left-to-right LM scores the label word as the
continuation of a prompt, so the label must come last. ``causal_text`` gives that prompt: the NPM text before its
mask for the templates that end with the mask, and for RTE, whose NPM template puts the hypothesis after the mask,
the prompt of Shi et al. (2022, kNN-Prompt; from Holtzman et al. 2021), where the paper's GPT-2 / GPT-3 rows come
from, with its label words ``CAUSAL_LABEL_WORDS["rte"]`` (" true", " false").

Open set (paper-map §5.1): LAMA, KAMEL, NQ/TriviaQA and entity-translation inputs (which tasks are questions is
their config/tasks.yaml ``is_question``).

Fuzzy verbalizers (paper-map §4.2 notes, §9 item 28): the .txt format (one line per label, words joined by ", ",
every list truncated to the shortest) and yahoo's .json (topic -> words, not truncated). Every word gets a leading
space and must encode to exactly one token.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

MASK_PLACEHOLDER = "<mask>"  # the mask of every template; a model's own mask token replaces it at encoding time
_PUNCTUATION = frozenset(string.punctuation)
_NO_SPACE_BEFORE = frozenset({"!", "?", ".", ",", "'", ";", ":", ")", "]"})
_NO_SPACE_AFTER = frozenset({"(", "["})


def detokenize(text: str) -> str:
    """Undo PTB-style tokenisation (paper-map §4.2 notes; sst2/mr/rt/cr/subj).

    "n 't" -> "n't"; then, token by token (whitespace split), in the original's order of rules: none before the first
    token; none after a "(" or "[" that itself got a space (so not after a first one, nor after one glued to the one
    before it); none before a token that is one of ! ? . , ' ; : ) ], starts with "'", or is "n't"; none after "www."
    (the text so far ends with it); none before "com" when the text ends in "."; else one space. Finally "!." -> "!",
    "?." -> "?".
    """
    out, glue_next = "", False
    for i, tok in enumerate(text.replace("n 't", "n't").split()):
        if i == 0:
            pass
        elif glue_next:
            glue_next = False
        elif not (tok in _NO_SPACE_BEFORE or tok.startswith("'") or tok == "n't" or out.endswith("www.")
                  or (tok == "com" and out.endswith("."))):
            out += " "
            glue_next = tok in _NO_SPACE_AFTER
        out += tok
    return out.replace("!.", "!").replace("?.", "?")


# ------------------------------------------------------------------------------------------------ closed set

def _rstrip_punctuation(s: str) -> str:
    s = s.strip()
    while s and s[-1] in _PUNCTUATION:
        s = s[:-1].rstrip()
    return s


def _agn(r: Mapping) -> str:
    return f"{r['title']} \n {r['description']} The text topic is about"


def _yahoo(r: Mapping) -> str:
    return (f"title: {r['question_title']} content: {r['question_content']} answer: {r['best_answer']}"
            " The text topic is about")


def _rte(r: Mapping) -> str:
    premise, hypothesis = _rstrip_punctuation(r["sentence1"]), _rstrip_punctuation(r["sentence2"])
    return f"{premise}, right?{MASK_PLACEHOLDER}, {hypothesis[:1].lower()}{hypothesis[1:]}."


def _subj(r: Mapping) -> str:
    return detokenize(r["text"]) + " This is a"


def _sentiment(r: Mapping) -> str:
    return detokenize(r["text"]) + " It was"


def _amazon(r: Mapping) -> str:
    """The original's load_amazon: "." after a title that does not end in punctuation (an empty one too), one space,
    the content; the whole input stripped, then the sentiment prompt."""
    title = r["title"] if r["title"][-1:] in _PUNCTUATION else r["title"] + "."
    return f"{title} {r['content']}".strip() + " It was"


CLOSED_SET_TEMPLATES: dict[str, Callable[[Mapping], str]] = {
    "agn": _agn, "yahoo": _yahoo, "rte": _rte, "subj": _subj,
    "sst2": _sentiment, "mr": _sentiment, "rt": _sentiment, "cr": _sentiment, "amazon": _amazon,
}

# HF yahoo_answers_topics topic names, in topic-id order (the assumed key order of yahoo.json).
YAHOO_TOPICS = ("Society & Culture", "Science & Mathematics", "Health", "Education & Reference",
                "Computers & Internet", "Sports", "Business & Finance", "Entertainment & Music",
                "Family & Relationships", "Politics & Government")


def closed_set_input(text: str) -> str:
    """Paper-map §9 item 27: a template without a mask gets "<mask>." appended with no space."""
    return text if MASK_PLACEHOLDER in text else text + MASK_PLACEHOLDER + "."


def closed_set_text(task: str, record: Mapping) -> str:
    """The model input of one closed-set example: the task's template, "<mask>." appended when it has none."""
    if task not in CLOSED_SET_TEMPLATES:
        raise ValueError(f"unknown closed-set task {task!r}; known: {sorted(CLOSED_SET_TEMPLATES)}")
    return closed_set_input(CLOSED_SET_TEMPLATES[task](record))


class _AnyField(dict):
    def __missing__(self, key):
        return "x"


def mask_at_end(template: str) -> bool:
    """Whether a closed-set template ends with its mask (only "." after it): a causal LM can then score the label
    words left to right. RTE's "{premise}, right?<mask>, {hypothesis}." cannot (it has ``CAUSAL_TEMPLATES``)."""
    after = closed_set_text(template, _AnyField()).partition(MASK_PLACEHOLDER)[2]
    return after.strip() in ("", ".")


def _rte_causal(r: Mapping) -> str:
    # Shi et al. (2022, kNN-Prompt) for RTE, as Holtzman et al. (2021): " {premise}\n question: {hypothesis} true or
    # false?\n answer:" + " true" / " false"; the leading space dropped, as every other prompt here starts bare.
    return f"{r['sentence1'].strip()}\n question: {r['sentence2'].strip()} true or false?\n answer:"


# Templates whose NPM form has text after the mask get a causal-LM form with the label word last (Shi et al. 2022).
CAUSAL_TEMPLATES: dict[str, Callable[[Mapping], str]] = {"rte": _rte_causal}
CAUSAL_LABEL_WORDS: dict[str, tuple[str, ...]] = {"rte": (" true", " false")}  # label-id order: entailment first


def has_causal_form(template: str) -> bool:
    """Whether a left-to-right LM can score this closed-set template: it ends with its mask, or has a causal form."""
    return template in CAUSAL_TEMPLATES or mask_at_end(template)


def causal_text(template: str, record: Mapping) -> str | None:
    """The causal-LM prompt of one closed-set record when ``template`` has its own causal form (RTE), else None: the
    decoders then score the NPM text before its mask (``npm.baselines.pmi.causal_prompt``)."""
    form = CAUSAL_TEMPLATES.get(template)
    return None if form is None else form(record)


def causal_label_words(template: str, label_words: Sequence[str]) -> tuple[str, ...]:
    """The label words a causal LM scores after ``causal_text`` (label-id order): the causal form's own, else the
    task's ``label_words``."""
    return CAUSAL_LABEL_WORDS.get(template, tuple(label_words))


# ------------------------------------------------------------------------------------------------ open set

# Entity translation (paper-map §5.1, Table 7): the 15 codes of the data and the language names of the template.
TRANSLATION_LANGUAGES = {
    "zh": "Chinese", "ar": "Arabic", "el": "Greek", "iw": "Hebrew", "ru": "Russian", "jp": "Japanese",
    "hi": "Hindi", "ko": "Korean", "pl": "Polish", "tr": "Turkish", "cs": "Czech", "ta": "Tamil", "th": "Thai",
    "mn": "Mongolian", "ml": "Malayalam",
}


def lama_input(template: str, subject: str) -> str:
    """HF LAMA template: [Y] -> "<mask>", " ." -> ".", then [X] -> subject, in the original code's order, so a " ."
    inside the subject ("Washington , D . C .") is kept as the data has it (paper-map §5.1)."""
    return template.replace("[Y]", MASK_PLACEHOLDER).replace(" .", ".").replace("[X]", subject)


def kamel_input(question: str, subject: str, answers: Sequence[str]) -> str:
    """"{question, [S] -> subject} Answer: <mask>."; the final "." is dropped if a gold ends in ".", "+" or "!"."""
    text = f"{question.replace('[S]', subject)} Answer: {MASK_PLACEHOLDER}."
    if any(a.endswith((".", "+", "!")) for a in answers):
        text = text[:-1]
    return text


def qa_input(question: str) -> str:
    """NQ / TriviaQA: stripped, wrapping double quotes removed, "?" appended if missing, " The answer is: <mask>."."""
    q = question.strip()
    if len(q) >= 2 and q[0] == '"' and q[-1] == '"':
        q = q[1:-1].strip()
    if not q.endswith("?"):
        q += "?"
    return f"{q} The answer is: {MASK_PLACEHOLDER}."


def translation_input(language: str, title: str) -> str:
    """"The {Language} translation of {English title} is: <mask>."; ``language`` is a name or a Table 7 code."""
    name = TRANSLATION_LANGUAGES.get(language, language)
    return f"The {name} translation of {title.strip()} is: {MASK_PLACEHOLDER}."


# ------------------------------------------------------------------------------------------------ verbalizers

def _one_token_ids(words: Iterable[str], tokenizer, label) -> list[int]:
    ids = []
    for word in words:
        pieces = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
        if len(pieces) != 1:
            raise ValueError(f"fuzzy verbalizer word {word!r} of label {label!r} encodes to {len(pieces)} tokens "
                             f"{pieces} with a leading space; every word must be exactly one token")
        ids.append(int(pieces[0]))
    return ids


def _split_words(line: str) -> list[str]:
    return [w.strip() for w in line.strip().split(", ") if w.strip()]


def fuzzy_txt_words(path_or_lines: str | Path | Iterable[str]) -> dict[int, list[str]]:
    """The words of each label (0, 1, ...) of a .txt fuzzy verbalizer: one line per label, in label order, words
    separated by ", " (not yet truncated). Trailing blank lines are ignored; a blank line between labels is an
    error."""
    if isinstance(path_or_lines, (str, Path)):
        lines = Path(path_or_lines).read_text(encoding="utf-8").splitlines()
    else:
        lines = [line.rstrip("\n") for line in path_or_lines]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError("empty fuzzy verbalizer: expected one line of words per label")
    per_label = {}
    for label, line in enumerate(lines):
        per_label[label] = _split_words(line)
        if not per_label[label]:
            raise ValueError(f"fuzzy verbalizer line {label} (label {label}) has no words")
    return per_label


def read_fuzzy_verbalizer_txt(path_or_lines: str | Path | Iterable[str], tokenizer) -> list[np.ndarray]:
    """The .txt fuzzy verbalizer (``fuzzy_txt_words``): one int64 array of token ids per label, in label order, all
    of the shortest list's length."""
    per_label = [_one_token_ids(words, tokenizer, label) for label, words in fuzzy_txt_words(path_or_lines).items()]
    shortest = min(len(ids) for ids in per_label)
    return [np.asarray(ids[:shortest], dtype=np.int64) for ids in per_label]


def fuzzy_json_words(path_or_mapping: str | Path | Mapping,
                     topics: Sequence[str] | None = None) -> dict[str, list[str]]:
    """The words of each topic of yahoo.json (topic name -> a list of words, or one ", "-joined string), in the order
    of ``topics`` (e.g. ``YAHOO_TOPICS``) when given, else the file's key order."""
    if isinstance(path_or_mapping, (str, Path)):
        mapping = json.loads(Path(path_or_mapping).read_text(encoding="utf-8"))
    else:
        mapping = path_or_mapping
    if not isinstance(mapping, Mapping):
        raise ValueError(f"fuzzy verbalizer must be a JSON object topic -> words, got {type(mapping).__name__}")
    order = list(mapping) if topics is None else list(topics)
    missing = [t for t in order if t not in mapping]
    if missing:
        raise ValueError(f"fuzzy verbalizer has no words for {missing}; its keys are {list(mapping)}")
    out = {}
    for topic in order:
        words = mapping[topic]
        out[topic] = _split_words(words) if isinstance(words, str) else [w.strip() for w in words if w.strip()]
        if not out[topic]:
            raise ValueError(f"fuzzy verbalizer topic {topic!r} has no words")
    return out


def read_fuzzy_verbalizer_json(path_or_mapping: str | Path | Mapping, tokenizer,
                               topics: Sequence[str] | None = None) -> list[np.ndarray]:
    """yahoo.json (``fuzzy_json_words``): one int64 array of token ids per topic; not truncated."""
    return [np.asarray(_one_token_ids(words, tokenizer, topic), dtype=np.int64)
            for topic, words in fuzzy_json_words(path_or_mapping, topics).items()]
