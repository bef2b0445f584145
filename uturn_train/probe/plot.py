"""Plots people would rather look at than read: follow-up rate against temperature, and across checkpoints."""

from pathlib import Path

from ..io import atomic_open


def _figure():
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes
    import matplotlib.pyplot as plt

    return plt


def plot_followup_vs_temperature(settings: list[dict], accuracy: float | None, path: str | Path,
                                 title: str = "") -> None:
    """Follow-up rate with its Wilson 95% interval at each temperature; task accuracy as a dashed line."""
    plt = _figure()
    temps = [s["temperature"] for s in settings]
    rates = [s["followup_rate"] or 0.0 for s in settings]
    lo = [r - s["ci95"][0] for r, s in zip(rates, settings)]
    hi = [s["ci95"][1] - r for r, s in zip(rates, settings)]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.errorbar(temps, rates, yerr=[lo, hi], marker="o", capsize=4, label="follow-up rate (95% CI)")
    for t, r, s in zip(temps, rates, settings):
        ax.annotate(f"{r:.2f} (n={s['n']})", (t, r), textcoords="offset points", xytext=(6, 6), fontsize=8)
    if accuracy is not None:
        ax.axhline(accuracy, color="tab:green", linestyle="--", label=f"accuracy (greedy) = {accuracy:.2f}")
    ax.set_xlabel("temperature (0 = greedy)")
    ax.set_ylabel("share of user turns")
    ax.set_ylim(0, 1)
    ax.set_title(title or "User-turn probe: genuine follow-ups")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)


def plot_probe_history(records: list[dict], path: str | Path, title: str = "") -> None:
    """Follow-up rate per temperature (95% interval as a band) and accuracy against the training step, from the
    records of `probe_history.jsonl`; records of failed probes are skipped."""
    plt = _figure()
    records = sorted((r for r in records if r["settings"]), key=lambda r: r["step"])
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    temperatures = sorted({s["temperature"] for r in records for s in r["settings"]})
    for t in temperatures:
        points = [(r["step"], s) for r in records for s in r["settings"] if s["temperature"] == t]
        steps = [step for step, _ in points]
        line, = ax.plot(steps, [s["followup_rate"] or 0.0 for _, s in points], marker="o",
                        label=f"follow-up rate, {'greedy' if t == 0 else f'T={t:g}'}")
        ax.fill_between(steps, [s["ci95"][0] for _, s in points], [s["ci95"][1] for _, s in points],
                        color=line.get_color(), alpha=0.15)
    graded = [r for r in records if r["accuracy"] is not None]
    if graded:
        ax.plot([r["step"] for r in graded], [r["accuracy"] for r in graded], marker="s", linestyle="--",
                color="tab:green", label="accuracy (greedy)")
    ax.set_xlabel("training step")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1)
    ax.set_title(title or "User-turn probe per checkpoint")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
