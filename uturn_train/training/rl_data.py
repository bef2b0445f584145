"""The prompts of online RL on the user turn (`recipes/collab_grpo.py`): user-turn prompts and accuracy anchors.

A user-turn prompt is the conversation (query, then an answer) rendered with the policy's own chat template and cut
at the user header, exactly as the probe builds it ([`~uturn_train.chat.user_turn_prompt`]): a plain-text prompt, since
TRL renders a conversational prompt with an *assistant* generation header. The answer is the policy's own greedy
answer, produced once before training (`prompt_setting: self`), or the data's (`heldout`). An anchor prompt is an
ordinary problem with a gold answer, rendered with the assistant header: the policy answers it and is rewarded for a
correct result, so that problem solving is trained in the same run (`anchor_share` of the prompts).
"""

import random
from dataclasses import dataclass, field

from ..chat import answer_prompt, user_turn_prompt
from ..collab.tasks import FAMILIES
from ..probe.rules.grounding import mismatched_contexts
from ..probe.settings import OFFLINE_LABELERS
from ..tasks.base import Example
from .data import check_source, prompt_examples


@dataclass
class RLArguments:
    """Where the RL prompts come from, and the user-turn length budget of the rewards.

    Args:
        prompt_source (`str`, *optional*, defaults to `"testbed"`): `testbed` (the built testbed's training
            conversations, never its held-out probe problems), `gsm8k` (a GSM8K file, or the hub's train split),
            `oasst` or `conversations`; see `uturn_train/training/data.py`.
        prompt_setting (`str`, *optional*, defaults to `"self"`): the answer a user turn reacts to: `self` (the policy's
            own greedy answer, generated once before training) or `heldout` (the data's answer).
        anchor_share (`float`, *optional*, defaults to `0.25`): share of the prompts that are anchor problems (the
            policy answers, rewarded by correctness); 0 disables them. Needs a source with gold answers.
        user_turn_budget (`int`, *optional*, defaults to `48`): tokens a user turn may take before the length guard
            lowers its reward (to -1 at twice the budget).
        reward_labeler (`str`, *optional*, defaults to `"auto"`): who decides the user-turn reward: `rules`, `trained`
            (the trained judge) or `auto` (the rules on the testbed, the judge on every other source).
        objective (`str`, *optional*, defaults to `"user_turn"`): `user_turn` (one user turn after an answer, rewarded
            by the probe's verdict) or `collab` (whole conversations with the oracle partner, rewarded by how they end;
            `uturn_train/training/collab_rl.py`; prompt_source `testbed` or `gsm8k`, `prompt_limit` problems).
        collab_families (`list[str]`, *optional*, defaults to both): the collaboration families trained on.
        collab_max_turns (`int`, *optional*, defaults to `3`): the policy's turns per conversation.
        collab_turn_cost (`float`, *optional*, defaults to `0.0`): subtracted from the reward per policy turn after
            the first (CollabLLM's efficiency cost; at 0.1 the testbed's follow-ups died out before any paid).
        collab_wrong_share (`float`, *optional*, defaults to `0.5`): share of the training peer_check tasks whose answer
            starts wrong. A right start ends right whatever the user says, so its group of conversations teaches the
            outcome nothing (only the first-turn shaping); the measured tasks keep `uturn collab`'s 0.5.
    """

    prompt_source: str = field(default="testbed", metadata={"help": "testbed, gsm8k, oasst or conversations."})
    prompt_data: str | None = field(default=None, metadata={"help": "Data file; default per source."})
    prompt_limit: int | None = field(default=512, metadata={"help": "Source examples to read."})
    prompt_setting: str = field(default="self", metadata={"help": "self (the policy's own answers) or heldout."})
    anchor_share: float = field(default=0.25, metadata={"help": "Share of anchor prompts (0 = none)."})
    prompt_answer_max_new_tokens: int = field(default=256, metadata={"help": "Token limit of the self answers."})
    prompt_seed: int = field(default=0, metadata={"help": "Seeds the anchor split and the mismatched contexts."})
    user_turn_budget: int = field(default=48, metadata={"help": "User-turn tokens before the length guard bites."})
    reward_labeler: str = field(default="auto", metadata={
        "help": "auto (rules on the testbed, the trained judge elsewhere), rules or trained."})
    objective: str = field(default="user_turn", metadata={
        "help": "user_turn (one user turn, the probe's verdict) or collab (whole conversations, their success)."})
    collab_families: list[str] = field(default_factory=lambda: ["info_gap", "peer_check"],
                                       metadata={"help": "Collaboration families trained on (objective collab)."})
    collab_max_turns: int = field(default=3, metadata={"help": "Policy turns per conversation (objective collab)."})
    collab_turn_cost: float = field(default=0.0, metadata={
        "help": "Reward lost per policy turn after the first (objective collab)."})
    collab_wrong_share: float = field(default=0.5, metadata={
        "help": "Share of the training peer_check tasks that start wrong (objective collab)."})

    def __post_init__(self):
        check_source(self.prompt_source, self.prompt_data, option="prompt")
        if self.prompt_setting not in ("self", "heldout"):
            raise ValueError(f"prompt_setting {self.prompt_setting!r} is not one of ('self', 'heldout')")
        if not 0 <= self.anchor_share < 1:
            raise ValueError(f"anchor_share must be in [0, 1), got {self.anchor_share}")
        if self.reward_labeler not in OFFLINE_LABELERS:
            raise ValueError(f"reward_labeler {self.reward_labeler!r} is not one of {OFFLINE_LABELERS} (an LLM judge "
                             "is not offered as a reward: every rollout would be a request)")
        if self.user_turn_budget < 1:
            raise ValueError(f"user_turn_budget must be >= 1, got {self.user_turn_budget}")
        if self.objective not in ("user_turn", "collab"):
            raise ValueError(f"objective {self.objective!r} is not one of ('user_turn', 'collab')")
        if self.objective == "collab":
            if self.prompt_source not in ("testbed", "gsm8k"):
                raise ValueError(f"objective `collab` takes prompt_source testbed or gsm8k (problems the oracle can "
                                 f"play), not {self.prompt_source!r}")
            if not self.collab_families or any(f not in FAMILIES for f in self.collab_families):
                raise ValueError(f"collab_families {self.collab_families}: choose among {', '.join(FAMILIES)}")
            if self.collab_max_turns < 1 or not 0 <= self.collab_turn_cost < 1:
                raise ValueError(f"collab_max_turns must be >= 1 and collab_turn_cost in [0, 1), got "
                                 f"{self.collab_max_turns} and {self.collab_turn_cost}")
            if not 0 < self.collab_wrong_share <= 1:
                raise ValueError(f"collab_wrong_share must be in (0, 1], got {self.collab_wrong_share}")


