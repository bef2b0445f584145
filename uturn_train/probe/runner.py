"""The user-turn probe: answer (self setting) or take the real answer (heldout), generate the next user turn, classify.

Every turn is also tested for being a *grounded* follow-up ([`~uturn_train.probe.rules.grounding.is_grounded`]): its
mismatched context is the query and answer of another prompt of the same probe, paired by a derangement seeded with
`settings.seed`, so the control is the same for every model probed on the same prompts.

Used alike by `uturn probe`, `eval/probe.py`, `eval/gsm8k.py`, mining and the training callback. Under several
processes each rank generates for an equal share of the prompts ([`~uturn_train.distributed.map_sharded`]); the
generations are gathered and every rank classifies the same full set, so all ranks return identical results.

Generation runs locally ([`~uturn_train.generation.generate`]) or, given a `client`
([`~uturn_train.server.CompletionsClient`]), through a server, from the same rendered prompts. A request that failed
for good is an *error row*: `label` None, `finish_reason` "error", the reason in `error`; a prompt whose answer failed
(`answer_error`) gets error rows for all its user turns. Error rows are counted (`errors` per temperature,
`answer_errors`) and left out of every rate. With `settings.scorer` a fixed model must confirm each grounded turn
([`~uturn_train.probe.labelers.scorer`]). Labels come from the rules, the trained judge, an LLM judge or both
(`settings.labeler`, see [`~uturn_train.probe.labelers.policy`]).
"""

from dataclasses import dataclass, field

from ..chat import answer_prompt, role_header_starts, user_turn_prompt
from ..distributed import map_sharded
from ..generation import generate
from ..tasks import gsm8k
from ..tasks.base import Example
from .labelers.policy import judge_rows, judge_summary, make_judge
from .labelers.scorer import confirm_grounded, load_scorer
from .metrics import across_temperatures, summarize_setting
from .rules.classify import classify_turn
from .rules.grounding import derangement, is_grounded
from .settings import ProbeSettings


