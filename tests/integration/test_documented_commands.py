"""Every command's `--help` works, and every command line the docs show uses only flags that exist: `uturn <command>`
and `recipes/<recipe>.py` in the READMEs, docs/, the recipes' docstrings and the YAMLs' headers (issue 38)."""

import argparse
import importlib
import re

import pytest
from helpers import ROOT, load_recipe

from uturn_train.cli import main
from uturn_train.commands import COMMANDS

DOCUMENTS = sorted([ROOT / "README.md", ROOT / "recipes" / "README.md", *(ROOT / "docs").glob("*.md"),
                    *(ROOT / "recipes").glob("*.py"), *(ROOT / "recipes").glob("*/*.yaml"),
                    *(ROOT / "accelerate_configs").glob("*.sh"), ROOT / "uturn_train" / "cli.py"])
UTURN = re.compile(r"\buturn (" + "|".join(COMMANDS) + r")\b([^`\n|;&)#]*)")
RECIPE = re.compile(r"\brecipes/(collab_\w+)\.py\b([^`\n|;&)#]*)")
FLAG = re.compile(r"(?<![\w\[-])--([a-zA-Z][\w-]*)")


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings of a parser and of its sub-commands, without the dashes."""
    flags = set()
    for action in parser._actions:
        flags |= {s.lstrip("-") for s in action.option_strings}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _flags(sub)
    return flags


def _known(kind: str, name: str) -> set[str]:
    if kind == "recipe":
        return _flags(load_recipe(name).make_parser()) | {"config"}
    flags = _flags(importlib.import_module(f"uturn_train.commands.{name}").make_parser())
    if name == "plan":  # plus any recipe field, as `--key value` overrides
        from uturn_train.commands.plan import defaults

        flags |= {k for recipe in ("sft", "dpo", "grpo") for k in defaults(recipe)}
    return flags


def documented_commands() -> list[tuple[str, str, str, str]]:
    """(file, kind, name, arguments) of every command line shown; a line ending in `\\` goes on."""
    found = []
    for path in DOCUMENTS:
        text = re.sub(r"\\\n\s*#?\s*", " ", path.read_text(encoding="utf-8"))
        for kind, pattern in (("uturn", UTURN), ("recipe", RECIPE)):
            for match in pattern.finditer(text):
                found.append((str(path.relative_to(ROOT)), kind, match.group(1), match.group(2)))
    return found


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_a_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0 and "usage: uturn" in capsys.readouterr().out


def test_the_docs_show_only_flags_that_exist():
    commands = documented_commands()
    assert len(commands) > 100, "the docs' command lines are no longer found"
    known, wrong = {}, []
    for where, kind, name, arguments in commands:
        flags = known.setdefault((kind, name), _known(kind, name))
        wrong += [f"{where}: {'uturn ' if kind == 'uturn' else 'recipes/'}{name} --{flag}"
                  for flag in FLAG.findall(arguments) if flag not in flags]
    assert not wrong, "flags that do not exist:\n" + "\n".join(sorted(set(wrong)))


def test_a_misspelt_flag_in_the_docs_would_fail():
    flags = _known("uturn", "probe")
    assert "out" in flags and "output_dir" in flags and "model_name_or_path" in flags
    assert not set(FLAG.findall(" --temperatures 0 1.0 --outt x")) <= flags


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_takes_dashes_for_underscores(command):
    """`--dry-run` as `--dry_run`: TRL's parser takes both, so the plain-argparse commands do too."""
    parser = importlib.import_module(f"uturn_train.commands.{command}").make_parser()
    flags = _flags(parser)
    missing = [f for f in flags if "_" in f and f.replace("_", "-") not in flags]
    assert not missing, f"uturn {command}: no dashed spelling for {missing}"


def test_argparse_commands_read_a_yaml_as_trl_commands_do(tmp_path):
    from uturn_train.commands import parse_args
    from uturn_train.commands.classify import make_parser

    config = tmp_path / "classify.yaml"
    config.write_text("input: turns.jsonl\noutput: labelled.jsonl\nlabeler: trained\n")
    args = parse_args(make_parser(), ["--config", str(config), "--labeler", "rules"])
    assert (args.input, args.output, args.labeler) == ("turns.jsonl", "labelled.jsonl", "rules")  # the line wins
    config.write_text("input: turns.jsonl\noutput: labelled.jsonl\nlabler: trained\n")
    with pytest.raises(ValueError, match="labler: not an option of uturn classify"):
        parse_args(make_parser(), ["--config", str(config)])
    with pytest.raises(ValueError, match="no-such.yaml"):
        parse_args(make_parser(), ["--config", str(tmp_path / "no-such.yaml")])
