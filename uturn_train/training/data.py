"""Training data: the conversations of collaboration SFT (and which of their turns the loss sees), and the prompts that
mining (`mine_source`) and online RL (`prompt_source`) start from.

Sources (`collab_source`, `mine_source`, `prompt_source`):

- `testbed`: the built testbed's `conversations.jsonl`: a problem, the assistant's worked answer, a grounded user
  follow-up and the assistant's reply (problems disjoint from the held-out probe set); the recipes fill in its path.
- `oasst`: OpenAssistant trees, every root-to-follow-up path (human-written turns on both sides, ending with the real
  follow-up). `collab_data` is a tree file such as `../shared/data/oasst/en_100_tree.jsonl`; default: the hub's
  `OpenAssistant/oasst1` validation split.
- `gsm8k`: GSM8K training problems and their reference solutions, each followed by a question about one step of the
  solution and the solution's own line as the reply. GSM8K has no real follow-ups: the question is a template
  ("How did you get 24?", "Why 48 / 2?") filled from the step's calculator annotation (`<<48/2=24>>`), so it is
  grounded by construction but not human-written. `collab_data` is a GSM8K jsonl such as
  `../shared/data/gsm8k/train.jsonl`; default: the hub's `openai/gsm8k` train split.
- `conversations`: any JSON Lines file of `{"messages": [{"role": ..., "content": ...}, ...]}` rows: real
  follow-ups from human logs or a stronger model come in here.

Mining and online RL take from a source its first user turn (the query), the assistant's answer after it (the
reference answer) and the user turn after that (the reference follow-up), see [`prompt_examples`]; `gsm8k` without a
file reads the hub's train split, never the test split the probe measures on.

Loss scope (`loss_scope`), see [`sft_dataset`]:

- `assistant`: the usual chat SFT, TRL's `assistant_only_loss=True` (assistant content and end-of-turn tokens).
- `all`: every token of every turn, headers included (TRL's default full-sequence loss).
- `user`: user turns only (content and end-of-turn token).
"""

import random
import re
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from ..tasks import gsm8k
from ..tasks.base import Example
from ..tasks.jsonl import BadRow, read_jsonl

SOURCES = ("testbed", "oasst", "gsm8k", "conversations")
LOSS_SCOPES = ("assistant", "all", "user")
ROLES = ("system", "user", "assistant")


@dataclass
class CollabDataArguments:
    """Which conversations collaboration SFT trains on, and which turns are in the loss.

    Args:
        collab_source (`str`, *optional*, defaults to `"testbed"`): `testbed`, `oasst`, `gsm8k` or `conversations`.
        collab_data (`str`, *optional*): the file: an OASST tree file for `oasst`, a GSM8K jsonl for `gsm8k`, a
            `{"messages"}` jsonl for `conversations` and `testbed` (filled in with the built testbed's
            `conversations.jsonl`). `oasst` and `gsm8k` default to their hub data sets.
        collab_limit (`int`, *optional*): keep the first N conversations.
        loss_scope (`str`, *optional*, defaults to `"assistant"`): `assistant`, `all` or `user`.
    """

    collab_source: str = field(default="testbed", metadata={"help": "testbed, oasst, gsm8k or conversations."})
    collab_data: str | None = field(default=None, metadata={"help": "OASST tree, GSM8K or {messages} jsonl."})
    collab_limit: int | None = field(default=None, metadata={"help": "Keep the first N conversations."})
    loss_scope: str = field(default="assistant", metadata={"help": "Turns in the loss: assistant, all or user."})

    def __post_init__(self):
        check_source(self.collab_source, self.collab_data, option="collab")
        if self.loss_scope not in LOSS_SCOPES:
            raise ValueError(f"loss_scope {self.loss_scope!r} is not one of {LOSS_SCOPES}")
        if self.collab_limit is not None and self.collab_limit < 1:
            raise ValueError(f"collab_limit must be >= 1, got {self.collab_limit}")


def check_source(source: str, data: str | None, option: str) -> None:
    """A clear error for a bad `<option>_source` / `<option>_data` pair, when the command line is parsed."""
    if source not in SOURCES:
        raise ValueError(f"{option}_source {source!r} is not one of {SOURCES}")
    if source == "conversations" and not data:
        raise ValueError(f"{option}_source `conversations` needs {option}_data: a jsonl of "
                         '{"messages": [...]} rows')


