"""``npm-repro serve``: a local web page that asks one question of NPM (BM25-restricted and FAISS), NPM-single,
DensePhrases and REPLUG side by side (paper 3.3 and 6.4; docs/paper-map.md §3.8, §6, §D1.5, §R2.2).

The page has one text box. The question is written as NPM reads it, a sentence with one ``<mask>`` where the answer
goes ("Bratislava is the capital of <mask>."); a question ending in "?" may put the mask after it ("Who founded
Tesla? <mask>"), which is read as the NQ template "... The answer is: <mask>." (``npm.tasks.templates``). Each
system answers with what the evaluation gives it:

* NPM and NPM-single: ``npm.Predictor.from_config`` (the workflow's model, datastore and indexes), the top phrases
  with their scores and the blocks that support them;
* DensePhrases: ``npm.densephrases.searcher.PhraseSearcher`` over the corpus's phrase dump and index, the input asked
  as a question (``npm.densephrases.evaluate.task_question``), the top phrases with their passages;
* REPLUG: the evaluation's scorer (``npm.evaluation.systems``, ``npm.baselines.decoder.DecoderScorer``): the BM25
  top passages each prepended to the prompt, greedy decoding over the mixture; its score is the mean log-probability
  of the answer's tokens under that mixture (``npm.baselines.replug.mix_logprobs``).

Each evidence passage is shown with the answer's occurrences highlighted, each column with the seconds its system took
and the model, datastore and indexes it read. Everything is loaded once at start-up, relative to the workflow's
working directory (run it where ``snakemake`` runs), with progress in the terminal; a system whose artefacts are
missing shows, in its column, which file is missing and the ``snakemake`` target that builds it. The server binds
127.0.0.1 (this machine only) unless told otherwise, and answers one question at a time.
"""

from __future__ import annotations

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
from npm.densephrases.evaluate import task_question
from npm.evaluation.systems import Inputs, get
from npm.io import read_yaml
from npm.model import locate_checkpoint
from npm.settings import Settings
from npm.tasks.registry import resolve_task

log = logging.getLogger("npm-repro.serve")

MASK = "<mask>"
QUESTION_SPLIT = "The answer is: <mask>"  # npm.baselines.lm.QUESTION_SPLIT: the NQ / TriviaQA template
MAX_CHARS = 1000  # longest question the page takes (a cloze sentence, not a document)
EXAMPLE = "Bratislava is the capital of <mask>."  # the README's question; also the start-up warm-up query
COLUMNS = ("npm", "npm_faiss", "npm_single", "densephrases", "replug")  # systems of npm.evaluation.systems shown
TASKS = {"question": "nq", "cloze": "lama_trex"}  # the registry task whose prompt and BM25 query REPLUG uses
SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"


@dataclass
class Column:
    """One system's column: ``answer(question) -> (answers, asked as)`` or, when its artefacts are missing, the
    ``missing`` message; ``provenance``: what it read (model, datastore, indexes)."""

    name: str
    label: str
    answer: Callable[[str], tuple[list[dict], str | None]] | None = None
    provenance: dict = field(default_factory=dict)
    missing: str | None = None


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
        predictors[model] = Predictor.from_config(model, corpus, config=config)
    p = predictors[model]

    def answer(text: str):
        found = p.predict(text, top=top, mode=mode)
        return [{"text": r["text"], "score": r["score"], "score_name": "score",
                 "evidence": [(f"block {b}", passage) for b, passage in r["evidence"][:2]]} for r in found], None

    index = f"data/bm25/{corpus}" if mode == "restricted" else f"data/index/{model}/{corpus}.faiss"
    s = p.settings
    provenance = {"model": p.encoder.name_or_path, "datastore": f"{p.ds.root} ({p.ds.n_rows:,} vectors, "
                  f"{p.ds.n_blocks:,} blocks, corpus {p.ds.corpus_fingerprint[:12]})", "index": index,
                  "settings": f"tau {s.open_set_tau}, {s.span_score} span score"
                              + (f", k {s.k}" if mode == "faiss" else f", top {s.restricted_blocks} BM25 blocks")}
    return answer, provenance


def _densephrases(cfg: dict, corpus: str, top: int):
    from npm.densephrases.searcher import PhraseSearcher  # deferred: loads torch

    dp = cfg.get("densephrases")
    if not dp:
        raise FileNotFoundError("the config has no `densephrases` section, so the workflow builds no DensePhrases "
                                "model; add one (config/config.yaml shows it)")
    negatives = dp["train"]["negatives"]
    model = f"results/densephrases/model_{negatives}" + ("_qft" if dp.get("query_ft") else "")
    dump = f"data/densephrases/dump/{negatives}/{corpus}"
    slug = re.sub(r"[^A-Za-z0-9]+", "_", dp["index"]).strip("_")  # the factory string as a file name (common.smk)
    index = f"data/densephrases/index/{negatives}/{corpus}/{slug}.faiss"
    _need(model, f"{dump}/meta.json", index)
    settings = Settings.from_mapping(cfg.get("inference"))
    searcher = PhraseSearcher(model, dump, index)

    def answer(text: str):
        question = task_question(*task_input(text))
        found = searcher.search([question], settings.phrase_k, settings.phrase_max_words, top_n=top)[0]
        return [{"text": p["text"], "score": p["score"], "score_name": "score",
                 "evidence": [(f"{p['doc']}, passage {p['passage']}", p["context"])]} for p in found], question

    provenance = {"model": model, "phrase dump": f"{dump} ({searcher.dump.meta['rows']:,} vectors)", "index": index,
                  "settings": f"k {settings.phrase_k}, at most {settings.phrase_max_words} words"}
    return answer, provenance


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
    tasks = {family: resolve_task(task) for family, task in TASKS.items()}

    def answer(text: str):
        family, given = task_input(text)
        task = tasks[family]
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
    return answer, provenance


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
            column.answer, column.provenance = loaders[name]()
            column.answer(EXAMPLE)  # opens the lazily loaded indexes (Lucene, FAISS) now, not on the first question
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


