"""What the trained judge reads of a user turn: a fixed language model's likelihoods of the turn in four contexts, its
hidden state at a middle layer over the turn read after its own conversation, the rules' verdicts, and a few lexical
cues (`judge.py` combines them).

The likelihoods answer the question the labels ask, *does the turn react to this answer?*, as a reader would check it:
is the turn more likely after its own answer than after another answer to the same query (a reaction to what this
answer said), than after another conversation (a turn about this conversation at all), than with no conversation (a
turn that needs one)? And is it likely at all (incoherent text is not, even in its own context)? The hidden state
carries what words and likelihoods do not: what kind of turn it is (a question, a solution, thanks), read in its
conversation. A middle layer's, not the last: on the labelled dev split, cross-validated, SmolLM2's layer 16 of 30 gave
grounded F1 0.70 where layers 8, 24 and 30 gave 0.66, 0.66 and 0.67, and adding the change of the state when the answer
is another (0.703) or more layers (0.68-0.69) did not help (`probe/labelers/judge_v5.md`). The model reads the
turn under the user role with its own chat template, as the probe's prompts are built (`chat.user_turn_prompt`);
each context is computed once for all the turns that follow it.
"""

import math
import re

import torch

from ...chat import stop_strings, user_turn_prompt
from ..rules import cues, word_problem
from ..rules.classify import LABELS, classify_turn
from ..rules.grounding import is_grounded
from ..rules.text import content, context, words

CONTEXTS = ("own", "other_answer", "other_conversation", "none")
LM_FEATURES = ("nll_own", "gain_answer", "gain_conversation", "gain_context", "top_gain_answer", "share_gained",
               "nll_first", "turn_tokens")
RULE_FEATURES = (*(f"rules_{label}" for label in LABELS), "rules_grounded", "rules_mismatch_followup")
LEXICAL_FEATURES = ("words", "asks", "numbers", "numbers_of_answer", "numbers_of_query_only", "numbers_new",
                    "shares_answer", "shares_query", "points_back", "back_at_answer")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def context_messages(query: str, answer: str | None) -> list[dict]:
    if answer is None:
        return [{"role": "user", "content": query}] if query else []
    return [{"role": "user", "content": query}, {"role": "assistant", "content": answer}]


