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


def parse_args(parser, argv: list[str]):
    """`parser.parse_args(argv)` with TRL's `--config FILE.yaml` for the commands that parse with argparse: the file's
    values are the defaults, the command line wins; a key the command does not have is an error that names it."""
    import yaml

    argv = list(argv)
    if "--config" in argv and "config" not in {action.dest for action in parser._actions}:
        at = argv.index("--config")
        if at + 1 >= len(argv):
            raise ValueError("--config needs a YAML file")
        path = argv[at + 1]
        del argv[at: at + 2]
        try:
            with open(path, encoding="utf-8") as f:
                config = yaml.safe_load(f)
        except OSError as e:
            raise ValueError(f"--config {path}: {e.strerror}") from None
        if not isinstance(config, dict):
            raise ValueError(f"--config {path}: expected a YAML mapping of option: value")
        actions = {action.dest: action for action in parser._actions}
        unknown = sorted(set(config) - set(actions))
        if unknown:
            raise ValueError(f"--config {path}: {', '.join(unknown)}: not an option of {parser.prog} "
                             f"({', '.join(sorted(k for k in actions if k != 'help'))})")
        for key in config:
            actions[key].required = False
        parser.set_defaults(**config)
    return parser.parse_args(argv)