def check_messages(messages, where: str) -> list[dict]:
    """`messages` as a list of `{role, content}` dicts, or a `BadRow` naming `where` and what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise BadRow(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRow(f"{where}: message {i} needs a 'role' among {ROLES}, got {m!r:.80}")
        if not isinstance(m.get("content"), str) or not m["content"].strip():
            raise BadRow(f"{where}: message {i} ({m['role']}) has no text 'content'")
    if not any(m["role"] == "user" for m in messages):
        raise BadRow(f"{where}: no user message")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def read_conversations(path: str | Path, limit: int | None = None) -> list[list[dict]]:
    """The `messages` of every row of a JSON Lines file, checked (errors name the file and line)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"conversations file {path} does not exist")
    conversations = []
    for where, row in read_jsonl(path):
        if "messages" not in row:
            raise BadRow(f"{where}: no 'messages' field (fields present: {', '.join(row) or 'none'})")
        conversations.append(check_messages(row["messages"], where))
        if limit is not None and len(conversations) >= limit:
            break
    if not conversations:
        raise ValueError(f"{path} holds no conversations")
    return conversations


def oasst_conversations(data: str | None = None, limit: int | None = None) -> list[list[dict]]:
    """Every OASST path that ends with a real user follow-up and is not the start of a longer one."""
    from ..tasks import load_task

    paths = [
        [*ex.meta["history"], {"role": "user", "content": ex.query}, {"role": "assistant", "content": ex.answer},
         {"role": "user", "content": ex.reference_followup}]
        for ex in load_task("oasst", data=data, data_option="--collab_data")
    ]
    # A path u-a-u is also the start of u-a-u-a-u: keep only the longest, so early turns are not counted twice.
    key = lambda p: tuple((m["role"], m["content"]) for m in p)  # noqa: E731
    prefixes = {key(p)[:n] for p in paths for n in range(1, len(p))}
    conversations = [p for p in paths if key(p) not in prefixes]
    return conversations[:limit] if limit else conversations


_CALCULATION = re.compile(r"<<([^<>=]+)=([^<>]+)>>([\d,]*\d(?:\.\d+)?)?")  # and the value as the text writes it
STEP_QUESTIONS = ["How did you get {value}?", "Where does the {value} come from?", "Why {expr}?",
                  "Can you explain the step {expr} = {value}?", "Why do you compute {expr} there?",
                  "I don't get where {value} comes from.", "Thanks. Why is it {expr}?"]


def gsm8k_conversations(data: str | None = None, limit: int | None = None, seed: int = 0) -> list[list[dict]]:
    """GSM8K problems, their solutions, and a question about one step with that step's line as the reply.

    The step is drawn (seeded) among the solution's calculator annotations; problems without any are left out.
    """
    from ..tasks import load_task

    rng, conversations = random.Random(seed), []
    for example in load_task("gsm8k", data=data, split="train", data_option="--collab_data"):
        lines = [line for line in example.meta["solution"].splitlines() if _CALCULATION.search(line)]
        if not lines:
            continue
        line = rng.choice(lines)
        expr, value, written = _CALCULATION.search(line).groups()
        value = written or value
        expr = re.sub(r"\s*([-+*/])\s*", r" \1 ", expr).strip()
        followup = rng.choice(STEP_QUESTIONS).format(expr=expr, value=value)
        reply = f"{value} comes from this step: {_CALCULATION.sub(lambda m: m.group(3) or '', line).strip()}"
        conversations.append([{"role": "user", "content": example.query},
                              {"role": "assistant", "content": example.answer},
                              {"role": "user", "content": followup}, {"role": "assistant", "content": reply}])
        if limit is not None and len(conversations) >= limit:
            break
    return conversations


def load_conversations(args: CollabDataArguments) -> list[list[dict]]:
    if args.collab_source == "oasst":
        return oasst_conversations(args.collab_data, args.collab_limit)
    if args.collab_source == "gsm8k":
        return gsm8k_conversations(args.collab_data, args.collab_limit)
    if not args.collab_data:  # `testbed`, unresolved
        raise ValueError("collab_source `testbed` reads the built testbed's conversations.jsonl: pass it as "
                         "collab_data (the recipes fill it in, see `uturn_train.testbed.resolve`)")
    return read_conversations(args.collab_data, args.collab_limit)


def conversation_examples(conversations: list[list[dict]], prefix: str) -> list[Example]:
    """Prompts from conversations: the first user turn, the assistant's answer, and the user turn after it."""
    examples = []
    for n, messages in enumerate(conversations):
        i = next((i for i, m in enumerate(messages[:-1]) if m["role"] == "user"), None)
        if i is None or messages[i + 1]["role"] != "assistant":
            continue  # nothing answered: no reference answer to ground a follow-up in
        answer = messages[i + 1]["content"]
        after = messages[i + 2] if len(messages) > i + 2 and messages[i + 2]["role"] == "user" else None
        examples.append(Example(
            id=f"{prefix}-{n}", query=messages[i]["content"], answer=answer,
            gold=gsm8k.extract_answer(answer) if "####" in answer else None,
            reference_followup=after["content"] if after else None, meta={"history": messages[:i]},
        ))
    return examples


