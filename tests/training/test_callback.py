import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ARITHMETIC, HELPERS, ROOT
from helpers.train_with_probe import make_trainer  # noqa: E402

from uturn_train import ProbeArguments, UserTurnProbeCallback  # noqa: E402

SCRIPT = HELPERS / "train_with_probe.py"


@pytest.fixture(scope="module")
def gsm8k_file():
    # Hand-written GSM8K-format problems: the callback suite runs on a clean clone, without ../shared/data.
    return ARITHMETIC


def _history(out):
    return [json.loads(line) for line in (Path(out) / "probe_history.jsonl").read_text().splitlines()]


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_probe_scalars_files_and_no_perturbation(tiny_qwen_dir, gsm8k_file, tmp_path):
    trainer = make_trainer(tiny_qwen_dir, tmp_path / "with", gsm8k_file)
    trainer.train()
    probed = [h for h in trainer.state.log_history if "probe/followup_rate/T0.0" in h]
    assert [h["step"] for h in probed] == [0, 2, 4], "baseline at step 0, then every save, never twice"
    for h in probed:
        for key in ("probe/followup_rate/T1.0", "probe/followup_rate/T0.0/ci_low", "probe/followup_rate/T1.0/ci_high",
                    "probe/identity_drift_share/T1.0", "probe/empty_share/T0.0", "gsm8k/accuracy", "probe/seconds"):
            assert key in h, key
        rate = "probe/followup_rate/T0.0"
        assert h[f"{rate}/ci_low"] <= h[rate] <= h[f"{rate}/ci_high"]
        for t in ("T0.0", "T1.0"):  # both shares of the follow-ups, whenever there are follow-ups
            assert (f"probe/distinct_followups/{t}" in h) == (f"probe/distinct_templates/{t}" in h) \
                == (h[f"probe/followup_rate/{t}"] > 0)
    history = _history(tmp_path / "with")
    assert [r["step"] for r in history] == [0, 2, 4] and all(r["error"] is None for r in history)
    assert [s["n"] for s in history[0]["settings"]] == [5, 10]  # 5 prompts: 1 greedy turn, 2 samples at T=1
    rows = [json.loads(line) for line in (tmp_path / "with" / "probe" / "step_2.jsonl").read_text().splitlines()]
    assert len(rows) == 15 and {"id", "temperature", "sample_index", "user_prompt", "user_turn", "label",
                                "finish_reason", "answer_correct"} <= set(rows[0])
    # The probe must not perturb training: same losses as a run without it, model back in train mode.
    plain = make_trainer(tiny_qwen_dir, tmp_path / "without", gsm8k_file, with_probe=False)
    plain.train()
    assert _losses(trainer) == _losses(plain) and len(_losses(plain)) == 4
    assert trainer.model.training == plain.model.training
    assert trainer.processing_class.padding_side == plain.processing_class.padding_side


def test_gradient_checkpointing_and_use_cache_restored(tiny_qwen_dir, gsm8k_file, tmp_path):
    trainer = make_trainer(tiny_qwen_dir, tmp_path / "gc", gsm8k_file, max_steps=2)
    trainer.args.gradient_checkpointing = True
    trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert model.is_gradient_checkpointing
    assert [r["step"] for r in _history(tmp_path / "gc")] == [0, 2]


def test_resume_keeps_one_record_per_step(tiny_qwen_dir, gsm8k_file, tmp_path):
    out = tmp_path / "run"
    make_trainer(tiny_qwen_dir, out, gsm8k_file, max_steps=4).train()
    assert [r["step"] for r in _history(out)] == [0, 2, 4]
    make_trainer(tiny_qwen_dir, out, gsm8k_file, max_steps=4).train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert [r["step"] for r in _history(out)] == [0, 2, 4]


