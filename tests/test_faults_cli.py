"""Faults of the command line and of the JSON writers (issue 12, item 4; the CLI side of item 8).

* An out-of-range numeric option (``predict --open-set-tau 0``, ``embed --batch-blocks 0``, ``mask-batches --ratio 2``
  ...) is rejected by argparse before any work: exit status 2 and a usage error naming the option. The range of an
  option that is also an inference setting comes from ``npm.settings``; the range of an option that a config key
  feeds agrees with workflow/schemas/config.schema.yaml.
* No file holds NaN or Infinity: the JSON writers of ``npm.io`` refuse a non-finite number with a ValueError naming
  the file and the key path, and leave the target untouched.
* A full disk (ENOSPC, EDQUOT, EFBIG) ends a command with one ``npm-repro CMD: error: no space left on device ...``
  line and exit status 1; ``npm.io.preallocate`` reserves the bytes of a file up front, or says it cannot.

The commands run for real (``npm.cli.main``) with dummy paths: a rejected value never reaches the paths.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml

from npm import cli, settings
from npm.baselines import smollm2
from npm.io import write_jsonl, write_summary

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())

# The required arguments of each subcommand, with dummy values (never read: parsing fails first).
BASE = {
    "prepare-embedded": ["prepare-embedded", "wikipedia", "--out", "o"],
    "download": ["download", "--url", "http://example.invalid/x", "--out", "o"],
    "extract-documents": ["extract-documents", "--format", "kilt", "--source", "s", "--out", "o"],
    "shard-documents": ["shard-documents", "--docs", "d", "--out-dir", "o", "--shards", "1"],
    "tokenize-blocks": ["tokenize-blocks", "--docs", "d", "--tokenizer", "t", "--out", "o"],
    "subsample-blocks": ["subsample-blocks", "--blocks", "b", "--percent", "50", "--out", "o"],
    "batch-blocks": ["batch-blocks", "--blocks", "b", "--out", "o"],
    "mask-batches": ["mask-batches", "--blocks", "b", "--batches", "c", "--out", "o"],
    "train": ["train", "--model", "npm", "--encoder", "e", "--blocks", "b", "--masked", "m", "--out", "o",
              "--checkpoint-dir", "c"],
    "embed": ["embed", "--checkpoint", "m", "--blocks", "b", "--out", "o"],
    "build-faiss-index": ["build-faiss-index", "--datastore", "d", "--out", "o"],
    "build-bm25-index": ["build-bm25-index", "--blocks", "b", "--out", "o"],
    "predict": ["predict", "--checkpoint", "m", "--datastore", "d", "Paris is the capital of <mask>."],
    "evaluate": ["evaluate", "--task", "nq", "--system", "npm", "--checkpoint", "m"],
    "replug texts": ["replug", "texts", "--articles", "a", "--corpus", "c", "--out", "o"],
    "replug queries": ["replug", "queries", "--articles", "a", "--corpus", "c", "--exclude", "e", "--out", "o"],
    "replug eval-lm": ["replug", "eval-lm", "--lm", "m", "--texts", "t", "--blocks", "b", "--out", "o"],
    "replug train-lsr": ["replug", "train-lsr", "--encoder", "e", "--lm", "m", "--blocks", "b", "--queries", "q",
                         "--out", "o", "--checkpoint-dir", "c"],
    "densephrases rc": ["densephrases", "rc", "--out-dir", "o"],
    "densephrases train": ["densephrases", "train", "--encoder", "e", "--train", "t", "--out", "o",
                           "--checkpoint-dir", "c"],
    "densephrases train-teacher": ["densephrases", "train-teacher", "--encoder", "e", "--train", "t", "--out", "o",
                                   "--checkpoint-dir", "c"],
    "densephrases dump": ["densephrases", "dump", "--checkpoint", "m", "--blocks", "b", "--out", "o"],
    "densephrases index": ["densephrases", "index", "--dump", "d", "--out", "o"],
    "densephrases evaluate": ["densephrases", "evaluate", "--checkpoint", "m", "--out", "o"],
    "densephrases query-ft": ["densephrases", "query-ft", "--checkpoint", "m", "--dump", "d", "--index", "i", "--train",
                              "t", "--out", "o"],
}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Run in a scratch folder, so that a value wrongly accepted writes nothing into the checkout."""
    monkeypatch.chdir(tmp_path)


