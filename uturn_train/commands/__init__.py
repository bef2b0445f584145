"""The `uturn` commands, one module each: `make_parser()` and `main(argv)`, which turns model names into folders
(`uturn_train.zoo.resolve`) and runs the command; `uturn_train/cli.py` only dispatches to them, as TRL's CLI does to
its scripts."""

COMMANDS = ("probe", "classify", "testbed", "mine", "agreement", "ablate", "report", "validate", "collab", "plan",
            "judge")