@dataclass
class ProbeRun:
    """What one probe produced.

    Args:
        summary (`dict`): `n_prompts`, `accuracy`, `accuracy_strict`, `accuracy_flexible` (None without gold
            answers or in the heldout setting; failed answers left out), `answer_errors`, `labeler`, `settings` (one
            entry per temperature, see `summarize_setting`: follow-up and grounded follow-up rates with Wilson
            intervals, distinct follow-ups, label shares, error rows; with `labeler="both"` a nested `judge` entry),
            `followup_rate_max`/`_mean`, `grounded_followup_rate_max`/`_mean`; `server` (`flavour`, `requests`,
            `errors`) through a server, `judge` (`model`, `rubric_version`, `requests`, `cache_hits`, `errors`) with a
            judge.
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


def _generate(model, tokenizer, client, prompts: list[str], settings: ProbeSettings, **kwargs) -> list:
    if client is not None:
        return client.generate(prompts, **kwargs)
    return generate(model, tokenizer, prompts, batch_size=settings.batch_size, **kwargs)


SEED_STRIDE = 1_000_003  # more generator seeds than one run's requests


def _answers(model, tokenizer, client, examples: list[Example], settings: ProbeSettings, seed: int,
             disable_progress: bool) -> list[dict]:
    """The answer each user turn reacts to: the model's own (greedy), or the data's in the heldout setting."""
    if settings.setting == "heldout":
        return [{"answer_prompt": None, "answer": ex.answer, "answer_finish_reason": None, "answer_error": None}
                for ex in examples]
    prompts = [answer_prompt(tokenizer, _messages(ex), enable_thinking=settings.enable_thinking) for ex in examples]
    generations = _generate(model, tokenizer, client, prompts, settings, max_new_tokens=settings.answer_max_new_tokens,
                            temperature=0.0, seed=seed, desc="answers", disable_progress=disable_progress)
    return [{"answer_prompt": p, "answer": g.text, "answer_finish_reason": g.finish_reason, "answer_error": g.error}
            for p, (g,) in zip(prompts, generations)]


def _generate_shard(model, tokenizer, client, examples: list[Example], settings: ProbeSettings, rank: int,
                    disable_progress: bool) -> list[dict]:
    """Per example: its answer, its user-turn prompt and, per temperature, its generated user turns (None when its
    answer failed)."""
    seed = settings.seed + 1000 * rank  # shards of different ranks are independent draws
    answers = _answers(model, tokenizer, client, examples, settings, seed, disable_progress)
    # Each seed owns a range of SEED_STRIDE generator seeds, so that two runs with different `--seed` never draw with
    # the same one (`seed + 1 + t_index` alone gave `--seed 1 --temperatures 1` the samples of `--seed 0
    # --temperatures 0 1`, and a server's per-request seeds overlapped in k - 1 of k samples); seed 0 keeps its draws.
    base = seed * SEED_STRIDE
    answered = [i for i, a in enumerate(answers) if a["answer_error"] is None]
    prompts = [user_turn_prompt(tokenizer, _messages(ex, a["answer"]), enable_thinking=settings.enable_thinking)
               if a["answer_error"] is None else None for ex, a in zip(examples, answers)]
    turns = [[] if a["answer_error"] is None else None for a in answers]
    offset = len(examples)
    for t_index, temperature in enumerate(settings.temperatures):
        k = 1 if temperature == 0 else settings.samples
        # The local backend draws a temperature from one generator seeded `base + 1 + t_index`; a server seeds each
        # request (`base + i * k + j`), so there each temperature takes its own range, after the answers'.
        t_seed = base + offset if client is not None else base + 1 + t_index
        offset += len(answered) * k
        gens = _generate(model, tokenizer, client, [prompts[i] for i in answered], settings,
                         max_new_tokens=settings.max_new_tokens, temperature=temperature, num_samples=k, seed=t_seed,
                         desc=f"user turns T={temperature:g}", disable_progress=disable_progress)
        for i, outs in zip(answered, gens):
            turns[i].append(outs)
    return [{**a, "user_prompt": p, "turns": t} for a, p, t in zip(answers, prompts, turns)]


def _graded(ex: Example, answer: str, setting: str, failed: bool) -> dict:
    if setting != "self" or ex.gold is None or failed:
        return {"answer_correct": None, "answer_strict": None, "answer_flexible": None}
    return {"answer_correct": gsm8k.is_correct(answer, ex.gold), "answer_strict": gsm8k.strict_match(answer, ex.gold),
            "answer_flexible": gsm8k.flexible_extract(answer, ex.gold)}


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _row(ex: Example, a: dict, g: dict, temperature: float, s: int) -> dict:
    return {"index": a["index"], "id": ex.id, "temperature": temperature, "sample_index": s, "query": ex.query,
            "answer": a["answer"], "answer_prompt": a["answer_prompt"], "answer_correct": a["answer_correct"],
            "user_prompt": g["user_prompt"], "user_turn": "", "label": None, "reason": None, "grounded": None,
            "mismatch_label": None, "mismatch_index": None, "finish_reason": "error", "completion_tokens": 0,
            "reference_followup": ex.reference_followup, "error": None}


def _rows(examples: list[Example], answers: list[dict], generated: list[dict], settings: ProbeSettings,
          headers: list[str]) -> list[dict]:
    """One row per generated user turn, labelled by the rules; error rows for failed requests and failed answers."""
    # Each prompt's mismatched context for the grounded decision: another answered prompt's query and answer. The
    # distinct contexts are paired, as prompts may share one (OASST siblings); none if fewer than two.
    first = {}  # context -> the first answered prompt that has it
    for a in answers:
        if a["answer_error"] is None:
            first.setdefault((a["query"], a["answer"]), a["index"])
    contexts = list(first)
    pairs = dict(zip(contexts, (contexts[j] for j in derangement(len(contexts), settings.seed)))) \
        if len(contexts) > 1 else {}
    other = {a["index"]: first[pairs[a["query"], a["answer"]]] for a in answers
             if (a["query"], a["answer"]) in pairs and a["answer_error"] is None}
    rows = []
    for t_index, temperature in enumerate(settings.temperatures):
        k = 1 if temperature == 0 else settings.samples
        for a, ex, g in zip(answers, examples, generated):
            if g["turns"] is None:  # no answer to react to
                rows += [{**_row(ex, a, g, temperature, s), "error": f"answer failed: {a['answer_error']}"}
                         for s in range(k)]
                continue
            for s, out in enumerate(g["turns"][t_index]):
                row = _row(ex, a, g, temperature, s)
                rows.append(row)
                if out.finish_reason == "error":
                    row["error"] = out.error
                    continue
                # A turn that ended by opening another role's header keeps that header: the classifier calls a user
                # turn that hands over to the assistant identity drift.
                turn = out.text + out.stop if out.stop in headers else out.text
                verdict = classify_turn(ex.query, a["answer"], turn, finish_reason=out.finish_reason)
                row.update(user_turn=turn, label=verdict.label, reason=verdict.reason,
                           finish_reason=out.finish_reason, completion_tokens=out.completion_tokens)
                if a["index"] in other:
                    o = answers[other[a["index"]]]
                    grounding = is_grounded(ex.query, a["answer"], turn, o["query"], o["answer"], verdict=verdict,
                                            finish_reason=out.finish_reason)
                    row.update(grounded=grounding.grounded, mismatch_label=grounding.mismatch_label,
                               mismatch_index=o["index"])
    return rows


def run_probe(model, tokenizer, examples: list[Example], settings: ProbeSettings | None = None, *, state=None,
              disable_progress: bool = False, client=None, judge=None, scorer=None) -> ProbeRun:
    """Probe `model` on `examples`; see the module docstring.

    Args:
        model: the model to probe; unused (may be `None`) with `client`.
        settings ([`ProbeSettings`], *optional*): what to generate and how, its labeler resolved
            (`settings.for_task(task)`, not `auto`); defaults to `ProbeSettings(labeler="rules")`.
        state (`accelerate.PartialState`, *optional*): shard across its processes; all of them must call this.
        client ([`~uturn_train.server.CompletionsClient`], *optional*): generate through this server instead of
            locally (one process: the server does the batching).
        judge (*optional*): the judge for `settings.labeler`: a trained
            [`~uturn_train.probe.labelers.judge.Judge`] for `trained`, an LLM
            [`~uturn_train.probe.labelers.llm_judge.Judge`] for `judge` or `both`; made from `settings` (on the main
            process) when not given.
        scorer ([`~uturn_train.probe.labelers.scorer.AnswerScorer`], *optional*): confirms the grounded turns; loaded
            from `settings.scorer` (a folder) when not given.
    """
    settings = settings or ProbeSettings(labeler="rules")
    if settings.labeler == "auto":  # every rank, before any generation
        make_judge(settings)  # raises: says how to choose
    if not examples:
        raise ValueError("no prompts to probe")
    check_setting(settings.setting, examples)
    if client is not None and state is not None and state.num_processes > 1:
        raise ValueError("the server backend runs in one process (the server batches); launch it without accelerate")
    is_main = state is None or state.is_main_process
    if judge is None and is_main:
        judge = make_judge(settings, None if model is None else str(model.device))
    show = not disable_progress and is_main
    sent = (client.endpoint.attempts, client.errors) if client is not None else None
    generated = map_sharded(
        examples, lambda shard, rank: _generate_shard(model, tokenizer, client, shard, settings, rank, not show), state)

    answers = []
    for index, (ex, g) in enumerate(zip(examples, generated)):
        answers.append({"index": index, "id": ex.id, "query": ex.query, "answer_prompt": g["answer_prompt"],
                        "answer": g["answer"], "answer_finish_reason": g["answer_finish_reason"],
                        "answer_error": g["answer_error"], "gold": ex.gold,
                        **_graded(ex, g["answer"], settings.setting, g["answer_error"] is not None)})
    rows = _rows(examples, answers, generated, settings, role_header_starts(tokenizer))
    scored = None
    if settings.scorer or scorer is not None:
        scorer = scorer or load_scorer(settings.scorer, None if model is None else str(model.device))
        scored = {"model": settings.scorer, "min_gain": scorer.min_gain, "max_nll": scorer.max_nll,
                  "turns_scored": confirm_grounded(rows, answers, scorer, state)}
    judged = judge_rows(rows, settings, judge, answers=answers, state=state, disable_progress=not show)

    summaries = []
    for temperature in settings.temperatures:
        of_t = [r for r in rows if r["temperature"] == temperature]
        k = 1 if temperature == 0 else settings.samples
        summaries.append(summarize_setting(temperature, k, [r["label"] for r in of_t],
                                           grounded=[r["grounded"] for r in of_t],
                                           turns=[r["user_turn"] for r in of_t],
                                           answers=[r["answer"] for r in of_t]))
        if settings.labeler == "both":
            summaries[-1]["judge"] = judge_summary(of_t, temperature, k)
    graded = settings.setting == "self" and any(a["gold"] is not None for a in answers)
    summary = {
        "setting": settings.setting,
        "n_prompts": len(answers),
        "accuracy": _mean([a["answer_correct"] for a in answers]) if graded else None,
        "accuracy_strict": _mean([a["answer_strict"] for a in answers]) if graded else None,
        "accuracy_flexible": _mean([a["answer_flexible"] for a in answers]) if graded else None,
        "answer_errors": sum(a["answer_error"] is not None for a in answers),
        "labeler": settings.labeler,
        "settings": summaries,
        **across_temperatures(summaries),
    }
    if scored is not None:
        summary["scorer"] = scored
    if client is not None:
        summary["server"] = {"flavour": client.flavour, "requests": client.endpoint.attempts - sent[0],
                             "errors": client.errors - sent[1]}
    if judged is not None:
        summary["judge"] = judged
    return ProbeRun(summary=summary, rows=rows, answers=answers)