def _argv(command: str, flag: str, value) -> list[str]:
    base = BASE[command]
    if command == "shard-documents" and flag == "--shards":
        base = base[:-2]
    if command == "subsample-blocks" and flag == "--percent":
        base = [a for i, a in enumerate(base) if a != "--percent" and base[i - 1] != "--percent"]
    return [*base, flag, str(value)]


def _rejected(capsys, argv: list[str]) -> str:
    """Run ``npm-repro ARGV``; it must stop in argparse with exit status 2. Returns stderr."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, f"npm-repro {' '.join(argv)} exited {info.value.code}, not 2:\n{err}"
    return err


def _accepted(argv: list[str]) -> None:
    cli.build_parser().parse_args(argv)  # parsing only: no work is done


# ------------------------------------------------------------------------------------------------ item 4: ranges

PREDICT_BAD = [("--open-set-tau", "0"), ("--open-set-tau", "-1"), ("--open-set-tau", "nan"), ("--open-set-tau", "inf"),
               ("--k", "0"), ("--k", "-3"), ("--l-max", "0"), ("--top", "0"), ("--evidence", "-1"),
               ("--span-score", "sum")]


@pytest.mark.parametrize(("flag", "value"), PREDICT_BAD)
def test_predict_rejects_out_of_range_options_before_any_work(capsys, flag, value):
    """Fault: `predict --open-set-tau 0` (or negative) got past the parser (exit 1 after starting, or NaN scores), and
    `--l-max 0`, `--top 0`, `--evidence -1` were not checked at all. Expected: argparse rejects each with exit
    status 2 and a usage error naming the option and the value."""
    err = _rejected(capsys, _argv("predict", flag, value))
    assert f"argument {flag}:" in err, err
    assert value in err, err


@pytest.mark.parametrize(("flag", "name", "bad"), [("--open-set-tau", "open_set_tau", 0.0), ("--k", "k", 0),
                                                    ("--span-score", "span_score", "sum")])
def test_predict_settings_ranges_come_from_npm_settings(capsys, flag, name, bad):
    """Fault: `predict` declared its own type and default for the options that are inference settings, so their
    range could drift from npm.settings. Expected: the message is settings.check's own, and the default is the
    Settings default."""
    with pytest.raises(ValueError) as info:
        settings.check(name, bad)
    err = _rejected(capsys, _argv("predict", flag, bad))
    assert str(info.value) in err, err
    args = cli.build_parser().parse_args(BASE["predict"])
    assert getattr(args, flag[2:].replace("-", "_")) == getattr(settings.Settings(), name)


# (subcommand, option, an out-of-range value): every numeric option of every subcommand
OTHER_BAD = [
    ("prepare-embedded", "--max-articles", -1),
    ("download", "--sha256", "xyz"),
    ("download", "--sha256", "A" * 64),
    ("extract-documents", "--limit", -1),
    ("shard-documents", "--shards", 0),
    ("shard-documents", "--shuffle-buffer", 0),
    ("tokenize-blocks", "--max-seq-length", 2),
    ("tokenize-blocks", "--max-seq-length", 5000),
    ("subsample-blocks", "--percent", 0),
    ("subsample-blocks", "--percent", 150),
    ("subsample-blocks", "--percent", "nan"),
    ("batch-blocks", "--batch-size", 1),
    ("mask-batches", "--ratio", 2),
    ("mask-batches", "--ratio", 0),
    ("mask-batches", "--p", 0),
    ("mask-batches", "--max-span-length", 0),
    ("mask-batches", "--max-spans-per-sequence", 0),
    ("mask-batches", "--max-ngram-repeats", 0),
    ("mask-batches", "--min-masked-ratio", 2),
    ("mask-batches", "--punct-keep-prob", -0.1),
    ("train", "--steps", 0),
    ("train", "--lr", -1),
    ("train", "--lr", "inf"),
    ("train", "--warmup-steps", -1),
    ("train", "--schedule-steps", -1),
    ("train", "--weight-decay", -1),
    ("train", "--grad-clip", 0),
    ("train", "--pad-to", -1),
    ("train", "--checkpoint-every", 0),
    ("embed", "--batch-blocks", 0),
    ("embed", "--shards", 0),
    ("embed", "--shard", -1),
    ("embed", "--max-length", -1),
    ("build-faiss-index", "--faiss-train-sample", 0),
    ("build-faiss-index", "--nprobe", 0),
    ("build-faiss-index", "--ef-search", 0),
    ("build-bm25-index", "--threads", 0),
    ("evaluate", "--n-samples", -1),
    ("evaluate", "--closed-set-tau", 0),
    ("evaluate", "--k", 0),
    ("evaluate", "--passages", 0),
    ("densephrases train", "--batch-size", 0),
    ("densephrases train", "--lr", 0),
    ("densephrases train", "--lambda-neg", -1),
    ("densephrases train", "--pre-batch", -1),
    ("densephrases dump", "--batch-blocks", 0),
    ("densephrases index", "--nprobe", 0),
    ("densephrases query-ft", "--k", 0),
    ("densephrases query-ft", "--epochs", 0),
]


@pytest.mark.parametrize(("command", "flag", "value"), OTHER_BAD)
def test_every_numeric_option_is_range_checked(capsys, command, flag, value):
    """Fault: the numeric options of the other subcommands took any int/float (`embed --batch-blocks 0`,
    `mask-batches --ratio 2`, `subsample-blocks --percent 150`, `download --sha256 xyz` ...), failing late (after
    loading models) or not at all. Expected: argparse rejects each with exit status 2, naming the option."""
    err = _rejected(capsys, _argv(command, flag, value))
    assert f"argument {flag}:" in err, err


# config key -> (subcommand, option): the keys of the config schema that a workflow rule passes to an option.
# ``*`` is any source; ``[]`` an item of the list. ``0 = null``: the rule passes a null key as 0 (= all / none).
SCHEMA_TO_CLI = {
    "sources.*.shards": ("shard-documents", "--shards"),
    "embedded.max_articles": ("prepare-embedded", "--max-articles"),
    "embedded.max_news": ("prepare-embedded", "--max-articles"),
    "embedded.max_reviews": ("prepare-embedded", "--max-articles"),
    "embedded.max_rc_subjects": ("densephrases rc", "--max-subjects"),
    "evaluation.max_examples": ("evaluate", "--n-samples"),
    "ablation.percents[]": ("subsample-blocks", "--percent"),
    "training.steps": ("train", "--steps"),
    "training.warmup_steps": ("train", "--warmup-steps"),
    "training.schedule_steps": ("train", "--schedule-steps"),
    "training.lr": ("train", "--lr"),
    "training.weight_decay": ("train", "--weight-decay"),
    "training.grad_clip": ("train", "--grad-clip"),
    "training.pad_to": ("train", "--pad-to"),
    "training.checkpoint_every": ("train", "--checkpoint-every"),
    "training.lines_per_rank": ("train", "--lines-per-rank"),
    "training.accumulate": ("train", "--accumulate"),
    "datastore.batch_blocks": ("embed", "--batch-blocks"),
    "datastore.shards": ("embed", "--shards"),
    "datastore.faiss_train_sample": ("build-faiss-index", "--faiss-train-sample"),
    "datastore.nprobe": ("build-faiss-index", "--nprobe"),
    "datastore.ef_search": ("build-faiss-index", "--ef-search"),
    "data.max_seq_length": ("tokenize-blocks", "--max-seq-length"),
    "data.batch_size": ("batch-blocks", "--batch-size"),
    "data.shuffle_buffer": ("shard-documents", "--shuffle-buffer"),
    "masking.ratio": ("mask-batches", "--ratio"),
    "masking.p": ("mask-batches", "--p"),
    "masking.max_span_length": ("mask-batches", "--max-span-length"),
    "masking.max_ngram_repeats": ("mask-batches", "--max-ngram-repeats"),
    "masking.min_masked_ratio": ("mask-batches", "--min-masked-ratio"),
    "masking.punct_keep_prob": ("mask-batches", "--punct-keep-prob"),
    "replug.n_texts": ("replug texts", "--n-texts"),
    "replug.max_chars": ("replug texts", "--max-chars"),
    "replug.k[]": ("replug eval-lm", "--k"),
    "replug.context_len": ("replug eval-lm", "--context-len"),
    "replug.pred_len": ("replug eval-lm", "--pred-len"),
    "replug.doc_len": ("replug eval-lm", "--doc-len"),
    "replug.temperature": ("replug eval-lm", "--temperature"),
    "replug.lsr.n_queries": ("replug queries", "--n-queries"),
    "replug.lsr.chars": ("replug queries", "--chars"),
    **{f"replug.lsr.{key}": ("replug train-lsr", f"--{key.replace('_', '-')}")
       for key in ("steps", "batch_size", "k", "gamma", "beta", "lr", "warmup_ratio", "refresh_every", "x_len",
                   "y_len", "doc_len", "checkpoint_every")},
    "densephrases.max_passage_tokens": ("densephrases train", "--max-passage-tokens"),
    "densephrases.max_question_tokens": ("densephrases train", "--max-question-tokens"),
    "densephrases.doc_stride": ("densephrases train", "--doc-stride"),
    "densephrases.rc_answer_tokens": ("densephrases evaluate", "--rc-answer-tokens"),
    "densephrases.nprobe": ("densephrases index", "--nprobe"),
    "densephrases.dump_max_tokens": ("densephrases dump", "--dump-max-tokens"),
    "densephrases.dump_stride": ("densephrases dump", "--dump-stride"),
    "densephrases.index_train_sample": ("densephrases index", "--index-train-sample"),
    "densephrases.refine_factor": ("densephrases evaluate", "--refine-factor"),
    **{f"densephrases.teacher.{key}": ("densephrases train-teacher", f"--{key.replace('_', '-')}")
       for key in ("epochs", "batch_size", "lr")},
    **{f"densephrases.train.{key}": ("densephrases train", f"--{key.replace('_', '-')}")
       for key in ("epochs", "pre_batch_epochs", "pre_batch", "batch_size", "lr", "lambda_single", "lambda_distill",
                   "lambda_neg", "lambda_filter")},
    **{f"densephrases.query_ft.{key}": ("densephrases query-ft", f"--{key.replace('_', '-')}")
       for key in ("epochs", "batch_size", "lr", "k", "dev_k")},
}
# read by the Snakefile, not by an npm-repro option: torchrun's process count, the datastores' disk-cost estimate
NO_CLI_OPTION = {"training.gpus_per_node", "sources.*.tokens"}
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
SCHEMA_TO_CLI.update({f"inference.{key}": ("evaluate", f"--{key.replace('_', '-')}")  # npm.settings.Settings
                      for key, node in SCHEMA["properties"]["inference"]["properties"].items()
                      if any(b in node for b in BOUNDS)})


def _schema_keys(node: dict, prefix: str = ""):
    """(key path, schema) of every key of the schema that has a bound."""
    if any(b in node for b in BOUNDS):
        yield prefix, node
    for name, sub in node.get("properties", {}).items():
        yield from _schema_keys(sub, f"{prefix}.{name}" if prefix else name)
    if isinstance(node.get("additionalProperties"), dict):
        yield from _schema_keys(node["additionalProperties"], f"{prefix}.*")
    if isinstance(node.get("items"), dict):
        yield from _schema_keys(node["items"], f"{prefix}[]")


def test_schema_ranges_and_cli_ranges_agree(capsys):
    """Fault: the config schema checked a key's range (datastore.batch_blocks >= 1, masking.ratio in (0, 1] ...)
    while the option the workflow passes it to took any value, so the two could disagree. Expected: for every key
    with a bound, the option rejects the values just outside it and accepts the bound itself (a nullable key that
    the rule passes as 0 keeps 0 as "null")."""
    bounded = dict(_schema_keys(SCHEMA))
    unmapped = sorted(set(bounded) - set(SCHEMA_TO_CLI) - NO_CLI_OPTION)
    assert not unmapped, f"schema keys with a range but no CLI option in SCHEMA_TO_CLI: {unmapped}"
    for key, (command, flag) in SCHEMA_TO_CLI.items():
        node = bounded[key]
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        integer, nullable = "integer" in kinds, "null" in kinds
        step = 1 if integer else 0.5
        outside, inside = [], []
        if "minimum" in node:
            low = node["minimum"]
            outside.append(low - step if not (nullable and low - step == 0) else -1)
            inside.append(low)
        if "exclusiveMinimum" in node:
            outside.append(node["exclusiveMinimum"])
        if "maximum" in node:
            outside.append(node["maximum"] + step)
            inside.append(node["maximum"])
        if "exclusiveMaximum" in node:
            outside.append(node["exclusiveMaximum"])
        if nullable:
            inside.append(0)
        for value in outside:
            err = _rejected(capsys, _argv(command, flag, value))
            assert f"argument {flag}:" in err, f"{key} = {value}: {err}"
        for value in inside:
            _accepted(_argv(command, flag, value))
        if "default" in node:  # the option's default is the key's (null: 0 or absent)
            given = getattr(cli.build_parser().parse_args(BASE[command]), flag[2:].replace("-", "_"))
            assert given in ((0, None) if node["default"] is None else (node["default"],)), (key, given)


def test_sha256_option_and_schema_pattern_agree(capsys):
    """Fault: `download --sha256 xyz` started the download and failed (or not) later; the schema checks
    sources.*.sha256 with a pattern. Expected: the option accepts exactly what the pattern accepts (and '' = not
    checked)."""
    import re

    pattern = SCHEMA["properties"]["sources"]["additionalProperties"]["properties"]["sha256"]["pattern"]
    good = "0123456789abcdef" * 4
    assert re.fullmatch(pattern, good)
    _accepted(_argv("download", "--sha256", good))
    _accepted(_argv("download", "--sha256", ""))
    for bad in ("xyz", good[:-1], good.upper(), good + "0"):
        assert not re.fullmatch(pattern, bad)
        err = _rejected(capsys, _argv("download", "--sha256", bad))
        assert "argument --sha256:" in err and "64" in err, err


def test_every_inference_setting_range_is_checked_by_evaluate(capsys):
    """Fault: `evaluate --closed-set-tau 0` wrote NaN scores. Expected: every setting with a minimum in
    npm.settings is rejected below it by `evaluate`, with the settings' own message."""
    checked = 0
    for name, f in settings.FIELDS.items():
        low = f.metadata["minimum"]
        if low is None:
            continue
        bad = low if f.metadata["exclusive"] else low - 1
        if f.default is None and bad == 0:  # a nullable setting reads 0 as null (npm.settings.arg_type)
            bad = -1
        err = _rejected(capsys, _argv("evaluate", "--" + name.replace("_", "-"), bad))
        assert f"setting {name} must be" in err, err
        checked += 1
    assert checked >= 6


