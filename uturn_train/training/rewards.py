"""Reward functions for online RL on the user turn (`recipes/collab_grpo.py`), in TRL's `reward_funcs` signature.

Each is called with the batch's `prompts`, `completions` (decoded text) and `completion_ids`, plus the data set's extra
columns (see [`~uturn_train.training.rl_data.grpo_rows`]): `kind` (`user_turn` or `anchor`), `query`, `answer` (what the
user turn reacts to), `controls` (mismatched contexts `[query, answer]` for the grounded decision) and `gold`. A
function returns one float per completion, or None where it does not apply (TRL leaves those out of the sum), and TRL
logs each function's mean as `rewards/<name>/mean`.

- [`UserTurnReward`]: the user-turn probe's verdict as a reward: +1 for a follow-up grounded against every
  mismatched context of its row (`grounding.CONTROLS`), +0.5 for one specific to its conversation against every
  control that takes nothing from its answer (a step towards reacting to it), 0 for one that fits any answer, for
  thanks and for a new topic, and -1 for identity drift, repetition, empty or degenerate turns. With the trained
  judge (`reward_labeler` `trained`, the default off the testbed) the label and grounded decision are the judge's,
  read against the row's first mismatched context: +1 for a grounded follow-up, the labels' rewards otherwise (the
  judge has no "specific" tier).
- [`LengthGuard`]: a penalty for user turns longer than a budget, so a turn cannot gain by padding.
- [`accuracy`]: 1 for a correct answer to an anchor problem (`tasks.gsm8k.is_correct`), 0 otherwise.
"""

from ..probe.rules.classify import classify_turn
from ..probe.rules.grounding import grounded_in
from ..tasks import gsm8k

# The reward of each verdict. Only a grounded follow-up earns anything. A follow-up that fits any answer ("Can you
# break it down for me?") earns what a new topic or thanks earn: with 0.25 for it (and -0.25 for a new topic), the
# testbed's greedy turn became one such question for 187 of 200 prompts by step 100 (grounded rate 0.02), because
# every group whose samples held no grounded follow-up still rewarded the generic one over the rest.
# A turn specific to its conversation but not to its answer ("What if Noah was 8?") earns half: with 0 for it, once the
# grounded decision asked a turn to react to its answer (issue 17), seed 0's greedy turn stayed a new topic for 200
# steps (T=1.0 grounded 0.039 -> 0.064); with half, it becomes a follow-up between steps 150 and 225 on seeds 0-2, and
# their selected checkpoints are grounded 0.37-0.44 (recipes/README.md). Such a turn is no generic question: hack 1
# of recipes/README.md does not come back.
LABEL_REWARD = {"grounded": 1.0, "specific": 0.5, "followup": 0.0, "acknowledgement": 0.0, "new_topic": 0.0,
                "identity_drift": -1.0, "repetition": -1.0, "empty": -1.0, "degenerate": -1.0}


class UserTurnReward:
    """The verdict of the probe's classifier and grounded decision on a generated user turn, as a reward.

    A completion that stopped on the start of another role's header (`<|im_start|>`) keeps that header, as in the
    probe: the header is a special token that TRL's decoding drops, so it is put back from `completion_ids`.

    Args:
        tokenizer: the policy's tokenizer.
        header_starts (`list[str]`): [`~uturn_train.chat.role_header_starts`] of its template.
        judge ([`~uturn_train.probe.labelers.judge.Judge`], *optional*): the trained judge decides instead of the
            rules.
    """

    __name__ = "user_turn"  # TRL names the logged reward after it

    def __init__(self, tokenizer, header_starts: list[str], judge=None):
        added = tokenizer.get_added_vocab()
        self.header_ids = {added[h]: h for h in header_starts if h in added}
        self.judge = judge

    def turn(self, text: str, ids: list[int]) -> str:
        return text + self.header_ids[ids[-1]] if ids and ids[-1] in self.header_ids else text

    def __call__(self, completions, completion_ids, kind, query, answer, controls, **kwargs):
        if self.judge is not None:
            return self.judged(completions, completion_ids, kind, query, answer, controls)
        rewards = []
        for text, ids, k, q, a, others in zip(completions, completion_ids, kind, query, answer, controls):
            if k != "user_turn":
                rewards.append(None)
                continue
            turn = self.turn(text, ids)
            verdict = classify_turn(q, a, turn)
            others = [tuple(c) for c in others]
            if verdict.is_followup and grounded_in(q, a, turn, others, verdict):
                rewards.append(LABEL_REWARD["grounded"])
            elif verdict.is_followup and grounded_in(q, a, turn, others, verdict, reacts=False):
                rewards.append(LABEL_REWARD["specific"])
            else:
                rewards.append(LABEL_REWARD[verdict.label])
        return rewards

    def judged(self, completions, completion_ids, kind, query, answer, controls) -> list[float | None]:
        """The trained judge's verdicts as rewards; one `Judge.label` call for the batch's user turns."""
        rows = [i for i, k in enumerate(kind) if k == "user_turn"]
        items = [{"query": query[i], "answer": answer[i], "user_turn": self.turn(completions[i], completion_ids[i]),
                  "other_query": controls[i][0][0], "other_answer": controls[i][0][1]} for i in rows]
        rewards = [None] * len(kind)
        for i, v in zip(rows, self.judge.label(items)):
            rewards[i] = LABEL_REWARD["grounded"] if v.grounded else LABEL_REWARD[v.label]
        return rewards


class LengthGuard:
    """0 for a user turn of at most `budget` tokens, then down linearly to -1 at twice the budget; None for answers."""

    __name__ = "length_guard"

    def __init__(self, budget: int):
        self.budget = budget

    def __call__(self, completion_ids, kind, **kwargs):
        return [None if k != "user_turn" else -min(1.0, max(0, len(ids) - self.budget) / self.budget)
                for ids, k in zip(completion_ids, kind)]


def accuracy(completions, kind, gold, **kwargs):
    """1 for a correct answer to an anchor problem, 0 for a wrong one (no number is wrong); None for user turns."""
    return [None if k != "anchor" else float(gsm8k.is_correct(text, g)) for text, k, g in zip(completions, kind, gold)]
