"""The validity suite (`uturn validate`): perturbations whose effect on the probe is predictable, each checked.

Every check states a prediction, measures it with a 95% interval and passes or fails; a failure makes the command
exit non-zero. The answers are perturbed three ways, per prompt (one per distinct query):

- **shuffled**: another prompt's answer, two steps along the single cycle of the grounded control (`derangement`), so
  never the prompt's own answer nor its control's;
- **emptied**: `""`;
- **truncated** mid-sentence: the first half of the words, cut back so that it ends inside a sentence.

**The decision** (the rules' `classify_turn` and `is_grounded`, or the trained judge with `judge`; no generation) on
the task's real contexts:

- the query pasted as the user turn is a repetition, every time (share 1.0);
- generic questions (`GENERIC_QUESTIONS`) are grounded <= 0.10 of the time (Wilson upper bound);
- the data's real next user turns are grounded >= 0.20 of the time (Wilson lower bound), and less often once their
  answer is shuffled, emptied or truncated: what they share with their answer only (its numbers, its result, its
  terms) is gone. With the answer emptied the follow-up rate falls too: a turn whose only link to the conversation
  is a word of the answer becomes a new topic.

**The model** writes user turns (heldout setting, sampled) after the real and the perturbed answers; each prompt's
turns are compared with those written after its real answer (paired bootstrap over prompts):

- after a shuffled answer, judged against the prompt's *real* context, a turn can be grounded in the real answer only
  through the query, which both share: the grounded rate falls. (Judged against what the model saw, the rate says how
  the model copes with an incoherent conversation, which no property of the probe predicts.)
- after an emptied or truncated answer, judged against what the model saw, the direction depends on the model: one
  reacting to the answer has less to react to, but a user may ask the assistant to go on (a follow-up that fits any
  answer), and one grounding its turns in the query loses little. Only a reversal fails: the grounded rate is not
  above the real answers' (truncated: nor below the emptied answers', half an answer is still more to react to), and
  the follow-up rate after a truncated answer is not below the one after an emptied answer.

A fall needs a rate to fall from: when the model's grounded rate after the real answers is not above `NO_GROUNDING`
(its Wilson lower bound), the perturbed answers are not generated and the model's checks are `n/a`.
"""

import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ...stats import paired_bootstrap
from ...tasks.base import Example
from ..metrics import wilson_interval
from ..rules.classify import classify_turn
from ..rules.grounding import derangement, is_grounded
from ..settings import JUDGE_FIELDS, ProbeSettings, prefixed

logger = logging.getLogger(__name__)

# Questions that fit any answer, written for this check (none is from the data).
GENERIC_QUESTIONS = [
    "Can you tell me more about that?", "Is that right?", "Why?", "Can you explain that more simply?",
    "Could you give me an example?", "What do you mean by that?", "Are you sure?", "Can you elaborate?",
    "Could you explain the steps again?", "Why do you multiply in the first step?", "Is there a faster way?",
    "What are the pros and cons?", "Can you make it shorter?", "Can you summarize that in one sentence?",
    "Which one would you recommend?", "How does that work?", "What happens next?", "Can you give me some sources?",
    "Thanks! Could you go into more detail?", "I don't understand, can you rephrase it?", "What else should I know?",
    "Is there anything I should be careful about?", "How long does that take?", "Why is that important?",
    "Can you put it in a table?", "What would you do in my place?", "Can you explain the second point?",
    "Does that always work?", "Could you check your answer again?", "What is the most important part of this?",
    "Can you write that in a more formal tone?", "What if I can't do that?",
]
GENERIC_CEILING = 0.10  # issue 10: generic questions after real contexts are counted grounded <= 10% of the time
# Many real next turns are grounded. Far below the 0.65 for human-labelled follow-ups: the data's next turns
# include turns that are no follow-up (OASST: 29 of 380 by hand), and the testbed's follow-ups are by design a quarter
# variants of the query ("What if it was 8 instead of 5?") and a sixth requests that fit any answer ("Explain it in
# words please."), neither grounded since issue 17; measured 0.68 on OASST and 0.27 [0.23, 0.31] on the testbed
# (0.32 until its age problems, "What will Tara's age be ...?", were read as word problems too: 26 of 500 turns lost
# it, variants of the query, push-back with the user's own number, or questions naming only numbers below 13, which
# the rules take for chance on every other problem too).
REAL_FLOOR = 0.20
NO_GROUNDING = 0.05  # issue 10 counts a model at <= 0.05 as writing no grounded follow-ups (the step-0 acceptance)
SENTENCE_END = re.compile(r"[.!?:;]['\")\]]*$")