# ------------------------------------------------------------------------------------------------ item 4: NaN


def test_write_jsonl_refuses_nan_naming_file_and_key(tmp_path):
    """Fault: write_jsonl wrote `NaN` (not JSON) into predictions files. Expected: ValueError naming the file, the
    record and the key path of the first non-finite number; the previous file stays as it was, no temporary."""
    out = tmp_path / "predictions.jsonl"
    write_jsonl(out, [{"id": 0, "score": 1.0}])
    before = out.read_bytes()
    records = [{"id": 1, "scores": [{"score": 0.5}, {"score": 0.1}, {"score": 0.2}, {"score": math.nan}]}]
    with pytest.raises(ValueError) as info:
        write_jsonl(out, records)
    message = str(info.value)
    assert str(out) in message and "scores[3].score" in message and "record 1" in message, message
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["predictions.jsonl"]
    new = tmp_path / "new.jsonl.gz"
    with pytest.raises(ValueError, match=r"new\.jsonl\.gz.*\binf\b"):
        write_jsonl(new, [{"a": {"b": [float("-inf")]}}])
    assert not new.exists() and [p.name for p in tmp_path.iterdir()] == ["predictions.jsonl"]


def test_write_summary_refuses_nan_naming_file_and_key(tmp_path):
    """Fault: write_summary (every metrics file, every .summary.json) wrote `NaN` / `Infinity`. Expected:
    ValueError naming the file and the key path; the target is not created."""
    import numpy as np

    out = tmp_path / "metrics.json"
    with pytest.raises(ValueError) as info:
        write_summary(out, {"task": "nq", "score": 10.0, "groups": {"1": 5.0, "2": float("nan")}})
    message = str(info.value)
    assert str(out) in message and "groups.2" in message and "nan" in message, message
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"metrics\.json.*score"):
        write_summary(out, {"score": np.float64("inf")})
    write_summary(out, {"score": 1.5})
    assert json.loads(out.read_text())["score"] == 1.5


