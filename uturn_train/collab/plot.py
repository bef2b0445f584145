"""`collab.png`: collaboration success per family, the plot `uturn collab` writes."""

from pathlib import Path

from ..io import atomic_open


def plot_success(summary: dict, path: str | Path, title: str = "") -> None:
    """Success rate per family (and peer_check split by its starting answer) with Wilson 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = []
    for family, s in summary.items():
        bars.append((family, s))
        if family == "peer_check":
            bars += [(f"{family}\nwrong start", s["wrong_start"]), (f"{family}\nright start", s["right_start"])]
    bars = [(name, s) for name, s in bars if s["success_rate"] is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    rates = [s["success_rate"] for _, s in bars]
    # Clamped at 0: at a rate of 0 or 1, Wilson's bound equals the rate up to rounding.
    yerr = [[max(0.0, r - s["ci95"][0]) for r, (_, s) in zip(rates, bars)],
            [max(0.0, s["ci95"][1] - r) for r, (_, s) in zip(rates, bars)]]
    ax.bar(range(len(bars)), rates, yerr=yerr, capsize=5, color="tab:blue", alpha=0.8)
    for i, (r, (_, s)) in enumerate(zip(rates, bars)):
        ax.annotate(f"{r:.2f} (n={s['n']})", (i, r), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("success rate (95% CI)")
    ax.set_title(title or "Collaboration success", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
