"""The other side of a collaboration: an oracle that speaks the task's own lines, or a chat model.

A partner's `respond(tasks, conversations)` gets the conversations whose last turn is the model's and returns, per
conversation, a [`~uturn_train.generation.Generation`] (its turn) or None (it ends the conversation).
"""

import re

from ..chat import answer_prompt
from ..generation import Generation, generate
from ..probe.rules.classify import classify_turn
from .tasks import CollabTask

AGAIN = "Let me go over it again.\n"
NOTHING_MORE = "That is all I know. Please solve it."
_NUMBER = re.compile(r"(?<![\d.])\d+(?![\d])")


def questions_the_slip(turn: str, oracle: dict, ordinal: bool = True) -> bool:
    """Whether a user turn points at the wrong step of a peer_check answer: it names a value the slip changed (the
    wrong result, the results after it, the final answer), both numbers of the wrong step, or (with `ordinal`) the
    wrong step by its ordinal ("the second step"). Push-back that points nowhere ("Are you sure?") does not, nor a
    question about a step that is right: they fit any answer, and the partner only rechecks what it is shown.

    An ordinal alone fits any answer too: "Can you explain the first step?" names the wrong step of every answer that
    slipped there (half the testbed's). `uturn collab` counts it, as a partner asked to go over a step would find the
    slip; online RL does not (`ordinal=False`): rewarded for it, GRPO on the testbed learned to ask it of every answer
    (recipes/README.md, "Collaboration as the objective")."""
    if oracle.get("wrong_step") is None:
        return False
    numbers = set(_NUMBER.findall(turn))
    named = ordinal and re.search(rf"\b{oracle['ordinal']} (step|line|part)\b", turn, re.IGNORECASE)
    return bool(numbers & set(oracle["values"]) or set(oracle["operands"]) <= numbers or named)


_WORD = re.compile(r"[a-z]+|\d+")


def _words(text: str) -> list[str]:
    return [w.rstrip("s") for w in _WORD.findall(text.lower().replace("'s", ""))]  # "miles" = "mile", "Mia's" = "mia"


# Words of a quantity's name that do not tell which quantity it is ("the number of days": only "days" does).
_FRAME = set(_words("the a an of per each number how many much is in at to for"))


def names_the_gap(turn: str, question: str, asks_for: str) -> bool:
    """Whether an assistant turn asks for the quantity an info_gap question lacks: every word of its name (`asks_for`,
    "the miles per day": "miles" and "day") stands in what the turn adds to the question, a run of 4 words or more
    copied from `question` taken out first. The question restated with a bare question mark ("Mei walks some miles
    every day for 9 days,?") does not, nor a question about nothing in particular ("But how many then?"); "How many
    miles does she walk each day?" does. The testbed's asks name the quantity in these words
    (`testbed.turns.RESTATED_ASK`); a real model's paraphrase ("How far does she walk daily?") does not count."""
    words, said, asked = _words(turn), set(), _words(question)
    grams = set(zip(*(asked[i:] for i in range(4))))
    for i in range(len(words) - 3):
        if tuple(words[i: i + 4]) in grams:
            said.update(range(i, i + 4))
    added = {w for i, w in enumerate(words) if i not in said}
    return set(_words(asks_for)) - _FRAME <= added


def _said(text: str) -> Generation:
    return Generation(text, "stop", None, 0, 0)


