"""The collaboration objective of online RL (`recipes/collab_grpo.py`, `objective: collab`): whole conversations with
the oracle partner, rewarded by how they end.

CollabLLM's idea (a multiturn-aware reward: roll the conversation forward with a simulated partner and reward the
outcome), cheaply: the partner is the oracle of `uturn_train.collab` (the task's own lines, no model), and the
conversation is the rollout. Through TRL's `rollout_func`: GRPOTrainer hands [`CollabRollout`] the batch's prompts (each
`num_generations` times), it holds every task's conversation with the policy sampling its turns
([`~uturn_train.collab.dialogue.run_collab`] with `trace`), and returns one token sequence per conversation: the
opening prompt, then every turn up to the end of the policy's last one, with `env_mask` 1 on the tokens the policy
sampled (the loss) and 0 on the partner's and the template's. The policy plays the user in peer_check (question the
answer, or thank and move on) and the assistant in info_gap (ask for the missing number, or guess).

Reward ([`CollabReward`]): 1 when the conversation ends right (info_gap: the policy's answer is the gold one;
peer_check: the pair's final answer is), 0 otherwise, minus `collab_turn_cost` per policy turn after the first
(CollabLLM's efficiency cost, in turns rather than tokens; 0 by default: at 0.1 the testbed's sampled follow-ups died
out before any paid, since half the peer_check answers are right and a follow-up there only costs a turn). The oracle
of the rollouts does not count a question that names the wrong step by its ordinal alone ("Can you explain the first
step?"): it fits any answer, and rewarded for it GRPO learned to ask it of every answer (recipes/README.md). Nor does
it reveal the missing number to an ask that does not name the missing quantity (`partners.names_the_gap`): rewarded for
any question, the testbed's asks decayed to the question restated with a bare question mark. Anchors
(`anchor_share`) are ordinary problems, one turn, rewarded by `rewards.accuracy` as in the user-turn objective.

Shaping ([`FirstUserTurn`], its weight in `reward_weights`): the user-turn probe's verdict on the policy's first user
turn of a peer_check conversation (`rewards.UserTurnReward`, against three other tasks' openings). The outcome alone is
too sparse for a model that seldom questions anything: on the testbed the rollouts' wrong-start success stayed at
0.5-1.6% over 300 steps, and most groups of 8 held no success to compare (recipes/README.md). A grounded first turn
names the answer's own numbers, the step before naming the one the slip changed, which the outcome then selects.

Training tasks are never the measured ones: the recipe draws the testbed's from world problems apart from its held-out
keys (`testbed.collab.training_collab_tasks`), GSM8K's from its train split (`collab.gsm8k.gsm8k_collab_tasks`),
`collab_wrong_share` of their peer_check answers starting wrong: a right start ends right whatever the user says, so its
group of conversations holds no advantage for the outcome.
"""

import random
from dataclasses import replace

from ..chat import answer_prompt
from ..collab.dialogue import CollabSettings, run_collab, turn_prompt
from ..collab.partners import OraclePartner
from ..collab.tasks import CollabTask
from ..generation import generate
from ..models import merged_lora
from ..probe.rules.grounding import mismatched_contexts


def collab_rows(tokenizer, tasks: list[CollabTask], examples: list, anchor_share: float, seed: int) -> list[dict]:
    """The RL data set: a row per task (`kind` `collab`) and per anchor problem (`kind` `anchor`, drawn among the
    `examples` with a gold answer so that they are `anchor_share` of the rows), shuffled. A peer_check row also holds
    its opening (`query`, `answer`) and other tasks' openings (`controls`: `mismatched_contexts`), for
    [`FirstUserTurn`]."""
    rng = random.Random(seed)
    opening = {t.id: (t.messages[0]["content"], t.messages[1]["content"]) for t in tasks if t.family == "peer_check"}
    controls = dict(zip(opening, mismatched_contexts(list(opening.values()), seed)))
    graded = [ex for ex in examples if ex.gold is not None]
    n = round(anchor_share / (1 - anchor_share) * len(tasks))
    if n > len(graded):
        raise ValueError(f"anchor_share {anchor_share} asks for {n} anchor problems beside {len(tasks)} tasks, but "
                         f"only {len(graded)} prompts have a gold answer: lower anchor_share or raise prompt_limit")
    anchors = rng.sample(graded, n)
    rows = [{"prompt": turn_prompt(tokenizer, t), "kind": "collab", "id": t.id, "family": t.family, "gold": t.gold,
             "answer_right": t.answer_right, **dict(zip(("query", "answer"), opening.get(t.id, (None, None)))),
             "controls": [list(c) for c in controls.get(t.id, [])]} for t in tasks]
    rows += [{"prompt": answer_prompt(tokenizer, [{"role": "user", "content": ex.query}]), "kind": "anchor",
              "id": ex.id, "family": None, "gold": ex.gold, "answer_right": None, "query": None, "answer": None,
              "controls": []} for ex in anchors]
    rng.shuffle(rows)
    return rows


