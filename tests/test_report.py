"""`uturn report` on hand-made probe histories: paired statistics against values computed by hand, the best checkpoint,
the Pareto front, the files, W&B (offline) and bad folders."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from uturn_train.probe.metrics import summarize_setting, wilson_interval
from uturn_train.report import main as report_main
from uturn_train.report import pareto_front, write_report
from uturn_train.stats import mcnemar_exact, paired_accuracy, paired_bootstrap

IDS = [f"p{i}" for i in range(8)]


def write_run(folder: Path, steps: dict, grounded: bool = True, card: dict | None = None) -> Path:
    """A run folder as the probe callback writes it. `steps[step]`: per prompt, `greedy` (one turn) and `t1` (two
    sampled turns) coded 0 = not a follow-up, 1 = follow-up, 2 = grounded follow-up; `correct`: the greedy answer's
    correctness. Records are computed from the rows with the probe's own `summarize_setting`."""
    (folder / "probe").mkdir(parents=True)
    history = []
    for step, spec in steps.items():
        rows, settings = [], []
        for t, turns in ((0.0, [[g] for g in spec["greedy"]]), (1.0, spec["t1"])):
            t_rows = [{"index": i, "id": pid, "temperature": t, "sample_index": s, "query": f"q{i}", "answer": f"a{i}",
                       "answer_correct": bool(spec["correct"][i]), "user_turn": f"Why step {i}?" if code else "Next.",
                       "label": "followup" if code else "new_topic", "reason": "", "finish_reason": "stop",
                       **({"grounded": code == 2} if grounded else {})}
                      for i, (pid, codes) in enumerate(zip(IDS, turns)) for s, code in enumerate(codes)]
            setting = summarize_setting(t, 1 if t == 0 else 2, [r["label"] for r in t_rows])
            if grounded:
                hits = sum(r["grounded"] for r in t_rows)
                followups = [r["user_turn"] for r in t_rows if r["label"] == "followup"]
                setting.update(grounded_followup_rate=hits / len(t_rows),
                               grounded_ci95=list(wilson_interval(hits, len(t_rows))),
                               distinct_followups=len(set(followups)) / len(followups) if followups else None)
            rows += t_rows
            settings.append(setting)
        (folder / "probe" / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        history.append({"step": step, "epoch": None, "seconds": 1.0, "accuracy": float(np.mean(spec["correct"])),
                        "settings": settings, "error": None})
    (folder / "probe_history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    if card is not None:
        (folder / "pairs").mkdir()
        (folder / "pairs" / "mining_card.json").write_text(json.dumps(card))
    return folder


BASE = {"greedy": [0] * 8, "t1": [[0, 0]] * 7 + [[1, 0]], "correct": [1, 1, 1, 1, 1, 0, 0, 1]}
A_LAST = {"greedy": [2, 0, 0, 1, 0, 0, 0, 0], "t1": [[1, 0], [0, 0], [0, 0], [0, 0], [2, 2], [0, 0], [0, 0], [0, 1]],
          "correct": [1, 1, 1, 1, 1, 0, 0, 1]}
B_LAST = {"greedy": [2, 2, 1, 2, 0, 1, 0, 0], "t1": [[1, 1], [2, 0], [0, 0], [0, 1], [2, 2], [0, 0], [1, 0], [0, 0]],
          "correct": [1, 0, 0, 1, 1, 0, 1, 0]}


def _comparison(report, a, b):
    return next(c for c in report["comparisons"] if c["a"]["run"] == a and c["b"]["run"] == b)


def _rate(comparison, t, metric):
    return next(r for r in comparison["rates"] if r["temperature"] == t and r["metric"] == metric)


def test_paired_statistics_match_hand_computation(tmp_path):
    write_run(tmp_path / "abl" / "a", {0: BASE, 4: A_LAST})
    write_run(tmp_path / "abl" / "b", {0: BASE, 4: B_LAST})
    report = write_report([tmp_path / "abl"], tmp_path / "out")
    assert [r["name"] for r in report["runs"]] == ["a", "b"]
    ab = _comparison(report, "a", "b")
    assert (ab["a"]["step"], ab["b"]["step"]) == (4, 4)

    # Greedy follow-ups by prompt: a [1,0,0,1,0,0,0,0] = 2/8, b [1,1,1,1,0,1,0,0] = 5/8.
    greedy = _rate(ab, 0.0, "followup_rate")
    assert (greedy["n_prompts"], greedy["rate_a"], greedy["rate_b"]) == (8, 0.25, 0.625)
    assert greedy["difference"] == pytest.approx(0.375)
    # Grounded: a [1,0,...] = 1/8, b [1,1,0,1,0,0,0,0] = 3/8.
    grounded = _rate(ab, 0.0, "grounded_followup_rate")
    assert (grounded["rate_a"], grounded["rate_b"]) == (0.125, 0.375)
    # T=1, two samples per prompt, each prompt weighing the same: a 2/8, b 3.5/8.
    sampled = _rate(ab, 1.0, "followup_rate")
    assert (sampled["rate_a"], sampled["rate_b"]) == (0.25, 0.4375)

    # The bootstrap resamples prompts: with seed 0 it equals the direct numpy computation over the per-prompt
    # differences (ids in sorted order)...
    d = np.array([0, 1, 1, 0, 0, 1, 0, 0], dtype=float)
    means = d[np.random.default_rng(0).integers(0, 8, size=(2000, 8))].mean(axis=1)
    assert greedy["ci95"] == pytest.approx(list(np.percentile(means, [2.5, 97.5])))
    # ... and, with 0/1 differences, a resampled mean is Binomial(8, 3/8) / 8: its percentiles fall within one step
    # (1/8) of the exact binomial quantiles.
    cdf = np.cumsum([math.comb(8, k) * 0.375**k * 0.625 ** (8 - k) for k in range(9)])
    exact = [np.searchsorted(cdf, q) / 8 for q in (0.025, 0.975)]
    assert abs(greedy["ci95"][0] - exact[0]) <= 0.125 and abs(greedy["ci95"][1] - exact[1]) <= 0.125
    assert 0 <= greedy["ci95"][0] <= 0.375 <= greedy["ci95"][1] <= 1

    # Accuracy: a right and b wrong on p1, p2, p7; b right and a wrong on p6. McNemar exact, by hand:
    # p = 2 * (C(4,0) + C(4,1)) / 2^4 = 10/16.
    acc = ab["accuracy"]
    assert (acc["accuracy_a"], acc["accuracy_b"], acc["only_a"], acc["only_b"]) == (0.75, 0.5, 3, 1)
    assert acc["p_value"] == pytest.approx(0.625)

    # Within a run: step 0 against the last checkpoint; b's greedy follow-ups rose from 0 to 5/8 on every one of
    # those prompts, so the whole interval lies above 0.
    within = _comparison(report, "b", "b")
    assert (within["a"]["step"], within["b"]["step"]) == (0, 4)
    rise = _rate(within, 0.0, "followup_rate")
    assert rise["difference"] == 0.625 and rise["ci95"][0] > 0
    assert len(report["comparisons"]) == 3


def test_mcnemar_exact_by_hand():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)  # the six discordant prompts all go one way
    assert mcnemar_exact(5, 1) == pytest.approx(2 * 7 / 64) == mcnemar_exact(1, 5)
    assert mcnemar_exact(3, 3) == 1.0  # 2 * 42/64 > 1 is capped
    acc = paired_accuracy({"x": True, "y": False, "z": True}, {"x": True, "y": True, "w": False})
    assert (acc["n_prompts"], acc["only_a"], acc["only_b"]) == (2, 0, 1)  # only the shared prompts x, y count


def test_bootstrap_of_a_constant_difference_is_that_constant():
    a = {i: [False, False] for i in "abcdef"}
    b = {i: [True, False] for i in "abcdef"}
    stats = paired_bootstrap(a, b, seed=3)
    assert stats["difference"] == 0.5 and stats["ci95"] == [0.5, 0.5]
    assert paired_bootstrap(a, {"zz": [True]})["n_prompts"] == 0


def test_best_checkpoint_pareto_front_and_files_without_grounded_rates(tmp_path):
    drop = {**A_LAST, "greedy": [1] * 6 + [0, 0], "correct": [1, 1, 0, 0, 1, 0, 0, 0]}  # rate 0.75, accuracy -0.375
    mid = {**A_LAST, "greedy": [1] * 4 + [0] * 4}  # rate 0.5, accuracy as step 0
    card = {"model": "tiny", "n_prompts": 5, "n_pairs": 12, "kind": {"followup": 8, "anchor": 4}, "seconds": 3.5,
            "policy": {"accuracy": 0.75, "followup_rate_greedy": 0.0, "categories_greedy": {"new_topic": 1.0}},
            "settings": {"mine_samples": 2}, "chosen_grounded_share": 0.625}
    run = write_run(tmp_path / "dpo", {0: BASE, 2: drop, 4: mid, 6: A_LAST}, grounded=False, card=card)
    report = write_report([run], run)
    (summary,) = report["runs"]
    assert report["metric"] == "followup_rate"
    # Step 2 has the highest rate but loses 0.375 accuracy: the best is step 4 (0.5 at step 0's accuracy).
    assert {k: c["step"] for k, c in summary["checkpoints"].items()} == {"step0": 0, "last": 6, "best": 4}
    assert summary["checkpoints"]["best"]["settings"]["0"]["followup_rate"] == 0.5
    # Trade-off points: (0, 0.75), (0.75, 0.375), (0.5, 0.75), (0.25, 0.75) -> front: step 4 and step 2.
    front = [(p["step"], p["rate"], p["accuracy"]) for p in report["pareto_front"]]
    assert front == [(4, 0.5, 0.75), (2, 0.75, 0.375)]
    assert pareto_front([(0.1, 0.9), (0.5, 0.8), (0.4, 0.7), (0.9, 0.5), (0.9, 0.4), (0.5, 0.8)]) == [0, 1, 3]

    md = (run / "report.md").read_text()
    assert "grounded follow-up rate is not available" in md
    assert "| dpo | - | - | - | - | best | 4 | 0.750 | 0.500 [" in md
    assert "n_pairs 12" in md and "chosen_grounded_share 0.625" in md and "followup 8, anchor 4" in md
    assert (run / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run / "report.json").read_text())["runs"][0]["mining"]["n_pairs"] == 12
    assert not list(run.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_runs_with_and_without_grounded_rates(tmp_path):
    write_run(tmp_path / "new", {0: BASE, 4: B_LAST})
    write_run(tmp_path / "old", {0: BASE, 4: A_LAST}, grounded=False)  # probed before the grounded decision
    report = write_report([tmp_path / "new", tmp_path / "old"], tmp_path / "out")
    assert report["metric"] == "followup_rate"  # one metric for every run, on the plot and for the best checkpoint
    between = _comparison(report, "new", "old")
    assert {r["metric"] for r in between["rates"]} == {"followup_rate"}
    assert _rate(between, 0.0, "followup_rate")["difference"] == pytest.approx(0.25 - 0.625)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| new | - | - | - | - | last | 4 | 0.500 | 0.625 [0.31, 0.86] | 0.375 [0.14, 0.69] |" in md
    assert "| old | - | - | - | - | best = last | 4 | 0.750 | 0.250 [0.07, 0.59] | n/a |" in md
    with pytest.raises(ValueError, match="several DIRs given: pass --out"):
        report_main([str(tmp_path / "new"), str(tmp_path / "old")])


def test_report_logs_tables_and_plot_to_wandb_offline(tmp_path):
    import subprocess
    import sys

    from wandb_records import history_rows

    write_run(tmp_path / "abl" / "a", {0: BASE, 4: A_LAST})
    write_run(tmp_path / "abl" / "b", {0: BASE, 4: B_LAST})
    # `uturn report --wandb` in a process of its own, as users run it: wandb keeps per-process state that runs of
    # earlier tests in this process (the recipes') leave behind.
    env = {**os.environ, "WANDB_MODE": "offline", **{var: str(tmp_path / "wandb") for var in
                                                     ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}}
    proc = subprocess.run([sys.executable, "-c", "from uturn_train.cli import main; main()", "report",
                           str(tmp_path / "abl"), "--out", str(tmp_path / "out"), "--wandb"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    (row,) = [r for r in history_rows(run_dir) if "report/checkpoints/path" in r]
    assert row["report/pareto/_type"] == "image-file" and row["report/comparisons/_type"] == "table-file"
    table = json.loads((run_dir / "files" / row["report/checkpoints/path"]).read_text())
    assert [r[0] for r in table["data"]] == ["a", "a", "b", "b"]
    assert "grounded greedy" in table["columns"]


def test_folders_without_probe_history_fail_clearly(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"empty: no probe_history.jsonl in it or in its subfolders"):
        write_report([tmp_path / "empty"], tmp_path / "out")
    with pytest.raises(ValueError, match="no such folder"):
        write_report([tmp_path / "missing"], tmp_path / "out")
    failed = tmp_path / "failed"
    failed.mkdir()
    record = {"step": 0, "epoch": 0, "seconds": 0.1, "accuracy": None, "settings": [], "error": "RuntimeError: boom"}
    (failed / "probe_history.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=r"no successful probe record.*RuntimeError: boom"):
        write_report([failed], tmp_path / "out")
    assert not (tmp_path / "out" / "report.md").exists()