@dataclass
class ValidateSettings(prefixed("", exclude=("setting", "answer_max_new_tokens", *JUDGE_FIELDS), temperatures=[1.0],
                                samples=8, max_new_tokens=64, batch_size=8)):
    """[`ProbeSettings`] for the validity suite, always in the heldout setting. Sampled by default: greedy gives one
    turn per prompt, too few to see a change in a rate that sits near 0 for an untrained model. 64 tokens hold a user
    turn; 8 prompts x 8 samples per `generate` call are as many sequences as the probe's 16 x 4.
    """


def load_contexts(task: str, data: str | None) -> list[Example]:
    """The task's (query, real answer, real next user turn) examples; the testbed's from its `heldout_triples.jsonl`."""
    from ...tasks import load_task
    from ...tasks.jsonl import read_jsonl, require

    if task != "testbed":
        examples = load_task(task, data)
    else:
        if data is None:
            raise ValueError("task `testbed` needs the built testbed's heldout.jsonl as --data (`uturn validate` fills "
                             "it in for --task testbed)")
        # The testbed's build writes the held-out problems with a real follow-up each beside them.
        triples = Path(data).expanduser().with_name("heldout_triples.jsonl")
        if not triples.is_file():
            raise ValueError(f"{triples} not found: --task testbed reads the triples beside its held-out problems "
                             f"({data}); point --data at a built testbed's heldout.jsonl")
        examples = [Example(f"testbed-{i}", require(row, "query", where), require(row, "answer", where),
                            reference_followup=require(row, "followup", where))
                    for i, (where, row) in enumerate(read_jsonl(triples))]
    missing = [ex.id for ex in examples if ex.answer is None]
    if missing:
        raise ValueError(f"task {task} has no real answers ({len(missing)} prompts, first: {missing[0]}); the validity "
                         "suite needs them: use --task testbed or oasst")
    return examples


def truncate_mid_sentence(text: str) -> str:
    """The first half of `text`'s words, cut back to end inside a sentence (never after its closing mark)."""
    words = list(re.finditer(r"\S+", text))
    cut = len(words) // 2
    while cut > 0 and SENTENCE_END.search(words[cut - 1][0]):
        cut -= 1
    return text[: words[cut - 1].end()] if cut else ""


def first_per_query(examples: list[Example]) -> list[Example]:
    """One example per distinct query, the first: an emptied answer leaves only the query, and the grounded control
    needs every context distinct from its pair."""
    first = {}
    for ex in examples:
        first.setdefault(ex.query, ex)
    return list(first.values())


def perturbed(prompts: list[Example], seed: int) -> dict[str, list[Example]]:
    """The prompts (distinct queries) with their real answers, and shuffled, emptied and truncated ones (ids kept)."""
    control = derangement(len(prompts), seed)  # the runner's grounded control for the same prompts and seed
    # Two steps along the control's single cycle: never the prompt's own answer, nor its control's.
    return {
        "real": prompts,
        "shuffled": [replace(ex, answer=prompts[control[control[i]]].answer) for i, ex in enumerate(prompts)],
        "emptied": [replace(ex, answer="") for ex in prompts],
        "truncated": [replace(ex, answer=truncate_mid_sentence(ex.answer)) for ex in prompts],
    }


def rate(hits: list[bool]) -> dict:
    n, k = len(hits), sum(hits)
    return {"rate": k / n if n else None, "ci95": list(wilson_interval(k, n)), "n": n}


def _fmt(r: dict) -> str:
    return f"{r['rate']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"


def _fmt_diff(d: dict) -> str:
    return f"{d['difference']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"