class CollabRollout:
    """TRL's `rollout_func` for the collaboration objective (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer (its template's end of turn must be a special token).
        tasks (`list[CollabTask]`): the tasks, found again by their opening prompt.
        settings ([`CollabSettings`]): turns and token limit per policy turn; the temperature and seed are the
            trainer's (`temperature`; the seed moves with the step and the process).
    """

    def __init__(self, tokenizer, tasks: list[CollabTask], settings: CollabSettings):
        self.tokenizer, self.settings = tokenizer, settings
        self.tasks = {}
        for t in tasks:  # two tasks that open alike are the same conversation to the policy: the first is kept
            self.tasks.setdefault(turn_prompt(tokenizer, t), t)

    def __call__(self, prompts: list[str], trainer) -> dict:
        from trl.models import unwrap_model_for_generation

        args = trainer.args
        seed = args.seed + 7919 * trainer.state.global_step + 104729 * trainer.accelerator.process_index
        settings = replace(self.settings, temperature=args.temperature, seed=seed)
        collab = [i for i, p in enumerate(prompts) if p in self.tasks]
        anchors = [i for i, p in enumerate(prompts) if p not in self.tasks]
        out = {"prompt_ids": [None] * len(prompts), "completion_ids": [None] * len(prompts),
               "env_mask": [None] * len(prompts), "logprobs": None, "collab_success": [None] * len(prompts),
               "collab_turns": [None] * len(prompts), "first_turn": [None] * len(prompts)}
        unwrap = unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                             gather_deepspeed3_params=args.ds3_gather_for_generation,
                                             gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
        with unwrap as unwrapped, merged_lora(unwrapped) as model:  # fp32: faster merged (models.merged_lora)
            if collab:
                # An ordinal alone ("Can you explain the first step?") fits any answer, as does an ask that names no
                # quantity ("...for 9 days,?"): neither is rewarded (partners.py).
                run = run_collab(model, self.tokenizer, [self.tasks[prompts[i]] for i in collab],
                                 OraclePartner(ordinal=False, named=True), settings, disable_progress=True,
                                 trace=True)
                for i, record in zip(collab, run.conversations):
                    trace, opened = record["trace"], len(self.tasks[prompts[i]].messages)
                    out["first_turn"][i] = record["messages"][opened]["content"] if len(record["messages"]) > opened \
                        else ""
                    out["prompt_ids"][i], out["completion_ids"][i] = trace["prompt_ids"], trace["completion_ids"]
                    out["env_mask"][i] = trace["env_mask"]
                    out["collab_success"][i], out["collab_turns"][i] = bool(record["success"]), record["turns"]
            if anchors:
                self._anchors(model, prompts, anchors, settings, args.max_completion_length, out)
        return out

    def _anchors(self, model, prompts, rows, settings, max_new_tokens, out) -> None:
        added = self.tokenizer.get_added_vocab()
        outs = generate(model, self.tokenizer, [prompts[i] for i in rows], max_new_tokens=max_new_tokens,
                        temperature=settings.temperature, batch_size=settings.batch_size, seed=settings.seed,
                        disable_progress=True)
        for i, (g,) in zip(rows, outs):
            ids = list(g.token_ids) + ([added[g.stop]] if g.stop in added else [])
            out["prompt_ids"][i] = self.tokenizer(prompts[i], add_special_tokens=False).input_ids
            out["completion_ids"][i], out["env_mask"][i] = ids, [1] * len(ids)


class CollabReward:
    """1 for a conversation that ended right, else 0, minus `turn_cost` per policy turn after the first; None for
    anchors. Reads the rollout's `collab_success` and `collab_turns`; logs the rollouts' success per family
    (`collab/rollout_success/<info_gap|peer_check_wrong_start|peer_check_right_start>`) through TRL's `log_metric`."""

    __name__ = "collab_success"  # TRL logs it as rewards/collab_success/mean

    def __init__(self, turn_cost: float = 0.0):
        if not 0 <= turn_cost < 1:
            raise ValueError(f"collab_turn_cost must be in [0, 1), got {turn_cost}")
        self.turn_cost = turn_cost

    def __call__(self, completions, kind, collab_success=None, collab_turns=None, family=None, answer_right=None,
                 log_metric=None, **kwargs):
        if log_metric is not None:  # the rollouts' success per family, beside the reward TRL logs
            groups = {"info_gap": ("info_gap", None), "peer_check_wrong_start": ("peer_check", False),
                      "peer_check_right_start": ("peer_check", True)}
            for name, want in groups.items():
                got = [float(s) for k, s, f, r in zip(kind, collab_success, family, answer_right)
                       if k == "collab" and (f, r) == want]
                if got:
                    log_metric(f"collab/rollout_success/{name}", sum(got) / len(got))
        return [None if k != "collab" else float(s) - self.turn_cost * (t - 1)
                for k, s, t in zip(kind, collab_success, collab_turns)]


class FirstUserTurn:
    """Shaping: the user-turn probe's verdict ([`~uturn_train.training.rewards.UserTurnReward`]: +1 grounded, +0.5
    specific to its conversation, 0 a follow-up that fits any answer, thanks or a new topic, -1 drift, repetition,
    empty) on the policy's first user turn of each peer_check conversation, against the row's `controls`; None for
    info_gap and anchors. Reads the rollout's `first_turn`."""

    __name__ = "first_user_turn"

    def __init__(self, turn_reward):
        self.turn_reward = turn_reward

    def __call__(self, completions, kind, family, query, answer, controls, first_turn=None, **kwargs):
        rows = [i for i, (k, f) in enumerate(zip(kind, family)) if k == "collab" and f == "peer_check"]
        rewards = [None] * len(kind)
        if rows:
            got = self.turn_reward([first_turn[i] or "" for i in rows], [[] for _ in rows], ["user_turn"] * len(rows),
                                   [query[i] for i in rows], [answer[i] for i in rows], [controls[i] for i in rows])
            for i, r in zip(rows, got):
                rewards[i] = r
        return rewards
