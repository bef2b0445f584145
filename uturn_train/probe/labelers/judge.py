"""The trained judge: the label and the grounded decision of a user turn, learnt from turns labelled by reading.

Words cannot carry the grounded decision after open-ended answers, and a 135M model asked zero-shot cannot either; but
the judgment exists in the labels read by hand (`tests/data/README.md`, the rubric). The judge distils it into a small
network over the features of `features.py` (a fixed language model's likelihoods of the turn in four contexts, its
hidden state read in its conversation, the rules' verdicts and lexical cues): an ensemble of MLPs (one hidden layer)
whose outputs are the seven labels' logits and the grounded logit, averaged as probabilities over the members. A turn
is a grounded follow-up when the labels' argmax is `followup` and p(grounded) reaches `threshold`. v2's heads were
linear (a member of one layer, the same format); the hidden layer is why v3 replaced them (`judge_v5.md`).

```python
judge = load_judge()                                      # the shipped one (`judge_v5.json`), its feature model
judge.label([{"query": q, "answer": a, "user_turn": t, "other_query": q2, "other_answer": a2}])
# -> [JudgeVerdict(label="followup", grounded=True, p_followup=0.93, p_grounded=0.81)]
```

The shipped weights, how they were trained and what they measure on the test split: `judge_v5.md`.
"""

import json
import os
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ..rules.classify import LABELS
from .features import (
    CONTEXTS,
    LEXICAL_FEATURES,
    LM_FEATURES,
    RULE_FEATURES,
    TurnLikelihoods,
    lm_features,
    rule_features,
)

NAME = "uturn-judge-v5"
WEIGHTS = Path(__file__).with_name("judge_v5.json")
FEATURE_NAMES = (*LM_FEATURES, *RULE_FEATURES, *LEXICAL_FEATURES)  # then the feature model's hidden state


def feature_names(likelihoods: TurnLikelihoods) -> list[str]:
    """The columns of `featurize`: `FEATURE_NAMES`, then `state<layer>_0` ... of the feature model's hidden size."""
    return [*FEATURE_NAMES, *(f"state{likelihoods.state_layer}_{i}" for i in range(likelihoods.state_size))]


def read_names(likelihoods: TurnLikelihoods) -> list[str]:
    """The columns of `read_turns`: `LM_FEATURES`, then the hidden state's."""
    return [*LM_FEATURES, *feature_names(likelihoods)[len(FEATURE_NAMES):]]


@dataclass(frozen=True)
class JudgeVerdict:
    label: str
    grounded: bool
    p_followup: float
    p_grounded: float

    @property
    def reason(self) -> str:
        return f"judge: p(followup) {self.p_followup:.2f}, p(grounded) {self.p_grounded:.2f}"


def _contexts(item: dict) -> dict[str, tuple]:
    """The four contexts a turn is read in (`features.CONTEXTS`), as (query, answer) keys; answer None: no answer."""
    return {"own": (item["query"], item["answer"]), "other_answer": (item["query"], item["other_answer"]),
            "other_conversation": (item["other_query"], item["other_answer"]), "none": ("", None)}


def read_turns(items: list[dict], likelihoods: TurnLikelihoods, progress=None) -> torch.Tensor:
    """What the feature model reads of each item: its `LM_FEATURES`, then its hidden state over the turn (the costly
    columns, which `uturn judge` caches); the likelihoods are computed one context at a time, for all the turns read
    in it."""
    from .features import context_messages

    by_context = defaultdict(list)  # (query, answer) -> [(item index, context name)]
    for i, item in enumerate(items):
        for name, key in _contexts(item).items():
            by_context[key].append((i, name))
    nll, state = [dict() for _ in items], [None] * len(items)
    for (query, answer), uses in by_context.items():
        turns = [items[i]["user_turn"] for i, _ in uses]
        for (i, name), (values, hidden) in zip(uses, likelihoods(context_messages(query, answer), turns, states=True)):
            nll[i][name] = values
            if name == "own":
                state[i] = hidden.tolist()
        if progress is not None:
            progress.update(len(uses))
    return torch.tensor([[*lm_features(n), *h] for n, h in zip(nll, state)],
                        dtype=torch.float32).reshape(len(items), len(read_names(likelihoods)))


def text_features(items: list[dict]) -> torch.Tensor:
    """`RULE_FEATURES` and `LEXICAL_FEATURES` of each item (no model: about 0.2 ms a turn)."""
    return torch.tensor([rule_features(item["query"], item["answer"], item["user_turn"], item["other_query"],
                                       item["other_answer"], item.get("finish_reason")) for item in items],
                        dtype=torch.float32).reshape(len(items), len(RULE_FEATURES) + len(LEXICAL_FEATURES))


