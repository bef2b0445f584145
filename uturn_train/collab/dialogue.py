"""Run collaboration conversations in batches and score them.

Each round, every open conversation gets the model's next turn (one batched `generate`), then the partner's. A
conversation ends when the model answers (info_gap: a turn that is not a question, or that holds `#### N`), when the
partner ends it, after `max_turns` turns of the model, or on a failed server request (an *error*, counted apart and
left out of every rate, as in the probe).

Success: **info_gap** when the model's answer is the gold one; **peer_check** when the pair's final answer, the
last assistant turn that states one, is. Rates carry Wilson 95% intervals; peer_check also reports the conversations
that started from a wrong answer, where only the user's reaction can bring success.
"""

import time
from dataclasses import dataclass, field

from ..chat import answer_prompt, stop_strings, user_turn_prompt
from ..generation import generate
from ..probe.metrics import wilson_interval
from ..tasks.gsm8k import extract_answer, is_correct
from .partners import names_the_gap
from .tasks import FAMILIES, CollabTask


@dataclass
class CollabSettings:
    """How the conversations are run.

    Args:
        families (`list[str]`, *optional*, defaults to both): `info_gap` and/or `peer_check`.
        max_turns (`int`, *optional*, defaults to `3`): turns of the model under test per conversation.
        max_new_tokens (`int`, *optional*, defaults to `192`): token limit of a model turn (a worked answer fits).
        partner_max_new_tokens (`int`, *optional*, defaults to `192`): token limit of a model partner's turn.
        temperature (`float`, *optional*, defaults to `0.0`): the model's decoding; 0 is greedy.
        batch_size (`int`, *optional*, defaults to `16`): prompts per `generate` call.
        seed (`int`, *optional*, defaults to `0`): sampling seed.
    """

    families: list[str] = field(default_factory=lambda: list(FAMILIES),
                                metadata={"help": "info_gap and/or peer_check."})
    max_turns: int = field(default=3, metadata={"help": "Turns of the model under test per conversation."})
    max_new_tokens: int = field(default=192, metadata={"help": "Token limit of a model turn."})
    partner_max_new_tokens: int = field(default=192, metadata={"help": "Token limit of a model partner's turn."})
    temperature: float = field(default=0.0, metadata={"help": "The model's decoding temperature (0 = greedy)."})
    batch_size: int = field(default=16, metadata={"help": "Prompts per generate call."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})

    def __post_init__(self):
        if not self.families or any(f not in FAMILIES for f in self.families):
            raise ValueError(f"families {list(self.families)}: choose among {', '.join(FAMILIES)}")
        for name in ("max_turns", "max_new_tokens", "partner_max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")


@dataclass
class CollabRun:
    """`summary`: per family (see [`summarize`]); `conversations`: one record per conversation; `seconds`: wall time."""

    summary: dict
    conversations: list[dict]
    seconds: float


def is_question(turn: str) -> bool:
    """An assistant turn that asks rather than answers: a question mark, and no `#### N` final answer."""
    return "?" in turn and "####" not in turn


def asked_first(record: dict) -> bool:
    """Whether an info_gap conversation's first model turn (a [`run_collab`] record's) asks rather than answers."""
    return len(record["messages"]) > 1 and is_question(record["messages"][1]["content"])


@dataclass
class _Conversation:
    task: CollabTask
    messages: list[dict]
    turns: int = 0
    tokens: int = 0
    questions: int = 0
    ended: str | None = None  # answered, partner_ended, max_turns or error
    error: str | None = None
    # With `trace` (online RL): the token ids the model read and wrote, in one sequence that grows by appending, and
    # 1 on the tokens the model itself sampled; `model_end` is where its last turn ends.
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    model_end: int = 0


def _final(c: _Conversation) -> str | None:
    """The turn that holds the conversation's answer: info_gap the model's answer, peer_check the last assistant turn
    that states one as an answer ("#### 61", "the answer is 61"), else the answer the conversation opened with. A
    model partner asked about a step explains that step ("so 6 * 9 = 54"), and its last number is not the pair's
    answer."""
    if c.task.family == "info_gap":
        return c.messages[-1]["content"] if c.ended == "answered" else None
    answers = [m["content"] for m in c.messages if m["role"] == "assistant"]
    return next((a for a in reversed(answers) if extract_answer(a, last_number=False) is not None), answers[0])


