"""`npm-repro --help`: every option of every subcommand says what it is, and `--help` shows its default."""

from __future__ import annotations

import argparse

import pytest

from npm.cli import build_parser


def _subcommands(parser: argparse.ArgumentParser, prefix: str = "npm-repro"):
    """(name, parser) of ``parser`` and of every subcommand below it, depth first."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{prefix} {name}")


def _options(parser: argparse.ArgumentParser):
    """Every argument of ``parser`` but -h/--help and the subcommand selector."""
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        yield action


@pytest.fixture(scope="module")
def commands():
    return list(_subcommands(build_parser()))


def test_every_subcommand_is_walked(commands):
    names = {name.split()[-1] for name, _ in commands}
    for command in ("train", "mask-batches", "embed", "build-faiss-index", "predict", "evaluate", "report"):
        assert command in names


def test_every_option_has_help(commands):
    missing = [f"{name}: {'/'.join(action.option_strings) or action.dest}"
               for name, parser in commands for action in _options(parser)
               if not (action.help and action.help.strip()) or action.help == argparse.SUPPRESS]
    assert not missing, "options without a help text:\n" + "\n".join(missing)


def test_help_shows_the_defaults(commands):
    wrong = [name for name, parser in commands
             if not issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter)]
    assert not wrong, f"--help of these does not show the defaults: {wrong}"
    parsers = dict(commands)
    mask = parsers["npm-repro mask-batches"].format_help()
    assert "(default: 0.15)" in mask and "(default: 128)" in mask and "15%" in mask
    train = " ".join(parsers["npm-repro train"].format_help().split())
    assert "(default: 100000)" in train and "(default: half)" in train


def test_help_cites_the_paper_not_a_reference_document(commands):
    for name, parser in commands:
        text = parser.format_help()
        assert "npm.md" not in text, name
        assert "reference 2" not in text and "reference 3" not in text, name


def test_help_runs(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["train", "--help"])
    assert e.value.code == 0
    assert "--checkpoint-every" in capsys.readouterr().out


def test_options_are_declared_as_data_and_handed_to_argparse_in_one_place():
    """Every command is an npm.options.Command whose options are data (a config section's come from its settings
    dataclass): only npm.options and npm.settings call argparse's add_argument, so a shared option (--summary, --out,
    --seed, ...) is written once and a setting's flag, default and help cannot drift apart."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "npm"
    callers = sorted(str(path.relative_to(root.parent)) for path in root.rglob("*.py")
                     if any(isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                            for node in ast.walk(ast.parse(path.read_text()))))
    assert callers == ["npm/options.py", "npm/settings.py"]


def test_adapting_a_shared_option_leaves_it_unchanged():
    from npm.options import OUT, SEED

    assert OUT(help="blocks .npz").spec["help"] == "blocks .npz" and OUT.spec["help"] == "the output"
    assert SEED(default=1).spec == {**SEED.spec, "default": 1} and SEED.spec["default"] == 0
