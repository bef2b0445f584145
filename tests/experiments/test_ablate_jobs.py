"""`uturn ablate --jobs N`: each run's share of the machine, runs at once with `start_first` first, and SIGTERM
stopping every run that is running."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT
from helpers.ablation import SFT, SLEEPER, group_alive, kill_leftovers, wait_for, write_ablation

from uturn_train.commands.ablate import main
from uturn_train.experiments.ablate import launch_argv, load_ablation, slot_envs


def accelerate_file(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump({"num_machines": 1, **fields}))
    return path


def test_each_run_gets_its_share_of_the_cores_or_its_own_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    cpu = accelerate_file(tmp_path, use_cpu=True, num_processes=1)
    assert slot_envs(cpu, 1) == [{}]  # one at a time: the environment as it is
    assert slot_envs(cpu, 3) == [{"OMP_NUM_THREADS": "2"}] * 3
    with pytest.raises(ValueError, match=r"--jobs 9: 9 processes at once, more than the 8 CPU cores .* use --jobs 8"):
        slot_envs(cpu, 9)
    with pytest.raises(ValueError, match="--jobs must be at least 1, got 0"):
        slot_envs(cpu, 0)
    gpus = accelerate_file(tmp_path, distributed_type="MULTI_GPU", num_processes=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5,7")
    # 2 runs x 2 processes on 8 cores: 2 threads for each process (accelerate passes OMP_NUM_THREADS to every one)
    assert slot_envs(gpus, 2) == [{"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "2,3"},
                                  {"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "5,7"}]
    with pytest.raises(ValueError, match=r"--jobs 3: each run takes 2 GPU\(s\) \(`num_processes` of .*\), 6 in all, "
                                         r"but 4 are visible here; use --jobs 2"):
        slot_envs(gpus, 3)


def test_a_run_given_gpus_keeps_them_and_takes_a_free_port(tmp_path):
    """accelerate sets CUDA_VISIBLE_DEVICES to the config's `gpu_ids` (single_gpu.yaml: '0'), which would put every run
    on GPU 0: a run given GPUs is launched with `--gpu_ids all`, so that its share stands."""
    path = write_ablation(tmp_path, [{"recipe": "collab_sft", "config": SFT}])
    _, (run,), _ = load_ablation(path, tmp_path / "out")
    argv = launch_argv(run, {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "5,7"})
    assert argv[1:] == ["-m", "accelerate.commands.launch", "--main_process_port", "0", "--gpu_ids", "all",
                        *run.command[2:]]
    assert "--gpu_ids" not in launch_argv(run, {"OMP_NUM_THREADS": "1"})
    assert launch_argv(run, {})[3:] == run.command[2:]  # one at a time: the run's own command


STAMP = """import argparse, json, os, time
from pathlib import Path


def make_parser():
    parser = argparse.ArgumentParser()
    for flag in ("--config", "--output_dir", "--run_name", "--seconds"):
        parser.add_argument(flag)
    return parser


if __name__ == "__main__":
    args = make_parser().parse_args()
    start = time.time()
    time.sleep(float(args.seconds))
    stamp = {"start": start, "end": time.time(), "threads": os.environ.get("OMP_NUM_THREADS")}
    Path(args.output_dir, "stamp.json").write_text(json.dumps(stamp))
"""


def test_two_at_a_time_start_first_runs_first_report_keeps_the_file_order(tmp_path, monkeypatch, capsys):
    import uturn_train.experiments.ablation_file

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "stamp.py").write_text(STAMP)
    (tmp_path / "stamp.yaml").write_text("seconds: 1\n")
    monkeypatch.setattr(uturn_train.experiments.ablation_file, "RECIPES", recipes)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    stamp = {"recipe": "stamp", "config": str(tmp_path / "stamp.yaml")}
    path = write_ablation(tmp_path, [{**stamp, "name": "a", "overrides": {"seconds": 4}},
                                     {**stamp, "name": "b", "overrides": {"seconds": 1}},
                                     {**stamp, "name": "long", "overrides": {"seconds": 6}}], start_first=["long"])
    out = tmp_path / "out"
    main(["--config", str(path), "--out", str(out), "--jobs", "2"])
    printed = capsys.readouterr().out
    stamps = {n: json.loads((out / n / "stamp.json").read_text()) for n in ("a", "b", "long")}
    assert {s["threads"] for s in stamps.values()} == {"1"}  # 2 cores, 2 runs: one thread each
    assert stamps["long"]["start"] < stamps["a"]["end"] and stamps["a"]["start"] < stamps["long"]["end"]  # together
    assert stamps["b"]["start"] >= min(stamps["a"]["end"], stamps["long"]["end"]) - 0.5  # b waits for a free slot
    assert printed.index("[3/3] long: running") < printed.index("[1/3] a: running") < printed.index("[2/3] b: running")
    assert "tiny-ablation: a done, b done, long done" in printed  # the file's order
    markers = {n: json.loads((out / n / "ablation_run.json").read_text()) for n in stamps}
    assert {n: m["share"] for n, m in markers.items()} == {n: {"OMP_NUM_THREADS": "1"} for n in stamps}
    assert [r["name"] for r in json.loads((out / "ablation.json").read_text())["runs"]] == ["a", "b", "long"]
    # The markers hold the runs' own commands: a rerun one at a time finds them finished.
    main(["--config", str(path), "--out", str(out)])
    assert "tiny-ablation: a skipped, b skipped, long skipped" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"--jobs runs several runs at once here; a SLURM array"):
        main(["--config", str(path), "--out", str(out), "--jobs", "2", "--slurm"])

def test_sigterm_stops_every_running_run(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "sleeper.yaml").write_text("{}\n")
    sleeper = {"recipe": "sleeper", "config": str(tmp_path / "sleeper.yaml")}
    path = write_ablation(tmp_path, [{**sleeper, "name": "one"}, {**sleeper, "name": "two"},
                                     {**sleeper, "name": "three"}])
    out = tmp_path / "out"
    wrapper = ("import os, sys; from pathlib import Path; import uturn_train.commands.ablate as a, "
               "uturn_train.experiments.ablation_file as c; c.RECIPES = Path(sys.argv[1]); "
               "os.sched_getaffinity = lambda pid: {0, 1}; a.main(sys.argv[2:])")
    log = tmp_path / "ablate.log"
    with open(log, "w") as f:
        cmd = [sys.executable, "-c", wrapper, str(recipes), "--config", str(path), "--out", str(out), "--jobs", "2"]
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        for name in ("one", "two"):
            wait_for(lambda n=name: (out / n / "grandchild.pid").exists(), 120, f"{name}'s grandchild", proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130, log.read_text()
    except BaseException:
        kill_leftovers(proc, log)
        raise
    text = log.read_text()
    children = [int(p) for p in re.findall(r"(?:one|two): running \(pid (\d+)\)", text)]
    alive = [c for c in children if group_alive(c)]
    kill_leftovers(proc, log)
    assert len(children) == 2 and not alive, "both runs' processes must be gone"
    assert text.count("interrupted; its processes were stopped and no marker written") == 2
    assert not any((out / n / "ablation_run.json").exists() for n in ("one", "two")) and not (out / "three").exists()
