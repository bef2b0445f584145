"""Smoke runs of the Qwen3.5-2B recipes on a CPU: the 2B YAMLs on `qwen3.5-2b-random` (Qwen3.5-2B's exact shape, random
weights; `uturn_train/zoo/qwen3_5_2b.py`), overridden only in length, steps and what a CPU without the hub needs (local
data files, float32 unless `--dtype bfloat16`, generation layer by layer under ZeRO-3), 2 optimizer steps with the
probe at step 0 and at the end. Measures what the planner (`uturn plan`) predicts: peak RSS of every process, seconds
per optimizer step, trainable parameters; and compares the memory with the plan for the same YAML and overrides.

```bash
python eval/smoke_2b.py --recipes sft dpo grpo --out outputs/smoke-2b                    # one process, float32
python eval/smoke_2b.py --recipes dpo --launcher zero3 --out outputs/smoke-2b            # 2 processes, ZeRO-3
python eval/smoke_2b.py --recipes dpo_mining --launcher zero3 --out outputs/smoke-2b     # DPO mining its own pairs
python eval/smoke_2b.py --recipes dpo --launcher zero3 --dtype bfloat16 --out outputs/smoke-2b-bf16  # the YAMLs' bf16
MALLOC_MMAP_THRESHOLD_=65536 python eval/smoke_2b.py --recipes sft grpo --out outputs/smoke-2b-freed  # live memory
```

glibc keeps freed blocks for reuse, so a process's RSS overstates its live memory, most where generation and training
alternate; with the environment variable above, blocks of 64 KiB and more go back to the system when freed (slower).

A random-weight model writes no follow-up, so DPO cannot mine a pair from its own turns: the DPO smoke trains on
`--pairs` (default: pairs mined by the testbed's main job; any `uturn mine` output works, the pairs are text), and
`--recipes mine` runs `uturn mine` on the 2B alone, which passes when it ends with the clear "no follow-up pair mined"
error after generating and labelling every turn. `--recipes dpo_mining` runs collab DPO without pairs, so that the
recipe mines its own on the same problems (under ZeRO-3: over both processes) and ends with that error; in bf16
weights, because mining gathers the whole model on every rank under ZeRO-3 (two fp32 ranks would need ~11.3 GiB
each) and a CPU with AVX512-BF16 or AMX runs bf16 natively. (Real follow-ups of OASST as references do not help: a
reference is chosen only if grounded in the model's own answer, and a random model's answer grounds none.) Results:
`<out>/<recipe>-<launcher>/smoke.json`, and a line each on stdout.
"""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("UTURN_SHARED_DATA", ROOT.parent / "shared" / "data"))
# 4 GSM8K train problems, 2 sampled user turns at T=1.0 beside the greedy one, 8-token answers and turns
MINING = ["--mine_source", "gsm8k", "--mine_data", str(SHARED / "gsm8k" / "train.jsonl"), "--mine_limit", "4",
          "--mine_samples", "2", "--mine_max_new_tokens", "8", "--mine_answer_max_new_tokens", "8",
          "--mine_batch_size", "4"]
SCRIPT = {"dpo_mining": "dpo"}  # the recipe a smoke runs, where its name is not the recipe's
LAUNCHERS = {
    "one": ["--config_file", "accelerate_configs/cpu.yaml"],
    "zero3": ["--config_file", "accelerate_configs/deepspeed_zero3.yaml", "--num_processes", "2"],
}


def overrides(recipe: str, launcher: str, out: Path, args) -> list[str]:
    """The 2B YAML's values that change: length, steps, local data, precision; nothing else."""
    # float32: a CPU without AVX512-BF16 or AMX emulates bf16 (the AVX2 machine: ~200x slower than fp32 in a matmul).
    # Two fp32 ranks that each gather the whole model to generate take 11.3 GiB each, too close to 24 GB (GRPO's final
    # probe was killed there with a small test beside it), so under ZeRO-3 all generation goes layer by layer.
    # bf16 (`--dtype bfloat16`) for a CPU that runs it natively; always to mine under ZeRO-3 (see the docstring).
    bf16 = args.dtype == "bfloat16" or recipe == "dpo_mining"
    gather, dtype = [], ["--dtype", "bfloat16" if bf16 else "float32", "--bf16", str(bf16).lower()]
    if launcher == "zero3":
        gather = ["--probe_ds3_gather", "false"]
        gather += ["--ds3_gather_for_generation", "false"] if recipe == "grpo" else []
    common = ["--model_name_or_path", "qwen3.5-2b-random", *dtype, "--use_cpu", "true", *gather,
              "--max_steps", "2", "--save_steps", "2",
              "--logging_steps", "1", "--gradient_accumulation_steps", "1", "--output_dir", str(out),
              "--run_name", out.name, "--probe_data", str(SHARED / "gsm8k" / "test.jsonl"), "--probe_limit",
              str(args.probe_limit), "--probe_batch_size", "4", "--probe_samples", "2", "--probe_max_new_tokens", "8",
              "--probe_answer_max_new_tokens", "8"]
    length = ["--max_length", str(args.max_length)]
    if recipe == "sft":
        return [*common, "--collab_data", str(SHARED / "oasst" / "en_100_tree.jsonl"), *length]
    if recipe == "dpo":
        return [*common, "--dataset_name", args.pairs, *length]
    if recipe == "dpo_mining":
        return [*common, *MINING, *length]
    return [*common, "--prompt_data", str(SHARED / "gsm8k" / "train.jsonl"), "--prompt_limit", "16",
            "--prompt_answer_max_new_tokens", "8", "--max_completion_length", "8", "--num_generations", "8",
            "--per_device_train_batch_size", "8"]


