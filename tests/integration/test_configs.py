"""Every config in `recipes/` and `accelerate_configs/` loads, and every field in it exists: typos fail here, not
an hour into a GPU job."""

import json
import re
import subprocess

import pytest
import yaml
from helpers import ROOT, load_recipe

RECIPE_CONFIGS = sorted(p for p in (ROOT / "recipes").glob("*/*.yaml") if p.name != "ablation.yaml")
# A YAML is named after its recipe, but for the collaboration objective, which collab GRPO runs (`objective: collab`).
RECIPE_OF = {"collab_objective": "collab_grpo"}
ABLATION_CONFIGS = sorted((ROOT / "recipes").glob("*/ablation.yaml"))
ACCELERATE_CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))


def test_configs_are_found():
    assert {p.parent.name for p in RECIPE_CONFIGS} == {"qwen3.5-2b", "smollm2", "testbed"}
    assert {p.stem for p in RECIPE_CONFIGS} == {"collab_sft", "collab_dpo", "collab_grpo", "collab_objective"}
    assert len(ACCELERATE_CONFIGS) == 6
    assert {p.parent.name for p in ABLATION_CONFIGS} == {"qwen3.5-2b", "testbed"}


@pytest.mark.parametrize("path", RECIPE_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_config_fields_exist_and_parse(path, monkeypatch):
    parser = load_recipe(RECIPE_OF.get(path.stem, path.stem)).make_parser()
    config = yaml.safe_load(path.read_text())
    fields = {action.dest for action in parser._actions}
    unknown = sorted(set(config) - fields - {"env"})
    assert not unknown, f"{path}: unknown fields {unknown}"
    for key in config.get("env", {}):
        monkeypatch.delenv(key, raising=False)  # the parser sets them; restore afterwards
    # Parsing builds every dataclass, so values are checked too (choices, loss_scope, mine_source...). `use_cpu`
    # lets a bf16 GPU config build its TrainingArguments on this CPU machine.
    args = parser.parse_args_and_config(["--config", str(path), "--use_cpu", "true"])
    values = {k: getattr(a, k) for a in args for k in vars(a)}
    for key, value in config.items():
        if key != "env" and not isinstance(value, (list, dict)):
            assert str(values[key]).lower().endswith(str(value).lower()), (key, value, values[key])
    assert "wandb" in values["report_to"]


def test_qwen_configs_match_the_issue():
    for name in ("collab_sft", "collab_dpo", "collab_grpo"):
        config = yaml.safe_load((ROOT / "recipes" / "qwen3.5-2b" / f"{name}.yaml").read_text())
        assert (config["bf16"], config["lora_r"], config["lora_alpha"], config["gradient_checkpointing"]) == \
            (True, 32, 64, True)
        assert (config["probe_task"], config["probe_limit"], config["probe_temperatures"], config["probe_samples"]) \
            == ("gsm8k", 256, [0.0, 1.0], 4)
        assert config["report_to"] == ["wandb"] and config.get("probe_on_save", True)


# What the testbed taught (recipes/README.md) and the 2B YAMLs must carry: the selection rule, DPO's SFT term, the
# rewards' weights, the mining and collaboration choices. Sizes (steps, tokens, learning rates) differ on purpose.
LESSONS = {"collab_dpo": ("loss_type", "beta", "anchor_ratio", "mine_temperatures", "select_metric",
                          "select_max_accuracy_drop", "select_min_distinct"),
           "collab_grpo": ("loss_type", "beta", "reward_weights", "anchor_share", "prompt_setting", "temperature",
                           "select_metric", "select_max_accuracy_drop", "select_min_distinct"),
           "collab_objective": ("objective", "collab_families", "collab_max_turns", "collab_turn_cost", "anchor_share",
                                "reward_weights", "loss_type", "beta"),
           "collab_sft": ("loss_scope",)}


@pytest.mark.parametrize(("model", "name"), [("qwen3.5-2b", n) for n in sorted(LESSONS)] +
                         [("smollm2", "collab_objective")])
def test_real_model_configs_carry_what_the_testbed_taught(model, name):
    testbed, other = (yaml.safe_load((ROOT / "recipes" / d / f"{name}.yaml").read_text()) for d in ("testbed", model))
    differ = {k: (testbed.get(k), other.get(k)) for k in LESSONS[name] if testbed.get(k) != other.get(k)}
    assert not differ, f"recipes/{model}/{name}.yaml departs from the testbed's measured choice: {differ}"


@pytest.mark.parametrize("path", [p for p in RECIPE_CONFIGS if p.stem == "collab_dpo"], ids=lambda p: p.parent.name)
def test_the_mine_command_a_yaml_shows_mines_its_pairs(path):
    """"Mine once, train several": the `uturn mine` line in a DPO YAML's header gives the YAML's own mining fields."""
    from uturn_train.commands.mine import make_parser

    commands = [line[line.index("uturn mine "):].strip("`") for line in path.read_text().splitlines()
                if "uturn mine " in line]
    assert commands, f"{path}: shows no `uturn mine` command"
    config = yaml.safe_load(path.read_text())
    for command in commands:
        _, mining = make_parser().parse_args_and_config(command.split()[2:])
        for key, value in config.items():
            if hasattr(mining, key):
                assert getattr(mining, key) == value, f"{path}: `{command}` mines {key}={getattr(mining, key)!r}, " \
                                                      f"the YAML trains on {value!r}"


@pytest.mark.parametrize("path", ABLATION_CONFIGS, ids=lambda p: p.parent.name)
def test_ablation_files_load_and_probe_every_run_alike(path, monkeypatch):
    from uturn_train.experiments.ablate import load_ablation

    monkeypatch.chdir(ROOT)  # the files' paths are relative to the repository root
    _, runs, _ = load_ablation(path)  # checks recipes, configs and every override against the recipe's parser
    assert {(r.recipe, json.dumps(r.knobs)) for r in runs} >= {
        ("collab_sft", '{"loss_scope": "assistant"}'), ("collab_sft", '{"loss_scope": "user"}'),
        ("collab_dpo", '{"loss_type": ["sigmoid"]}'), ("collab_dpo", '{"loss_type": ["sigmoid", "sft"]}')}
    assert all(r.config.startswith(f"recipes/{path.parent.name}/") for r in runs)
    # The report pairs runs prompt by prompt: every run must get the same probe.
    probes = {json.dumps({k: v for k, v in {**yaml.safe_load((ROOT / r.config).read_text()), **r.overrides}.items()
                          if k.startswith("probe_")}, sort_keys=True) for r in runs}
    assert len(probes) == 1, probes


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_config_fields_exist(path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    config = load_config_from_file(str(path))  # raises on unknown top-level keys
    assert config.distributed_type is not None
    # accelerate copies deepspeed_config keys onto its launch arguments: each must be one of them.
    launch_args = {action.dest for action in launch_command_parser()._actions}
    unknown = sorted(set(config.deepspeed_config or {}) - launch_args)
    assert not unknown, f"{path}: unknown deepspeed_config keys {unknown}"
    assert path.read_text().startswith("#"), f"{path}: say in a comment header how to launch with it"


def test_slurm_script_launches_files_that_exist():
    script = ROOT / "accelerate_configs" / "slurm_multi_node.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    # Every repository path it runs or reads (the defaults and the examples of its header): a renamed recipe, config
    # or accelerate file would leave a script that fails on the cluster, after the queue.
    named = set(re.findall(r"(?:recipes|accelerate_configs)/[\w./-]+\.(?:py|yaml|sh)", text))
    assert {"recipes/collab_dpo.py", "recipes/qwen3.5-2b/collab_dpo.yaml",
            "accelerate_configs/multi_node_zero3.yaml"} <= named
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"{script.name} names files that do not exist: {missing}"
