"""benchmarks/suite_cpu.py, the measurement of where `make test`'s CPU goes: every Python process under the command
logs its own CPU, command line and test, and the summary sums them by test file and command."""

from __future__ import annotations

import sys

from tests.conftest import load_benchmark

PARENT = ("import subprocess, sys; sum(i * i for i in range(300000)); "
          "subprocess.run([sys.executable, sys.argv[1], '--flag'], check=True)")


def test_every_python_process_under_the_command_logs_its_cpu_command_and_test(tmp_path):
    bench = load_benchmark("suite_cpu")
    log = tmp_path / "processes.jsonl"
    (tmp_path / "child.py").write_text("sum(i * i for i in range(300000))\n")
    code, wall, cpu = bench.run_accounted([sys.executable, "-c", PARENT, str(tmp_path / "child.py")], log,
                                          cwd=tmp_path)
    records = bench.read_log(log)
    assert code == 0 and wall > 0
    parent, child = sorted(records, key=lambda r: r["argv"][0] != "-c")
    assert child["ppid"] == parent["pid"] and child["argv"] == [str(tmp_path / "child.py"), "--flag"]
    assert all(r["test"].startswith("tests/test_suite_cpu.py::") for r in records)  # inherited from this test
    summary = bench.summarise(records, cpu)
    assert summary["processes"] == 2
    assert set(summary["by_command"]) == {"python -c (pytest workers, helpers)", "child.py"}
    assert list(summary["by_file"]) == ["tests/test_suite_cpu.py"]
    assert 0 < summary["python_cpu_s"] <= summary["all_cpu_s"] + 0.1  # what the processes logged is part of it all


def test_commands_group_by_subcommand_and_step():
    command_of = load_benchmark("suite_cpu").command_of
    assert command_of(["/venv/bin/npm-repro", "evaluate", "--task", "nq"]) == "npm-repro evaluate"
    assert command_of(["/venv/bin/npm-repro", "densephrases", "dump", "--shard", "0"]) == "npm-repro densephrases dump"
    assert command_of(["/venv/bin/npm-repro", "embed", "--step", "plan", "--out", "x"]) == "npm-repro embed --step plan"
    assert command_of(["/venv/lib/python3.11/site-packages/snakemake/__main__.py", "--snakefile", "S"]) == "snakemake"
    assert command_of(["/venv/bin/snakemake", "all", "-n"]) == "snakemake"
