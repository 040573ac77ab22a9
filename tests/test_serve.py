"""The web page ``npm-repro serve`` (npm.serve) as a user meets it: the real command started in a workflow directory
whose artefacts were built with the real entry points (tiny models: a random BERT for NPM, NPM-single and
DensePhrases, a random Llama for REPLUG), driven in a real headless Chromium through Selenium. Every system's column
answers with its evidence highlighted, a system whose artefacts are missing names its ``snakemake`` target, and bad
input (empty, no mask, 10,000 characters, HTML and script) is a message in the page while the server keeps serving.

Without Chromium and chromedriver (Debian: ``apt-get install chromium chromium-driver``) the browser tests are
skipped; NPM_REQUIRE_BROWSER=1 turns that skip into a failure. ``NPM_SERVE_SCREENSHOT=PATH`` saves the browser
test's screenshot there too (docs/serve.png was made so). The slow test serves the finished ``make demo`` of the
repository (or of ``NPM_DEMO_ROOT``), asks it a question whose answer is in the corpus, and is skipped when its
outputs are absent.

The page states its corpus as its NPM datastore counts it (checked here against the datastore's own files), takes
NPM's tau and k from its form (the README's values by default; a value out of range is a message), asks REPLUG with
Table 8's NQ prompt, and says what each column's score means."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from html import escape as html_escape
from pathlib import Path

import pytest
import yaml

from npm.serve import COLUMNS, EXAMPLE, MAX_CHARS, load_columns, make_server, page_facts
from npm.settings import PageSettings, Settings
from tests.conftest import WORDPIECE, lee_corpus_lines, require_jvm, save_tiny_bert

REPO = Path(__file__).resolve().parents[1]
CORPUS_LINES = ["Bratislava is the capital of Slovakia, a city on the Danube.",
                "Vienna is the capital of Austria, upstream of Bratislava on the Danube."]
EXTRACTIVE = [c for c in COLUMNS if c != "replug"]  # their answers are spans of the passages they show
DOCS = "data/docs/enwiki.jsonl.gz"  # the corpus's documents with their titles, where the workflow puts them
SERVE = "import sys; del sys.path[0]; from npm.cli import main; sys.exit(main())"  # `npm-repro`, cwd not on the path


# ------------------------------------------------------------------------------------------------ the workflow dir

def build_workdir(root: Path) -> None:
    """Every artefact the page reads, at the workflow's paths under ``root`` (the current directory while building,
    so that the recorded blocks paths are relative as the workflow's are), and config/config.yaml: the repository's
    config with the tiny checkpoints and a one-shard corpus."""
    from npm.data.blocks import build_blocks
    from npm.datastore.bm25 import block_documents, build_bm25_index
    from npm.datastore.embed import embed_corpus
    from npm.datastore.faiss_index import build_faiss_index
    from npm.datastore.store import load_datastore
    from npm.densephrases.dump import build_index, dump_phrases
    from npm.densephrases.model import DensePhrases
    from npm.io import atomic_dir, write_jsonl
    from tests.test_baselines import save_tiny_llama

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    cfg["models"].update(npm=None, npm_single="released/npm-single")
    cfg["baselines"]["lm"] = "released/lm"
    cfg["sources"]["enwiki"]["shards"] = 1
    cfg["inference"] = {"k": 64, "max_new_tokens": 8}
    dp = cfg["densephrases"]
    negatives, qft = dp["train"]["negatives"], "_qft" if dp.get("query_ft") else ""
    (root / "config").mkdir()
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")

    blocks = "data/blocks/enwiki/shard0.npz"
    os.makedirs("data/blocks/enwiki")
    write_jsonl(DOCS, [{"id": f"doc{i}", "title": line.split(" is ")[0] if i < len(CORPUS_LINES) else f"Lee {i}",
                        "units": [line]} for i, line in enumerate(CORPUS_LINES + lee_corpus_lines()[:10])])
    build_blocks(DOCS, blocks, WORDPIECE, max_seq_length=64)
    build_bm25_index(block_documents([blocks]), "data/bm25/enwiki")
    for kind, checkpoint in (("npm", save_tiny_bert("results/models/npm", seed=0)),
                             ("npm_single", save_tiny_bert("released/npm-single", seed=1))):
        embed_corpus(checkpoint, [blocks], f"data/datastore/{kind}/enwiki", batch_blocks=8, progress=False)
        os.makedirs(f"data/index/{kind}", exist_ok=True)
        store = load_datastore(f"data/datastore/{kind}/enwiki")
        build_faiss_index(store.vector_shards(), store.hidden_size, f"data/index/{kind}/enwiki.faiss",
                          factory="Flat", datastore=store)
    model = f"results/densephrases/model_{negatives}{qft}"
    with atomic_dir(model) as tmp:
        DensePhrases.from_encoder(save_tiny_bert("released/dp-encoder", seed=2)).save(tmp)
    dump_phrases(model, [blocks], f"data/densephrases/dump/{negatives}/enwiki", progress=False)
    os.makedirs(f"data/densephrases/index/{negatives}/enwiki")
    build_index(f"data/densephrases/dump/{negatives}/enwiki", f"data/densephrases/index/{negatives}/enwiki/Flat.faiss")
    save_tiny_llama(root / "released" / "lm")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    require_jvm()
    root = tmp_path_factory.mktemp("served")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        build_workdir(root)
    return root


def start_server(root: Path, log: Path, timeout: float = 300.0) -> tuple[subprocess.Popen, str]:
    """``npm-repro serve --port 0`` of this code started in ``root`` as a user would (a checkout's own npm/ there is
    not imported: ``-c`` drops the working directory from the path); its URL once every system is loaded."""
    err = log.open("w")
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "serve", "--port", "0", "--threads", "1"], cwd=root,
                            stdout=subprocess.PIPE, stderr=err, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        url = next((w for line in lines for w in line.split() if w.startswith("http://")), None)
        if url:
            return proc, url
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"npm-repro serve did not start: {''.join(lines)}{log.read_text()}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def served(workdir, tmp_path_factory):
    proc, url = start_server(workdir, tmp_path_factory.mktemp("log") / "serve.log")
    yield url
    stop(proc)


def get(url: str, question: str | None = None, **form: str) -> tuple[int, str]:
    """Status and body of the page (asked ``question``, with the form's other fields ``form``)."""
    if question is not None or form:
        url += "?" + urllib.parse.urlencode(({"q": question} if question is not None else {}) | form)
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return r.status, r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8")


def assert_still_serving(url: str) -> None:
    status, body = get(url, EXAMPLE)
    assert status == 200 and body.count("class='answer'") >= len(COLUMNS), body[-2000:]


def shown_facts(body: str) -> dict:
    """The corpus facts the page states (its #corpus paragraph): documents, blocks, tokens and example titles."""
    corpus = re.search(r"<p class='corpus' id='corpus'>(.*?)</p>", body, re.S)
    assert corpus, body[:3000]
    facts = {k: int(re.search(rf"<span id='{k}'>([\d,]+)</span>", corpus[1])[1].replace(",", ""))
             for k in ("documents", "blocks", "tokens")}
    return facts | {"titles": re.findall(r"<i>(.*?)</i>", corpus[1]), "text": corpus[1]}


def datastore_facts(root: Path, corpus: str = "enwiki") -> dict:
    """What the NPM datastore of ``corpus`` under ``root`` holds, read from its files here: blocks and tokens from
    meta.json (checked against its blocks files), documents and every document's title from the blocks files and
    data/docs/{corpus}.jsonl.gz."""
    import numpy as np

    meta = json.loads((root / f"data/datastore/npm/{corpus}/meta.json").read_text())
    documents, blocks, tokens, ids = 0, 0, 0, set()
    for source in meta["sources"]:
        with np.load(root / source) as z:
            documents += len(z["doc_ids"])
            ids |= set(z["doc_ids"].tolist())
            blocks += len(z["block_offsets"]) - 1
            tokens += int(z["block_offsets"][-1])
    assert (blocks, tokens) == (meta["n_blocks"], meta["n_tokens"])
    with gzip.open(root / f"data/docs/{corpus}.jsonl.gz", "rt", encoding="utf-8") as f:
        titles = {d["title"] for d in map(json.loads, f) if d["id"] in ids}
    return {"documents": documents, "blocks": meta["n_blocks"], "tokens": meta["n_tokens"], "titles": titles}


def assert_facts_are_the_datastore_s(body: str, root: Path) -> None:
    shown, truth = shown_facts(body), datastore_facts(root)
    assert {k: shown[k] for k in ("documents", "blocks", "tokens")} == \
        {k: truth[k] for k in ("documents", "blocks", "tokens")}, (shown, truth)
    assert shown["titles"] and len(shown["titles"]) <= 5 and set(shown["titles"]) <= truth["titles"], shown
    assert "a question about anything else cannot be answered from them" in shown["text"], shown["text"]


def column_html(body: str, name: str) -> str:
    found = re.search(rf"<section class='system' id='col-{name}'>(.*?)</section>", body, re.S)
    assert found, (name, body[:3000])
    return found[1]


def top_score(body: str, name: str) -> str:
    return re.search(r"<span class='score'>[^<]* ([-\d.]+|n/a)</span>", column_html(body, name))[1]


def field_value(body: str, key: str) -> str:
    return re.search(rf"<input id='{key}' name='{key}'[^>]*value=\"([^\"]*)\"", body)[1]


def is_phrase(answer: str) -> bool:
    """A non-empty phrase: a word, not a bare prefix such as "A:" or a list marker alone."""
    return bool(re.search(r"\w\w", answer)) and not answer.rstrip().endswith(":")


# ------------------------------------------------------------------------------------------------ the browser

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Debian's headless Chromium driven by Selenium (skipped without them unless NPM_REQUIRE_BROWSER=1)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    if not (chromium and driver and webdriver):
        reason = ("no headless browser: needs chromium and chromedriver (apt-get install chromium chromium-driver) "
                  "and selenium (the dev extras)")
        if os.environ.get("NPM_REQUIRE_BROWSER") == "1":
            pytest.fail(f"NPM_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1700,1100", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    chrome.set_page_load_timeout(300)
    yield chrome
    chrome.quit()


def ask_in_browser(chrome, url: str, question: str) -> None:
    """Type ``question`` into the page's text box and press Ask; returns once the answer page has loaded."""
    from selenium.webdriver.common.by import By

    chrome.get(url)
    box = chrome.find_element(By.ID, "q")
    box.clear()
    box.send_keys(question)
    chrome.find_element(By.ID, "ask").click()
    for _ in range(600):  # the form submits by GET: the answer page carries the question in its URL
        if "q=" in chrome.current_url and chrome.execute_script("return document.readyState") == "complete":
            return
        time.sleep(0.2)
    raise AssertionError(f"no answer page after asking {question!r}")


def columns_in_browser(chrome) -> dict:
    """Per column: its answers, scores, evidence passages, highlighted spans and missing-artefact message."""
    from selenium.webdriver.common.by import By

    fields = {"answers": ".answer", "scores": ".score", "evidence": ".evidence", "marks": ".evidence mark",
              "missing": ".missing", "time": ".time"}
    out = {}
    for name in COLUMNS:
        col = chrome.find_element(By.ID, f"col-{name}")
        out[name] = {k: [e.text for e in col.find_elements(By.CSS_SELECTOR, css)] for k, css in fields.items()}
    return out


def screenshot(chrome, tmp_path) -> None:
    chrome.save_screenshot(str(tmp_path / "serve.png"))
    if os.environ.get("NPM_SERVE_SCREENSHOT"):
        chrome.save_screenshot(os.environ["NPM_SERVE_SCREENSHOT"])


# ------------------------------------------------------------------------------------------------ tests

def test_evidence_is_escaped_and_the_answer_marked_as_whole_words():
    from npm.serve import highlight

    passage = "Pakistani troops <b>left</b> Pakistan-based camps; pakistan said"
    assert highlight(passage, "Pakistan") == ("Pakistani troops &lt;b&gt;left&lt;/b&gt; <mark>Pakistan</mark>-based "
                                              "camps; pakistan said")
    assert highlight(passage, "PAKISTAN") == ("Pakistani troops &lt;b&gt;left&lt;/b&gt; <mark>Pakistan</mark>-based "
                                              "camps; <mark>pakistan</mark> said")
    assert highlight("<script>x</script>", "<script>") == "<mark>&lt;script&gt;</mark>x&lt;/script&gt;"


def test_serve_binds_loopback_by_default():
    from npm.cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.port == 8000 and args.config == "config/config.yaml"


def test_the_page_states_what_its_corpus_holds_as_its_datastore_counts_it(served, workdir):
    """Fault: the page never said which documents it could answer from (the demo's 2,000 of 10,033 leads)."""
    for question in (None, EXAMPLE):
        status, body = get(served, question)
        assert status == 200
        assert_facts_are_the_datastore_s(body, workdir)


def test_the_page_uses_the_readme_settings_with_tau_and_k_as_form_fields(served):
    """Fault: the page ran NPM at tau 1.0 while the README's examples use 0.1, with no control for it."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    taus = set(re.findall(r"--open-set-tau ([\d.]+)", readme)) | set(re.findall(r"open_set_tau=([\d.]+)", readme))
    assert taus == {f"{PageSettings().open_set_tau:g}"}, taus  # the README's examples' tau is the page's default
    assert PageSettings().k == Settings().k  # ... and their k (predict's default)
    stated = re.findall(r"\(tau ([\d.]+), k (\d+);", readme)  # the README's page section
    assert stated == [(f"{PageSettings().open_set_tau:g}", str(PageSettings().k))], stated
    status, body = get(served)
    assert status == 200 and field_value(body, "tau") == "0.1" and field_value(body, "k") == "4096"
    status, sharp = get(served, EXAMPLE)
    status_flat, flat = get(served, EXAMPLE, tau="100", k="8")
    assert status == status_flat == 200
    assert field_value(flat, "tau") == "100" and field_value(flat, "k") == "8"  # the form keeps what was asked
    assert top_score(sharp, "npm") != top_score(flat, "npm")  # the temperature reached NPM's softmax
    assert "<script" not in body


@pytest.mark.parametrize(("form", "says"), [
    ({"tau": "0"}, "The temperature tau must be a number above 0 and at most 100"),
    ({"tau": "-1"}, "The temperature tau must be a number above 0"),
    ({"tau": "hot"}, "The temperature tau must be a number"),
    ({"tau": "1e9"}, "at most 100"),
    ({"k": "0"}, "k must be a whole number from 1 to 16,384"),
    ({"k": "2.5"}, "k must be a whole number"),
    ({"k": "99999"}, "k must be a whole number from 1 to 16,384")])
def test_a_setting_out_of_range_is_a_message_and_the_server_keeps_serving(served, form, says):
    status, body = get(served, EXAMPLE, **form)
    assert status == 400 and says in body and "class='answer'" not in body, body[-1500:]
    assert_still_serving(served)


def test_every_column_says_what_its_score_means(served):
    """Fault: the columns' scores (about 0.1, about 60, a log-probability) had no legend."""
    status, body = get(served, EXAMPLE)
    meaning = {name: re.search(r"<p class='meaning'>score: (.*?)</p>", column_html(body, name))[1] for name in COLUMNS}
    for name in ("npm", "npm_faiss"):
        assert "probability of the phrase" in meaning[name] and "tau" in meaning[name], meaning[name]
    assert "k nearest" in meaning["npm_faiss"] and "BM25 top blocks" in meaning["npm"]
    assert "probability of the token" in meaning["npm_single"] and "tau" in meaning["npm_single"]
    assert "inner product" in meaning["densephrases"]
    assert "mean log-probability" in meaning["replug"] and "mixture" in meaning["replug"]


def test_replug_is_asked_as_table_8_asks_nq_and_answers_a_phrase(served):
    """Fault: the page gave REPLUG the cloze prompt, to which its LM answers "A:" or "A: 1"; Table 8's NQ prompt
    gets spans."""
    from npm.baselines.lm import open_set_prompt
    from npm.tasks.templates import qa_input

    status, body = get(served, EXAMPLE)
    replug = column_html(body, "replug")
    asked = open_set_prompt("nq", qa_input("Bratislava is the capital of"))  # the evaluation's NQ prompt
    assert asked == "Question: Bratislava is the capital of?\nAnswer:"
    assert f"<p class='asked'>asked as: {html_escape(asked)}</p>" in replug, replug[:1500]
    answer = re.search(r"<span class='answer'>(.*?)</span>", replug)[1]
    assert answer and answer != "(empty)", replug[:1500]


def test_every_system_answers_with_its_evidence_highlighted_in_the_browser(served, browser, tmp_path):
    from selenium.webdriver.common.by import By

    ask_in_browser(browser, served, EXAMPLE)
    shown = columns_in_browser(browser)
    screenshot(browser, tmp_path)
    assert "a question about anything else cannot be answered" in browser.find_element(By.ID, "corpus").text
    for name in COLUMNS:
        col = shown[name]
        assert not col["missing"], (name, col["missing"])
        assert col["answers"] and all(a.strip() for a in col["answers"]) and is_phrase(col["answers"][0]), (name, col)
        assert col["evidence"] and col["time"] and col["time"][0].endswith(" s"), (name, col)
        assert all(s.split()[-1] != "n/a" for s in col["scores"][:1]) or name == "replug", (name, col)
    for name in EXTRACTIVE:  # an extractive answer is a span of its evidence: highlighted there
        col = shown[name]
        assert col["marks"], (name, col)
        assert {m.casefold() for m in col["marks"]} <= {a.casefold() for a in col["answers"]}, (name, col)
    replug = shown["replug"]  # a (tiny, random) LM's answer is highlighted only where a passage holds it
    assert len(replug["answers"]) == 1 and len(replug["evidence"]) >= 1
    assert all(m.casefold() == replug["answers"][0].casefold() for m in replug["marks"])


def test_html_and_script_in_the_question_are_shown_as_text_never_run(served, browser):
    from selenium.webdriver.common.by import By

    attack = ("<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\"> "
              "Bratislava is the capital of <mask>.")
    ask_in_browser(browser, served, attack)
    assert browser.title == "npm-repro: ask the systems"
    assert browser.find_elements(By.TAG_NAME, "script") == [] and browser.find_elements(By.TAG_NAME, "img") == []
    assert browser.find_element(By.ID, "q").get_attribute("value") == attack  # the text box holds it as typed
    assert columns_in_browser(browser)["npm"]["answers"]  # and it was answered as a question
    assert_still_serving(served)


def test_an_empty_question_is_a_message_and_the_server_keeps_serving(served):
    for question in ("", "   "):
        status, body = get(served, question)
        assert status == 400 and "Type a question first" in body and "class='answer'" not in body
    assert_still_serving(served)


def test_a_question_without_a_mask_is_a_message_and_the_server_keeps_serving(served):
    status, body = get(served, "What is the capital of Slovakia?")
    assert status == 400 and "has no &lt;mask&gt;" in body and "write one &lt;mask&gt; where the answer goes" in body
    status, body = get(served, "<mask> is the capital of <mask>.")
    assert status == 400 and "has 2 &lt;mask&gt;" in body
    assert_still_serving(served)


def test_a_question_of_10000_characters_is_a_message_and_the_server_keeps_serving(served):
    question = (EXAMPLE + " and more" * 2000)[:10_000]
    status, body = get(served, question)
    assert status == 400 and f"has 10,000 characters; the page takes at most {MAX_CHARS:,}" in body
    assert_still_serving(served)


def test_a_system_without_its_artefacts_names_the_snakemake_target_in_the_page(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    columns = load_columns("config/config.yaml", corpus="cc_news", progress=lambda line: None)  # nothing built
    server = make_server(columns, port=0, facts=page_facts("cc_news"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        for question in (None, EXAMPLE):  # the blank page and an answer page both say what to build
            status, body = get(url, question)
            assert status == 200 and body.count("class='missing'") == len(COLUMNS)
            assert "build it with `snakemake data/datastore/npm/cc_news/meta.json`" in body
            assert "build it with `snakemake data/datastore/npm_single/cc_news/meta.json`" in body
            assert "build it with `snakemake data/densephrases/dump/pre_batch/cc_news/meta.json`" in body
            assert "build it with `snakemake data/bm25/cc_news`" in body
            assert ("What the corpus holds is unknown: data/datastore/npm/cc_news/meta.json does not exist; build it "
                    "with `snakemake data/datastore/npm/cc_news/meta.json`") in body
            assert "Traceback" not in body
    finally:
        server.shutdown()
        server.server_close()


# A question whose answer is in the demo's corpus (its 2,000 of the 10,033 leads hold "14th Dalai Lama"), and that title
DEMO_QUESTION = "The 14th Dalai Lama is the highest spiritual leader and head of <mask>."
DEMO_TITLE = "14th Dalai Lama"


@pytest.mark.slow
def test_the_demo_answers_a_corpus_question_in_the_browser(browser, tmp_path):
    """After `make demo`: the page states the corpus as its datastore counts it, and every column's top answer to a
    question whose answer is in the corpus is a phrase (REPLUG's too: Table 8's NQ prompt, not "A:" or "A: 1")."""
    from selenium.webdriver.common.by import By

    root = Path(os.environ.get("NPM_DEMO_ROOT", REPO))
    needed = ["results/models/npm", "data/datastore/npm/enwiki/meta.json", "data/datastore/npm_single/enwiki/meta.json",
              "data/index/npm/enwiki.faiss", "data/bm25/enwiki", "data/docs/enwiki.jsonl.gz",
              "data/densephrases/dump/pre_batch/enwiki/meta.json", "results/densephrases/model_pre_batch_qft",
              "results/models/smollm2"]
    absent = [p for p in needed if not (root / p).exists()]
    if absent:
        pytest.skip(f"no finished `make demo` in {root} (missing {', '.join(absent)}); run `make demo` first or set "
                    "NPM_DEMO_ROOT")
    assert DEMO_TITLE in datastore_facts(root)["titles"]  # the question's answer is in the corpus
    proc, url = start_server(root, tmp_path / "serve.log", timeout=900)
    try:
        ask_in_browser(browser, url, DEMO_QUESTION)
        shown = columns_in_browser(browser)
        screenshot(browser, tmp_path)
        assert_facts_are_the_datastore_s(get(url)[1], root)
        assert "cannot be answered" in browser.find_element(By.ID, "corpus").text
        assert browser.find_element(By.ID, "tau").get_attribute("value") == f"{PageSettings().open_set_tau:g}"
        for name in COLUMNS:
            col = shown[name]
            assert not col["missing"] and col["answers"] and col["evidence"], (name, col)
            assert is_phrase(col["answers"][0]), (name, col["answers"])
            if name in EXTRACTIVE:  # a span of its evidence, highlighted there
                assert col["marks"], (name, col)
    finally:
        stop(proc)


def test_a_port_in_use_is_one_line_at_once_before_anything_is_loaded(tmp_path):
    """Fault: the port was tried only after every system had loaded (~100 s on the demo)."""
    shutil.copytree(Path(__file__).resolve().parents[1] / "config", tmp_path / "config")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "npm.cli", "serve", "--port", str(port), "--threads", "1"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1 and "Traceback" not in run.stderr and "loading" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], run.stderr


@pytest.mark.parametrize("path", ["/..%2F..%2Fetc%2Fpasswd", "/../../etc/passwd", "/%2E%2E/%2E%2E/etc/passwd",
                                  "/config/config.yaml", "/static/../../etc/passwd"])
def test_the_page_serves_no_file(path):
    """The page serves no static file at all: every path but / is the page's 404 message."""
    server = make_server([], port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read().decode("utf-8")
        assert r.status == 404 and "root:" not in body and "sources:" not in body
    finally:
        server.shutdown()
        server.server_close()
