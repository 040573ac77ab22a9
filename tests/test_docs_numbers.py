"""The numbers the README and docs state about a run are the measured ones, each stated once: the wandb runs a demo
leaves (counted in the workflow's own plan), the demo's time (docs/demo-timings.md's measured runs), the full
route's pretraining cost (docs/paper-scale.md §7's measurement), the REPLUG job times and label_knn's time (only in
their measurement files)."""

import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
TIMINGS = (ROOT / "docs" / "demo-timings.md").read_text(encoding="utf-8")
PAPER_SCALE = (ROOT / "docs" / "paper-scale.md").read_text(encoding="utf-8")
TRAININGS = ("npm-repro train ", "densephrases train", "densephrases query-ft", "replug train-lsr")


def _tracked_jobs(workdir: Path) -> Counter:
    """{(control or not, kind): jobs} of the demo's plan (`make demo`: the default target, then negative_control)
    whose command starts a wandb run (`--tracking wandb`: one run per command, npm.tracking.from_args)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "-d", str(workdir), "--configfile",
                          str(ROOT / "config" / "config.yaml"), "-n", "-p", "all", "negative_control"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    counts = Counter()
    for line in out.stdout.splitlines():
        if not line.startswith("Shell command: ") or "--tracking wandb" not in line:
            continue
        kind = ("report" if " report " in line else "training" if any(t in line for t in TRAININGS)
                else "evaluation")
        counts["control" if "results/control/" in line else "demo", kind] += 1
    return counts


def test_the_wandb_runs_the_readme_counts_are_the_tracked_jobs_of_the_demo_s_plan(tmp_path):
    """Before: "61 runs" (the 6 report runs missing); the demo leaves 67."""
    stated = re.search(r"A `make demo` leaves one run per tracked job, (\d+) in all: (\d+) trainings, (\d+) "
                       r"evaluations\s+and (\d+) reports .*? from `snakemake`, (\d+) negative-control evaluations",
                       README, flags=re.S)
    assert stated, "README: the sentence on the wandb runs a make demo leaves"
    total, trainings, evaluations, reports, control = map(int, stated.groups())
    jobs = _tracked_jobs(tmp_path)
    assert jobs == {("demo", "training"): trainings, ("demo", "evaluation"): evaluations,
                    ("demo", "report"): reports, ("control", "evaluation"): control}
    assert total == sum(jobs.values())


def _measured_demo_minutes() -> list[float]:
    """docs/demo-timings.md's table of measured `make demo` runs, those with other heavy jobs beside them left out."""
    rows = re.findall(r"^\| [^|]+ \| [^|]+ \| (?:about )?([0-9.]+) \| ([^|]+) \|$", TIMINGS, flags=re.M)
    assert len(rows) >= 2, "docs/demo-timings.md: the table of measured make demo runs"
    return [float(minutes) for minutes, loaded in rows if loaded.strip() != "yes"]


def test_the_readme_s_demo_time_is_the_range_of_the_measured_runs():
    """Before: "about 25 minutes" twice; runs took 25.6, 46 and 49 minutes."""
    stated = re.findall(r"`make demo` takes (\d+)-(\d+) minutes", README)
    assert len(stated) == 1, "README states the demo time once"
    minutes = _measured_demo_minutes()
    assert (int(stated[0][0]), int(stated[0][1])) == (5 * math.floor(min(minutes) / 5), 5 * math.ceil(max(minutes) / 5))
    assert not re.search(r"about \d+ min", README.split("## Three routes")[1].split("\n## ")[0])  # the table: above


def test_the_full_route_s_pretraining_cost_is_paper_scale_s_measurement():
    """Before: "about 50" in the table of routes, "50-80" two sections below."""
    measured = re.search(r"(\d+) at \d+ \(`config/paper\.yaml`", PAPER_SCALE)
    assert measured, "docs/paper-scale.md §7: the pretraining H100-hours of config/paper.yaml"
    stated = re.findall(r"(\d+(?:-\d+)?) H100-hours per model", README)
    assert stated == [measured.group(1)]
    assert re.findall(r"≈ (\d+) H100-hours measured", PAPER_SCALE) == [measured.group(1)]  # §6's table row


def test_job_times_are_stated_in_the_timings_file_only():
    """Before: REPLUG's LSR and LM evaluation were 4.4 / 5.9 min in the README and 3.6 / 4.7 in
    docs/demo-timings.md; label_knn "14 s" in docs/expected-numbers.md (1 min 42 s measured)."""
    assert not re.search(r"Job times?:? [^.]*\d+(\.\d+)? min", README)
    parts = re.findall(r"^\| ([^|]+) \| \d* \| ([0-9.]+) min \(([0-9., ]+)\) \|$", TIMINGS, flags=re.M)
    assert any(part.startswith("REPLUG") for part, _, _ in parts), "docs/demo-timings.md: REPLUG's job times"
    for part, total, jobs in parts:
        assert abs(sum(map(float, jobs.split(","))) - float(total)) <= 0.15, part  # each part's total is its jobs'
    expected = (ROOT / "docs" / "expected-numbers.md").read_text(encoding="utf-8")
    line = next(x for x in expected.splitlines() if "benchmarks/label_knn.py" in x and "#" in x)
    assert not re.search(r"\d+ (s|min)\b", line), line
    assert '"seconds": seconds' in (ROOT / "benchmarks" / "label_knn.py").read_text()  # the file has its time