class OraclePartner:
    """Plays the partner from each task's `oracle` lines (written by the task's generator, which knows the world;
    `load_collab_tasks(..., oracle=True)` checks that every task has them).

    - info_gap (the partner is the user who holds the missing number): a question from the assistant gets `reveal`
      the first time and [`NOTHING_MORE`] after; CollabLLM's simulated users likewise reveal facts only when asked.
      With `named`, only a question that names the missing quantity ([`names_the_gap`]) gets it; any other,
      [`NOTHING_MORE`].
    - peer_check (the partner is the assistant that answered): a turn the probe's classifier does not call a follow-up
      (thanks, a new problem, an answer of its own, nothing) ends the conversation, the answer standing; a follow-up
      that questions the slip ([`questions_the_slip`]) gets `fix`, the corrected solution; any other follow-up gets
      the current solution gone over again, wrong as it was if it was never fixed (so does push-back that points at
      no step: a partner that rechecks only what it is shown, never talked out of an answer).
    """

    name = "oracle"

    def __init__(self, ordinal: bool = True, named: bool = False):
        self.ordinal = ordinal  # whether the wrong step's ordinal alone questions it ([`questions_the_slip`])
        self.named = named  # whether only a question naming the missing quantity gets it ([`names_the_gap`])

    def respond(self, tasks: list[CollabTask], conversations: list[list[dict]]) -> list[Generation | None]:
        return [_said(text) if (text := self._reply(t, m)) is not None else None for t, m in zip(tasks, conversations)]

    def _reply(self, task: CollabTask, messages: list[dict]) -> str | None:
        o, turn = task.oracle, messages[-1]["content"]
        if task.family == "info_gap":
            if any(m["content"] == o["reveal"] for m in messages):
                return NOTHING_MORE
            if self.named and "asks_for" not in o:
                raise ValueError(f"task {task.id} has no oracle `asks_for` (the missing quantity's name), which a "
                                 "partner that reveals only to a question naming it needs: make the tasks again "
                                 "with this version")
            asked = not self.named or names_the_gap(turn, messages[0]["content"], o["asks_for"])
            return o["reveal"] if asked else NOTHING_MORE
        answer = next(m["content"] for m in reversed(messages) if m["role"] == "assistant")
        if classify_turn(messages[0]["content"], answer, turn).label != "followup":
            return None
        fixed = task.answer_right or any(m["content"] == o.get("fix") for m in messages)
        if not fixed and questions_the_slip(turn, o, self.ordinal):
            return o["fix"]
        return AGAIN + (o["solution"] if fixed else messages[1]["content"])


class ModelPartner:
    """A chat model plays the partner: the model under test itself, another local model, or one behind a server
    (`client`, a [`~uturn_train.server.CompletionsClient`]).

    As the assistant (peer_check) it simply continues the conversation. As the user (info_gap) it reads the task's
    `brief` and the conversation so far as text in one user message and writes the user's next message, as CollabLLM's
    simulator prompt does (a conversation that opens with the partner's own turn would not fit every chat template).
    """

    def __init__(self, model, tokenizer, *, client=None, name: str = "self", max_new_tokens: int = 128,
                 batch_size: int = 16, seed: int = 0):
        self.model, self.tokenizer, self.client, self.name = model, tokenizer, client, name
        self.max_new_tokens, self.batch_size, self.seed = max_new_tokens, batch_size, seed

    def _prompt(self, task: CollabTask, messages: list[dict]) -> str:
        if task.model_role == "user":
            return answer_prompt(self.tokenizer, messages)
        if not task.brief:
            raise ValueError(f"task {task.id} has no `brief`: a model partner needs one to play the user")
        transcript = "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)
        return answer_prompt(self.tokenizer, [{"role": "user", "content": (
            f"{task.brief}\n\nThe conversation so far:\n\n{transcript}\n\nWrite only the user's next message.")}])

    def respond(self, tasks: list[CollabTask], conversations: list[list[dict]]) -> list[Generation | None]:
        prompts = [self._prompt(t, m) for t, m in zip(tasks, conversations)]
        if self.client is not None:
            outs = self.client.generate(prompts, max_new_tokens=self.max_new_tokens, seed=self.seed,
                                        desc="partner's turns")
        else:
            outs = generate(self.model, self.tokenizer, prompts, max_new_tokens=self.max_new_tokens,
                            batch_size=self.batch_size, seed=self.seed, desc="partner's turns")
        return [g for (g,) in outs]
