"""The user-turn probe: answer (self setting) or take the real answer (heldout), generate the next user turn, classify.

Every turn is also tested for being a *grounded* follow-up ([`~uturn_train.probe.grounding.is_grounded`]): its
mismatched context is the query and answer of another prompt of the same probe, paired by a derangement seeded with
`settings.seed`, so the control is the same for every model probed on the same prompts.

Used alike by `uturn probe`, `eval/probe.py`, `eval/gsm8k.py`, mining and the training callback. Under several
processes each rank generates for an equal share of the prompts ([`~uturn_train.distributed.map_sharded`]); the
generations are gathered and every rank classifies the same full set, so all ranks return identical results.
"""

from dataclasses import dataclass, field

from ..chat import answer_prompt, role_header_starts, user_turn_prompt
from ..distributed import map_sharded
from ..generation import generate
from ..tasks import gsm8k
from ..tasks.base import Example
from .classify import classify_turn
from .grounding import derangement, is_grounded
from .metrics import across_temperatures, summarize_setting
from .settings import ProbeSettings


@dataclass
class ProbeRun:
    """What one probe produced.

    Args:
        summary (`dict`): `n_prompts`, `accuracy`, `accuracy_strict`, `accuracy_flexible` (None without gold
            answers or in the heldout setting), `settings` (one entry per temperature, see `summarize_setting`:
            follow-up and grounded follow-up rates with Wilson intervals, distinct follow-ups, label shares),
            `followup_rate_max`/`_mean`, `grounded_followup_rate_max`/`_mean`.
        rows (`list[dict]`): one per generated user turn (the `samples.jsonl` schema).
        answers (`list[dict]`): one per prompt: the answer the user turn reacts to, and its correctness.
    """

    summary: dict
    rows: list[dict] = field(default_factory=list)
    answers: list[dict] = field(default_factory=list)


def check_setting(setting: str, examples: list[Example], task: str = "this task") -> None:
    if setting == "heldout":
        # None, not "": the loaders reject empty answers, so an empty one is on purpose (`uturn validate` empties
        # answers to check that the probe reacts).
        missing = [ex.id for ex in examples if ex.answer is None]
        if missing:
            raise ValueError(
                f"the heldout setting needs a real assistant answer per prompt, but {task} has none for "
                f"{len(missing)} prompts (first: {missing[0]}); use --setting self, or a task with answers "
                "(gsm8k, oasst, testbed)"
            )


def _messages(ex: Example, answer: str | None = None) -> list[dict]:
    messages = [*ex.meta.get("history", []), {"role": "user", "content": ex.query}]
    return messages if answer is None else [*messages, {"role": "assistant", "content": answer}]


def _answers(model, tokenizer, examples: list[Example], settings: ProbeSettings, seed: int,
             disable_progress: bool) -> list[dict]:
    """The answer each user turn reacts to: the model's own (greedy), or the data's in the heldout setting."""
    if settings.setting == "heldout":
        return [{"answer_prompt": None, "answer": ex.answer, "answer_finish_reason": None} for ex in examples]
    prompts = [answer_prompt(tokenizer, _messages(ex), enable_thinking=settings.enable_thinking) for ex in examples]
    generations = generate(model, tokenizer, prompts, max_new_tokens=settings.answer_max_new_tokens, temperature=0.0,
                           batch_size=settings.batch_size, seed=seed, desc="answers", disable_progress=disable_progress)
    return [{"answer_prompt": p, "answer": g.text, "answer_finish_reason": g.finish_reason}
            for p, (g,) in zip(prompts, generations)]


def _generate_shard(model, tokenizer, examples: list[Example], settings: ProbeSettings, rank: int,
                    disable_progress: bool) -> list[dict]:
    """Per example: its answer, its user-turn prompt and, per temperature, its generated user turns."""
    seed = settings.seed + 1000 * rank  # shards of different ranks are independent draws
    answers = _answers(model, tokenizer, examples, settings, seed, disable_progress)
    prompts = [user_turn_prompt(tokenizer, _messages(ex, a["answer"]), enable_thinking=settings.enable_thinking)
               for ex, a in zip(examples, answers)]
    turns = [[] for _ in examples]
    for t_index, temperature in enumerate(settings.temperatures):
        gens = generate(model, tokenizer, prompts, max_new_tokens=settings.max_new_tokens, temperature=temperature,
                        num_samples=1 if temperature == 0 else settings.samples, batch_size=settings.batch_size,
                        seed=seed + 1 + t_index, desc=f"user turns T={temperature:g}",
                        disable_progress=disable_progress)
        for per_example, outs in zip(turns, gens):
            per_example.append(outs)
    return [{**a, "user_prompt": p, "turns": t} for a, p, t in zip(answers, prompts, turns)]