def _record(c: _Conversation) -> dict:
    final = _final(c)
    success = None if c.error else final is not None and is_correct(final, c.task.gold)
    record = {"id": c.task.id, "family": c.task.family, "success": success, "turns": c.turns, "tokens": c.tokens,
              "questions": c.questions, "ended": c.ended, "error": c.error, "gold": c.task.gold,
              "final_answer": extract_answer(final) if final else None, "answer_right": c.task.answer_right,
              "messages": c.messages}
    if c.task.family == "info_gap" and "asks_for" in (c.task.oracle or {}):
        record["named_first"] = asked_first(record) and names_the_gap(
            c.messages[1]["content"], c.messages[0]["content"], c.task.oracle["asks_for"])
    if c.ids:
        end = c.model_end
        record["trace"] = {"prompt_ids": c.ids[: c.prompt_tokens], "completion_ids": c.ids[c.prompt_tokens: end],
                           "env_mask": c.mask[c.prompt_tokens: end]}
    return record


def _rate(records: list[dict]) -> dict:
    n, k = len(records), sum(r["success"] for r in records)
    return {"n": n, "success_rate": k / n if n else None, "ci95": list(wilson_interval(k, n)) if n else None}


def summarize(records: list[dict], families: list[str]) -> dict:
    """Per family: `n` (conversations without error), `errors`, `success_rate` with `ci95`, mean `turns`, `tokens`
    (the model's) and `questions` (its turns with a question mark); info_gap also `asked_first` (share whose first
    model turn asks) and, where every task has an oracle `asks_for`, `named_first` (share whose first turn asks for the
    missing quantity by name, [`~uturn_train.collab.partners.names_the_gap`]: the oracle of `uturn collab` reveals to
    any ask, "Could you tell me the number of scarves?" about notebooks too); peer_check also `wrong_start` and
    `right_start`, the same rate split by the starting answer."""
    summary = {}
    for family in families:
        rows = [r for r in records if r["family"] == family]
        ok = [r for r in rows if r["error"] is None]
        s = {**_rate(ok), "errors": len(rows) - len(ok)}
        for key in ("turns", "tokens", "questions"):
            s[key] = sum(r[key] for r in ok) / len(ok) if ok else None
        if family == "info_gap":
            s["asked_first"] = sum(map(asked_first, ok)) / len(ok) if ok else None
            named = [r["named_first"] for r in ok if "named_first" in r]
            s["named_first"] = sum(named) / len(named) if named and len(named) == len(ok) else None
        else:
            s["wrong_start"] = _rate([r for r in ok if r["answer_right"] is False])
            s["right_start"] = _rate([r for r in ok if r["answer_right"] is True])
        summary[family] = s
    return summary


def log_scalars(summary: dict) -> dict[str, float]:
    """What the training callback logs of a [`summarize`]d run: `collab/success_rate/<family>` with `/ci_low` and
    `/ci_high`, and `collab/success_rate/peer_check_wrong_start` likewise."""
    logs = {}
    for family, s in summary.items():
        for name, r in ((family, s), (f"{family}_wrong_start", s.get("wrong_start"))):
            if r is not None and r["success_rate"] is not None:
                key = f"collab/success_rate/{name}"
                logs[key] = r["success_rate"]
                logs[f"{key}/ci_low"], logs[f"{key}/ci_high"] = r["ci95"]
    return logs


def turn_prompt(tokenizer, task: CollabTask, messages: list[dict] | None = None) -> str:
    """The prompt of the model's next turn in `task` after `messages` (default: the task's opening)."""
    render = answer_prompt if task.model_role == "assistant" else user_turn_prompt
    return render(tokenizer, task.messages if messages is None else messages)


def _prompt(tokenizer, c: _Conversation) -> str:
    return turn_prompt(tokenizer, c.task, c.messages)


class _Tracer:
    """Keeps each conversation as one growing token sequence (`trace=True`), as online RL trains on it.

    The model's next turn is sampled after exactly that sequence, not after the template's rendering of the messages
    so far: a template may render history otherwise than the prompt it was sampled from (Qwen3.5 drops the empty
    `<think></think>` block of earlier assistant turns), and the policy must be trained on the context it sampled in.
    The partner's turn enters as the template renders it: the text between the end of the model's turn and the next
    header, read off the template's rendering of the conversation with the partner's message last.
    """

    def __init__(self, tokenizer):
        self.tokenizer, self.added = tokenizer, tokenizer.get_added_vocab()
        self.end = stop_strings(tokenizer)[0]
        self.end_id = self.added.get(self.end)
        if self.end_id is None:
            raise ValueError(f"the chat template of {tokenizer.name_or_path!r} ends turns with plain text "
                             f"{self.end!r}, not a special token: a rollout cannot be kept as token ids")

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def open(self, c: _Conversation) -> None:
        c.ids = self._ids(_prompt(self.tokenizer, c))
        c.mask, c.prompt_tokens = [0] * len(c.ids), len(c.ids)

    def model_turn(self, c: _Conversation, g) -> None:
        """The sampled ids and the end token that ended them (the model's); a turn cut by the token limit or a role
        header is closed with the end of turn, which the model did not write."""
        stop = self.added.get(g.stop) if g.stop else None
        ids = list(g.token_ids) + ([stop] if stop is not None else [])
        c.ids, c.mask = c.ids + ids, c.mask + [1] * len(ids)
        if stop != self.end_id:
            c.ids, c.mask = c.ids + [self.end_id], c.mask + [0]
        c.model_end = len(c.ids)

    def partner_turn(self, c: _Conversation) -> None:
        rendered, content = _prompt(self.tokenizer, c), c.messages[-1]["content"]
        at = rendered.rfind(content)
        start = rendered.rfind(self.end, 0, at) if at > 0 else -1
        if start < 0:
            raise ValueError(f"the chat template of {self.tokenizer.name_or_path!r} does not render the partner's "
                             f"message as written ({content[:60]!r}): a rollout cannot append it")
        ids = self._ids(rendered[start + len(self.end):])
        c.ids, c.mask = c.ids + ids, c.mask + [0] * len(ids)


