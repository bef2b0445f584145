"""Plots people would rather look at than read: follow-up rate against temperature, and across checkpoints."""

from pathlib import Path

from ..io import atomic_open
from .record import temperature_label


def _figure():
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes
    import matplotlib.pyplot as plt

    return plt


def plot_followup_vs_temperature(settings: list[dict], accuracy: float | None, path: str | Path,
                                 title: str = "") -> None:
    """Follow-up and grounded follow-up rates with their Wilson 95% intervals at each temperature; task accuracy as a
    dashed line."""
    plt = _figure()
    temps = [s["temperature"] for s in settings]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for key, ci, name, marker in (("followup_rate", "ci95", "follow-up rate", "o"),
                                  ("grounded_followup_rate", "grounded_ci95", "grounded follow-up rate", "D")):
        points = [(t, s[key], s[ci], s["n"]) for t, s in zip(temps, settings) if s.get(key) is not None]
        if not points:
            continue
        rates = [r for _, r, _, _ in points]
        yerr = [[r - c[0] for _, r, c, _ in points], [c[1] - r for _, r, c, _ in points]]
        ax.errorbar([t for t, *_ in points], rates, yerr=yerr, marker=marker, capsize=4, label=f"{name} (95% CI)")
        for t, r, _, n in points:
            ax.annotate(f"{r:.2f} (n={n})", (t, r), textcoords="offset points", xytext=(6, 6), fontsize=8)
    if accuracy is not None:
        ax.axhline(accuracy, color="tab:green", linestyle="--", label=f"accuracy (greedy) = {accuracy:.2f}")
    ax.set_xlabel("temperature (0 = greedy)")
    ax.set_ylabel("share of user turns")
    ax.set_ylim(0, 1)
    ax.set_title(title or "User-turn probe: follow-ups and grounded follow-ups")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)


def plot_probe_history(records: list[dict], path: str | Path, title: str = "") -> None:
    """Follow-up rate (solid, its 95% interval as a band) and grounded follow-up rate (dotted) per temperature, and
    accuracy against the training step, from the records of `probe_history.jsonl`; failed probes are skipped."""
    plt = _figure()
    records = sorted((r for r in records if r["settings"]), key=lambda r: r["step"])
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    temperatures = sorted({s["temperature"] for r in records for s in r["settings"]})
    for t in temperatures:
        points = [(r["step"], s) for r in records for s in r["settings"] if s["temperature"] == t]
        steps = [step for step, _ in points]
        name = temperature_label(t)
        (line,) = ax.plot(steps, [s["followup_rate"] or 0.0 for _, s in points], marker="o",
                          label=f"follow-up rate, {name}")
        ax.fill_between(steps, [s["ci95"][0] for _, s in points], [s["ci95"][1] for _, s in points],
                        color=line.get_color(), alpha=0.15)
        grounded = [(step, s) for step, s in points if s.get("grounded_followup_rate") is not None]
        if grounded:
            ax.plot([step for step, _ in grounded], [s["grounded_followup_rate"] for _, s in grounded], marker="D",
                    linestyle=":", color=line.get_color(), label=f"grounded follow-up rate, {name}")
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