def _graded(ex: Example, answer: dict, setting: str) -> dict:
    if setting != "self" or ex.gold is None:
        return {"answer_correct": None, "answer_strict": None, "answer_flexible": None}
    return {"answer_correct": gsm8k.is_correct(answer, ex.gold), "answer_strict": gsm8k.strict_match(answer, ex.gold),
            "answer_flexible": gsm8k.flexible_extract(answer, ex.gold)}


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def run_probe(model, tokenizer, examples: list[Example], settings: ProbeSettings | None = None, *, state=None,
              disable_progress: bool = False) -> ProbeRun:
    """Probe `model` on `examples`; see the module docstring.

    Args:
        settings ([`ProbeSettings`], *optional*): what to generate and how; defaults to `ProbeSettings()`.
        state (`accelerate.PartialState`, *optional*): shard across its processes; all of them must call this.
    """
    settings = settings or ProbeSettings()
    if not examples:
        raise ValueError("no prompts to probe")
    check_setting(settings.setting, examples)
    show = not disable_progress and (state is None or state.is_main_process)
    generated = map_sharded(
        examples, lambda shard, rank: _generate_shard(model, tokenizer, shard, settings, rank, not show), state)

    headers = role_header_starts(tokenizer)
    # Each prompt's mismatched context for the grounded decision: another prompt's query and answer (none if alone).
    other = derangement(len(examples), settings.seed) if len(examples) > 1 else None
    answers, rows = [], []
    for index, (ex, g) in enumerate(zip(examples, generated)):
        answers.append({"index": index, "id": ex.id, "query": ex.query, "answer_prompt": g["answer_prompt"],
                        "answer": g["answer"], "answer_finish_reason": g["answer_finish_reason"], "gold": ex.gold,
                        **_graded(ex, g["answer"], settings.setting)})
    for t_index, temperature in enumerate(settings.temperatures):
        for a, ex, g in zip(answers, examples, generated):
            for s, out in enumerate(g["turns"][t_index]):
                # A turn that ended by opening another role's header keeps that header: the classifier calls a user
                # turn that hands over to the assistant identity drift.
                turn = out.text + out.stop if out.stop in headers else out.text
                verdict = classify_turn(ex.query, a["answer"], turn, finish_reason=out.finish_reason)
                grounding = None
                if other is not None:
                    o = answers[other[a["index"]]]
                    grounding = is_grounded(ex.query, a["answer"], turn, o["query"], o["answer"], verdict=verdict,
                                            finish_reason=out.finish_reason)
                rows.append({
                    "index": a["index"], "id": ex.id, "temperature": temperature, "sample_index": s,
                    "query": ex.query, "answer": a["answer"], "answer_prompt": a["answer_prompt"],
                    "answer_correct": a["answer_correct"], "user_prompt": g["user_prompt"], "user_turn": turn,
                    "label": verdict.label, "reason": verdict.reason,
                    "grounded": grounding.grounded if grounding else None,
                    "mismatch_label": grounding.mismatch_label if grounding else None,
                    "mismatch_index": other[a["index"]] if other else None, "finish_reason": out.finish_reason,
                    "completion_tokens": out.completion_tokens, "reference_followup": ex.reference_followup,
                })

    summaries = []
    for temperature in settings.temperatures:
        of_t = [r for r in rows if r["temperature"] == temperature]
        summaries.append(summarize_setting(temperature, 1 if temperature == 0 else settings.samples,
                                           [r["label"] for r in of_t], grounded=[r["grounded"] for r in of_t],
                                           turns=[r["user_turn"] for r in of_t]))
    graded = settings.setting == "self" and any(a["gold"] is not None for a in answers)
    summary = {
        "setting": settings.setting,
        "n_prompts": len(answers),
        "accuracy": _mean([a["answer_correct"] for a in answers]) if graded else None,
        "accuracy_strict": _mean([a["answer_strict"] for a in answers]) if graded else None,
        "accuracy_flexible": _mean([a["answer_flexible"] for a in answers]) if graded else None,
        "settings": summaries,
        **across_temperatures(summaries),
    }
    return ProbeRun(summary=summary, rows=rows, answers=answers)