def run_collab(model, tokenizer, tasks: list[CollabTask], partner, settings: CollabSettings | None = None, *,
               client=None, disable_progress: bool = False, trace: bool = False) -> CollabRun:
    """Hold every task's conversation between `model` (or `client`, a server serving it) and `partner`.

    Args:
        model: the model under test (unwrapped), or None with `client`.
        tokenizer: its tokenizer, with a chat template.
        tasks (`list[CollabTask]`): from [`~uturn_train.collab.tasks.load_collab_tasks`].
        partner: an [`~uturn_train.collab.partners.OraclePartner`] or [`~uturn_train.collab.partners.ModelPartner`].
        settings ([`CollabSettings`], *optional*): decoding and turn limit.
        client ([`~uturn_train.server.CompletionsClient`], *optional*): generate the model's turns on a server.
        disable_progress (`bool`, *optional*): hide the progress bars (rounds, and each round's batches).
        trace (`bool`, *optional*): keep each conversation as token ids for online RL (a record's `trace`:
            `prompt_ids`, then `completion_ids` up to the end of the model's last turn and `env_mask`, 1 on the
            tokens the model sampled; see [`_Tracer`]). Local models only.
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    settings = settings or CollabSettings()
    tasks = [t for t in tasks if t.family in settings.families]
    conversations = [_Conversation(t, [dict(m) for m in t.messages]) for t in tasks]
    tracer = _Tracer(tokenizer) if trace else None
    if tracer is not None:
        if client is not None:
            raise ValueError("trace keeps the sampled token ids, which a server does not return: use a local model")
        for c in conversations:
            tracer.open(c)
    rounds = tqdm(range(settings.max_turns), desc="collaboration", disable=disable_progress, unit="round")
    for round_index in rounds:
        active = [c for c in conversations if c.ended is None]
        if not active:
            break
        kwargs = {"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
                  "seed": settings.seed + round_index, "desc": f"round {round_index + 1}: the model's turns",
                  "disable_progress": disable_progress}
        prompts = [c.ids if tracer is not None else _prompt(tokenizer, c) for c in active]
        outs = client.generate(prompts, **kwargs) if client is not None else \
            generate(model, tokenizer, prompts, batch_size=settings.batch_size, **kwargs)
        for c, (g,) in zip(active, outs):
            if g.finish_reason == "error":
                c.ended, c.error = "error", g.error
                continue
            turn = g.text.strip()
            c.messages.append({"role": c.task.model_role, "content": turn})
            if tracer is not None:
                tracer.model_turn(c, g)
            c.turns, c.tokens, c.questions = c.turns + 1, c.tokens + g.completion_tokens, c.questions + ("?" in turn)
            if c.task.family == "info_gap" and not is_question(turn):
                c.ended = "answered"
            elif c.task.family == "info_gap" and c.turns == settings.max_turns:
                c.ended = "max_turns"  # a question with no turn left to use its answer
        waiting = [c for c in active if c.ended is None]
        replies = partner.respond([c.task for c in waiting], [c.messages for c in waiting]) if waiting else []
        for c, r in zip(waiting, replies):
            if r is None:
                c.ended = "partner_ended"
            elif r.finish_reason == "error":
                c.ended, c.error = "error", f"partner: {r.error}"
            else:
                c.messages.append({"role": "user" if c.task.model_role == "assistant" else "assistant",
                                   "content": r.text.strip()})
                if tracer is not None and c.turns < settings.max_turns:  # no model turn follows the last reply
                    tracer.partner_turn(c)
                if c.turns == settings.max_turns:
                    c.ended = "max_turns"
        rounds.set_postfix(open=sum(c.ended is None for c in conversations))
    records = [_record(c) for c in conversations]
    return CollabRun(summarize(records, settings.families), records, time.perf_counter() - start)
