"""Run folders as the probe callback writes them, built by hand: what the report and correlation tests read."""

import json
from pathlib import Path

import numpy as np

from uturn_train.probe.metrics import followup_template, summarize_setting, wilson_interval

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
                followups = [r for r in t_rows if r["label"] == "followup"]
                forms = {followup_template(r["user_turn"], r["answer"]) for r in followups}
                setting.update(grounded_followup_rate=hits / len(t_rows),
                               grounded_ci95=list(wilson_interval(hits, len(t_rows))),
                               distinct_followups=len({r["user_turn"] for r in followups}) / len(followups)
                               if followups else None,
                               distinct_templates=len(forms) / len(followups) if followups else None)
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


def add_collab(folder: Path, step: int, wrong: list[bool], asks: list[bool], error_row: bool = False) -> None:
    """Collaboration conversations held at `step` of a run folder, as the callback stores them (`collab/step_<N>.jsonl`
    and the record's `collab` summary, by `collab.dialogue.summarize`): four peer_check tasks whose answer started
    wrong (`wrong`: each one's success), four that started right (all succeed), and four info_gap tasks (`asks`: each
    one's first turn asks, and then succeeds). `error_row`: one more wrong-start conversation that failed with an error
    (left out of every rate)."""
    from uturn_train.collab.dialogue import summarize

    def row(task_id, family, success, answer_right, model_turn, error=None):
        return {"id": task_id, "family": family, "success": success, "turns": 1, "tokens": 5, "questions": 1,
                "ended": "partner_ended", "error": error, "gold": "1", "final_answer": "1",
                "answer_right": answer_right,
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": model_turn}]}

    rows = [row(f"w{i}", "peer_check", ok, False, "Why 2 + 2?") for i, ok in enumerate(wrong)]
    rows += [row(f"r{i}", "peer_check", True, True, "Why 2 + 2?") for i in range(4)]
    rows += [row(f"g{i}", "info_gap", ask, None, "How many apples?" if ask else "#### 3") for i, ask in enumerate(asks)]
    if error_row:
        rows.append(row("w9", "peer_check", None, False, "", error="HTTP 500"))
    (folder / "collab").mkdir(exist_ok=True)
    (folder / "collab" / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    history = [json.loads(line) for line in (folder / "probe_history.jsonl").read_text().splitlines()]
    for record in history:
        if record["step"] == step:
            record["collab"] = summarize(rows, ["info_gap", "peer_check"])
    (folder / "probe_history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