def test_evaluate_print_refuses_nan():
    """Fault: `evaluate` without --metrics printed NaN scores and exited 0. Expected: the metrics JSON goes
    through the same finite-number check (a ValueError naming stdout and the key, exit status 1 from main)."""
    from npm.io import dumps_json

    with pytest.raises(ValueError, match=r"stdout.*score"):
        dumps_json({"score": math.nan}, "metrics (stdout)")
    assert json.loads(dumps_json({"score": 1.0}, "x")) == {"score": 1.0}


# ------------------------------------------------------------------------------------------------ item 8: disk full


def _fill(path_of_error):
    def command(*args, **kwargs):
        raise OSError(path_of_error[0], os.strerror(path_of_error[0]), path_of_error[1])

    return command


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_disk_full_ends_with_one_line(tmp_path, monkeypatch, capsys, code):
    """Fault: a full disk while writing an output ended in a Python traceback (or SIGBUS). Expected: one line
    `npm-repro CMD: error: no space left on device while writing FILE (...); free space or point --out elsewhere;
    finished work is kept`, exit status 1; -v adds the traceback."""
    target = tmp_path / "shard00001.npy"
    monkeypatch.setattr(smollm2, "convert_smollm2", _fill((code, str(target))))
    assert cli.main(["convert-smollm2", "--out", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    line = err.strip()
    assert line.startswith(f"npm-repro convert-smollm2: error: no space left on device while writing {target} ("), line
    assert os.strerror(code) in line and line.endswith("free space or point --out elsewhere; finished work is kept")
    monkeypatch.setattr(smollm2, "convert_smollm2", _fill((code, str(target))))
    assert cli.main(["-v", "convert-smollm2", "--out", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1] == line


def test_disk_full_from_a_real_write_names_the_output(tmp_path, monkeypatch, capsys):
    """Fault: a real ENOSPC from a write (no file name on the error, e.g. a flush; here /dev/full), also when a
    library re-raises it as another exception, ended in a traceback. Expected: the one-line message, naming the
    command's --out when the error carries no file name."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")

    def write_to_full_disk(*args, **kwargs):
        with open("/dev/full", "w") as f:
            f.write("x" * 10)

    def wrapped(*args, **kwargs):
        try:
            write_to_full_disk()
        except OSError as e:
            raise RuntimeError("saving the checkpoint failed") from e

    out = tmp_path / "model"
    for func in (write_to_full_disk, wrapped):
        monkeypatch.setattr(smollm2, "convert_smollm2", func)  # what the command calls
        assert cli.main(["convert-smollm2", "--out", str(out)]) == 1
        line = capsys.readouterr().err.strip()
        assert line.startswith(f"npm-repro convert-smollm2: error: no space left on device while writing {out}"), line
        assert "No space left on device" in line and "\n" not in line


def test_preallocate_reserves_the_bytes(tmp_path):
    """Fault: a memmap'd embedding file was a sparse file, so a full disk surfaced as SIGBUS on a later page write.
    Expected: preallocate(path or fd, n) makes the file n bytes long with its blocks allocated (not sparse)."""
    from npm.io import preallocate

    path = tmp_path / "vectors.npy"
    n = 3 * 1024 * 1024 + 17
    preallocate(path, n)
    st = path.stat()
    assert st.st_size == n and st.st_blocks * 512 >= n
    other = tmp_path / "other.bin"
    other.write_bytes(b"abc")
    fd = os.open(other, os.O_RDWR)
    try:
        preallocate(fd, 1 << 20)
    finally:
        os.close(fd)
    assert other.stat().st_size == 1 << 20 and other.read_bytes()[:3] == b"abc"
    preallocate(path, 10)  # never shrinks
    assert path.stat().st_size == n


def test_preallocate_beyond_free_space_is_enospc_with_the_file(tmp_path):
    """Fault: reserving more than the free space either filled the disk or was not noticed until SIGBUS.
    Expected: OSError ENOSPC (EFBIG past the largest file size) naming the file, without filling the disk; a file
    preallocate created is removed, an existing one keeps its size."""
    from npm.io import preallocate

    free = shutil.disk_usage(tmp_path).free
    path = tmp_path / "huge.npy"
    for size in (free + (1 << 30), 1 << 62):
        with pytest.raises(OSError) as info:
            preallocate(path, size)
        assert info.value.errno in (errno.ENOSPC, errno.EFBIG), info.value
        assert info.value.filename == str(path) and str(path) in str(info.value)
        assert not path.exists()
    path.write_bytes(b"x" * 100)
    with pytest.raises(OSError):
        preallocate(path, free + (1 << 30))
    assert path.stat().st_size == 100
    assert shutil.disk_usage(tmp_path).free > free - (1 << 30)  # nothing was left allocated