# Every time or rate the README states, and where it is checked: a new one fails here until it has a check.
README_TIMES = re.compile(r"(\d[\d.,]*(?:-\d[\d.]*)?) ?(s|ms|min|minutes|seconds|hours|H100-hours|V100-hours|"
                          r"questions/s|queries/s|tokens/s|step/s)\b")
CHECKED_README_TIMES = {
    "25-70 minutes": "test_the_readme_s_demo_time_is_the_range_of_the_measured_runs",
    "30 s": "test_settings_the_readme_states_are_the_code_s",
    "1.21 step/s": "test_settings_the_readme_states_are_the_code_s",  # the example progress line
    "11 H100-hours": "test_the_released_route_s_embedding_cost_follows_paper_scale_s",
    "50 H100-hours": "test_the_full_route_s_pretraining_cost_is_paper_scale_s_measurement",
    "46 V100-hours": "test_the_released_route_s_embedding_cost_follows_paper_scale_s",
    "2 H100-hours": "test_the_released_route_s_embedding_cost_follows_paper_scale_s",
    "20 s": "test_settings_the_readme_states_are_the_code_s",
    "13.6 questions/s": "the DensePhrases paper's number, not a run of ours",
}


def test_every_time_the_readme_states_is_checked():
    """A time or rate in the README goes stale silently unless a test holds it to a measurement or the code."""
    stated = {" ".join(m.groups()) for m in README_TIMES.finditer(README)}
    assert stated <= set(CHECKED_README_TIMES), sorted(stated - set(CHECKED_README_TIMES))
    for claim, check in CHECKED_README_TIMES.items():
        assert claim in stated, f"{claim!r} is no longer in the README: drop it from CHECKED_README_TIMES"
        assert not check.startswith("test_") or check in globals(), check


def test_settings_the_readme_states_are_the_code_s():
    from npm.progress import SUMMARY_EVERY_S
    from npm.tracking import INIT_TIMEOUT

    assert f"every {SUMMARY_EVERY_S:.0f} s, one line per" in README
    assert f"no answer from the server within {INIT_TIMEOUT:.0f} s" in README
    example = re.search(r"```text\n(progress train npm: .*)\n```", README)
    assert example and re.fullmatch(r"progress train npm: \d+/300 step \(\d+%\), [0-9.]+ step/s, ETA \d\d:\d\d",
                                    example.group(1)), "the README's example progress line has the format of one"


def test_the_released_route_s_embedding_cost_follows_paper_scale_s():
    """The README's released-route embedding cost is two models' worth of docs/paper-scale.md's per-model figures
    (NPM and NPM-single each embed their datastores), and fp16's from its measured rate."""
    per_model_v100 = float(re.search(r"Per model: .*?\*\*≈ ([0-9.]+) V100-h\*\*", PAPER_SCALE).group(1))
    per_model_fp32 = float(re.search(r"so ≈ ([0-9.]+) H100-hours per model, an estimate", PAPER_SCALE).group(1))
    rate = float(re.search(r"\*\*0\.6 H100-hours\*\* \| (\d+)k tokens/s", PAPER_SCALE).group(1)) * 1e3
    assert f"about {round(2 * per_model_v100)} V100-hours of embedding" in README
    fp32 = round(2 * per_model_fp32)
    assert f"about {fp32} H100-hours of embedding" in README and f"(`datastore.precision: fp32`) about {fp32} " \
        f"H100-hours" in README
    tokens, stated_rate = re.search(r"takes about \d+ H100-hours at the rate measured on one H100, ([0-9.]+)B tokens "
                                    r"at (\d+)k tokens/s", README).groups()
    assert abs(int(stated_rate) * 1e3 - rate) / rate < 0.05
    assert f"takes about {round(float(tokens) * 1e9 / rate / 3600)} H100-hours" in README


def test_the_demo_s_job_time_table_is_its_measurement(tmp_path):
    """docs/demo-timings.md's job-time table is `benchmarks/demo_timings.py`'s rendering of the run it names, kept in
    docs/demo-timings.json (each job's start and seconds from that run's Snakemake logs); the script reads such logs
    back to the same jobs."""
    import json

    from tests.conftest import load_benchmark

    demo_timings = load_benchmark("demo_timings")
    measured = json.loads((ROOT / "docs" / "demo-timings.json").read_text(encoding="utf-8"))
    assert demo_timings.table(measured) in TIMINGS
    assert f"at {measured['commit']}" in TIMINGS
    log = "\n".join(f"[{time}]\nlocalrule {rule}:\n    wildcards: model=npm\n    jobid: {i}\n[{end}]\n"
                    f"Finished jobid: {i} (Rule: {rule})" for i, (rule, time, end) in enumerate(
                        [("pretrain", "Sun Nov 29 12:29:49 2026", "Sun Nov 29 12:59:50 2026"),
                         ("embed_shard", "Sun Nov 29 13:00:00 2026", "Sun Nov 29 13:00:35 2026")]))
    jobs = demo_timings.parse_log(log)
    assert [(j["rule"], j["wildcards"], j["seconds"]) for j in jobs] == [("pretrain", "model=npm", 1801.0),
                                                                         ("embed_shard", "model=npm", 35.0)]
