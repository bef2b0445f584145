"""`uturn report` on hand-made probe histories: paired statistics against values computed by hand, the best checkpoint,
the Pareto front, the files, W&B (offline) and bad folders."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from helpers.report_runs import A_LAST, B_LAST, BASE, IDS, add_collab, write_run

from uturn_train.commands.report import main as report_main
from uturn_train.experiments.report import pareto_front, write_report
from uturn_train.experiments.seeds import called_different
from uturn_train.stats import (
    excludes_zero,
    mcnemar_exact,
    paired_accuracy,
    paired_bootstrap,
    probability_of_improvement,
    seed_t_interval,
    seeds_beating,
    t_quantile_975,
    two_level_bootstrap,
)


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
    # "Why step 1?" ... "Why step 5?": five texts, one template (`why step <n>`).
    last = report["runs"][0]["checkpoints"]["last"]["settings"]["0"]
    assert (last["distinct_followups"], last["distinct_templates"]) == (1.0, 0.2)
    assert "| templates greedy (share of follow-ups) |" in md and md.count("| 1.000 | 0.200 |") == 1
    assert "| old | - | - | - | - | best = last | 4 | 0.750 | 0.250 [0.07, 0.59] | n/a |" in md
    with pytest.raises(ValueError, match="several DIRs given: pass --out"):
        report_main([str(tmp_path / "new"), str(tmp_path / "old")])


def test_report_logs_tables_and_plot_to_wandb_offline(tmp_path):
    import subprocess
    import sys

    from helpers.wandb_records import history_rows

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


# Across seeds. Eight prompts; a seed's last checkpoint has its first `grounded` prompts with a grounded greedy
# follow-up and its first `correct` answers right.
def last(grounded: int, correct: int) -> dict:
    return {"greedy": [2] * grounded + [0] * (8 - grounded), "t1": [[0, 0]] * 8,
            "correct": [1] * correct + [0] * (8 - correct)}


def write_seeds(ablation: Path, variant: str, lasts: dict) -> None:
    """One run folder per seed with the marker `uturn ablate` writes (variant, seed), step 0 and step 4."""
    for seed, spec in lasts.items():
        folder = write_run(ablation / f"{variant}-seed{seed}", {0: BASE, 4: spec})
        marker = {"ablation": "abl", "name": folder.name, "variant": variant, "seed": seed, "recipe": "collab_dpo",
                  "knobs": {"beta": 0.1}, "exit_code": 0, "wall_seconds": 60.0}
        (folder / "ablation_run.json").write_text(json.dumps(marker))


def _across(report, a, b, metric, checkpoint="last", t=0.0):
    return next(c for c in report["seed_comparisons"] if (c["a"]["run"], c["b"]["run"], c["metric"]) == (a, b, metric)
                and c["b"]["checkpoint"] == checkpoint and c["temperature"] == (None if metric == "accuracy" else t))


def test_two_level_bootstrap_probability_of_improvement_and_seeds_beating_by_hand():
    # Two seeds, each the same on every prompt: a resample's mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4,
    # so the percentiles are exactly 0 and 1; with the seeds fixed, resampling prompts changes nothing.
    stats = two_level_bootstrap([dict.fromkeys(IDS, 0.0), dict.fromkeys(IDS, 1.0)])
    assert (stats["value"], stats["ci95"], stats["ci95_prompts"], stats["n_prompts"]) == (0.5, [0.0, 1.0],
                                                                                          [0.5, 0.5], 8)
    # Paired seeds (a run's step 0 and its last checkpoint): each seed gains exactly 0.25, so every resample does.
    step0 = [dict.fromkeys(IDS, 0.25), dict.fromkeys(IDS, 0.5)]
    stats = two_level_bootstrap(step0, [{i: v + 0.25 for i, v in s.items()} for s in step0], paired_seeds=True)
    assert stats["value"] == 0.25 and stats["ci95"] == pytest.approx([0.25, 0.25])
    assert two_level_bootstrap([{"x": 1.0}], [{"y": 1.0}])["n_prompts"] == 0  # no shared prompt
    # P(B > A) over the 9 seed pairs, ties 1/2: 1.0 beats 0 and 0.5 and ties 1.0 (2.5), 0.25 beats 0 (1), 0.75 beats
    # 0 and 0.5 (2).
    assert probability_of_improvement([0.0, 0.5, 1.0], [1.0, 0.25, 0.75]) == pytest.approx(5.5 / 9)
    assert probability_of_improvement([0.3], [0.3]) == 0.5
    assert seeds_beating({0: 0.0, 1: 0.5, 2: 1.0}, {0: 1.0, 1: 0.25, 2: 0.75}) == (1, 3)  # paired by seed
    assert seeds_beating({0: 0.2, 1: 0.4}, {5: 0.35, 6: 0.25}) == (1, 2)  # no common seed: against A's mean 0.3


def test_seed_t_interval_by_hand():
    # Welch: a = 0.1, 0.2, 0.3, 0.4 (mean 0.25, var 1/60), b = 0.5, 0.7, 0.9 (mean 0.7, var 0.04). Squared standard
    # errors 1/240 and 0.04/3; df = (1/240 + 0.04/3)^2 / ((1/240)^2 / 3 + (0.04/3)^2 / 2) = 3.23 -> 3, t = 3.1824.
    va, vb = 1 / 240, 0.04 / 3
    assert (va + vb) ** 2 / (va**2 / 3 + vb**2 / 2) == pytest.approx(3.235, abs=1e-3)
    welch = seed_t_interval({0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}, {4: 0.5, 5: 0.7, 6: 0.9})
    half = 3.1824 * math.sqrt(va + vb)  # 0.4210
    assert (welch["test"], welch["df"], welch["difference"]) == ("welch", 3, pytest.approx(0.45))
    assert welch["ci95"] == pytest.approx([0.45 - half, 0.45 + half]) and welch["ci95"][0] == pytest.approx(0.0290,
                                                                                                        abs=1e-4)
    # Paired (the same seeds): differences 0.1, 0.2, 0.1, mean 2/15, sd sqrt(1/300), se 1/30; df 2, t = 4.3027: the
    # interval [-0.0101, 0.2768] holds 0 although every seed gained.
    paired = seed_t_interval({0: 0.2, 1: 0.4, 2: 0.5}, {0: 0.3, 1: 0.6, 2: 0.6})
    assert (paired["test"], paired["df"]) == ("paired", 2)
    assert paired["ci95"] == pytest.approx([2 / 15 - 4.3027 / 30, 2 / 15 + 4.3027 / 30])
    assert paired["ci95"][0] == pytest.approx(-0.0101, abs=1e-4) and not excludes_zero(paired["ci95"])
    # Two seeds per side: 0.1, 0.3 (var 0.02) against 0.5, 0.6 (var 0.005): squared standard errors 0.01 and
    # 0.0025, df = 0.0125^2 / (0.01^2 + 0.0025^2) = 1.47 -> 1, t = 12.7062.
    two = seed_t_interval({0: 0.1, 1: 0.3}, {2: 0.5, 3: 0.6})
    assert two["df"] == 1 and two["ci95"] == pytest.approx([0.35 - 12.7062 * math.sqrt(0.0125),
                                                            0.35 + 12.7062 * math.sqrt(0.0125)])
    # One seed on a side: no interval. Seeds that differ between sides are not paired.
    assert seed_t_interval({0: 0.1}, {0: 0.5})["ci95"] is None
    assert seed_t_interval({0: 0.1, 1: 0.2}, {0: 0.5, 2: 0.6})["test"] == "welch"
    assert (t_quantile_975(1), t_quantile_975(30)) == (12.7062, 2.0423)
    assert t_quantile_975(40) == pytest.approx(2.0211, abs=1e-4) and t_quantile_975(120) == pytest.approx(1.9799,
                                                                                                          abs=1e-4)


def test_aa_simulation_stars_about_five_percent():
    """A and B from one distribution (64 prompts of varied difficulty, each seed shifting every prompt's rate by
    N(0, 0.15)), three seeds per side: the two-level bootstrap alone excludes 0 far more often than 5%; the star, which
    also needs the seed-level t-interval to exclude 0, stays near 5%."""
    rng = np.random.default_rng(7)
    ids = [f"p{i}" for i in range(64)]

    def seeds(p):
        return [dict(zip(ids, (rng.random(64) < np.clip(p + rng.normal(0, 0.15), 0, 1)).astype(float)))
                for _ in range(3)]

    trials, bootstrap_only, starred = 400, 0, 0
    for trial in range(trials):
        difficulty = rng.uniform(0.2, 0.8, 64)
        a, b = seeds(difficulty), seeds(difficulty)
        ci95 = two_level_bootstrap(a, b, resamples=1000, seed=trial)["ci95"]
        t = seed_t_interval({s: float(np.mean(list(v.values()))) for s, v in enumerate(a)},
                            {s + 3: float(np.mean(list(v.values()))) for s, v in enumerate(b)})
        bootstrap_only += excludes_zero(ci95)
        starred += called_different(ci95, t["ci95"], 3, 3)
    assert bootstrap_only / trials > 0.1  # the bootstrap over three seeds alone is far too narrow
    assert starred / trials <= 0.08


def test_seeds_decide_where_prompt_level_tests_would_star_noise(tmp_path):
    """A and B on three seeds: on seed 0 alone B is far ahead in grounded rate and far behind in accuracy (the
    prompt-level bootstrap and McNemar star both), but over the seeds neither difference holds."""
    abl = tmp_path / "abl"
    write_seeds(abl, "A", {0: last(0, 8), 1: last(4, 4), 2: last(8, 6)})
    write_seeds(abl, "B", {0: last(8, 1), 1: last(2, 7), 2: last(6, 8)})
    write_seeds(abl, "D", {0: last(2, 5), 1: last(6, 5), 2: last(6, 5), 3: last(2, 5)})  # for the A/A check
    write_run(abl / "E", {0: BASE, 4: last(8, 4)})  # a recipe's own folder: one seed
    report = write_report([abl], tmp_path / "out")

    # The prompt-level tests on seed 0: grounded 0/8 against 8/8, accuracy 8/8 against 1/8 (7 discordant prompts,
    # p = 2/2^7).
    seed0 = _comparison(report, "A-seed0", "B-seed0")
    grounded0 = _rate(seed0, 0.0, "grounded_followup_rate")
    assert grounded0["difference"] == 1.0 and grounded0["ci95"][0] > 0
    assert seed0["accuracy"]["p_value"] == pytest.approx(2 / 128)  # < 0.05: starred
    assert not any(c["a"]["run"] == "A-seed0" and c["b"]["run"] == "B-seed1" for c in report["comparisons"])

    (a, b, d, e) = report["variants"]
    assert (a["name"], a["seeds"], a["runs"], a["note"]) == ("A", [0, 1, 2], ["A-seed0", "A-seed1", "A-seed2"], None)
    assert (e["name"], e["seeds"], e["note"]) == ("E", [None], "1 seed: training variance unknown")
    greedy = next(m for m in a["checkpoints"]["last"]["metrics"] if m["metric"] == "grounded_followup_rate"
                  and m["temperature"] == 0.0)
    assert [x["value"] for x in greedy["per_seed"]] == [0.0, 0.5, 1.0] and greedy["mean"] == 0.5
    templates = next(m for m in a["checkpoints"]["last"]["metrics"] if m["metric"] == "distinct_templates"
                     and m["temperature"] == 0.0)  # seeds 1 and 2 (seed 0 has no follow-up): 1/4 and 1/8
    assert [(x["seed"], x["value"]) for x in templates["per_seed"]] == [(1, 0.25), (2, 0.125)]
    assert templates["ci95"] is None and templates["mean"] == pytest.approx(0.1875)
    assert greedy["sd"] == pytest.approx(0.5)
    assert greedy["ci95"][0] <= 0.5 <= greedy["ci95"][1]
    width = greedy["ci95"][1] - greedy["ci95"][0]
    assert width > greedy["ci95_prompts"][1] - greedy["ci95_prompts"][0]  # seeds add training variance

    # Grounded across seeds: means 0.5 and 2/3; B beats A on seed 0 only; P(B > A) = 5.5/9 (by hand, above). With
    # the seeds fixed, the per-prompt differences are 1/3, 1/3, 0, 0, 1/3, 1/3, 0, 0 and the prompt-only interval
    # lies above 0; with the seeds resampled, it holds 0: not starred.
    g = _across(report, "A", "B", "grounded_followup_rate")
    assert (g["mean_a"], g["n_seeds"], g["n_prompts"]) == (0.5, [3, 3], 8)
    assert g["difference"] == pytest.approx(1 / 6) and g["seeds_beating"] == [1, 3]
    assert g["probability_of_improvement"] == pytest.approx(5.5 / 9)
    assert g["ci95_prompts"][0] > 0 and g["ci95"][0] < 0 < g["ci95"][1] and not g["significant"]
    # The seed-level test: A and B hold the same seeds, so a paired t on the per-seed differences 1, -1/4, -1/4
    # (sd 0.7217, df 2, t = 4.3027).
    sd = float(np.std([1, -0.25, -0.25], ddof=1))
    assert (g["seed_test"], g["seed_df"]) == ("paired", 2)
    assert g["ci95_seeds"] == pytest.approx([1 / 6 - 4.3027 * sd / math.sqrt(3), 1 / 6 + 4.3027 * sd / math.sqrt(3)])
    # Accuracy: A 1, 1/2, 3/4 and B 1/8, 7/8, 1: B beats A on seeds 1 and 2, P(B > A) = (0 + 2 + 2.5)/9.
    acc = _across(report, "A", "B", "accuracy")
    assert acc["difference"] == pytest.approx(2 / 3 - 3 / 4) and acc["seeds_beating"] == [2, 3]
    assert acc["probability_of_improvement"] == pytest.approx(4.5 / 9) and not acc["significant"]
    # Within a run, step 0 against the last checkpoint pairs each seed with itself.
    rise = _across(report, "B", "B", "grounded_followup_rate")
    assert (rise["a"]["checkpoint"], rise["b"]["checkpoint"], rise["seeds_beating"]) == ("step0", "last", [3, 3])
    # One seed on a side: the interval is reported, the difference is never starred.
    one = _across(report, "A", "E", "grounded_followup_rate")
    assert one["n_seeds"] == [3, 1] and one["note"] == "1 seed: training variance unknown" and not one["significant"]
    assert not any(c["significant"] for c in report["seed_comparisons"] if 1 in c["n_seeds"])

    # A/A: D's halves (seeds 0+1 and 2+3) are one training; seed 0 against seed 1 at prompt level is starred.
    aa = [c for c in report["aa_check"] if c["a"]["run"].startswith("D ")]
    assert {c["a"]["run"] for c in aa} == {"D seeds 0+1"} and {c["b"]["run"] for c in aa} == {"D seeds 2+3"}
    assert not any(c["significant"] for c in aa)
    assert {(c["variant"], c["seed_test"]) for c in aa} == {("D", "welch")}  # seeds 0+1 against 2+3: not paired
    seed0, seed1 = ({pid: [k < n] for k, pid in enumerate(IDS)} for n in (2, 6))
    assert paired_bootstrap(seed0, seed1)["ci95"][0] > 0
    assert {c["a"]["run"] for c in report["aa_check"]} == {"A seeds 0+1", "B seeds 0+1", "D seeds 0+1"}

    # The plot and its front: each run's mean over its seeds (A at step 4: grounded 0.5, accuracy 0.75).
    front = [(p["run"], p["step"], round(p["rate"], 3), round(p["accuracy"], 3)) for p in report["pareto_front"]]
    assert front == [("A", 4, 0.5, 0.75), ("B", 4, 0.667, 0.667), ("E", 4, 1.0, 0.5)]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Runs across seeds" in md and "| E (1 seed: training variance unknown) | - | last | 4 |" in md
    assert "| A | 0, 1, 2 | last | 4, 4, 4 | 0.750 [" in md and "(1.00, 0.50, 0.75)" in md
    assert "| A @ last | B @ last | greedy grounded | 3 / 3 | 0.500 | 0.667 | +0.167 [" in md
    assert f"Called different: 0 of {len(report['aa_check'])}" in md
    assert "| seeds (t) |" in md and " p, df 2 |" in md
    # A and B have three seeds: a half of one seed is never starred, and the report says so; D (four) is checked.
    assert "A, B: fewer than 4 seeds, so a half has one seed and is never starred: the check cannot flag anything " \
        "for them" in md
    assert "| A seeds 0+1 | A seed 2 | greedy grounded |" in md and "the check cannot flag this |" in md
    assert not any("cannot flag" in line for line in md.splitlines() if line.startswith("| D seeds 0+1 |"))
    assert "| A-seed0 @ 4 | B-seed0 @ 4 |" not in md  # per-seed prompt-level rows stay in report.json


def test_collaboration_success_across_seeds(tmp_path):
    """Runs that held conversations with the oracle partner: each family's success (peer_check also when the answer
    started wrong) and info_gap's asking, per seed, with intervals over seeds and tasks, and B against A starred when
    every seed of B is ahead; a conversation that ended in an error counts nowhere."""
    abl = tmp_path / "abl"
    write_seeds(abl, "A", {0: last(2, 6), 1: last(2, 6), 2: last(2, 6)})
    write_seeds(abl, "B", {0: last(2, 6), 1: last(2, 6), 2: last(2, 6)})
    for seed in range(3):
        for variant in ("A", "B"):
            add_collab(abl / f"{variant}-seed{seed}", 0, wrong=[False] * 4, asks=[False] * 4)
        add_collab(abl / f"A-seed{seed}", 4, wrong=[seed == 1, False, False, False], asks=[False] * 4)
        add_collab(abl / f"B-seed{seed}", 4, wrong=[True, True, True, seed != 1],
                   asks=[seed != 1, seed != 1, seed == 0, False], error_row=seed == 0)
    report = write_report([abl], tmp_path / "out")

    b = next(v for v in report["variants"] if v["name"] == "B")
    metrics = {m["metric"]: m for m in b["checkpoints"]["last"]["metrics"]}
    assert [x["value"] for x in metrics["collab peer_check wrong start"]["per_seed"]] == [1.0, 0.75, 1.0]
    assert [x["value"] for x in metrics["collab peer_check"]["per_seed"]] == [1.0, 0.875, 1.0]
    assert [x["value"] for x in metrics["collab info_gap asked first"]["per_seed"]] == [0.75, 0.0, 0.5]
    assert [x["value"] for x in metrics["collab info_gap"]["per_seed"]] == [0.75, 0.0, 0.5]
    assert metrics["collab peer_check wrong start"]["n_prompts"] == 4  # the errored conversation is not a task here

    # Wrong start: A 0, 1/4, 0 and B 1, 3/4, 1; paired differences 1, 1/2, 1 (mean 5/6): both intervals above 0.
    c = _across(report, "A", "B", "collab peer_check wrong start", t=None)
    assert c["temperature"] is None and c["difference"] == pytest.approx(5 / 6) and c["seeds_beating"] == [3, 3]
    sd = float(np.std([1, 0.5, 1], ddof=1))
    assert c["ci95_seeds"] == pytest.approx([5 / 6 - 4.3027 * sd / math.sqrt(3), 5 / 6 + 4.3027 * sd / math.sqrt(3)])
    assert c["ci95"][0] > 0 and c["significant"]
    assert not _across(report, "A", "B", "collab info_gap", t=None)["significant"]  # B 0.75, 0, 0.5: seed 1 not ahead
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| accuracy | greedy follow-up | greedy grounded |" in md and "| collab peer_check wrong start |" in md
    assert "| A @ last | B @ last | collab peer_check wrong start | 3 / 3 | 0.083 | 0.917 | +0.833 [" in md


def test_markers_from_before_variants_pool_by_their_seed_knob(tmp_path):
    """Ablations whose runs had `seeds` before the file field: the marker has the seed only in its knobs."""
    for seed, spec in ((0, last(2, 6)), (1, last(4, 6))):
        folder = write_run(tmp_path / "abl" / f"dpo-seed{seed}", {0: BASE, 4: spec})
        (folder / "ablation_run.json").write_text(json.dumps({"name": folder.name, "knobs": {"seed": seed},
                                                              "exit_code": 0, "wall_seconds": 1.0}))
    report = write_report([tmp_path / "abl"], tmp_path / "out")
    ((variant),) = report["variants"]
    assert (variant["name"], variant["seeds"]) == ("dpo", [0, 1])
    assert [r["knobs"] for r in report["runs"]] == [{}, {}]


def test_a_runs_own_selection_is_its_best_checkpoint(tmp_path):
    """A recipe run with `select_metric` saved the checkpoint its rule chose as its final adapter: the report's best
    is that one, whatever `--max_accuracy_drop` says."""
    mid = {**A_LAST, "greedy": [1] * 4 + [0] * 4}  # the report's own pick (rate 0.5 at step 0's accuracy)
    run = write_run(tmp_path / "dpo", {0: BASE, 4: mid, 6: A_LAST}, grounded=False)
    assert write_report([run], tmp_path / "out")["runs"][0]["checkpoints"]["best"]["step"] == 4
    (run / "selection.json").write_text(json.dumps({"step": 6, "rule": {"select_metric": "accuracy"}}))
    (summary,) = write_report([run], tmp_path / "out")["runs"]
    assert summary["checkpoints"]["best"]["step"] == 6 and summary["selection"]["rule"] == {"select_metric": "accuracy"}
