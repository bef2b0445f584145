"""How well the rule classifier (and an LLM judge) agree with reference labels from people or another judge
(`uturn agreement`, `commands/agreement.py`).

Each input row holds `query`, `answer`, `user_turn` and the reference `label` (one of `LABELS`; `finish_reason`
optional). Per labeler: per-label precision, recall and F1, the confusion matrix, accuracy and Cohen's kappa; the rows
where a labeler differs from the reference go to `disagreements.jsonl`, the figures to `agreement.json`, and a Markdown
table is printed. A turn the judge could not label is counted as an error and left out of the judge's figures.
"""

from collections import Counter
from pathlib import Path

from ...io import ensure_writable_dir, read_jsonl, write_json, write_jsonl
from ..rules.classify import LABELS, classify_turn


def load_labelled(path: str | Path) -> list[dict]:
    """Rows of a labelled jsonl file; a bad row fails with its line number."""
    if not Path(path).is_file():
        raise ValueError(f"--input {path} is not a file: pass a jsonl of rows with query, answer, user_turn and label")
    rows = read_jsonl(path, ("query", "answer", "user_turn"), check=lambda row: None if row.get("label") in LABELS
                      else f"label {row.get('label')!r} is not one of {list(LABELS)}")
    if not rows:
        raise ValueError(f"{path} holds no rows")
    return rows


def cohen_kappa(reference: list[str], predicted: list[str]) -> float | None:
    """Cohen's kappa, (p_o - p_e) / (1 - p_e); `None` when undefined (both sides use one and the same label)."""
    n = len(reference)
    observed = sum(r == p for r, p in zip(reference, predicted)) / n
    ref, pred = Counter(reference), Counter(predicted)
    expected = sum(ref[label] * pred[label] for label in ref) / (n * n)
    return None if expected == 1 else (observed - expected) / (1 - expected)


def agreement(reference: list[str], predicted: list[str | None]) -> dict:
    """Figures of `predicted` against `reference`; `None` predictions (errors) are counted and left out.

    Returns:
        `dict`: `n` (rows compared), `errors`, `accuracy`, `kappa`, `per_label` (label -> precision, recall, f1,
        support; `None` where undefined) and `confusion` (reference label -> predicted label -> count).
    """
    pairs = [(r, p) for r, p in zip(reference, predicted, strict=True) if p is not None]
    if not pairs:
        return {"n": 0, "errors": len(reference), "accuracy": None, "kappa": None, "per_label": {}, "confusion": {}}
    ref, pred = [r for r, _ in pairs], [p for _, p in pairs]
    counts = Counter(pairs)
    per_label = {}
    for label in LABELS:
        tp, n_pred, n_ref = counts[label, label], pred.count(label), ref.count(label)
        precision = tp / n_pred if n_pred else None
        recall = tp / n_ref if n_ref else None
        if precision is None or recall is None:
            f1 = None
        else:
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_label[label] = {"precision": precision, "recall": recall, "f1": f1, "support": n_ref}
    return {
        "n": len(pairs),
        "errors": len(reference) - len(pairs),
        "accuracy": sum(r == p for r, p in pairs) / len(pairs),
        "kappa": cohen_kappa(ref, pred),
        "per_label": per_label,
        "confusion": {r: {p: counts[r, p] for p in LABELS} for r in LABELS},
    }


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def markdown(report: dict) -> str:
    """Per labeler: a table of per-label figures and the confusion matrix (rows: reference, columns: labeler)."""
    out = []
    for name, figures in report["labelers"].items():
        out.append(f"### {name}: n={figures['n']}, errors={figures['errors']}, accuracy={_fmt(figures['accuracy'])}, "
                   f"kappa={_fmt(figures['kappa'])}\n")
        out.append("| label | precision | recall | F1 | support |\n|---|---|---|---|---|")
        for label, f in figures["per_label"].items():
            out.append(f"| {label} | {_fmt(f['precision'])} | {_fmt(f['recall'])} | {_fmt(f['f1'])} | {f['support']} |")
        if figures["confusion"]:
            out.append(f"\n| reference \\ {name} | " + " | ".join(LABELS) + " |\n|---|" + "---|" * len(LABELS))
            for r in LABELS:
                out.append(f"| {r} | " + " | ".join(str(figures["confusion"][r][p]) for p in LABELS) + " |")
        out.append("")
    return "\n".join(out)


def run_agreement(input_path: str | Path, out: str | Path, judge=None, disable_progress: bool = False) -> dict:
    """Label every row with the rules (and `judge`, a [`~uturn_train.probe.labelers.llm_judge.Judge`]), compare, write.

    Writes `out/agreement.json` and `out/disagreements.jsonl` (the input row plus `rules_label`, `rules_reason` and,
    with a judge, `judge_label`, `judge_grounded`, `judge_reason` or `judge_error`); returns the report.
    """
    rows = load_labelled(input_path)
    out = ensure_writable_dir(out)
    reference = [r["label"] for r in rows]
    verdicts = [classify_turn(r["query"], r["answer"], r["user_turn"], finish_reason=r.get("finish_reason"))
                for r in rows]
    labelled = [{**r, "rules_label": v.label, "rules_reason": v.reason} for r, v in zip(rows, verdicts)]
    report = {"input": str(input_path), "labelers": {"rules": agreement(reference, [v.label for v in verdicts])}}
    if judge is not None:
        from ..labelers.llm_judge import JudgeError

        judged = judge.label_many([(r["query"], r["answer"], r["user_turn"]) for r in rows],
                                  disable_progress=disable_progress)
        for row, j in zip(labelled, judged):
            if isinstance(j, JudgeError):
                row["judge_error"] = j.error
            else:
                row.update(judge_label=j.label, judge_grounded=j.grounded, judge_reason=j.reason)
        report["labelers"]["judge"] = agreement(reference, [row.get("judge_label") for row in labelled])
        report["judge"] = {"model": judge.model, "stats": dict(judge.stats)}
    disagreements = [row for row in labelled if row["rules_label"] != row["label"]
                     or ("judge_label" in row and row["judge_label"] != row["label"]) or "judge_error" in row]
    write_jsonl(out / "disagreements.jsonl", disagreements)
    write_json(out / "agreement.json", report)
    return report