def assemble(read: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """The columns of `feature_names` from `read_turns` and `text_features`."""
    return torch.cat([read[:, : len(LM_FEATURES)], text, read[:, len(LM_FEATURES):]], 1)


def featurize(items: list[dict], likelihoods: TurnLikelihoods, progress=None) -> torch.Tensor:
    """The `feature_names` of each item (`query`, `answer`, `user_turn`, `other_query`, `other_answer`, optional
    `finish_reason`)."""
    return assemble(read_turns(items, likelihoods, progress), text_features(items))


def forward(members: list[list[dict]], z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(label probabilities [n, 7], p(grounded) [n]) of standardised features `z`, averaged over the ensemble's
    members; each member a list of layers {"w": [out, in], "b": [out]} with GELU between them, its last layer giving
    the seven labels' logits and the grounded logit."""
    p_label, p_grounded = 0.0, 0.0
    for layers in members:
        h = z
        for k, layer in enumerate(layers):
            h = h @ layer["w"].T + layer["b"]
            if k < len(layers) - 1:
                h = torch.nn.functional.gelu(h)
        p_label = p_label + torch.softmax(h[:, :-1], -1)
        p_grounded = p_grounded + torch.sigmoid(h[:, -1])
    return p_label / len(members), p_grounded / len(members)


class Judge:
    """The trained judge (see the module docstring): `weights` as `judge_v5.json` holds them, and the feature model."""

    def __init__(self, weights: dict, likelihoods: TurnLikelihoods):
        if tuple(weights["features"][: len(FEATURE_NAMES)]) != FEATURE_NAMES:
            raise ValueError(f"{weights.get('name')}: trained on features {weights['features'][:len(FEATURE_NAMES)]}, "
                             f"this version reads {list(FEATURE_NAMES)}; train it again (`uturn judge train`)")
        if likelihoods is not None and weights["features"] != feature_names(likelihoods):
            trained = weights["features"][len(FEATURE_NAMES):]
            raise ValueError(f"{weights.get('name')}: trained on a feature model's states {trained[0]}..{trained[-1]}, "
                             f"this one reads state{likelihoods.state_layer}_0..{likelihoods.state_size - 1}; load "
                             f"the model the weights name ({weights.get('feature_model')}) with their `likelihoods`")
        self.weights, self.likelihoods = weights, likelihoods
        self.mean, self.std = torch.tensor(weights["mean"]), torch.tensor(weights["std"])
        self.members = [[{k: torch.tensor(layer[k]) for k in ("w", "b")} for layer in member]
                        for member in weights["members"]]
        self.threshold = weights["threshold"]
        self.name = weights["name"]

    def predict(self, features: torch.Tensor) -> list[JudgeVerdict]:
        x = (features - self.mean) / self.std
        with torch.no_grad():
            p_label, p_grounded = forward(self.members, x)
        verdicts = []
        for p, g in zip(p_label.tolist(), p_grounded.tolist()):
            label = LABELS[max(range(len(LABELS)), key=p.__getitem__)]
            verdicts.append(JudgeVerdict(label, label == "followup" and g >= self.threshold,
                                         p[LABELS.index("followup")], g))
        return verdicts

    def label(self, items: list[dict], progress=None) -> list[JudgeVerdict]:
        """Verdicts of `items` (see `featurize`), in order."""
        return self.predict(featurize(items, self.likelihoods, progress)) if items else []


def feature_model_dir(name: str) -> Path:
    """Where the uturn commands keep the feature model the weights name: `$UTURN_HOME/<name>` (`zoo.resolve` fetches
    `smollm2-135m-instruct` there when a labeler is `trained`)."""
    return Path(os.environ.get("UTURN_HOME", "~/.cache/uturn")).expanduser() / name


@lru_cache(maxsize=2)
def load_judge(weights: str | None = None, feature_model: str | None = None, device: str | None = None) -> Judge:
    """The judge of `weights` (a `judge_v*.json`; default the shipped one) on its feature model (`feature_model`, a
    folder; default `feature_model_dir` of the name the weights give)."""
    from ...distributed import outside_zero3
    from ...models import load_model, load_tokenizer

    path = Path(weights) if weights else WEIGHTS
    if not path.is_file():
        raise ValueError(f"judge weights {path} not found: train them with `uturn judge train`, or pass the file")
    data = json.loads(path.read_text(encoding="utf-8"))
    folder = Path(feature_model) if feature_model else feature_model_dir(data["feature_model"])
    if not (folder / "config.json").is_file():
        raise ValueError(f"{data['name']} reads with {data['feature_model']}, not found at {folder}: the uturn "
                         f"commands fetch it when --labeler is trained (or run `uturn probe --model "
                         f"{data['feature_model']} --limit 1` once)")
    with outside_zero3():  # a fixed model every process reads whole
        model, tokenizer = load_model(str(folder), dtype="float32", device=device), load_tokenizer(str(folder))
    return Judge(data, TurnLikelihoods(model, tokenizer, **data["likelihoods"]))


__all__ = ["CONTEXTS", "FEATURE_NAMES", "NAME", "Judge", "JudgeVerdict", "assemble", "feature_model_dir",
           "feature_names", "featurize", "forward", "load_judge", "read_names", "read_turns", "text_features"]