def ask(columns: list[Column], text: str) -> list[dict]:
    """Every column's answers to one checked question: {column, answers, asked, seconds, error}."""
    out = []
    for column in columns:
        result = {"column": column, "answers": [], "asked": None, "seconds": None, "error": None}
        if column.answer is not None:
            t0 = time.perf_counter()
            try:
                result["answers"], result["asked"] = column.answer(text)
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


def render(columns: list[Column], question: str = "", results: list[dict] | None = None,
           message: str | None = None) -> str:
    """The page: the text box (holding ``question``), a message, and one column per system with its answers, time and
    provenance (or its missing-artefact message). Every text is escaped."""
    e = html.escape
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'><title>npm-repro: ask the systems</title>",
             f"<style>{STYLE}</style></head><body><h1>Ask NPM, NPM-single, DensePhrases and REPLUG</h1>",
             "<form method='get' action='/'><input id='q' name='q' type='text' autofocus "
             f"placeholder=\"{e(EXAMPLE)}\" value=\"{e(question)}\">"
             "<button id='ask' type='submit'>Ask</button></form>",
             f"<p class='hint'>One {e(MASK)} where the answer goes; a question may end in \"? {e(MASK)}\".</p>"]
    if message:
        parts.append(f"<p class='message' id='message'>{e(message)}</p>")
    by_name = {r["column"].name: r for r in results or []}
    parts.append("<div class='columns'>")
    for column in columns:
        parts.append(f"<section class='system' id='col-{column.name}'><h2>{e(column.label)}</h2>")
        r = by_name.get(column.name)
        if column.missing:
            parts.append(f"<p class='missing'>Not available: {e(column.missing)}</p>")
        elif r is not None:
            parts.append(f"<p class='time'>{r['seconds']:.2f} s</p>")
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
        if column.provenance:
            parts.append("<dl class='provenance'>" + "".join(f"<dt>{e(k)}</dt><dd>{e(str(v))}</dd>"
                                                             for k, v in column.provenance.items()) + "</dl>")
        parts.append("</section>")
    parts.append("</div></body></html>")
    return "".join(parts)


def make_server(columns: list[Column], host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """The HTTP server of the page over ``columns`` (bound, not started: call ``serve_forever`` once they are loaded).
    A bad question is a message in the page (status 400) and the server goes on; questions are answered one at a time.
    Only ``/`` is a page: no file is ever served."""
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
                self._send(HTTPStatus.NOT_FOUND, render(columns, message=f"No page {url.path}; the page is at /."))
                return
            values = parse_qs(url.query, keep_blank_values=True).get("q")
            if values is None:
                self._send(HTTPStatus.OK, render(columns))
                return
            question = values[0]
            problem = check_question(question)
            if problem:
                self._send(HTTPStatus.BAD_REQUEST, render(columns, question[:MAX_CHARS], message=problem))
                return
            with lock:
                results = ask(columns, question)
            self._send(HTTPStatus.OK, render(columns, question, results))

    return ThreadingHTTPServer((host, port), Handler)


def serve(config: str = "config/config.yaml", corpus: str = "enwiki", host: str = "127.0.0.1", port: int = 8000,
          top: int = 3) -> None:
    """Bind ``host:port`` (a port in use is said at once, before minutes of loading), load every system (progress in
    the terminal), then serve the page until Ctrl-C."""
    t0 = time.perf_counter()
    columns: list[Column] = []  # the page's, filled once loaded: nothing is answered before serve_forever
    try:
        server = make_server(columns, host, port)
    except OSError as e:  # the port is taken, or the host is not an address of this machine
        raise ValueError(f"cannot serve on {host}:{port}: {e.strerror or e}; pass another --port (0 = any free one) "
                         "or --host") from None
    try:
        columns.extend(load_columns(config, corpus, top))
        ready = sum(c.answer is not None for c in columns)
        url = f"http://{host}:{server.server_address[1]}/"
        print(f"npm-repro serve: {ready} of {len(columns)} systems ready in {time.perf_counter() - t0:.0f} s; serving "
              f"{url} (Ctrl-C stops it)", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


__all__ = ["COLUMNS", "Column", "ask", "check_question", "highlight", "load_columns", "make_server", "render",
           "serve", "task_input"]