class TurnLikelihoods:
    """Per-token negative log-likelihoods of user turns after a context, with the context computed once.

    Args:
        model: a causal LM (the judge's feature model, fixed), in eval mode.
        tokenizer: its tokenizer, with a chat template.
        turn_tokens (`int`, *optional*, defaults to 48): the turn's first tokens scored, then its end of turn.
        context_tokens (`int`, *optional*, defaults to 640): the context's last tokens kept.
        state_layer (`int`, *optional*): the layer whose hidden state is read (0: the embeddings); default the one past
            the middle, `num_hidden_layers // 2 + 1` (16 of SmolLM2's 30).
    """

    def __init__(self, model, tokenizer, turn_tokens: int = 48, context_tokens: int = 640,
                 state_layer: int | None = None):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.turn_tokens, self.context_tokens = turn_tokens, context_tokens
        layers = model.config.get_text_config().num_hidden_layers
        self.state_layer = layers // 2 + 1 if state_layer is None else state_layer
        if not 0 <= self.state_layer <= layers:
            raise ValueError(f"state_layer {self.state_layer}: the model has layers 0 (embeddings) to {layers}")
        self.end_ids = tokenizer(stop_strings(tokenizer)[0], add_special_tokens=False).input_ids

    def turn_ids(self, turn: str) -> list[int]:
        return self.tokenizer(turn.strip(), add_special_tokens=False).input_ids[: self.turn_tokens] + self.end_ids

    @property
    def state_size(self) -> int:
        return self.model.config.get_text_config().hidden_size

    def __call__(self, messages: list[dict], turns: list[str], chunk: int = 32,
                 states: bool = False) -> list[torch.Tensor] | list[tuple[torch.Tensor, torch.Tensor]]:
        """The NLL of every token of each turn (its first `turn_tokens`, then the end of turn) after `messages`, with
        `states` also the mean of the model's hidden state at `state_layer` over the turn's tokens; turns are read
        `chunk` at a time (the logits of a chunk are `chunk x turn_tokens x vocabulary` floats)."""
        context = self.tokenizer(user_turn_prompt(self.tokenizer, messages),
                                 add_special_tokens=False).input_ids[-self.context_tokens:]
        ids = [self.turn_ids(t) for t in turns]
        read = [pair for i in range(0, len(ids), chunk) for pair in self._read(context, ids[i: i + chunk])]
        return read if states else [nll for nll, _ in read]

    @torch.no_grad()  # not inference_mode: the model may train next (see generation.py)
    def _read(self, context: list[int], ids: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from ...generation import preallocated_cache

        device = self.model.device
        width = max(map(len, ids))
        cache = preallocated_cache(self.model, len(context) + width)
        out = self.model(input_ids=torch.tensor([context], device=device), cache=cache, use_cache=True,
                         logits_to_keep=1)
        first = torch.log_softmax(out.logits[0, -1].float(), -1)
        cache.reorder_cache(torch.zeros(len(ids), dtype=torch.long, device=device))
        batch = torch.tensor([t + [t[-1]] * (width - len(t)) for t in ids], device=device)  # right-padded
        mask = torch.ones((len(ids), len(context) + width), dtype=torch.long, device=device)
        positions = torch.arange(len(context), len(context) + width, device=device).expand(len(ids), -1)
        out = self.model(input_ids=batch, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                         output_hidden_states=True)
        logprobs = torch.log_softmax(out.logits.float(), -1)
        hidden = out.hidden_states[self.state_layer].float()
        read = []
        for row, t in enumerate(ids):
            target = torch.tensor(t, device=device)
            steps = torch.cat([first[None], logprobs[row, : len(t) - 1]])  # token i is predicted at position i - 1
            read.append((-steps.gather(1, target[:, None]).squeeze(1).cpu(), hidden[row, : len(t)].mean(0).cpu()))
        return read


def lm_features(nll: dict[str, torch.Tensor]) -> list[float]:
    """`LM_FEATURES` of one turn from its per-token NLLs in each of `CONTEXTS`."""
    own = nll["own"]
    per_token_gain = nll["other_answer"] - own
    return [own.mean().item(), per_token_gain.mean().item(), (nll["other_conversation"] - own).mean().item(),
            (nll["none"] - own).mean().item(), per_token_gain.topk(min(3, len(own))).values.mean().item(),
            (per_token_gain > 1.0).float().mean().item(), own[: min(4, len(own))].mean().item(), math.log(len(own))]


def rule_features(query: str, answer: str, turn: str, other_query: str, other_answer: str,
                  finish_reason: str | None = None) -> list[float]:
    """`RULE_FEATURES` and `LEXICAL_FEATURES` of one turn: the rules' label and grounded decision against the
    mismatched context, and cues of what the turn shares with its answer and its query."""
    verdict = classify_turn(query, answer, turn, finish_reason)
    if (other_query, other_answer) != (query, answer):
        g = is_grounded(query, answer, turn, other_query, other_answer, verdict=verdict, finish_reason=finish_reason)
        grounded, mismatch = g.grounded, g.mismatch_label == "followup"
    else:
        grounded, mismatch = False, False
    turn_words = words(cues.MARKUP.sub(" ", turn))
    own, joined = context(query, answer), f" {' '.join(turn_words)} "
    numbers = {n.replace(",", "") for n in _NUMBER.findall(turn)}
    answer_numbers = {n.replace(",", "") for n in _NUMBER.findall(answer)}
    query_numbers = {n.replace(",", "") for n in _NUMBER.findall(query)}
    stems = content(set(turn_words))
    answer_stems = content(set(own.answer_words))
    n = max(1, len(stems))
    return [
        *(float(verdict.label == label) for label in LABELS), float(grounded), float(mismatch),
        math.log1p(len(turn_words)), float("?" in turn), math.log1p(len(numbers)),
        float(len(numbers & answer_numbers)), float(len(numbers & query_numbers - answer_numbers)),
        float(len(numbers - answer_numbers - query_numbers)),
        len(stems & answer_stems) / n, len(stems & own.query_content) / n,
        float(bool(cues.POINTS_BACK.search(joined))), float(bool(word_problem.BACK_AT_ANSWER.search(joined))),
    ]