class PeakRSS(threading.Thread):
    """Memory of every worker process under `pid`, twice a second: the kernel's high-water mark (VmHWM, the whole run,
    loading included) and the largest RSS seen once `log` shows `marker` (the trainer's start: W&B's first line), and
    of that the anonymous part (RssAnon: without pages of mapped files such as the checkpoint). On a CPU, loading maps
    the bf16 file while it builds the fp32 weights, a peak a GPU's memory never sees."""

    def __init__(self, pid: int, log: Path, marker: str = "wandb:"):
        super().__init__(daemon=True)
        self.pid, self.log, self.marker, self.stopped = pid, log, marker, threading.Event()
        self.peaks, self.trained, self.anon = {}, {}, {}

    def run(self):
        import psutil

        root, started = psutil.Process(self.pid), False
        while not self.stopped.wait(0.5):
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            started = started or self.marker in self.log.read_text(errors="replace")
            for p in procs:
                try:
                    status = Path(f"/proc/{p.pid}/status").read_text()
                    cmd = " ".join(p.cmdline())
                    rss = p.memory_info().rss
                except (OSError, psutil.Error):
                    continue
                if ("recipes/collab_" in cmd or "uturn_train.cli" in cmd or "/bin/uturn " in cmd) and (
                        "accelerate.commands" not in cmd):
                    kib = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines()
                           if line.startswith(("VmHWM", "RssAnon"))}
                    self.peaks[p.pid] = max(self.peaks.get(p.pid, 0), kib["VmHWM"] * 1024)
                    if started:
                        self.trained[p.pid] = max(self.trained.get(p.pid, 0), rss)
                        self.anon[p.pid] = max(self.anon.get(p.pid, 0), kib["RssAnon"] * 1024)