def rules_decide(items: list[dict]) -> list[tuple[str, bool]]:
    """(label, grounded) of each item (`query`, `answer`, `user_turn`, `other_query`, `other_answer`, optional
    `finish_reason`) by the rules, grounded against the item's other context."""
    out = []
    for it in items:
        verdict = classify_turn(it["query"], it["answer"], it["user_turn"], it.get("finish_reason"))
        g = is_grounded(it["query"], it["answer"], it["user_turn"], it["other_query"], it["other_answer"],
                        verdict=verdict, finish_reason=it.get("finish_reason"))
        out.append((verdict.label, g.grounded))
    return out


def decider(judge=None):
    """`rules_decide`, or the same decisions by a trained [`~uturn_train.probe.labelers.judge.Judge`]."""
    if judge is None:
        return rules_decide
    return lambda items: [(v.label, v.grounded) for v in judge.label(items)] if items else []


def _item(query, answer, turn, other_query, other_answer, finish_reason=None) -> dict:
    return {"query": query, "answer": answer, "user_turn": turn, "other_query": other_query,
            "other_answer": other_answer, "finish_reason": finish_reason}


def data_turns(examples: list[Example], seed: int, decide=rules_decide) -> dict[str, list[dict]]:
    """The data's real next user turns judged after their real answer and after it was shuffled, emptied, truncated.

    The control of a turn is the first context of another query (`derangement` over the distinct queries); its answer
    is perturbed alike, except for the shuffled answer, which is a third query's.
    """
    turns = [ex for ex in examples if ex.reference_followup]
    prompts = first_per_query(turns)
    if len(prompts) < 3:
        return {}
    position = {ex.query: i for i, ex in enumerate(prompts)}
    contexts = {context: str(i) for i, context in enumerate(dict.fromkeys((ex.query, ex.answer) for ex in turns))}
    control = derangement(len(prompts), seed)
    conditions, items = [], []
    for ex in turns:
        i = position[ex.query]
        other, shuffled = prompts[control[i]], prompts[control[control[i]]]  # as in `perturbed`
        for condition, (answer, other_answer) in {
            "real": (ex.answer, other.answer), "shuffled": (shuffled.answer, other.answer), "emptied": ("", ""),
            "truncated": (truncate_mid_sentence(ex.answer), truncate_mid_sentence(other.answer)),
        }.items():
            conditions.append((condition, contexts[ex.query, ex.answer]))
            items.append(_item(ex.query, answer, ex.reference_followup, other.query, other_answer))
    rows = {condition: [] for condition in ("real", "shuffled", "emptied", "truncated")}
    for (condition, id_), (label, grounded) in zip(conditions, decide(items)):
        rows[condition].append({"id": id_, "followup": label == "followup", "grounded": grounded})
    return rows


def _by_prompt(rows: list[dict], key: str) -> dict[str, list[bool]]:
    out = {}
    for row in rows:
        out.setdefault(row["id"], []).append(bool(row[key]))
    return out


# How a perturbed condition relates to another: "below" = falls (the difference's interval lies below 0); "not above"
# and "not below" fail only on a significant reversal (its interval entirely on the wrong side of 0).
RELATIONS = {"below": "falls below {}", "not above": "not above {}", "not below": "not below {}"}


def _check(title: str, rows: dict, name: str, quantity: str, relations: list[tuple[str, str]], seed: int) -> dict:
    measured, passed, diffs = [], True, {}
    for other, relation in relations:
        d = paired_bootstrap(_by_prompt(rows[other], quantity), _by_prompt(rows[name], quantity), seed=seed)
        low, high = d["ci95"]
        passed &= {"below": high < 0, "not above": low <= 0, "not below": high >= 0}[relation]
        diffs[other] = d
        measured.append(f"{_fmt_diff(d)} vs {other}")
    prediction = ", ".join(RELATIONS[relation].format(other) for other, relation in relations)
    return {"name": title, "prediction": prediction, "measured": "; ".join(measured),
            "status": "pass" if passed else "fail", "differences": diffs}


