"""The user-turn probe: answer (self setting) or take the real answer (heldout), generate the next user turn, classify.

Used alike by `uturn probe`, `eval/probe.py`, `eval/gsm8k.py` and the training callback. Under several processes each
rank takes an equal-sized shard (padded, so collective generation under ZeRO-3 never waits on a rank with less work),
and the rows are gathered so every rank returns the full, identically ordered result.
"""

from dataclasses import dataclass, field

from ..chat import answer_prompt, role_header_starts, user_turn_prompt
from ..generation import generate
from ..tasks import gsm8k
from ..tasks.base import Example
from .classify import classify_turn
from .metrics import across_temperatures, summarize_setting

SETTINGS = ("self", "heldout")


@dataclass
class ProbeRun:
    """What one probe produced.

    Args:
        summary (`dict`): `n_prompts`, `accuracy`, `accuracy_strict`, `accuracy_flexible` (None without gold
            answers or in the heldout setting), `settings` (one entry per temperature, see `summarize_setting`),
            `followup_rate_max`, `followup_rate_mean`.
        rows (`list[dict]`): one per generated user turn (the `samples.jsonl` schema).
        answers (`list[dict]`): one per prompt: the answer the user turn reacts to, and its correctness.
    """

    summary: dict
    rows: list[dict] = field(default_factory=list)
    answers: list[dict] = field(default_factory=list)


def check_setting(setting: str, examples: list[Example], task: str = "this task") -> None:
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; choose one of {SETTINGS}")
    if setting == "heldout":
        missing = [ex.id for ex in examples if not ex.answer]
        if missing:
            raise ValueError(
                f"the heldout setting needs a real assistant answer per prompt, but {task} has none for "
                f"{len(missing)} prompts (first: {missing[0]}); use --setting self, or a task with answers "
                "(gsm8k, oasst, testbed)"
            )


