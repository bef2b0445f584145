"""`uturn ablate`: bad files fail before anything runs; dry run and SLURM script; and, on a tiny model, two runs end to
end, interrupted after the first, resumed without repeating it, with a failing run reported while the others go on."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT
from helpers.ablation import SFT, SLEEPER, group_alive, kill_leftovers, wait_for, write_ablation
from helpers.conversations import conversations

from uturn_train.commands.ablate import main
from uturn_train.experiments.ablate import load_ablation

DPO = str(ROOT / "recipes" / "testbed" / "collab_dpo.yaml")


@pytest.mark.parametrize(("run", "fields", "error"), [
    ({"recipe": "collab_ppo", "config": SFT}, {}, r"runs\[1\] \(collab_ppo\): field `recipe`: unknown recipe"),
    ({"recipe": "collab_dpo", "config": "nowhere/dpo.yaml"}, {},
     r"runs\[1\] \(collab_dpo\): field `config`: nowhere/dpo.yaml does not exist"),
    ({"recipe": "collab_dpo", "config": DPO, "overrides": {"lossype": ["sigmoid"]}}, {},
     (r"runs\[1\] \(collab_dpo\): field `overrides.lossype`: not an option of recipes/collab_dpo.py; did you "
      r"mean `loss_type`")),
    ({"recipe": "collab_dpo", "config": DPO, "overrides": {"loss_scope": "user"}}, {},
     r"field `overrides.loss_scope`: not an option of recipes/collab_dpo.py"),  # an SFT option
    ({"recipe": "collab_dpo", "config": DPO, "overrides": {"max_steps": "ten"}}, {},
     r"runs\[1\] \(collab_dpo\): field `overrides`: argument --max_steps.*invalid int value: 'ten'"),
    ({"recipe": "collab_dpo", "config": DPO, "overrides": {"output_dir": "x"}}, {},
     r"field `overrides.output_dir`: set by uturn ablate"),
    ({"recipe": "collab_sft", "config": SFT, "name": "first"}, {}, r"runs\[1\] \(first\): runs\[0\] has the name"),
    ({"recipe": "collab_dpo", "config": DPO, "seeds": [0, "one"]}, {},
     r"runs\[1\] \(collab_dpo\): field `seeds`: expected a non-empty list of integers"),
    ({"recipe": "collab_dpo", "config": DPO, "seeds": [0, True]}, {}, r"field `seeds`: expected a non-empty list"),
    ({"recipe": "collab_dpo", "config": DPO, "seeds": [0, 1, 0]}, {},
     r"runs\[1\] \(collab_dpo\): field `seeds`: seed\(s\) \[0\] given twice"),
    ({"recipe": "collab_dpo", "config": DPO, "overrides": {"seed": 3}}, {"seeds": [0, 1]},
     r"runs\[1\] \(collab_dpo\): field `seeds`: the overrides set `seed` too"),
    ({"recipe": "collab_dpo", "config": DPO}, {"seeds": 3}, r"ablation.yaml: field `seeds`: expected a non-empty list"),
    ({"recipe": "collab_dpo", "config": DPO}, {"seeds": []}, r"field `seeds`: expected a non-empty list"),
    ({"recipe": "collab_sft", "config": SFT, "name": "first", "seeds": [1]}, {"seeds": [0]},
     r"runs\[1\] \(first\): runs\[0\] has the name 'first' too"),
    ({"recipe": "collab_dpo", "config": DPO}, {"accelerate_config": str(ROOT / "accelerate_configs" /
                                                                     "multi_node_zero3.yaml")},
     r"field `accelerate_config`: .*spans 2 machines"),
    ({"recipe": "collab_dpo", "config": DPO}, {"group": "x"}, r"unknown field\(s\) \['group'\]"),
    ({"recipe": "collab_dpo", "config": DPO}, {"start_first": ["collab_sft-seed0"]},
     r"field `start_first`: expected a list of this file's run names .*the runs: \['collab_dpo', 'first'\]"),
], ids=["recipe", "config", "typo", "other-recipe", "value", "reserved", "duplicate", "seeds", "seeds-bool",
        "seeds-twice", "seeds-and-seed", "file-seeds", "file-seeds-empty", "same-name-other-seeds", "multi-node",
        "field", "start-first"])
def test_bad_files_fail_before_anything_runs(run, fields, error, tmp_path):
    path = write_ablation(tmp_path, [{"recipe": "collab_sft", "config": SFT, "name": "first"}, run], **fields)
    with pytest.raises(ValueError, match=error):
        main(["--config", str(path), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_names_dry_run_and_slurm_script(tmp_path, capsys):
    path = write_ablation(tmp_path, [
        {"recipe": "collab_sft", "config": SFT, "overrides": {"loss_scope": "user"}, "tags": ["sft"]},
        {"recipe": "collab_dpo", "config": DPO, "overrides": {"loss_type": ["sigmoid", "sft"], "beta": 0.2},
         "seeds": [0, 1]},
        {"recipe": "collab_dpo", "config": DPO, "name": "dpo-default"},
    ], common={"probe_limit": 50, "use_cpu": True})
    _, runs, _ = load_ablation(path, tmp_path / "out")
    assert [r.name for r in runs] == ["collab_sft-loss_scope-user", "collab_dpo-loss_type-sigmoid+sft-beta-0.2-seed0",
                                      "collab_dpo-loss_type-sigmoid+sft-beta-0.2-seed1", "dpo-default"]
    assert runs[1].knobs == {"loss_type": ["sigmoid", "sft"], "beta": 0.2}
    assert (runs[1].variant, runs[1].seed, runs[0].variant, runs[0].seed) == (
        "collab_dpo-loss_type-sigmoid+sft-beta-0.2", 0, "collab_sft-loss_scope-user", None)
    assert runs[1].command[-11:] == ["--probe_limit", "50", "--use_cpu", "true", "--loss_type", "sigmoid", "sft",
                                     "--beta", "0.2", "--seed", "0"]
    assert runs[0].env == {"WANDB_RUN_GROUP": "tiny-ablation", "WANDB_JOB_TYPE": "collab_sft-loss_scope-user",
                           "WANDB_TAGS": "test,sft"}

    main(["--config", str(path), "--out", str(tmp_path / "out"), "--dry_run"])
    printed = capsys.readouterr().out
    assert printed.count("accelerate launch --config_file") == 4 and not (tmp_path / "out").exists()
    assert f"--output_dir {tmp_path / 'out' / 'dpo-default'} --run_name dpo-default" in printed

    main(["--config", str(path), "--out", str(tmp_path / "out"), "--slurm"])
    script = tmp_path / "out" / "ablation.sbatch"
    text = script.read_text()
    assert "#SBATCH --array=0-3" in text and "--gres" not in text  # a CPU accelerate config asks for no GPU
    assert '--only "${RUNS[$SLURM_ARRAY_TASK_ID]}"' in text and "dpo-default" in text
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert f"sbatch --parsable {script}" in capsys.readouterr().out
    plan = json.loads((tmp_path / "out" / "ablation.json").read_text())
    assert [r["name"] for r in plan["runs"]] == [r.name for r in runs]
    with pytest.raises(ValueError, match="--only nope: no such run"):
        main(["--config", str(path), "--out", str(tmp_path / "out"), "--only", "nope"])

    # A run that finished with other settings (the file was edited since) is not skipped as if it were this one.
    marker = {"exit_code": 0, "command": "accelerate launch recipes/collab_dpo.py --max_steps 5", "wall_seconds": 1}
    (tmp_path / "out" / "dpo-default").mkdir()
    (tmp_path / "out" / "dpo-default" / "ablation_run.json").write_text(json.dumps(marker))
    with pytest.raises(ValueError, match=r"finished there with other settings.*\n  dpo-default: ran `accelerate"):
        main(["--config", str(path), "--out", str(tmp_path / "out")])
    marker["command"] = f"{' '.join(f'{k}={v}' for k, v in runs[3].env.items())} {shlex.join(runs[3].command)}"
    (tmp_path / "out" / "dpo-default" / "ablation_run.json").write_text(json.dumps(marker))
    main(["--config", str(path), "--out", str(tmp_path / "out"), "--dry_run"])
    assert "# [4/4] dpo-default (finished before: would be skipped)" in capsys.readouterr().out


TOY = """import argparse, sys
from pathlib import Path


