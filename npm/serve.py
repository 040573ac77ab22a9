"""``npm-repro serve``: a local web page that asks one question of NPM (BM25-restricted and FAISS), NPM-single,
DensePhrases and REPLUG side by side (paper 3.3 and 6.4; docs/paper-map.md §3.8, §6, §D1.5, §R2.2).

The page says first what its corpus holds, as NPM's datastore counts it (documents, blocks, tokens, a few titles of
data/docs/{corpus}.jsonl.gz): every system answers from those documents only. It has one text box and two settings
fields, NPM's temperature tau and the FAISS column's k (``npm.settings.PageSettings``: the README's examples' values,
checked by the server; the page runs no script). The question is written as NPM reads it, a sentence with one
``<mask>`` where the answer goes ("Bratislava is the capital of <mask>."); a question ending in "?" may put the mask
after it ("Who founded Tesla? <mask>"), which is read as the NQ template "... The answer is: <mask>."
(``npm.tasks.templates``). Each system answers with what the evaluation gives it:

* NPM and NPM-single: ``npm.Predictor.from_config`` (the workflow's model, datastore and indexes) at the page's tau
  and k, the top phrases with their scores and the blocks that support them;
* DensePhrases: ``npm.densephrases.searcher.PhraseSearcher`` over the corpus's phrase dump and index, the input asked
  as a question (``npm.densephrases.evaluate.task_question``), the top phrases with their passages;
* REPLUG: the evaluation's scorer (``npm.evaluation.systems``, ``npm.baselines.decoder.DecoderScorer``) on Table 8's
  NQ task, the question asked as DensePhrases asks it in the NQ template (its LM answers that prompt with a span; the
  cloze prompt gets "A:"): the BM25 top passages each prepended to the prompt, greedy decoding over the mixture; its
  score is the mean log-probability of the answer's tokens under that mixture (``npm.baselines.replug.mix_logprobs``).

Each column says what its score means, each evidence passage is shown with the answer's occurrences highlighted, each
column with the seconds its system took and the model, datastore and indexes it read. Everything is loaded once at
start-up, relative to the workflow's working directory (run it where ``snakemake`` runs), with progress in the
terminal; a system whose artefacts are missing shows, in its column, which file is missing and the ``snakemake``
target that builds it. The server binds 127.0.0.1 (this machine only) unless told otherwise, and answers one question
at a time.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from npm.baselines.lm import (
    MAX_LENGTH,
    clean_passage,
    decoding_setup,
    encode_prompt,
    open_set_prompt,
    prepend_passages,
    target_logprobs,
)
from npm.datastore.store import read_meta
from npm.densephrases.evaluate import task_question
from npm.evaluation.systems import Inputs, get
from npm.io import read_jsonl, read_yaml
from npm.model import locate_checkpoint
from npm.settings import PageSettings, Settings, check
from npm.tasks.registry import resolve_task
from npm.tasks.templates import qa_input

log = logging.getLogger("npm-repro.serve")

MASK = "<mask>"
QUESTION_SPLIT = "The answer is: <mask>"  # npm.baselines.lm.QUESTION_SPLIT: the NQ / TriviaQA template
MAX_CHARS = 1000  # longest question the page takes (a cloze sentence, not a document)
EXAMPLE = "Bratislava is the capital of <mask>."  # the README's question; also the start-up warm-up query
COLUMNS = ("npm", "npm_faiss", "npm_single", "densephrases", "replug")  # systems of npm.evaluation.systems shown
# REPLUG is asked every question as Table 8's NQ column asks it ("Question: ...\nAnswer:", templates.qa_input): the
# prompt with which its LM answers a span; its cloze prompt ("... _____. Fill in the blank. Answer:") gets "A:".
REPLUG_TASK = "nq"
SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"


@dataclass
class Column:
    """One system's column: ``answer(question, page settings) -> (answers, asked as)`` or, when its artefacts are
    missing, the ``missing`` message; ``provenance``: what it read (model, datastore, indexes); ``score``: what its
    score means, from what its code computes."""

    name: str
    label: str
    answer: Callable[[str, PageSettings], tuple[list[dict], str | None]] | None = None
    provenance: dict = field(default_factory=dict)
    missing: str | None = None
    score: str = ""


# ------------------------------------------------------------------------------------------------ questions

def check_question(text: str) -> str | None:
    """What is wrong with a question typed in the page, or None: empty, too long, not exactly one ``<mask>``."""
    if not text.strip():
        return f"Type a question first, with one {MASK} where the answer goes, e.g. {EXAMPLE!r}."
    if len(text) > MAX_CHARS:
        return (f"The question has {len(text):,} characters; the page takes at most {MAX_CHARS:,}. Shorten it to the "
                f"sentence around the {MASK}.")
    n = text.count(MASK)
    if n != 1:
        what = "no" if n == 0 else str(n)
        return (f"The question has {what} {MASK}; NPM predicts exactly one span, so write one {MASK} where the "
                f"answer goes, e.g. {EXAMPLE!r}.")
    return None


FORM = {"tau": ("open_set_tau", float, "The temperature tau"), "k": ("k", int, "k")}  # form field: setting, kind


def _allowed(name: str) -> str:
    """The range of page setting ``name`` in words (from ``PageSettings``, where it is defined)."""
    meta = {f.name: f.metadata for f in dataclasses.fields(PageSettings)}[name]
    low = f"above {meta['minimum']:g}" if meta["exclusive"] else f"from {meta['minimum']:,}"
    high = f"at most {meta['maximum']:g}" if meta["exclusive"] else f"to {meta['maximum']:,}"
    return f"{low} and {high}" if meta["exclusive"] else f"{low} {high}"


def page_settings(form: dict[str, str]) -> tuple[PageSettings, str | None]:
    """The page's settings from the form's ``tau`` and ``k`` (absent or blank: the default), and what is wrong with
    them or None; a bad value leaves every setting at its default."""
    values = {}
    for key, (name, kind, what) in FORM.items():
        text = form.get(key, "").strip()
        if not text:
            continue
        try:
            values[name] = kind(text)
            check(name, values[name], PageSettings)
        except ValueError:
            number = "a number" if kind is float else "a whole number"
            return PageSettings(), (f"{what} must be {number} {_allowed(name)} (default "
                                    f"{getattr(PageSettings(), name):g}); got {text[:40]!r}.")
    return PageSettings(**values), None


def task_input(text: str) -> tuple[str, str]:
    """(family, the input in the tasks' template) of a page question: "question" when a "?" comes before the mask
    (NPM's own rule for the BM25 query, ``npm.inference.predictor``), a bare trailing mask then read as the NQ
    template; "cloze" otherwise."""
    before = text.split(MASK)[0]
    if "?" not in before:
        return "cloze", text
    if QUESTION_SPLIT in text or "Answer: <mask>" in text:
        return "question", text
    return "question", f"{before[:before.rindex('?') + 1]} {QUESTION_SPLIT}."


def highlight(passage: str, span: str) -> str:
    """``passage`` as HTML with the occurrences of ``span`` in ``<mark>``: as whole words, else as whole words in any
    case, else anywhere; everything escaped."""
    span, found = span.strip(), []
    word = rf"(?<!\w){re.escape(span)}(?!\w)"
    for pattern, flags in ((word, 0), (word, re.IGNORECASE), (re.escape(span), 0)):
        found = [m.span() for m in re.finditer(pattern, passage, flags)] if span else []
        if found:
            break
    out, at = [], 0
    for a, e in found:
        out += [html.escape(passage[at:a]), f"<mark>{html.escape(passage[a:e])}</mark>"]
        at = e
    return "".join(out) + html.escape(passage[at:])


# ------------------------------------------------------------------------------------------------ loading

def _missing(path: str) -> str:
    """The message of a missing artefact at workflow path ``path`` (the form of ``Predictor.from_config``'s)."""
    return f"{path} does not exist; build it with `snakemake {path}`"


def _need(*paths: str) -> None:
    for path in paths:
        if not Path(path).exists():
            raise FileNotFoundError(_missing(path))


def load_config(config: str | Path) -> dict:
    """The workflow config with the schema's defaults filled in, as ``snakemake`` validates it at start-up; a YAML
    syntax error names the file, line and column (npm.io.read_yaml)."""
    from snakemake.utils import validate

    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist; run from the workflow's working directory or "
                                "pass --config")
    cfg = read_yaml(path) or {}
    try:
        validate(cfg, str(SCHEMA), set_default=True)
    except Exception as e:  # snakemake's WorkflowError: the schema's message
        raise ValueError(f"{path} does not match {SCHEMA.name}: {str(e).splitlines()[0]}") from None
    return cfg


def _npm(config: str, corpus: str, model: str, mode: str, top: int, predictors: dict):
    from npm import Predictor  # deferred: loads torch

    if model not in predictors:
        predictors[model] = Predictor.from_config(model, corpus, config=config, **dataclasses.asdict(PageSettings()))
    p = predictors[model]

    def answer(text: str, page: PageSettings):
        p.settings = dataclasses.replace(p.settings, **dataclasses.asdict(page))  # the form's; one question at a time
        found = p.predict(text, top=top, mode=mode)
        return [{"text": r["text"], "score": r["score"], "score_name": "score",
                 "evidence": [(f"block {b}", passage) for b, passage in r["evidence"][:2]]} for r in found], None

    index = f"data/bm25/{corpus}" if mode == "restricted" else f"data/index/{model}/{corpus}.faiss"
    s = p.settings
    provenance = {"model": p.encoder.name_or_path, "datastore": f"{p.ds.root} ({p.ds.n_rows:,} vectors, "
                  f"{p.ds.n_blocks:,} blocks, corpus {p.ds.corpus_fingerprint[:12]})", "index": index,
                  "settings": f"{s.span_score} span score, tau from the form" + (
                      ", k from the form" if mode == "faiss" else f", top {s.restricted_blocks} BM25 blocks")}
    return answer, provenance, npm_score(model, mode, s)


def npm_score(model: str, mode: str, s: Settings) -> str:
    """What an NPM / NPM-single score is (``npm.inference.phrase.score_spans``, ``aggregate_spans``)."""
    where = "the BM25 top blocks' stored tokens" if mode == "restricted" else "the k nearest stored tokens"
    if model == "npm_single":
        return (f"probability of the token: softmax(s / tau) over {where}, s = a stored vector's similarity to the "
                "query vector, summed over the token's occurrences (0 to 1)")
    if s.span_score == "code":
        return (f"P_start + P_end: two softmaxes at temperature tau over {where}, of their similarity to the query's "
                "start and end vectors, summed over the phrase's occurrences (0 to 2)")
    return (f"probability of the phrase: exp(s_start / tau) + exp(s_end / tau) normalised over every candidate span of "
            f"{where}, s = the similarity to the query's start / end vector, summed over the phrase's occurrences "
            "(0 to 1)")


def _densephrases(cfg: dict, corpus: str, top: int):
    from npm.densephrases.searcher import PhraseSearcher  # deferred: loads torch

    dp = cfg.get("densephrases")
    if not dp:
        raise FileNotFoundError("the config has no `densephrases` section, so the workflow builds no DensePhrases "
                                "model; add one (config/config.yaml shows it)")
    negatives = dp["train"]["negatives"]
    model = f"results/densephrases/model_{negatives}" + ("_qft" if dp.get("query_ft") else "")
    dump = f"data/densephrases/dump/{negatives}/{corpus}"
    slug = re.sub(r"[^A-Za-z0-9]+", "_", dp["index"]).strip("_")  # the factory as a file name (workflow `_slug`)
    index = f"data/densephrases/index/{negatives}/{corpus}/{slug}.faiss"
    _need(model, f"{dump}/meta.json", index)
    settings = Settings.from_mapping(cfg.get("inference"))
    searcher = PhraseSearcher(model, dump, index)

    def answer(text: str, page: PageSettings):
        question = task_question(*task_input(text))
        found = searcher.search([question], settings.phrase_k, settings.phrase_max_words, top_n=top)[0]
        return [{"text": p["text"], "score": p["score"], "score_name": "score",
                 "evidence": [(f"{p['doc']}, passage {p['passage']}", p["context"])]} for p in found], question

    provenance = {"model": model, "phrase dump": f"{dump} ({searcher.dump.meta['rows']:,} vectors)", "index": index,
                  "settings": f"k {settings.phrase_k}, at most {settings.phrase_max_words} words"}
    score = ("inner product q_start . h_start + q_end . h_end of the question's and the phrase's start and end "
             "vectors (npm.densephrases.search.phrase_scores): unbounded, comparable within this column only")
    return answer, provenance, score


def _replug(cfg: dict, corpus: str):
    name = cfg["baselines"]["lm"]
    lm = "results/models/smollm2" if name == "smollm2" else locate_checkpoint(name) or f"data/checkpoints/{name}"
    blocks = [f"data/blocks/{corpus}/shard{i}.npz" for i in range(cfg["sources"][corpus]["shards"])]
    settings = Settings.from_mapping(cfg.get("inference"))
    bm25, encoder = [f"data/bm25/{corpus}"], None
    if settings.retriever == "dense":  # REPLUG's own retriever: the NPM encoder (npm.baselines.dense)
        bm25, encoder = [], (cfg.get("models") or {}).get("npm") or "results/models/npm"
        _need(encoder)
    _need(lm, *bm25, *blocks)
    system = get("replug")
    inputs = Inputs(checkpoint=lm, bm25=bm25, blocks=blocks, encoder=encoder, corpus=corpus)
    scorer = system.load(system, inputs, settings)
    task = resolve_task(REPLUG_TASK)

    def answer(text: str, page: PageSettings):
        given = qa_input(task_question(*task_input(text)))  # a cloze asked as DensePhrases asks it
        out = scorer.open_set(task, [{"input": given}])
        rec, ans = out["records"][0], out["answers"][0]
        passages = [clean_passage(scorer.passage(b)) for b in rec["passages"]]  # as the scorer prepended them
        weights = rec.get("passage_weights", [])
        prompt = open_set_prompt(task.name, given, kamel_prompt=settings.kamel_prompt)
        if settings.replug_ensemble == "vote":
            score, score_name = rec["votes"].get(ans), "vote"
        else:
            score, score_name = replug_logprob(scorer, prompt, passages, weights, rec["raw_prediction"], ans), \
                "mean log p"
        evidence = [(f"block {b}, weight {w:.2f}", p) for b, w, p in zip(rec["passages"], weights, passages,
                                                                         strict=True)][:3]
        return [{"text": ans, "score": score, "score_name": score_name, "evidence": evidence}], prompt

    info = scorer.info
    provenance = {"model": f"{lm} ({info['parameters']:,} parameters)", "retrieval": f"{info['retrieval']}: "
                  + (bm25[0] if bm25 else str(encoder)), "blocks": f"{', '.join(blocks)} ({info['corpus_tokens']:,} "
                  "tokens)", "settings": f"{settings.passages} passages, {settings.replug_ensemble}, temperature "
                  f"{settings.replug_temperature}"}
    weights = f"softmax({info['retrieval']} score / T)"
    if settings.replug_ensemble == "vote":
        score = (f"vote: the summed weights {weights} x exp(mean answer-token log-probability) of the passages that "
                 "decoded this answer (npm.baselines.replug.replug_vote)")
    else:
        score = (f"mean log-probability of the answer's tokens under the mixture of the passages' next-token "
                 f"distributions, weighted {weights} (npm.baselines.replug.mix_logprobs): 0 at most, closer to 0 = "
                 "more likely")
    return answer, provenance, score


def replug_logprob(scorer, prompt: str, passages: list[str], weights, raw: str, answer: str) -> float | None:
    """Mean log-probability of the answer's tokens (with the text the LM generated before it) under REPLUG's mixture
    of the passages (``mix_logprobs``; the bare prompt with weight 1 when nothing was retrieved); None for an empty
    answer."""
    import numpy as np

    from npm.baselines.replug import mix_logprobs  # deferred: loads torch

    at = raw.find(answer)
    if not answer or at < 0:
        return None
    tok = scorer.tokenizer
    target = tok(raw[:at + len(answer)], add_special_tokens=False)["input_ids"]
    pad = decoding_setup(scorer.model, tok, scorer.settings.max_new_tokens, 1)[0]
    budget = MAX_LENGTH - scorer.settings.max_new_tokens
    rows = [prepend_passages(prompt, [p]) for p in passages] or [prompt]
    lp = target_logprobs(scorer.model, [encode_prompt(tok, r, budget) for r in rows], target, pad)
    return float(mix_logprobs(lp, np.asarray(weights if passages else [1.0])).mean())


def corpus_facts(corpus: str, titles: int = 5) -> dict:
    """What the page's corpus holds, as its NPM datastore counts it: ``documents`` (those of the blocks files it was
    embedded from), ``blocks`` and ``tokens`` (its meta.json), and ``titles``, those of its first ``titles`` documents
    in data/docs/{corpus}.jsonl.gz (none where that file is absent). A missing datastore is FileNotFoundError naming
    its ``snakemake`` target."""
    import numpy as np

    root = f"data/datastore/npm/{corpus}"
    _need(f"{root}/meta.json")
    meta = read_meta(root)
    ids: set[str] = set()
    documents = 0
    for source in meta["sources"]:
        _need(source)
        with np.load(source) as blocks:
            doc_ids = blocks["doc_ids"].tolist()
        documents += len(doc_ids)
        ids.update(doc_ids)
    docs, names = Path(f"data/docs/{corpus}.jsonl.gz"), []
    if docs.is_file():
        for doc in read_jsonl(docs):
            if str(doc.get("id")) in ids and doc.get("title"):
                names.append(str(doc["title"]))
            if len(names) == titles:
                break
    return {"corpus": corpus, "datastore": root, "documents": documents, "blocks": int(meta["n_blocks"]),
            "tokens": int(meta["n_tokens"]), "titles": names}


def page_facts(corpus: str) -> dict:
    """``corpus_facts``, or {"missing": why not} (the page then says what to build)."""
    try:
        return corpus_facts(corpus)
    except (FileNotFoundError, ValueError) as e:
        return {"missing": str(e)}


def load_columns(config: str = "config/config.yaml", corpus: str = "enwiki", top: int = 3,
                 progress=None) -> list[Column]:
    """Every column of the page, each loaded once and warmed up with ``EXAMPLE`` (which opens its indexes), in the
    order of ``COLUMNS``; ``progress(line)`` reports each step (default: the terminal). A system whose artefacts are
    missing (or fail to load) gets its message instead of an answer function."""
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    cfg = load_config(config)
    if corpus not in cfg["sources"]:
        raise ValueError(f"--corpus {corpus!r} is not a source of {config}; sources: {sorted(cfg['sources'])}")
    predictors: dict = {}
    loaders = {"npm": lambda: _npm(config, corpus, "npm", "restricted", top, predictors),
               "npm_faiss": lambda: _npm(config, corpus, "npm", "faiss", top, predictors),
               "npm_single": lambda: _npm(config, corpus, "npm_single", "restricted", top, predictors),
               "densephrases": lambda: _densephrases(cfg, corpus, top),
               "replug": lambda: _replug(cfg, corpus)}
    columns = []
    for i, name in enumerate(COLUMNS, 1):
        column = Column(name, get(name).label)
        progress(f"npm-repro serve: [{i}/{len(COLUMNS)}] {column.label}: loading ...")
        t0 = time.perf_counter()
        try:
            column.answer, column.provenance, column.score = loaders[name]()
            column.answer(EXAMPLE, PageSettings())  # opens the lazy indexes (Lucene, FAISS) now, not on a question
            progress(f"npm-repro serve: [{i}/{len(COLUMNS)}] {column.label}: ready ({time.perf_counter() - t0:.1f} s)")
        except (FileNotFoundError, ValueError) as e:
            column.answer, column.missing = None, str(e)
            progress(f"npm-repro serve: [{i}/{len(COLUMNS)}] {column.label}: unavailable: {e}")
        except Exception as e:  # a broken artefact: the page says so, the terminal has the traceback
            log.debug("%s", traceback.format_exc())
            column.answer, column.missing = None, f"{column.label} failed to load: {type(e).__name__}: {e}"
            progress(f"npm-repro serve: [{i}/{len(COLUMNS)}] {column.label}: failed: {type(e).__name__}: {e}")
        columns.append(column)
    return columns


def ask(columns: list[Column], text: str, page: PageSettings | None = None) -> list[dict]:
    """Every column's answers to one checked question under the page's settings (default: ``PageSettings()``):
    {column, answers, asked, seconds, error}."""
    page = page or PageSettings()
    out = []
    for column in columns:
        result = {"column": column, "answers": [], "asked": None, "seconds": None, "error": None}
        if column.answer is not None:
            t0 = time.perf_counter()
            try:
                result["answers"], result["asked"] = column.answer(text, page)
            except ValueError as e:  # e.g. the mask cut off by the model's length limit
                result["error"] = str(e)
            except Exception as e:  # the page says so, the terminal has the traceback; the other columns answer
                log.error("%s failed on %r:\n%s", column.label, text, traceback.format_exc())
                result["error"] = f"{column.label} failed: {type(e).__name__}: {e}"
            result["seconds"] = time.perf_counter() - t0
        out.append(result)
    return out


# ------------------------------------------------------------------------------------------------ the page

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
form { display: flex; gap: .5em; margin-bottom: 1em; }
#q { flex: 1; font-size: 1.1em; padding: .4em; }
label { align-self: center; }
#tau, #k { width: 6em; font-size: 1em; padding: .3em; }
.corpus { background: #e7f1fb; border: 1px solid #9fc3e6; padding: .6em; }
.meaning { color: #555; font-size: .85em; font-style: italic; }
button { font-size: 1.1em; }
.message { background: #fff3cd; border: 1px solid #e0c97f; padding: .6em; }
.columns { display: grid; grid-template-columns: repeat(5, minmax(0, 1fr)); gap: 1em; }
.system { border: 1px solid #ccc; border-radius: 6px; padding: .6em; font-size: .9em; overflow-wrap: anywhere; }
.system h2 { font-size: 1.1em; margin: 0 0 .3em; }
.answer { font-weight: bold; font-size: 1.1em; }
.score, .time, .asked { color: #555; }
.evidence { margin: .3em 0 .6em; padding: .3em .5em; border-left: 3px solid #ddd; background: #fafafa; }
.source { color: #777; font-size: .85em; }
mark { background: #ffe066; }
.missing, .error { background: #f8d7da; border: 1px solid #e4a1a8; padding: .5em; }
.provenance { color: #555; font-size: .8em; margin-top: .8em; }
.provenance dt { font-weight: bold; }
.provenance dd { margin: 0 0 .3em .5em; }
"""


def _corpus_html(facts: dict | None) -> str:
    """The page's statement of what its corpus holds (``corpus_facts``), or why it cannot say."""
    e = html.escape
    if not facts:
        return ""
    if "missing" in facts:
        return f"<p class='corpus missing' id='corpus'>What the corpus holds is unknown: {e(facts['missing'])}</p>"
    examples = ", ".join(f"<i>{e(t)}</i>" for t in facts["titles"])
    return (f"<p class='corpus' id='corpus'>The corpus <b>{e(facts['corpus'])}</b> holds "
            f"<span id='documents'>{facts['documents']:,}</span> documents (<span id='blocks'>{facts['blocks']:,}"
            f"</span> blocks, <span id='tokens'>{facts['tokens']:,}</span> tokens, as the datastore "
            f"{e(facts['datastore'])} counts them)" + (f", e.g. {examples}" if examples else "") + ". Every system "
            "answers from these documents only: a question about anything else cannot be answered from them.</p>")


def _form_html(question: str, form: dict[str, str]) -> str:
    """The text box and the settings fields (plain HTML; the server reads and checks them)."""
    e, default = html.escape, PageSettings()
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(PageSettings)}
    fields = "".join(f"<label title=\"{e(helps[name])}\">{key} <input id='{key}' name='{key}' type='number' "
                     f"step='{'any' if kind is float else '1'}' "
                     f"value=\"{e(form.get(key, f'{getattr(default, name):g}'))}\"></label>"
                     for key, (name, kind, _) in FORM.items())
    return ("<form method='get' action='/'><input id='q' name='q' type='text' autofocus "
            f"placeholder=\"{e(EXAMPLE)}\" value=\"{e(question)}\">{fields}"
            "<button id='ask' type='submit'>Ask</button></form>"
            f"<p class='hint'>One {e(MASK)} where the answer goes; a question may end in \"? {e(MASK)}\". tau: the "
            f"temperature of NPM's and NPM-single's softmax ({_allowed('open_set_tau')}); k: the nearest vectors the "
            f"FAISS column searches ({_allowed('k')}). The defaults are the README's examples' settings.</p>")


def _answers_html(r: dict) -> list[str]:
    """One column's answers with their scores and highlighted evidence, its time and what it was asked."""
    e, parts = html.escape, [f"<p class='time'>{r['seconds']:.2f} s</p>"]
    if r["asked"]:
        parts.append(f"<p class='asked'>asked as: {e(r['asked'])}</p>")
    if r["error"]:
        parts.append(f"<p class='error'>{e(r['error'])}</p>")
    elif not r["answers"]:
        parts.append("<p class='error'>No answer: nothing retrieved holds a candidate.</p>")
    parts.append("<ol class='answers'>")
    for a in r["answers"]:
        score = "n/a" if a["score"] is None else f"{a['score']:.4f}"
        parts.append(f"<li><span class='answer'>{e(a['text']) or '(empty)'}</span> "
                     f"<span class='score'>{e(a['score_name'])} {score}</span>")
        for source, passage in a["evidence"]:
            parts.append(f"<div class='evidence'><span class='source'>{e(source)}</span><br>"
                         f"{highlight(passage, a['text'])}</div>")
        parts.append("</li>")
    parts.append("</ol>")
    return parts


def render(columns: list[Column], question: str = "", results: list[dict] | None = None,
           message: str | None = None, facts: dict | None = None, form: dict[str, str] | None = None) -> str:
    """The page: what the corpus holds (``facts``), the text box (holding ``question``) with the settings fields
    (holding ``form``'s text, default the defaults), a message, and one column per system with what its score means,
    its answers, time and provenance (or its missing-artefact message). Every text is escaped."""
    e = html.escape
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'><title>npm-repro: ask the systems</title>",
             f"<style>{STYLE}</style></head><body><h1>Ask NPM, NPM-single, DensePhrases and REPLUG</h1>",
             _corpus_html(facts), _form_html(question, form or {})]
    if message:
        parts.append(f"<p class='message' id='message'>{e(message)}</p>")
    by_name = {r["column"].name: r for r in results or []}
    parts.append("<div class='columns'>")
    for column in columns:
        parts.append(f"<section class='system' id='col-{column.name}'><h2>{e(column.label)}</h2>")
        if column.score:
            parts.append(f"<p class='meaning'>score: {e(column.score)}</p>")
        r = by_name.get(column.name)
        if column.missing:
            parts.append(f"<p class='missing'>Not available: {e(column.missing)}</p>")
        elif r is not None:
            parts += _answers_html(r)
        if column.provenance:
            parts.append("<dl class='provenance'>" + "".join(f"<dt>{e(k)}</dt><dd>{e(str(v))}</dd>"
                                                             for k, v in column.provenance.items()) + "</dl>")
        parts.append("</section>")
    parts.append("</div></body></html>")
    return "".join(parts)


def make_server(columns: list[Column], host: str = "127.0.0.1", port: int = 8000,
                facts: dict | None = None) -> ThreadingHTTPServer:
    """The HTTP server of the page over ``columns`` and the corpus ``facts`` (bound, not started: call
    ``serve_forever`` once they are loaded). A bad question or setting is a message in the page (status 400) and the
    server goes on; questions are answered one at a time. Only ``/`` is a page: no file is ever served."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: HTTPStatus, body: str) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            if url.path != "/":
                self._send(HTTPStatus.NOT_FOUND, render(columns, message=f"No page {url.path}; the page is at /.",
                                                        facts=facts))
                return
            query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            form = {k: query[k][:40] for k in FORM if k in query}
            if "q" not in query:
                self._send(HTTPStatus.OK, render(columns, facts=facts, form=form))
                return
            question = query["q"]
            page, problem = page_settings(query)
            problem = check_question(question) or problem
            if problem:
                self._send(HTTPStatus.BAD_REQUEST, render(columns, question[:MAX_CHARS], message=problem, facts=facts,
                                                          form=form))
                return
            with lock:
                results = ask(columns, question, page)
            self._send(HTTPStatus.OK, render(columns, question, results, facts=facts, form=form))

    return ThreadingHTTPServer((host, port), Handler)


def serve(config: str = "config/config.yaml", corpus: str = "enwiki", host: str = "127.0.0.1", port: int = 8000,
          top: int = 3) -> None:
    """Bind ``host:port`` (a port in use is said at once, before minutes of loading), load every system (progress in
    the terminal), then serve the page until Ctrl-C."""
    t0 = time.perf_counter()
    columns: list[Column] = []  # the page's, filled once loaded: nothing is answered before serve_forever
    facts: dict = {}
    try:
        server = make_server(columns, host, port, facts)
    except OSError as e:  # the port is taken, or the host is not an address of this machine
        raise ValueError(f"cannot serve on {host}:{port}: {e.strerror or e}; pass another --port (0 = any free one) "
                         "or --host") from None
    try:
        columns.extend(load_columns(config, corpus, top))
        facts.update(page_facts(corpus))
        ready = sum(c.answer is not None for c in columns)
        url = f"http://{host}:{server.server_address[1]}/"
        print(f"npm-repro serve: {ready} of {len(columns)} systems ready in {time.perf_counter() - t0:.0f} s; serving "
              f"{url} (Ctrl-C stops it)", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


__all__ = ["COLUMNS", "Column", "ask", "check_question", "corpus_facts", "highlight", "load_columns", "make_server",
           "page_facts", "page_settings", "render", "serve", "task_input"]
