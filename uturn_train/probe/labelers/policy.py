"""Who labels the probe's turns: the rules, the trained judge ([`~uturn_train.probe.labelers.judge.Judge`]) or an LLM
judge ([`~uturn_train.probe.labelers.llm_judge.Judge`]) instead of them, or an LLM judge beside them.

`settings.labeler` decides what the rows and the rates say:
- `rules`: the rule classifier's `label`, `reason` and `grounded` only.
- `trained`: `label` and `grounded` are the trained judge's (`reason` gives its probabilities), read against the same
  mismatched context as the rules' grounded decision; the rules' ride along as `rules_label`, `rules_grounded` and
  `rules_reason`.
- `both`: those stay the rules'; every row also carries `judge_label`, `judge_grounded` (the judge's own grounded
  decision), `judge_reason` and `judge_error`, and each settings entry a nested `judge` summary.
- `judge`: `label`, `reason` and `grounded` are the judge's; the rules' ride along as `rules_label`, `rules_grounded`
  and `rules_reason`. A turn the judge gave no valid verdict is an error row (`label` None, `error` says why).

A grounded follow-up is, for the judge as for the rules, a `followup` that the judge calls grounded. Error rows of
generation (a failed server request) are not sent to the judge. Under several processes only the main one asks the
judge, and broadcasts the verdicts, so every rank returns (and logs) the same numbers.
"""

from ..metrics import summarize_setting
from ..settings import ProbeSettings
from .judge import Judge as TrainedJudge
from .judge import load_judge
from .llm_judge import RUBRIC_VERSION, Judge, JudgeError

JUDGE_COLUMNS = ("judge_label", "judge_grounded", "judge_reason", "judge_error")
RULES_COLUMNS = ("rules_label", "rules_grounded", "rules_reason")


def make_judge(settings: ProbeSettings, device: str | None = None) -> Judge | TrainedJudge | None:
    """The judge `settings` ask for (`None` for `labeler="rules"`), checked: a wrong URL, key or model fails here."""
    if settings.labeler == "auto":
        raise ValueError("labeler 'auto' is chosen by the task: probe with `settings.for_task(task)` (the commands, "
                         "the callback and mining do), or set labeler to rules or trained")
    if settings.labeler == "rules":
        return None
    if settings.labeler == "trained":
        return load_judge(device=device)
    return Judge(settings.judge_base_url, settings.judge_model, api_key_env=settings.judge_api_key_env,
                 cache_dir=settings.judge_cache_dir, concurrency=settings.judge_concurrency).check()


def on_main_process(fn, state):
    """`fn()` on the main process only; its result, or its error, reaches every rank (a collective)."""
    if state is None or state.num_processes == 1:
        return fn()
    from accelerate.utils import broadcast_object_list

    box = [None]
    if state.is_main_process:
        try:
            box = [(fn(), None)]
        except Exception as e:  # noqa: BLE001 - the other ranks wait on the broadcast: they must hear of it
            error = e
            box = [(None, f"{type(e).__name__} on the main process: {e}")]
    broadcast_object_list(box, from_process=0)
    result, message = box[0]
    if message is not None:
        raise error if state.is_main_process else RuntimeError(message)
    return result


def trained_rows(rows: list[dict], judge: TrainedJudge, answers: list[dict], state=None,
                 disable_progress: bool = False) -> dict:
    """`labeler="trained"`: the judge's label and grounded decision on every row with a turn, the mismatched context
    of a row being its `mismatch_index` prompt's (no grounded decision without one, as for the rules)."""
    import time

    from tqdm.auto import tqdm

    todo = [r for r in rows if r["label"] is not None]
    items = []
    for r in todo:
        other = answers[r["mismatch_index"]] if r["mismatch_index"] is not None else None
        items.append({"query": r["query"], "answer": r["answer"], "user_turn": r["user_turn"],
                      "finish_reason": r["finish_reason"], "other_query": (other or r)["query"],
                      "other_answer": (other or r)["answer"]})

    def ask():
        start = time.perf_counter()
        with tqdm(total=4 * len(items), desc="trained judge", unit="turn-context", disable=disable_progress) as bar:
            verdicts = judge.label(items, bar)
        return verdicts, {"model": judge.name, "turns": len(items), "seconds": round(time.perf_counter() - start, 1)}

    verdicts, figures = on_main_process(ask, state)
    for row in rows:
        row.update(dict.fromkeys(RULES_COLUMNS))
    for row, v in zip(todo, verdicts):
        row.update(rules_label=row["label"], rules_grounded=row["grounded"], rules_reason=row["reason"],
                   label=v.label, reason=v.reason,
                   grounded=v.grounded if row["mismatch_index"] is not None else None)
    return figures


def judge_rows(rows: list[dict], settings: ProbeSettings, judge: Judge | TrainedJudge | None, *, answers=None,
               state=None, disable_progress: bool = False) -> dict | None:
    """Label `rows` (in place) with `judge` as `settings.labeler` says; returns this run's judge figures for
    `results.json` (an LLM judge: `model`, `rubric_version`, `requests`, `cache_hits`, `errors`; the trained judge:
    `model`, `turns`, `seconds`), `None` for the rules alone. `answers`: the probe's, for the trained judge.

    `judge` is needed on the main process only; other ranks may pass `None`.
    """
    if settings.labeler == "rules":
        return None
    if settings.labeler == "trained":
        return trained_rows(rows, judge, answers, state, disable_progress)
    todo = [r for r in rows if r["label"] is not None]  # generation errors have no turn to judge

    def ask():
        before = dict(judge.stats)
        verdicts = judge.label_many([(r["query"], r["answer"], r["user_turn"]) for r in todo],
                                    disable_progress=disable_progress)
        figures = {k: judge.stats[k] - before[k] for k in ("requests", "cache_hits", "errors")}
        return verdicts, {"model": judge.model, "rubric_version": RUBRIC_VERSION, **figures}

    verdicts, figures = on_main_process(ask, state)
    for row in rows:
        row.update(dict.fromkeys(JUDGE_COLUMNS if settings.labeler == "both" else RULES_COLUMNS))
    for row, v in zip(todo, verdicts):
        failed = isinstance(v, JudgeError)
        if settings.labeler == "both":
            row.update({"judge_error": v.error} if failed else
                       {"judge_label": v.label, "judge_grounded": v.grounded, "judge_reason": v.reason})
            continue
        row.update(rules_label=row["label"], rules_grounded=row["grounded"], rules_reason=row["reason"])
        if failed:
            row.update(label=None, grounded=None, reason=None, error=f"judge: {v.error}")
        else:
            row.update(label=v.label, grounded=v.grounded and v.label == "followup", reason=v.reason)
    return figures


def judge_summary(rows: list[dict], temperature: float, samples: int) -> dict:
    """The nested `judge` entry of one temperature (`labeler="both"`): the judge's rates, its errors counted apart."""
    return summarize_setting(temperature, samples, [r["judge_label"] for r in rows],
                             grounded=[r["judge_label"] == "followup" and r["judge_grounded"] for r in rows],
                             turns=[r["user_turn"] for r in rows], answers=[r["answer"] for r in rows])