def make_parser():
    parser = argparse.ArgumentParser()
    for flag in ("--config", "--output_dir", "--run_name", "--steps"):
        parser.add_argument(flag)
    parser.add_argument("--seed", type=int, default=42)
    return parser


if __name__ == "__main__":
    args = make_parser().parse_args()
    out = Path(args.output_dir)
    (out / "ran.txt").write_text(f"seed {args.seed}")
    sys.exit(1 if (out.parent / f"fail-{args.run_name}").exists() else 0)
"""


def test_seeds_give_one_folder_marker_and_array_task_per_run_and_seed(tmp_path, monkeypatch, capsys):
    """The file's seeds, replaced by a run's own; each (run, seed) is launched for real (a toy recipe), one seed fails,
    and the rerun redoes that one alone."""
    import uturn_train.experiments.ablation_file

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "toy.py").write_text(TOY)
    (tmp_path / "toy.yaml").write_text("steps: 1\n")
    monkeypatch.setattr(uturn_train.experiments.ablation_file, "RECIPES", recipes)
    toy = {"recipe": "toy", "config": str(tmp_path / "toy.yaml")}
    path = write_ablation(tmp_path, [{**toy, "overrides": {"steps": 2}}, {**toy, "name": "short", "seeds": [7]}],
                          seeds=[0, 1, 2])
    out = tmp_path / "out"
    _, runs, _ = load_ablation(path, out)
    assert [(r.name, r.variant, r.seed) for r in runs] == [
        ("toy-steps-2-seed0", "toy-steps-2", 0), ("toy-steps-2-seed1", "toy-steps-2", 1),
        ("toy-steps-2-seed2", "toy-steps-2", 2), ("short-seed7", "short", 7)]
    assert runs[1].command[-4:] == ["--steps", "2", "--seed", "1"] and runs[1].knobs == {"steps": 2}
    assert {r.env["WANDB_RUN_GROUP"] for r in runs} == {"tiny-ablation"}  # one group; the seed is in each config

    main(["--config", str(path), "--out", str(out), "--dry_run"])
    printed = capsys.readouterr().out
    assert "4 runs ((run, seed) pairs of 2 runs)" in printed
    assert "# [2/4] toy-steps-2-seed1 (run toy-steps-2, seed 1)\n" in printed
    assert printed.count("--seed") == 4 and not out.exists()
    main(["--config", str(path), "--out", str(out), "--slurm"])
    text = (out / "ablation.sbatch").read_text()
    assert "#SBATCH --array=0-3" in text
    assert "RUNS=(toy-steps-2-seed0 toy-steps-2-seed1 toy-steps-2-seed2 short-seed7)" in text
    plan = json.loads((out / "ablation.json").read_text())
    assert [(r["variant"], r["seed"]) for r in plan["runs"]] == [(r.variant, r.seed) for r in runs]

    (out / "fail-toy-steps-2-seed1").touch()
    with pytest.raises(SystemExit) as exited:
        main(["--config", str(path), "--out", str(out)])
    assert exited.value.code == 1
    markers = {r.name: json.loads((out / r.name / "ablation_run.json").read_text()) for r in runs}
    assert {n: (m["exit_code"], m["seed"], m["variant"]) for n, m in markers.items()} == {
        "toy-steps-2-seed0": (0, 0, "toy-steps-2"), "toy-steps-2-seed1": (1, 1, "toy-steps-2"),
        "toy-steps-2-seed2": (0, 2, "toy-steps-2"), "short-seed7": (0, 7, "short")}
    assert (out / "short-seed7" / "ran.txt").read_text() == "seed 7"
    kept = {n: (out / n / "ablation_run.json").stat().st_mtime_ns for n in markers}

    (out / "fail-toy-steps-2-seed1").unlink()
    capsys.readouterr()
    main(["--config", str(path), "--out", str(out), "--only", "toy-steps-2"])  # a run's name: all its seeds
    printed = capsys.readouterr().out
    assert "[1/3] toy-steps-2-seed0: finished before" in printed
    assert "[3/3] toy-steps-2-seed2: finished before" in printed
    assert "[2/3] toy-steps-2-seed1: an earlier attempt did not finish" in printed and "short" not in printed
    # One at a time, each run is said in the file's order, a finished one where it comes.
    assert printed.index("[1/3] toy-steps-2-seed0: finished before") < printed.index("[2/3] toy-steps-2-seed1: an") \
        < printed.index("[2/3] toy-steps-2-seed1: done") < printed.index("[3/3] toy-steps-2-seed2: finished before")
    assert json.loads((out / "toy-steps-2-seed1" / "ablation_run.json").read_text())["exit_code"] == 0
    assert {n: (out / n / "ablation_run.json").stat().st_mtime_ns for n in markers if n != "toy-steps-2-seed1"} == \
        {n: t for n, t in kept.items() if n != "toy-steps-2-seed1"}


def test_sigterm_stops_the_whole_run_and_leaves_no_marker(tmp_path):
    """A recipe that starts a grandchild and waits: SIGTERM (kill, scancel) to ablate ends all of them."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "sleeper.yaml").write_text("steps: 1\n")
    path = write_ablation(tmp_path, [{"recipe": "sleeper", "config": str(tmp_path / "sleeper.yaml")}])
    out = tmp_path / "out"
    wrapper = ("import sys; from pathlib import Path; import uturn_train.commands.ablate as a, "
               "uturn_train.experiments.ablation_file as c; c.RECIPES = Path(sys.argv[1]); a.main(sys.argv[2:])")
    log = tmp_path / "ablate.log"
    with open(log, "w") as f:
        cmd = [sys.executable, "-c", wrapper, str(recipes), "--config", str(path), "--out", str(out)]
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_for(lambda: (out / "sleeper" / "grandchild.pid").exists(), 120, "the grandchild", proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130, log.read_text()
    except BaseException:
        kill_leftovers(proc, log)
        raise
    child = int(re.search(r"sleeper: running \(pid (\d+)\)", log.read_text()).group(1))
    alive = group_alive(child)
    kill_leftovers(proc, log)
    assert not alive, "accelerate, the recipe and its grandchild must all be gone"
    assert not (out / "sleeper" / "ablation_run.json").exists()


@pytest.mark.slow
def test_interrupted_ablation_resumes_without_repeating_a_finished_run(tiny_qwen_dir, tmp_path):
    convs, gsm8k = tmp_path / "conversations.jsonl", tmp_path / "gsm8k.jsonl"
    rows = conversations(16)
    convs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = [{"question": r["messages"][0]["content"], "answer": r["messages"][1]["content"]} for r in rows[8:]]
    gsm8k.write_text("".join(json.dumps(p) + "\n" for p in problems))
    # tests/integration/test_recipes.py's tiny overrides, shared by every run (both are probed on the same 4 problems).
    common = {"model_name_or_path": str(tiny_qwen_dir), "probe_task": "gsm8k", "probe_labeler": "rules",
              "probe_data": str(gsm8k),
              "probe_limit": 4, "probe_samples": 2, "probe_max_new_tokens": 8, "probe_answer_max_new_tokens": 12,
              "max_steps": 2, "save_steps": 2, "logging_steps": 1, "per_device_train_batch_size": 2,
              "collab_source": "conversations", "collab_data": str(convs), "report_to": ["wandb"]}
    path = write_ablation(tmp_path, [
        {"recipe": "collab_sft", "config": SFT, "overrides": {"loss_scope": "assistant"}},
        {"recipe": "collab_sft", "config": SFT, "overrides": {"loss_scope": "user"}},
        # Passes the checks (a string is a string) and fails in the recipe: reported, the others go on.
        {"recipe": "collab_sft", "config": SFT, "name": "broken", "overrides": {"collab_data": str(tmp_path / "no")}},
    ], common=common)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "offline", "UTURN_HOME": str(tmp_path / "uturn_home"),
           **{var: str(tmp_path / "wandb") for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}}
    # Ctrl-C as in a terminal, even when pytest runs in the background of a script (which ignores SIGINT).
    main_with_sigint = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                        "from uturn_train.cli import main; main()")
    cmd = [sys.executable, "-c", main_with_sigint, "ablate", "--config", str(path), "--out", str(out)]
    first, second = out / "collab_sft-loss_scope-assistant", out / "collab_sft-loss_scope-user"

    log = tmp_path / "ablate-1.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (first / "ablation_run.json").exists(), 600, "the first run's marker", proc, log)
        pid = re.compile(r"\[2/3\] collab_sft-loss_scope-user: running \(pid (\d+)\)")
        wait_for(lambda: pid.search(log.read_text()), 60, "the second run to start", proc, log)
        time.sleep(3)  # well inside the second run (its imports take longer)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=60) == 130, log.read_text()
    except BaseException:
        kill_leftovers(proc, log)
        raise
    child = int(pid.search(log.read_text()).group(1))
    alive = group_alive(child)
    kill_leftovers(proc, log)
    assert not alive, "the interrupted run's processes must be gone"
    assert "interrupted; its processes were stopped and no marker written" in log.read_text()
    assert not (second / "ablation_run.json").exists() and not (out / "broken").exists()
    marker = json.loads((first / "ablation_run.json").read_text())
    assert marker["exit_code"] == 0 and marker["knobs"] == {"loss_scope": "assistant"}
    assert marker["wall_seconds"] > 0 and "--loss_scope assistant" in marker["command"]
    kept = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in
            (first / "ablation_run.json", first / "train.log", first / "probe_history.jsonl")}

    rerun = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    printed = rerun.stdout + rerun.stderr
    assert rerun.returncode == 1, printed  # the broken run failed
    assert "[1/3] collab_sft-loss_scope-assistant: finished before" in printed
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in kept} == kept, "the finished run was repeated"
    assert "an earlier attempt did not finish; its folder moved to" in printed
    assert len(list((out / ".partial").glob("collab_sft-loss_scope-user-*"))) == 1
    assert json.loads((second / "ablation_run.json").read_text())["exit_code"] == 0
    assert [r["step"] for r in map(json.loads, (second / "probe_history.jsonl").read_text().splitlines())] == [0, 2]
    assert "[3/3] broken: FAILED (exit 1)" in printed and "Last lines of" in printed
    assert json.loads((out / "broken" / "ablation_run.json").read_text())["exit_code"] == 1

    report = json.loads((out / "report.json").read_text())
    assert [(r["name"], r["recipe"], r["knobs"], r["status"]) for r in report["runs"]] == [
        ("collab_sft-loss_scope-assistant", "collab_sft", {"loss_scope": "assistant"}, "done"),
        ("collab_sft-loss_scope-user", "collab_sft", {"loss_scope": "user"}, "done")]
    assert report["runs"][0]["wall_seconds"] == marker["wall_seconds"]
    assert report["missing_runs"] == [{"name": "broken", "exit_code": 1}]
    between = report["comparisons"][-1]
    assert between["a"]["run"] != between["b"]["run"] and between["rates"][0]["n_prompts"] == 4
    assert (out / "pareto.png").exists() and "| collab_sft-loss_scope-user | collab_sft | loss_scope=user | done |" \
        in (out / "report.md").read_text()

    # W&B: one group for the ablation, the file's tags, the run names.
    from helpers.wandb_records import read_records

    seen = set()
    for run_dir in (tmp_path / "wandb" / "wandb").glob("offline-run-*"):
        for record in read_records(next(run_dir.glob("run-*.wandb"))):
            if record.WhichOneof("record_type") == "run":
                seen.add((record.run.display_name, record.run.run_group, tuple(record.run.tags)))
    # Without `seeds` the folders carry no seed; the W&B names do, as every recipe run's (the YAML's seed 0)
    assert {("collab_sft-loss_scope-assistant-seed0", "tiny-ablation", ("test",)),
            ("collab_sft-loss_scope-user-seed0", "tiny-ablation", ("test",))} <= seen