DATA_CHECKS = [  # (title, condition, quantity, [(other condition, relation)])
    ("real next turns, answer shuffled: grounded", "shuffled", "grounded", [("real", "below")]),
    ("real next turns, answer emptied: grounded", "emptied", "grounded", [("real", "below")]),
    ("real next turns, answer emptied: follow-up", "emptied", "followup", [("real", "below")]),
    ("real next turns, answer truncated: grounded", "truncated", "grounded", [("real", "below")]),
]
GENERATION_CHECKS = [
    ("new turns after shuffled answers: grounded in the real context", "shuffled", "grounded_real",
     [("real", "below")]),
    ("new turns after emptied answers: grounded", "emptied", "grounded", [("real", "not above")]),
    ("new turns after truncated answers: grounded", "truncated", "grounded",
     [("real", "not above"), ("emptied", "not below")]),
    ("new turns after truncated answers: follow-up", "truncated", "followup", [("emptied", "not below")]),
]


def judge_checks(examples: list[Example], seed: int, decide=rules_decide) -> tuple[dict, list[dict]]:
    """The checks that need no generation; returns the data turns' rates per condition and the checks."""
    contexts = list(dict.fromkeys((ex.query, ex.answer) for ex in examples))
    # Each context is controlled with the same other one, as `ground_rows` pairs the contexts of a file.
    other = [contexts[j] for j in derangement(len(contexts), seed)] if len(contexts) > 1 else contexts
    repeated = rate([label == "repetition" for label, _ in decide(
        [_item(q, a, q, *o) for (q, a), o in zip(contexts, other)])])
    generic = rate([g for _, g in decide(
        [_item(q, a, turn, *o) for (q, a), o in zip(contexts, other) for turn in GENERIC_QUESTIONS])])
    checks = [
        {"name": "query pasted", "prediction": "repetition share 1.0", **repeated,
         "measured": _fmt(repeated), "status": "pass" if repeated["rate"] == 1.0 else "fail"},
        {"name": "generic questions", "prediction": f"grounded <= {GENERIC_CEILING} (upper bound)", **generic,
         "measured": _fmt(generic), "status": "pass" if generic["ci95"][1] <= GENERIC_CEILING else "fail"},
    ]
    rows = data_turns(examples, seed, decide)
    titles = ["real next turns: grounded", *(title for title, *_ in DATA_CHECKS)]
    if not rows:
        return {}, checks + [{"name": t, "prediction": "-", "measured": "needs real next user turns after at least 3 "
                              "distinct queries", "status": "n/a"} for t in titles]
    real = rate([r["grounded"] for r in rows["real"]])
    checks.append({"name": titles[0], "prediction": f"grounded >= {REAL_FLOOR} (lower bound)", **real,
                   "measured": _fmt(real), "status": "pass" if real["ci95"][0] >= REAL_FLOOR else "fail"})
    checks += [_check(title, rows, name, quantity, relations, seed) for title, name, quantity, relations in DATA_CHECKS]
    return _rates(rows), checks


def _rates(rows: dict) -> dict:
    keys = ("followup", "grounded", "grounded_real")
    return {name: {key: rate([r[key] for r in condition_rows]) for key in keys if key in condition_rows[0]}
            for name, condition_rows in rows.items()}


def _generated(run, condition: str, real: list[Example], control: list[int], decide=rules_decide) -> list[dict]:
    """The run's rows, each also judged against its prompt's real context (`grounded_real`)."""
    with_turn = [row for row in run.rows if row["label"] is not None]
    if condition == "real":
        in_real = [row["grounded"] for row in with_turn]
    else:
        in_real = [g for _, g in decide([
            _item(real[row["index"]].query, real[row["index"]].answer, row["user_turn"],
                  real[control[row["index"]]].query, real[control[row["index"]]].answer, row["finish_reason"])
            for row in with_turn])]
    grounded_real = {id(row): g for row, g in zip(with_turn, in_real)}
    return [{"condition": condition, **row, "followup": row["label"] == "followup",
             "grounded_real": grounded_real.get(id(row), False)} for row in run.rows]