def rl_examples(args: RLArguments) -> list[Example]:
    return prompt_examples(args.prompt_source, args.prompt_data, args.prompt_limit, option="prompt")


def grpo_rows(model, tokenizer, examples: list[Example], args: RLArguments, state=None) -> list[dict]:
    """The rows of the RL data set (`prompt` plus the columns the rewards read); the same on every rank of `state`.

    Anchors are drawn (seeded) among the examples with a gold answer; the others become user-turn prompts, each with
    the queries and answers of `CONTROLS` other user-turn prompts (seeded derangements) as mismatched contexts.
    """
    from ..probe.runner import run_probe
    from ..probe.settings import ProbeSettings

    rng = random.Random(args.prompt_seed)
    graded = [i for i, ex in enumerate(examples) if ex.gold is not None]
    n_anchors = round(args.anchor_share * len(examples))
    if n_anchors > len(graded):
        raise ValueError(f"anchor_share {args.anchor_share} asks for {n_anchors} anchor problems, but only "
                         f"{len(graded)} of the {len(examples)} prompts of {args.prompt_source!r} have a gold answer; "
                         "lower anchor_share or use a source with answers in GSM8K format")
    anchors = set(rng.sample(graded, n_anchors))
    turns = [ex for i, ex in enumerate(examples) if i not in anchors]
    if len(turns) < 2:
        raise ValueError(f"{len(turns)} user-turn prompts: the grounded reward needs at least 2; raise prompt_limit")
    if args.prompt_setting == "self":
        settings = ProbeSettings(temperatures=[], answer_max_new_tokens=args.prompt_answer_max_new_tokens,
                                 labeler="rules")  # answers only: no turn to label
        answers = [a["answer"] for a in run_probe(model, tokenizer, turns, settings, state=state).answers]
    else:
        answers = [ex.answer for ex in turns]
        if not all(answers):
            raise ValueError("prompt_setting `heldout` needs an answer per prompt; this source has none for some")
    contexts = [(ex.query, answer) for ex, answer in zip(turns, answers)]
    controls = mismatched_contexts(contexts, args.prompt_seed)
    rows = [{"prompt": user_turn_prompt(tokenizer, [*ex.meta.get("history", []), {"role": "user", "content": ex.query},
                                                    {"role": "assistant", "content": answer}]),
             "kind": "user_turn", "id": ex.id, "query": ex.query, "answer": answer, "gold": ex.gold,
             "controls": [list(c) for c in controls[i]]}
            for i, (ex, answer) in enumerate(zip(turns, answers))]
    rows += [{"prompt": answer_prompt(tokenizer, [*ex.meta.get("history", []), {"role": "user", "content": ex.query}]),
              "kind": "anchor", "id": ex.id, "query": ex.query, "answer": None, "gold": ex.gold, "controls": []}
             for i, ex in enumerate(examples) if i in anchors]
    rng.shuffle(rows)
    return rows
