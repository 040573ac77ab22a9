"""The registry of systems and the settings (paper-map §4-§6): one place names the systems, one place holds each
switch's default, the CLI and the workflow read both, and the package's imports point one way."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from npm import settings as settings_module
from npm.cli import build_parser
from npm.evaluation.systems import SYSTEMS, names
from npm.settings import Settings, to_args

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ settings

def test_default_settings_are_the_paper_s():
    s = Settings()
    assert (s.closed_set_tau, s.open_set_tau, s.tau_twice, s.span_score, s.k) == (5.0, 1.0, False, "paper", 4096)
    assert (s.passages, s.lama_average, s.restricted_blocks, s.fuzzy_verbalizers) == (5, "macro", 3, True)


@pytest.mark.parametrize("name,value", [("open_set_tau", 0), ("closed_set_tau", -1.0), ("open_set_tau", float("nan")),
                                        ("k", 0), ("passages", 0), ("span_score", "both"), ("tau_twice", 1),
                                        ("lama_average", "weighted"), ("k", 2.5)])
def test_invalid_settings_are_errors_in_the_api_the_cli_and_the_config(name, value, capsys):
    with pytest.raises(ValueError, match=f"setting {name}"):
        Settings(**{name: value})
    with pytest.raises(ValueError, match=f"setting {name}"):
        Settings.from_mapping({name: value})
    if not isinstance(Settings.__dataclass_fields__[name].default, bool):  # a flag takes no value
        flag = "--" + name.replace("_", "-")
        with pytest.raises(SystemExit):
            build_parser().parse_args(["evaluate", "--task", "nq", "--system", "npm", "--checkpoint", "m", flag,
                                       str(value)])
        assert name.replace("_", "-") in capsys.readouterr().err


def test_unknown_config_key_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown key.*'tau'.*allowed"):
        Settings.from_mapping({"tau": 1.0})


def test_cli_options_are_generated_from_the_settings_with_their_defaults():
    args = build_parser().parse_args(["evaluate", "--task", "nq", "--system", "npm", "--checkpoint", "m"])
    assert settings_module.from_args(args) == Settings()
    args = build_parser().parse_args(["evaluate", "--task", "nq", "--system", "npm", "--checkpoint", "m", "--tau-twice",
                                      "--span-score", "code", "--k", "8", "--no-fuzzy-verbalizers"])
    s = settings_module.from_args(args)
    assert s.tau_twice and s.span_score == "code" and s.k == 8 and not s.fuzzy_verbalizers


def test_workflow_arguments_round_trip_through_the_cli():
    config = {"tau_twice": True, "passages": 3, "skip_blank_lines": True, "open_set_tau": 0.1}
    argv = ["evaluate", "--task", "nq", "--system", "npm", "--checkpoint", "m", *to_args(config).split()]
    assert settings_module.from_args(build_parser().parse_args(argv)) == Settings(**config)


def test_configs_name_only_settings_keys():
    import yaml

    for config in ("config.yaml", "paper.yaml", "released.yaml"):
        Settings.from_mapping(yaml.safe_load((ROOT / "config" / config).read_text()).get("inference"))


# ------------------------------------------------------------------------------------------------ registry

def test_every_system_names_a_known_model_and_artefacts():
    from npm.evaluation.systems import ARTEFACTS, MODELS

    for system in SYSTEMS.values():
        assert system.model in MODELS
        assert system.closed is not None or system.open is not None
        for needs in (system.closed, system.open):
            assert needs is None or set(needs) <= set(ARTEFACTS)
    assert names(closed=True) == ["npm", "npm_single", "mlm", "lm", "lm_pmi"]
    assert names(closed=False) == ["npm", "npm_single", "npm_faiss", "lm", "bm25_lm", "replug", "replug_lsr",
                                   "densephrases"]
    assert SYSTEMS["replug_lsr"].needs(False, "bm25") == ("encoder", "blocks")  # always its own dense retriever


def test_left_to_right_systems_answer_every_closed_set_template_in_its_causal_form():
    assert SYSTEMS["lm"].applies(True, "rte") and SYSTEMS["lm_pmi"].applies(True, "rte")  # Shi et al. 2022's form
    assert SYSTEMS["lm"].applies(True, "sst2") and SYSTEMS["npm"].applies(True, "rte")
    assert not SYSTEMS["mlm"].applies(False, "lama")


def test_dense_retrieval_needs_the_encoder_instead_of_bm25():
    assert SYSTEMS["replug"].needs(False, "dense") == ("encoder", "blocks")
    assert SYSTEMS["npm"].needs(False, "dense") == ("datastore", "bm25")  # the switch is the decoders' only


def test_cli_system_choices_are_the_registry():
    action = next(a for a in build_parser()._subparsers._group_actions[0].choices["evaluate"]._actions
                  if a.dest == "system")
    assert list(action.choices) == list(SYSTEMS)


def test_only_the_registry_names_the_systems():
    """Code outside the registry never lists system names (tests, the paper-values data and configs may). REPLUG's
    own system (npm/replug, rules replug_*: its language-modelling rows and the config section `replug`) is not an
    evaluation system of the registry. The web page (npm/serve.py) is exempt: its five columns are a fixed layout,
    each loaded through its own entry point (npm.Predictor, the DensePhrases searcher, the registry's REPLUG)."""
    pattern = re.compile(r"""["'](npm_faiss|lm_pmi|bm25_lm|replug|replug_lsr)["']""")  # npm, mlm: model names too
    section = re.compile(r"""(config(\.get\(|\[)|SECTION = )["']replug["']""")  # the config section
    hits = []
    files = [*ROOT.glob("npm/**/*.py"), *ROOT.glob("workflow/rules/*.smk"), ROOT / "Snakefile"]
    for path in files:
        if (path.name == "systems.py" and path.parent.name == "evaluation") or path.parent.name == "replug" \
                or path.name in ("replug.smk", "serve.py"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(section.sub("", line)):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


# ------------------------------------------------------------------------------------------------ dependencies

LIGHT = ["npm.tasks.registry", "npm.tasks.templates", "npm.tasks.loaders", "npm.tasks.metrics",
         "npm.evaluation.systems", "npm.settings", "npm.report.tables"]


def test_tasks_registry_and_report_do_not_import_torch():
    code = f"import sys; import {', '.join(LIGHT)}; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "False False"


def _imports(path: Path) -> set[str]:
    """The npm modules a file imports, at module top or inside functions: ``from npm.data import ccnews`` imports
    npm.data.ccnews, ``from npm.io import read_jsonl`` imports npm.io."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "npm":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if (ROOT / sub.replace(".", "/")).with_suffix(".py").is_file()
                        or (ROOT / sub.replace(".", "/") / "__init__.py").is_file() else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "npm")
    return out


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_package_dependencies_point_one_way():
    graph: dict[str, set[str]] = {}
    for path in ROOT.glob("npm/**/*.py"):
        src = _package(_module(path))
        graph.setdefault(src, set()).update(_package(m) for m in _imports(path) if _package(m) != src)
    assert "npm.baselines" not in graph.get("npm.training", set())
    assert "npm.evaluation" not in graph.get("npm.baselines", set())
    assert "npm.evaluation" not in graph.get("npm.inference", set())
    for low in ("npm.tasks", "npm.training", "npm.datastore", "npm.data"):
        assert "npm.evaluation" not in graph.get(low, set()), low
        assert "npm.baselines" not in graph.get(low, set()), low
    assert "npm.inference" not in graph.get("npm.tasks", set())

    assert not _cycles(graph), _cycles(graph)  # no cycle between packages


def _cycles(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """{node on a cycle: its successors on a cycle with it}; empty when the graph has no cycle."""
    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {node: reach(node) for node in graph}
    return {node: sorted(n for n in graph[node] if node in reached.get(n, ())) for node in sorted(graph)
            if node in reached[node]}


def test_no_import_cycle_between_the_package_s_modules():
    """Module by module, imports inside functions included: a cycle hides which module is the lower layer (the two
    that were: npm.data.documents <-> the readers through Stats, now npm.data.stats; npm.densephrases.evaluate ->
    train -> rc -> evaluate through task_question, now npm.densephrases.questions)."""
    graph = {_module(path): {m for m in _imports(path) if m != _module(path)} for path in ROOT.glob("npm/**/*.py")}
    assert not _cycles(graph), _cycles(graph)


def test_only_the_cli_imports_the_demo_data_builders():
    """The embedded default's demo-data builders (npm.embedded) serve the CLI and the workflow: no other module of npm
    imports them, so no domain package depends on the demo's data (npm.densephrases gets the handler of its `rc`
    step, which builds demo data, from npm.cli)."""
    importers = sorted(_module(path) for path in ROOT.glob("npm/**/*.py")
                       if _package(_module(path)) != "npm.embedded"
                       and any(_package(m) == "npm.embedded" for m in _imports(path)))
    assert importers == ["npm.cli"], (f"{importers} import npm.embedded; only npm.cli may: move what a domain module "
                                      "needs out of npm.embedded, or pass it in from npm.cli")


def _undeferred_imports(root: Path) -> dict[str, list[int]]:
    """{file: lines} of the npm imports inside a function of ``root``'s package without a ``# deferred: REASON``
    comment on their (first) line."""
    out = {}
    for path in sorted(root.glob("npm/**/*.py")):
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        found = {node.lineno for func in ast.walk(tree) if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
                 for node in ast.walk(func)
                 if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "npm"
                 or isinstance(node, ast.Import) and any(a.name.split(".")[0] == "npm" for a in node.names)}
        bare = sorted(n for n in found if not re.search(r"# deferred: \S", lines[n - 1]))
        if bare:
            out[path.relative_to(root).as_posix()] = bare
    return out


def test_imports_inside_functions_say_why_they_are_deferred():
    """An npm module is imported at the top of the module that uses it, unless it would load a heavy optional
    dependency (torch, transformers, faiss, pandas, ...) where the importer does not, or close an import cycle: then
    the import inside the function says why (``# deferred: loads torch``)."""
    bare = _undeferred_imports(ROOT)
    assert not bare, (f"npm imports inside functions without a `# deferred: REASON` comment (file: lines): {bare}; "
                      "move each to the module top, or say why it must wait")


# ------------------------------------------------------------------------------------------------ the workflow

def _dry_run(tmp_path, overlay: dict, *targets):
    import yaml

    from tests.test_checkpoints import SNAKEMAKE

    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(overlay))
    return subprocess.run([SNAKEMAKE, *targets, "-n", "-p", "--cores", "1", "--directory", str(tmp_path / "work"),
                           "-s", str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config" / "config.yaml"),
                           str(path)], cwd=ROOT, capture_output=True, text=True)


def test_workflow_rejects_an_unknown_system_or_setting_at_start_up(tmp_path):
    out = _dry_run(tmp_path, {"evaluation": {"open_set_systems": ["npm", "lm_pmi"]}})
    message = out.stdout + out.stderr
    assert out.returncode != 0 and "open_set_systems: 'lm_pmi' is not a system for open-set tasks" in message
    out = _dry_run(tmp_path, {"inference": {"open_set_tau": 0}})  # the schema's range, equal to Settings'
    message = out.stdout + out.stderr
    assert out.returncode != 0 and "0 is less than or equal to the minimum of 0" in message
    assert "['inference']['open_set_tau']" in message


def test_workflow_passes_the_original_code_switches_to_the_evaluation(tmp_path):
    """inference.tau_twice / span_score reach `npm-repro evaluate` (the original's s/tau^2 without editing a rule)."""
    out = _dry_run(tmp_path, {"inference": {"tau_twice": True, "span_score": "code"}},
                   "results/metrics/agn/npm.json", "results/metrics/nq/bm25_lm.json")
    assert out.returncode == 0, out.stdout + out.stderr
    commands = [line for line in out.stdout.splitlines() if "npm-repro evaluate" in line]
    assert len(commands) == 2 and all("--tau-twice" in c and "--span-score code" in c for c in commands)
    nq = next(c for c in commands if "--system bm25_lm" in c)  # one job answers every task of bm25_lm on enwiki
    assert "--bm25 data/bm25/enwiki --blocks data/blocks/enwiki/shard0.npz" in nq and "--datastore" not in nq


# The original code's settings, as the paper routes pass them to each command (docs/paper-map.md, "The paper routes
# compute as the original code"): read from the plan, not from the config.
ORIGINAL_CODE_FLAGS = {
    "npm-repro evaluate": ("--tau-twice", "--span-score code", "--span-walk code", "--passages 3",
                           "--passage-text contents", "--kamel-prompt code", "--mlm-max-length 256",
                           "--translation-cut decoders", "--lama-average macro"),
    "npm-repro embed --step plan": ("--precision fp32", "--stopwords original"),
    "npm-repro build-faiss-index": ("--faiss-factory IVF4096,PQ64", "--faiss-metric l2", "--nprobe 8",
                                    "--faiss-train-draw code"),
    "npm-repro import-corpus": ("--word-boundaries code",),
}
ROUTE_FLAGS = {"paper.yaml": {"npm-repro tokenize-blocks": ("--word-boundaries code",)},  # it trains: blocks of text
               "released.yaml": {}}


def test_blocks_for_another_model_s_tokenizer_keep_the_text_rule(tmp_path):
    """Before: the blocks DensePhrases re-tokenizes for its own encoder inherited `data.word_boundaries: code` from
    rule tokenize_blocks, which SpanBERT's WordPiece tokenizer cannot have (no token decodes with a leading space):
    every DensePhrases job of config/paper.yaml would have failed. The rule is NPM's; other encoders read the text."""
    from tests.test_checkpoints import SNAKEMAKE

    out = subprocess.run([SNAKEMAKE, "all", "-n", "-p", "--cores", "1", "--directory", str(tmp_path), "-s",
                          str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config" / "paper.yaml")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if "npm-repro tokenize-blocks" in line]
    npm = [line for line in lines if " --out data/blocks/" in line]
    other = [line for line in lines
             if " --out data/densephrases/blocks/" in line or " --out data/replug/blocks/" in line]
    assert npm and all("--word-boundaries code" in line for line in npm)
    assert other and all("--word-boundaries text" in line for line in other), other[:1]


def test_the_paper_route_plans_densephrases_with_the_original_codes_search(tmp_path):
    """Before: config/paper.yaml's DensePhrases evaluations answered with eq. 10's best phrase and its query-side
    fine-tuning chose the best epoch by the dev EM at k 100, where the code answers with the best of its
    search_phrase groups and evaluates the epochs at top_k 10, and asked NQ's lowercased questions as they are where
    the code truecases them (docs/paper-map.md §D1.7): the statistics are an input placed by hand. Its phrase model
    trained on SQuAD alone, where the code's run-rc trains on its generated questions first, then on SQuAD, and cut
    its training passages at 384 tokens, where the code reads them in windows every 128 tokens; its RC evaluation
    answered with spans of up to 30 tokens, unfiltered, where the code's reads up to 9 that its filter keeps."""
    from tests.test_checkpoints import SNAKEMAKE

    out = subprocess.run([SNAKEMAKE, "all", "-n", "-p", "--cores", "1", "--directory", str(tmp_path), "-s",
                          str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config" / "paper.yaml")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line.partition("Shell command: ")[2] for line in out.stdout.splitlines()]
    query_ft = [line for line in lines if line.startswith("npm-repro densephrases query-ft")]
    searches = [line for line in lines if line.startswith("npm-repro densephrases evaluate") and " --task " in line]
    assert query_ft and searches
    dist = "data/raw/densephrases/truecase/english_with_questions.dist"
    for line in query_ft:
        assert all(f" {flag} " in f" {line} " for flag in ("--search-form code", "--dev-k 10", "--objective code",
                                                           f"--truecase {dist}"))
    assert all(f" --search-form code --truecase {dist} " in f" {line} " for line in searches)
    assert f"rule densephrases_manual_file:\n    output: {dist}" in out.stdout
    generated = "data/raw/densephrases/squad/train-v1.1_qg_ents_t5large_3500_filtered.json"
    trains = [line for line in lines if line.startswith("npm-repro densephrases train ")]
    assert trains and all(f" --generated {generated} " in line and " --generated-first " in line for line in trains)
    assert f"rule densephrases_manual_file:\n    output: {generated}" in out.stdout
    teachers = [line for line in lines if line.startswith("npm-repro densephrases train-teacher ")]
    assert teachers and all(" --doc-stride 128 " in line for line in trains + teachers)  # the code's windows
    rc = [line for line in lines if line.startswith("npm-repro densephrases evaluate") and " --rc " in line]
    assert rc and all(" --doc-stride 128 " in line and " --rc-answer-tokens 9 " in line
                      and " --rc-filter-threshold -2.0 " in line for line in rc)  # the code's RC prediction


@pytest.mark.parametrize("name", ["released.yaml", "paper.yaml"])
def test_the_paper_routes_plan_every_evaluation_with_the_original_codes_settings(tmp_path, name):
    from tests.test_checkpoints import SNAKEMAKE

    out = subprocess.run([SNAKEMAKE, "results/check/paper.txt", "-n", "-p", "--cores", "1", "--directory",
                          str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config" / name)],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line.partition("Shell command: ")[2] for line in out.stdout.splitlines()]
    for command, flags in (ORIGINAL_CODE_FLAGS | ROUTE_FLAGS[name]).items():
        planned = [line for line in lines if line.startswith(command)]
        assert planned, f"{name}: no `{command}` job planned for results/check/paper.txt"
        for line in planned:
            missing = [flag for flag in flags if f" {flag} " not in f" {line} "]
            assert not missing, f"{name}: {missing} not in {line[:300]}"