def prompt_examples(source: str, data: str | None, limit: int | None, option: str) -> list[Example]:
    """The prompts of a mining or RL source (see the module docstring); `option` names the options in errors."""
    from ..tasks import hub_rows, load_task

    if source in ("testbed", "conversations"):
        if not data:  # `testbed`, unresolved
            raise ValueError(f"{option}_source `testbed` reads the built testbed's conversations.jsonl: pass it as "
                             f"{option}_data (the uturn commands and recipes fill it in, see "
                             "`uturn_train.testbed.resolve`)")
        prefix = "testbed-train" if source == "testbed" else "conversations"
        examples = conversation_examples(read_conversations(data, limit), prefix)
    elif source == "gsm8k" and data is None:
        # load_task's default is the test split, which the probe measures on: take the train split.
        rows = hub_rows("openai/gsm8k", "main", "train", data_option=f"--{option}_data")
        examples = [gsm8k.to_example(row, i, where, prefix="gsm8k-train")
                    for i, (where, row) in enumerate(islice(rows, limit))]
    else:
        examples = load_task(source, data=data, limit=limit, data_option=f"--{option}_data")
    if not examples:
        raise ValueError(f"{option}_source {source!r} gave no prompt with a user turn answered by the assistant")
    return examples


def user_turn_rows(tokenizer, messages: list[dict]) -> list[dict]:
    """One plain-text prompt/completion row per user turn: the probe's own prompt, and the turn as the template writes
    it (content and end-of-turn marker, e.g. `"Why 2 * 9?<|im_end|>"`)."""
    from ..chat import render, user_turn_prompt

    rows = []
    for i, m in enumerate(messages):
        if m["role"] != "user":
            continue
        prompt = user_turn_prompt(tokenizer, messages[:i])
        rendered = render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not rendered.startswith(prompt + m["content"]):
            raise ValueError(
                f"the chat template of {tokenizer.name_or_path!r} renders the turns before user turn {i} differently "
                "when that turn is a sentinel, so its prompt cannot be cut out; use loss_scope `all` with this model"
            )
        # Trailing layout (the newline after `<|im_end|>`) is not part of the turn; TRL appends eos only if the
        # completion does not already end with it, so a template whose user turns end in eos gets it once.
        rows.append({"prompt": prompt, "completion": rendered[len(prompt):].rstrip()})
    return rows


def sft_dataset(conversations: list[list[dict]], tokenizer, loss_scope: str):
    """The `datasets.Dataset` SFTTrainer trains on for `loss_scope`; pair it with [`apply_loss_scope`].

    `assistant` and `all` keep whole conversations (`messages`). `user` becomes prompt/completion rows, one per user
    turn, the prompt being exactly what the probe feeds the model ([`~uturn_train.chat.user_turn_prompt`]). We chose
    that over a custom chat template with `{% generation %}` markers around user content (which also works with
    SFTTrainer): it needs no hand-written template per model family, it holds for every template the probe
    supports, and the tokens the loss sees are by construction those the probe asks for. The cost is that the turns
    before each user turn are fed again for every user turn (about 2x the tokens for two-user-turn conversations).
    """
    from datasets import Dataset

    if loss_scope not in LOSS_SCOPES:
        raise ValueError(f"loss_scope {loss_scope!r} is not one of {LOSS_SCOPES}")
    if loss_scope == "user":
        rows = [row for messages in conversations for row in user_turn_rows(tokenizer, messages)]
    else:
        rows = [{"messages": messages} for messages in conversations]
    return Dataset.from_list(rows)


def apply_loss_scope(training_args, loss_scope: str) -> None:
    """Set the `SFTConfig` fields that go with `loss_scope`; the scope, not these fields, is the knob."""
    if training_args.assistant_only_loss and loss_scope != "assistant":
        raise ValueError(f"assistant_only_loss=True contradicts loss_scope={loss_scope!r}; set loss_scope only")
    if training_args.completion_only_loss is False and loss_scope == "user":
        raise ValueError("completion_only_loss=False would train on the prompts of loss_scope `user`; unset it")
    # TRL swaps in a training template with `{% generation %}` markers for known templates (Qwen3.5 among them).
    training_args.assistant_only_loss = loss_scope == "assistant"