def generation_checks(model, tokenizer, prompts: list[Example], settings: ProbeSettings,
                      disable_progress: bool = False, judge=None) -> tuple[dict, list[dict], list[dict]]:
    """Probe the real and perturbed answers; returns per-condition rates, the checks and every generated row."""
    from ..runner import run_probe

    if len(prompts) < 3:
        raise ValueError(f"the shuffled answers need at least 3 distinct queries, got {len(prompts)}")
    settings = replace(settings, setting="heldout", labeler="rules" if judge is None else "trained")
    control = derangement(len(prompts), settings.seed)
    rows = {}
    for condition, perturbed_prompts in perturbed(prompts, settings.seed).items():
        logger.info("user turns after %s answers (%d prompts)", condition, len(prompts))
        run = run_probe(model, tokenizer, perturbed_prompts, settings, disable_progress=disable_progress, judge=judge)
        rows[condition] = _generated(run, condition, prompts, control, decider(judge))
        if condition == "real" and rate([r["grounded"] for r in rows["real"]])["ci95"][0] <= NO_GROUNDING:
            break
    conditions, every = _rates(rows), [r for condition_rows in rows.values() for r in condition_rows]
    if len(rows) == 1:
        why = (f"the model's grounded rate after the real answers, {_fmt(conditions['real']['grounded'])}, is not "
               f"above {NO_GROUNDING}: nothing for a perturbation to lower")
        return conditions, [{"name": title, "prediction": "-", "measured": why, "status": "n/a"}
                            for title, *_ in GENERATION_CHECKS], every
    checks = [_check(title, rows, name, quantity, relations, settings.seed)
              for title, name, quantity, relations in GENERATION_CHECKS]
    return conditions, checks, every


def validate(model, tokenizer, examples: list[Example], settings: ProbeSettings, limit: int | None = None,
             disable_progress: bool = False, judge=None) -> tuple[dict, list[dict]]:
    """Run every check; returns the report (`checks`, `data_turns` and `new_turns` rates per condition, `failed`,
    `labeler`) and the generated rows.

    `examples` are a task's (query, real answer, real next turn) triples; the model writes turns for one prompt per
    distinct query, the first `limit` of them. `judge`: a trained [`~uturn_train.probe.labelers.judge.Judge`] decides
    every label and grounded decision instead of the rules.
    """
    prompts = first_per_query(examples)[:limit]
    data, checks = judge_checks(examples, settings.seed, decider(judge))
    new, more, rows = generation_checks(model, tokenizer, prompts, settings, disable_progress, judge)
    checks += more
    report = {"n_contexts": len({(ex.query, ex.answer) for ex in examples}),
              "n_turns": sum(bool(ex.reference_followup) for ex in examples), "n_prompts": len(prompts),
              "labeler": "rules" if judge is None else "trained", "checks": checks, "data_turns": data,
              "new_turns": new,
              "failed": [c["name"] for c in checks if c["status"] == "fail"]}
    return report, rows


def markdown(report: dict) -> str:
    c = report["config"]
    lines = [f"# uturn validate: {report['model']} on {report['task']}", "",
             f"{report['n_contexts']} real contexts and {report['n_turns']} real next user turns (checks without "
             f"generation); the model wrote turns for {report['n_prompts']} prompts at "
             f"T={', '.join(map(str, c['temperatures']))} ({c['samples']} samples per temperature above 0), seed "
             f"{c['seed']}. Intervals: Wilson 95% for rates, paired bootstrap 95% over prompts for differences.", "",
             "| check | prediction | measured | result |", "|---|---|---|---|"]
    lines += [f"| {c['name']} | {c['prediction']} | {c['measured']} | {c['status']} |" for c in report["checks"]]
    lines += ["", "| user turns | answer | n | follow-up | grounded | grounded (real context) |",
              "|---|---|---|---|---|---|"]
    for kind, name in (("data_turns", "real next turns"), ("new_turns", "written by the model")):
        for answer, r in report[kind].items():
            real = _fmt(r["grounded_real"]) if "grounded_real" in r else "-"
            lines.append(f"| {name} | {answer} | {r['followup']['n']} | {_fmt(r['followup'])} | "
                         f"{_fmt(r['grounded'])} | {real} |")
    verdict = f"**{len(report['failed'])} failed**: {', '.join(report['failed'])}" if report["failed"] else "All pass."
    return "\n".join([*lines, "", verdict, ""])