def import_baseline(launcher: str) -> float:
    """RSS (GiB) of a process that imported what a recipe imports, before any model: the Python side of a run."""
    extra = ", deepspeed" if launcher == "zero3" else ""
    code = (f"import resource, datasets, peft, torch, transformers, trl, wandb{extra}, uturn_train.training.callback; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return round(int(out.split()[-1]) / 2**20, 2)


def step_seconds(out: Path) -> list[float]:
    """Seconds between the logs of successive optimizer steps, read back from the offline W&B run."""
    runs = sorted((out / "wandb").glob("offline-run-*"))
    if not runs:
        return []
    wandb = Path(sys.executable).with_name("wandb")  # the venv's, whether or not it is activated
    proc = subprocess.run([str(wandb), "leet", "inspect", "--json", str(runs[-1])], capture_output=True, text=True,
                          timeout=300)
    stamps = {}
    for line in proc.stdout.splitlines():
        item = json.loads(line).get("history", {}).get("item", {})
        if "train/loss" in item:
            stamps[item["train/global_step"]] = item["_timestamp"]
    steps = sorted(stamps)
    return [round(stamps[b] - stamps[a], 1) for a, b in zip(steps, steps[1:])]


def planned(recipe: str, launcher: str, out: Path, args) -> float:
    """`uturn plan`'s peak (GiB) for the same YAML and overrides, on as many devices as the run has processes; for
    `dpo_mining`, which ends in mining before any adapter exists, the weights and mining's generation."""
    import contextlib
    import io

    from uturn_train.commands.plan import run_plan

    gpus = 2 if launcher == "zero3" else 1
    argv = ["--config", f"recipes/qwen3.5-2b/collab_{SCRIPT.get(recipe, recipe)}.yaml", "--gpus", str(gpus),
            *overrides(recipe, launcher, out, args)]
    with contextlib.redirect_stdout(io.StringIO()):
        rows = run_plan(argv)
    row = next(r for r in rows if r["strategy"] == ("zero3" if launcher == "zero3" else "single"))
    if recipe == "dpo_mining":
        if row["generation_phase"] != "mining":
            raise ValueError(f"the plan's largest generation is {row['generation_phase']}, not mining: compare by hand")
        return round((row["weights"] + row["generation"]) / 2**30, 2)
    return round(row["peak"] / 2**30, 2)


def run(recipe: str, args) -> dict:
    import torch

    launcher = args.launcher
    out = Path(args.out) / f"{recipe}-{launcher}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "WANDB_DIR": str(out)}
    out.mkdir(parents=True, exist_ok=True)
    script = SCRIPT.get(recipe, recipe)
    if recipe == "mine":
        cmd = [str(Path(sys.executable).with_name("uturn")), "mine", "--model", "qwen3.5-2b-random", *MINING,
               "--out", str(out / "pairs")]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", *LAUNCHERS[launcher], f"recipes/collab_{script}.py",
               "--config", f"recipes/qwen3.5-2b/collab_{script}.yaml", *overrides(recipe, launcher, out, args)]
    start = time.perf_counter()
    with open(out / "log.txt", "w") as log:
        # Own process group: on a timeout the launcher's workers (~9 GiB each on the 2B) go with it.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        # Mining: its peak too (from the first answers on), as the plan's generation phase counts it.
        peaks = PeakRSS(proc.pid, out / "log.txt", "answers" if recipe in ("mine", "dpo_mining") else "wandb:")
        peaks.start()
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = "timeout"
        peaks.stopped.set()
    tail = (out / "log.txt").read_text()[-4000:]
    result = {"recipe": recipe, "launcher": launcher, "exit_code": code, "wall_seconds": round(time.perf_counter() -
              start, 1), "peak_rss_gib": sorted(round(v / 2**30, 2) for v in peaks.peaks.values()),
              "train_peak_rss_gib": sorted(round(v / 2**30, 2) for v in peaks.trained.values()),
              "train_peak_anon_gib": sorted(round(v / 2**30, 2) for v in peaks.anon.values()),
              "import_baseline_gib": import_baseline(launcher),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
              # set (e.g. 65536): freed blocks go back to the system, so RSS is live memory, as a GPU counts it
              "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
              "command": " ".join(cmd[2:])}
    if recipe != "mine":
        # What CPU and GPU share: the trained (or mining) process's memory less its Python side, against the plan.
        result["plan_gib"] = planned(recipe, launcher, out, args)
        trained = result["train_peak_rss_gib"]
        result["measured_over_plan"] = round((max(trained) - result["import_baseline_gib"]) / result["plan_gib"],
                                             3) if trained else None
    if recipe in ("mine", "dpo_mining"):  # a random-weight model writes no follow-up: mining ends with the clear error
        result["ok"] = code != 0 and "no follow-up pair mined" in tail
    else:
        result["ok"] = code == 0
        result["step_seconds"] = step_seconds(out)
        history = out / "probe_history.jsonl"
        result["probed_steps"] = [json.loads(line)["step"] for line in history.open()] if history.exists() else []
        result["probe_seconds"] = [round(json.loads(line)["seconds"], 1) for line in history.open()] if (
            history.exists()) else []
        adapter = out / "adapter_model.safetensors"
        if adapter.exists():
            from safetensors import safe_open

            with safe_open(adapter, "pt") as f:
                result["trainable_params"] = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    (out / "smoke.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", default=["sft", "dpo", "grpo"],
                        choices=["sft", "dpo", "dpo_mining", "grpo", "mine"])
    parser.add_argument("--launcher", default="one", choices=sorted(LAUNCHERS))
    parser.add_argument("--out", default="outputs/smoke-2b")
    parser.add_argument("--pairs", default="outputs/testbed-collab-dpo/pairs", help="Pairs for the DPO smoke.")
    parser.add_argument("--max_length", type=int, default=64, help="SFT and DPO sequence length.")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="Weights (bfloat16: the 2B YAMLs'; on a CPU only with AVX512-BF16 or AMX, else emulated).")
    parser.add_argument("--probe_limit", type=int, default=4, help="GSM8K test problems per probe.")
    parser.add_argument("--timeout", type=int, default=7200, help="Seconds per run (then its processes are killed).")
    args = parser.parse_args(argv)
    if "dpo" in args.recipes and not Path(args.pairs, "dataset_info.json").is_file():
        sys.exit(f"--pairs {args.pairs}: no pairs there; run the README's main job first, or `uturn mine` any model")
    if "mine" in args.recipes and args.launcher != "one":
        sys.exit("--recipes mine runs `uturn mine` in one process; for mining under ZeRO-3 use --recipes dpo_mining")
    results = [run(r, args) for r in args.recipes]
    for r in results:
        print(json.dumps({k: r[k] for k in r if k != "command"}))
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
