"""The `uturn` commands, one module each: `make_parser()` and `main(argv)`, which turns model names into folders
(`uturn_train.zoo.resolve`) and runs the command; `uturn_train/cli.py` only dispatches to them, as TRL's CLI does to
its scripts."""

# TRL's spellings, accepted beside the commands' own `--model` and `--out` (the recipes take only TRL's)
MODEL_ALIASES = ["--model_name_or_path", "--model-name-or-path"]
OUTPUT_ALIASES = ["--output_dir", "--output-dir"]
COMMANDS = ("probe", "classify", "testbed", "mine", "agreement", "ablate", "report", "validate", "collab", "plan",
            "judge")


def dashed_aliases(parser):
    """Accepts `--dry-run` for `--dry_run` (and so on, sub-commands included), as TRL's parser does for the other
    commands: one spelling rule across `uturn`, whichever parser a command uses."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                dashed_aliases(sub)
        for option in list(action.option_strings):
            alias = option.replace("_", "-")
            if option.startswith("--") and alias != option and alias not in parser._option_string_actions:
                action.option_strings.append(alias)
                parser._option_string_actions[alias] = action
    return parser