def test_failure_is_isolated_and_counted(tiny_qwen_dir, gsm8k_file, tmp_path, monkeypatch):
    import uturn_train.probe.runner as runner

    def boom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(runner, "generate", boom)
    trainer = make_trainer(tiny_qwen_dir, tmp_path / "err", gsm8k_file, max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2
    history = _history(tmp_path / "err")
    assert [r["error"] for r in history] == ["RuntimeError: CUDA out of memory (simulated)"] * 2
    assert history[0]["settings"] == [] and history[0]["accuracy"] is None  # no number made up
    errors = [h["probe/errors"] for h in trainer.state.log_history if "probe/errors" in h]
    assert errors == [1.0, 2.0]
    assert not any("probe/followup_rate/T0.0" in h for h in trainer.state.log_history)
    assert trainer.model.training

    strict = make_trainer(tiny_qwen_dir, tmp_path / "strict", gsm8k_file, max_steps=2, probe_fail_on_error=True)
    with pytest.raises(RuntimeError, match="simulated"):
        strict.train()


def test_bad_configuration_fails_at_construction(tiny_qwen_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    with pytest.raises(ValueError, match="unknown task"):
        UserTurnProbeCallback(ProbeArguments(probe_task="gsm9k"), tok)
    with pytest.raises(ValueError, match="nope.jsonl"):
        UserTurnProbeCallback(ProbeArguments(probe_data=str(tmp_path / "nope.jsonl")), tok)


def test_judge_labeler_logs_the_judges_rates(tiny_qwen_dir, gsm8k_file, tmp_path):
    from helpers.serve import ScriptedServer
    from transformers import AutoTokenizer

    from uturn_train.probe.rules.classify import LABELS

    def label_of(turn):  # a scripted judge: deterministic, and unlike the rules
        return "followup" if len(turn) % 2 else "new_topic"

    def judge(path, body):
        if path.endswith("/models"):
            return 200, {"data": [{"id": "judge-model"}]}
        label = label_of(json.loads(body["messages"][1]["content"])["user_turn"])
        content = json.dumps({"label": label, "grounded": label == "followup", "reason": "scripted"})
        return 200, {"choices": [{"message": {"role": "assistant", "content": content}}]}

    judged = dict(probe_labeler="judge", probe_judge_model="judge-model", probe_judge_cache_dir=str(tmp_path / "c"))
    with ScriptedServer(judge) as fake:
        trainer = make_trainer(tiny_qwen_dir, tmp_path / "judged", gsm8k_file, max_steps=2,
                               probe_judge_base_url=fake.base_url, **judged)
        trainer.train()
        tok = AutoTokenizer.from_pretrained(tiny_qwen_dir)
        with pytest.raises(ValueError, match="does not serve 'other-judge'"):  # before training
            UserTurnProbeCallback(ProbeArguments(**{**judged, "probe_judge_base_url": fake.base_url,
                                                    "probe_judge_model": "other-judge",
                                                    "probe_data": str(gsm8k_file)}), tok)
    with pytest.raises(ValueError, match="needs judge_base_url and judge_model .*as probe_\\* options"):
        ProbeArguments(**judged)
    probed = [h for h in trainer.state.log_history if "probe/judge_followup_rate/T0.0" in h]
    assert [h["step"] for h in probed] == [0, 2] and all(h["probe/judge_errors"] == 0.0 for h in probed)
    for h in probed:
        rows = [json.loads(line) for line in (tmp_path / "judged" / "probe" / f"step_{h['step']}.jsonl").open()]
        assert all(r["label"] == label_of(r["user_turn"]) and r["rules_label"] in LABELS for r in rows)
        for t in (0.0, 1.0):
            of_t = [r for r in rows if r["temperature"] == t]
            rate = sum(label_of(r["user_turn"]) == "followup" for r in of_t) / len(of_t)
            assert h[f"probe/followup_rate/T{t}"] == h[f"probe/judge_followup_rate/T{t}"] == rate
            assert h[f"probe/judge_grounded_followup_rate/T{t}"] == rate


def test_wandb_offline_records_probe_scalars(tiny_qwen_dir, gsm8k_file, tmp_path, monkeypatch):
    import wandb
    from helpers.wandb_records import history_rows

    wandb.teardown()  # wandb caches its settings (the run folder) per process: earlier tests' runs must not leak in
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "uturn-tests")
    trainer = make_trainer(tiny_qwen_dir, tmp_path / "wb", gsm8k_file, max_steps=2, report_to="wandb")
    trainer.train()
    wandb.finish()
    (run_dir,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    rows = history_rows(run_dir)
    # W&B may split one logged dict over several history records: merge the records of each step.
    by_step = {}
    for r in rows:
        if "train/global_step" in r:
            by_step.setdefault(r["train/global_step"], {}).update(r)
    probed = {step: r for step, r in by_step.items() if "train/probe/followup_rate/T0.0" in r}
    expected = {h["step"]: h for h in trainer.state.log_history if "probe/followup_rate/T0.0" in h}
    assert sorted(expected) == [0, 2]
    assert sorted(probed) == [0, 2]
    for step in probed:
        h = expected[step]
        for key in ("probe/followup_rate/T0.0", "probe/followup_rate/T1.0", "gsm8k/accuracy"):
            assert probed[step][f"train/{key}"] == h[key], (step, key)
    # The incremental samples table: one increment of 15 rows a probe.
    tables = [r for r in rows if "probe/samples/nrows" in r]
    assert [(t["probe/samples/nrows"], t["probe/samples/increment_num"]) for t in tables][:1] == [(15, 0)]


def _launch(args, out, model_dir, data, judge_url, timeout=900, **extra_env):
    # TORCH_EXTENSIONS_DIR stays at its default: DeepSpeed compiles its CPU op once and reuses it.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", **extra_env}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *args, str(SCRIPT), str(model_dir), str(out), str(data),
           judge_url]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _greedy(out, step):
    rows = [json.loads(line) for line in (Path(out) / "probe" / f"step_{step}.jsonl").read_text().splitlines()]
    return [(r["id"], r["answer"], r["user_turn"], r["label"]) for r in rows if r["temperature"] == 0.0]


def _judge(path, body):
    """A scripted judge for the launched runs: labels by the turn's length."""
    if path.endswith("/models"):
        return 200, {"data": [{"id": "judge-model"}]}
    label = "followup" if len(json.loads(body["messages"][1]["content"])["user_turn"]) % 2 else "new_topic"
    return 200, {"choices": [{"message": {"content": json.dumps({"label": label, "grounded": False})}}]}


def _judged(out) -> int:
    """Distinct (query, answer, turn) of every probe of a run: what its judge had to be asked."""
    rows = [json.loads(line) for path in (Path(out) / "probe").glob("step_*.jsonl") for line in path.open()]
    assert rows and all(r["judge_label"] in ("followup", "new_topic") for r in rows)
    return len({(r["query"], r["answer"], r["user_turn"]) for r in rows})


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["ddp", "zero3", "zero3-layerwise"])
def test_two_processes_match_one(launcher, tiny_qwen_dir, gsm8k_file, tmp_path):
    """zero3-layerwise: the probe generates through ZeRO-3's per-layer gathers (`probe_ds3_gather` false), without a
    whole copy of the model on every process: the same turns."""
    from helpers.serve import ScriptedServer

    with ScriptedServer(_judge) as judge:
        single = tmp_path / "single"
        _launch(["--cpu", "--num_processes", "1"], single, tiny_qwen_dir, gsm8k_file, judge.base_url)
        asked = len(judge.posts("/chat/completions"))
        multi = tmp_path / launcher
        if launcher == "ddp":
            _launch(["--multi_gpu", "--num_processes", "2"], multi, tiny_qwen_dir, gsm8k_file, judge.base_url)
        else:
            _launch(["--config_file", str(ROOT / "accelerate_configs" / "deepspeed_zero3.yaml"), "--num_processes",
                     "2"], multi, tiny_qwen_dir, gsm8k_file, judge.base_url,
                    PROBE_DS3_GATHER="0" if launcher == "zero3-layerwise" else "1")
        # The judge is asked by the main process only, once per distinct turn (its own cache per run).
        assert asked == _judged(single) and len(judge.posts("/chat/completions")) - asked == _judged(multi)
    assert [r["step"] for r in _history(multi)] == [0, 2, 4]
    # Step 0 is the same untrained model everywhere, so greedy turns must be identical with 1 and 2 processes.
    assert _greedy(multi, 0) == _greedy(single, 0) and len(_greedy(single, 0)) == 5
    assert _history(multi)[0]["settings"][0] == _history(single)[0]["settings"][0]
    assert _history(multi)[0]["settings"][0]["judge"]["n"] == 5
    assert _history(multi)[0]["settings"][1]["n"] == 10  # every prompt once, padding dropped