def _probe_shard(model, tokenizer, indexed: list[tuple[int, Example]], *, setting, temperatures, samples,
                 max_new_tokens, answer_max_new_tokens, batch_size, seed, enable_thinking, disable_progress):
    examples = [ex for _, ex in indexed]
    histories = [ex.meta.get("history", []) for ex in examples]
    answers = []
    if setting == "self":
        a_prompts = [answer_prompt(tokenizer, h + [{"role": "user", "content": ex.query}], enable_thinking=enable_thinking)
                     for h, ex in zip(histories, examples)]
        a_gens = generate(model, tokenizer, a_prompts, max_new_tokens=answer_max_new_tokens, temperature=0.0,
                          batch_size=batch_size, seed=seed, desc="answers", disable_progress=disable_progress)
        for (i, ex), prompt, (g,) in zip(indexed, a_prompts, a_gens):
            answers.append({
                "index": i, "id": ex.id, "query": ex.query, "answer_prompt": prompt, "answer": g.text,
                "answer_finish_reason": g.finish_reason, "gold": ex.gold,
                "answer_correct": gsm8k.is_correct(g.text, ex.gold) if ex.gold is not None else None,
                "answer_strict": gsm8k.strict_match(g.text, ex.gold) if ex.gold is not None else None,
                "answer_flexible": gsm8k.flexible_extract(g.text, ex.gold) if ex.gold is not None else None,
            })
    else:
        answers = [{"index": i, "id": ex.id, "query": ex.query, "answer_prompt": None, "answer": ex.answer,
                    "answer_finish_reason": None, "gold": ex.gold, "answer_correct": None, "answer_strict": None,
                    "answer_flexible": None} for i, ex in indexed]

    rows = []
    if not temperatures:
        return answers, rows
    u_prompts = [
        user_turn_prompt(tokenizer, h + [{"role": "user", "content": ex.query}, {"role": "assistant", "content": a["answer"]}],
                         enable_thinking=enable_thinking)
        for h, ex, a in zip(histories, examples, answers)
    ]
    headers = role_header_starts(tokenizer)
    for t_index, temperature in enumerate(temperatures):
        k = 1 if temperature == 0 else samples
        gens = generate(model, tokenizer, u_prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                        num_samples=k, batch_size=batch_size, seed=seed + 1 + t_index,
                        desc=f"user turns T={temperature:g}", disable_progress=disable_progress)
        for a, ex, prompt, outs in zip(answers, examples, u_prompts, gens):
            for s, g in enumerate(outs):
                # A turn that ended by opening another role's header keeps that header: the classifier
                # calls a user turn that hands over to the assistant identity drift.
                turn = g.text + g.stop if g.stop in headers else g.text
                verdict = classify_turn(ex.query, a["answer"], turn, finish_reason=g.finish_reason)
                rows.append({
                    "index": a["index"], "id": ex.id, "temperature": temperature, "sample_index": s,
                    "query": ex.query, "answer": a["answer"], "answer_prompt": a["answer_prompt"],
                    "answer_correct": a["answer_correct"], "user_prompt": prompt, "user_turn": turn,
                    "label": verdict.label, "reason": verdict.reason, "finish_reason": g.finish_reason,
                    "completion_tokens": g.completion_tokens, "reference_followup": ex.reference_followup,
                })
    return answers, rows


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def run_probe(model, tokenizer, examples: list[Example], *, setting: str = "self",
              temperatures: list[float] = (0.0, 1.0), samples: int = 4, max_new_tokens: int = 256,
              answer_max_new_tokens: int = 512, batch_size: int = 16, seed: int = 0, enable_thinking: bool = False,
              state=None, disable_progress: bool = False) -> ProbeRun:
    """Probe `model` on `examples`; see the module docstring.

    Args:
        temperatures (`list[float]`): 0 means greedy with one user turn per prompt; any other value samples
            `samples` user turns per prompt. Empty: answers (and accuracy) only.
        state (`accelerate.PartialState`, *optional*): shard across its processes; all of them must call this.
    """
    if not examples:
        raise ValueError("no prompts to probe")
    check_setting(setting, examples)
    if any(t < 0 for t in temperatures):
        raise ValueError(f"temperatures must be >= 0, got {list(temperatures)}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    kwargs = dict(setting=setting, temperatures=list(temperatures), samples=samples, max_new_tokens=max_new_tokens,
                  answer_max_new_tokens=answer_max_new_tokens, batch_size=batch_size, enable_thinking=enable_thinking)
    indexed = list(enumerate(examples))
    if state is None or state.num_processes == 1:
        answers, rows = _probe_shard(model, tokenizer, indexed, seed=seed, disable_progress=disable_progress, **kwargs)
    else:
        from accelerate.utils import gather_object

        with state.split_between_processes(indexed, apply_padding=True) as shard:
            # Seeds differ per rank so sampled turns of different shards are independent draws.
            answers, rows = _probe_shard(model, tokenizer, shard, seed=seed + 1000 * state.process_index,
                                         disable_progress=disable_progress or not state.is_main_process, **kwargs)
        # Padding repeats a rank's last prompt: keep the first copy of every (prompt, temperature, sample).
        answers = list({a["index"]: a for a in reversed(gather_object(answers))}.values())
        rows = list({(r["index"], r["temperature"], r["sample_index"]): r for r in reversed(gather_object(rows))}.values())
    answers.sort(key=lambda a: a["index"])
    order = {t: i for i, t in enumerate(kwargs["temperatures"])}
    rows.sort(key=lambda r: (order[r["temperature"]], r["index"], r["sample_index"]))

    settings = []
    for temperature in kwargs["temperatures"]:
        labels = [r["label"] for r in rows if r["temperature"] == temperature]
        settings.append(summarize_setting(temperature, 1 if temperature == 0 else samples, labels))
    graded = setting == "self" and any(a["gold"] is not None for a in answers)
    summary = {
        "setting": setting,
        "n_prompts": len(answers),
        "accuracy": _mean([a["answer_correct"] for a in answers]) if graded else None,
        "accuracy_strict": _mean([a["answer_strict"] for a in answers]) if graded else None,
        "accuracy_flexible": _mean([a["answer_flexible"] for a in answers]) if graded else None,
        "settings": settings,
        **across_temperatures(settings),
    }
    return ProbeRun(summary=summary, rows=rows, answers=answers)
