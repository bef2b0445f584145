"""How the trained judge (`judge.py`) is fitted and measured: `uturn judge train` and `uturn judge eval`.

The labelled rows (`probe/validity/reading.py`) are split by conversation; the judge is fitted on the dev split only:
features standardised on dev, an ensemble of `MEMBERS` MLPs (seeds 0..), the grounded threshold chosen by 5-fold
cross-validation over dev conversations (folds by prompt), then the ensemble refitted on all of dev. The MLP's size,
dropout, weight decay and epochs are the ones `eval/judge_reader.py` measured by the same cross-validation (above the
linear heads on every draw); the linear heads (`fit_logistic`, v2's, their L2 penalties cross-validated) stay as the
alternative `uturn judge eval` reports beside. The test split is scored once, by `uturn judge eval`. What the feature
model reads is cached by content hash (`--cache`), so a second run costs seconds; the rules' and lexical columns are
computed each time (a second for 5,000 turns), so changing them does not read every turn again.
"""

import hashlib
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import torch

from ...io import write_json
from ..rules.classify import LABELS
from ..validity.agreement import cohen_kappa
from .features import LM_FEATURES
from .judge import FEATURE_NAMES, Judge, assemble, feature_names, read_names, read_turns, text_features

L2 = (1e-4, 1e-3, 1e-2, 1e-1)
THRESHOLDS = tuple(round(0.2 + 0.05 * i, 2) for i in range(13))
MLP = {"members": 5, "hidden": 64, "dropout": 0.3, "weight_decay": 0.1, "epochs": 30}


def _key(row: dict) -> str:
    blob = json.dumps([row["query"], row["answer"], row["user_turn"], row["other_query"], row["other_answer"],
                       row.get("finish_reason")], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def features(rows: list[dict], likelihoods, cache: Path | None = None, chunk: int = 100) -> torch.Tensor:
    """`judge.featurize` of every row, reading and extending the cache file of `judge.read_turns` (one json line per
    row's key)."""
    from tqdm.auto import tqdm

    known = {}
    columns = read_names(likelihoods)
    names = hashlib.sha256(" ".join(columns).encode()).hexdigest()[:16]  # the cached columns' signature
    if cache is not None and cache.exists():
        for line in cache.read_text().splitlines():
            entry = json.loads(line)
            if entry["features"] == names:
                known[entry["key"]] = entry["x"]
    keys = [_key(r) for r in rows]
    todo = sorted({k: i for i, k in enumerate(keys) if k not in known}.values(), key=lambda i: rows[i]["query"])
    # In chunks of `chunk` rows, the turns of one prompt together, each chunk cached as it ends: an interrupted run
    # keeps what it read.
    with tqdm(total=4 * len(todo), desc="judge features", unit="turn-context", disable=not todo) as progress:
        for start in range(0, len(todo), chunk):
            part = todo[start: start + chunk]
            x = read_turns([rows[i] for i in part], likelihoods, progress)
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                with open(cache, "a", encoding="utf-8") as f:
                    for i, values in zip(part, x.tolist()):
                        f.write(json.dumps({"key": keys[i], "features": names, "x": values}) + "\n")
            for i, values in zip(part, x.tolist()):
                known[keys[i]] = values
    return assemble(torch.tensor([known[k] for k in keys], dtype=torch.float32).reshape(len(rows), len(columns)),
                    text_features(rows))


def _targets(rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor([LABELS.index(r["label"]) for r in rows]),
            torch.tensor([int(bool(r["grounded"])) for r in rows]))


def _folds(rows: list[dict], k: int = 5) -> list[int]:
    """A fold per row, by conversation (its query): the turns after one context stay in one fold."""
    return [hashlib.sha256(r["query"].encode()).digest()[0] % k for r in rows]


def _weights(y: torch.Tensor, classes: int) -> torch.Tensor:
    """Class weights that give every class present the same total weight, capped at 10x (rare labels count, but a
    handful of rows does not decide the fit)."""
    counts = torch.bincount(y, minlength=classes).float()
    w = torch.where(counts > 0, counts.sum() / (classes * counts.clamp(min=1)), torch.zeros_like(counts))
    return w.clamp(max=10.0)


def fit_logistic(x: torch.Tensor, y: torch.Tensor, classes: int, l2: float, weight: torch.Tensor | None = None):
    """Multinomial logistic regression (binary when `classes` is 2) by L-BFGS, with an L2 penalty on the weights;
    returns (weights [classes, d], bias [classes])."""
    w = torch.zeros((classes, x.shape[1]), requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], lr=1.0, max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w.T + b, y, weight=weight) + l2 * (w * w).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach(), b.detach()


def fit_mlp(z: torch.Tensor, y: torch.Tensor, g: torch.Tensor, seed: int, hidden: int, dropout: float,
            weight_decay: float, epochs: int) -> list[dict]:
    """One member: a hidden layer (GELU, dropout; input dropout 0.1) under both outputs, trained jointly on the
    class-weighted label loss and the positive-weighted grounded loss (AdamW, batches of 64, `epochs` but at least 600
    updates: the measured setting made ~630 on a dev fold, and a smaller set needs as many to converge); its two
    layers."""
    import random

    from torch import nn
    from torch.nn import functional as F

    torch.manual_seed(seed)
    rng = random.Random(seed)
    net = nn.Sequential(nn.Dropout(0.1), nn.Linear(z.shape[1], hidden), nn.GELU(), nn.Dropout(dropout),
                        nn.Linear(hidden, len(LABELS) + 1))
    optimizer = torch.optim.AdamW(net.parameters(), 1e-3, weight_decay=weight_decay)
    label_weight, gf = _weights(y, len(LABELS)), g.float()
    pos_weight = (len(gf) - gf.sum()) / gf.sum().clamp(min=1)
    for _ in range(max(epochs, math.ceil(600 / math.ceil(len(z) / 64)))):
        order = list(range(len(z)))
        rng.shuffle(order)
        for k in range(0, len(order), 64):
            b = order[k: k + 64]
            out = net(z[b])
            loss = F.cross_entropy(out[:, :-1], y[b], weight=label_weight) + \
                F.binary_cross_entropy_with_logits(out[:, -1], gf[b], pos_weight=pos_weight)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return [{"w": layer.weight.detach().tolist(), "b": layer.bias.detach().tolist()} for layer in (net[1], net[4])]


def fit(x: torch.Tensor, rows: list[dict], head: dict, threshold: float, names: list[str] | None = None) -> dict:
    """The judge's weights (as `judge_v5.json` stores them) fitted on `x` (unstandardised, columns `names`) and the
    rows' labels; `head` is `{"kind": "mlp", **MLP}` or `{"kind": "linear", "l2_label": .., "l2_grounded": ..}`."""
    mean, std = x.mean(0), x.std(0).clamp(min=1e-6)
    z = (x - mean) / std
    y, g = _targets(rows)
    if head["kind"] == "mlp":
        options = {k: head[k] for k in ("hidden", "dropout", "weight_decay", "epochs")}
        members = [fit_mlp(z, y, g, seed, **options) for seed in range(head["members"])]
        # A column constant on dev taught nothing, but its random initial weights survive; a turn read elsewhere
        # where it varies would meet them at (x - mean) / 1e-6. Zero them (the linear heads' L2 does it itself).
        constant = (x.std(0) < 1e-6).tolist()
        for layers in members:
            layers[0]["w"] = [[0.0 if c else v for v, c in zip(row, constant)] for row in layers[0]["w"]]
    else:  # the two logistic heads as one layer: a two-class softmax is the sigmoid of its logits' difference
        w_label, b_label = fit_logistic(z, y, len(LABELS), head["l2_label"], _weights(y, len(LABELS)))
        w_g, b_g = fit_logistic(z, g, 2, head["l2_grounded"], _weights(g, 2))
        members = [[{"w": torch.cat([w_label, (w_g[1] - w_g[0])[None]]).tolist(),
                     "b": [*b_label.tolist(), (b_g[1] - b_g[0]).item()]}]]
    return {"features": names or [*FEATURE_NAMES, *(f"state_{i}" for i in range(x.shape[1] - len(FEATURE_NAMES)))],
            "mean": mean.tolist(), "std": std.tolist(), "head": head, "members": members, "threshold": threshold}


def _verdicts(weights: dict, x: torch.Tensor):
    return Judge({**weights, "name": "cv"}, likelihoods=None).predict(x)


def _held_out(x: torch.Tensor, rows: list[dict], head: dict, k: int) -> list[tuple[str, float]]:
    """(label, p(grounded)) of every row from the fit on the other folds."""
    folds = _folds(rows, k)
    predictions = [None] * len(rows)
    for fold in range(k):
        train = [i for i, f in enumerate(folds) if f != fold]
        held = [i for i, f in enumerate(folds) if f == fold]
        for i, v in zip(held, _verdicts(fit(x[train], [rows[i] for i in train], head, 0.5), x[held])):
            predictions[i] = (v.label, v.p_grounded)
    return predictions


def _scores(rows: list[dict], predictions) -> dict:
    accuracy = sum(p[0] == r["label"] for p, r in zip(predictions, rows)) / len(rows)
    threshold, f1 = max(((t, grounded_f1(rows, predictions, t)) for t in THRESHOLDS), key=lambda tf: tf[1])
    return {"label_accuracy": accuracy, "threshold": threshold, "grounded_f1": f1}


def cross_validate(x: torch.Tensor, rows: list[dict], kind: str = "mlp", k: int = 5) -> dict:
    """The head and grounded threshold that do best on held-out folds of dev (grounded F1; for the linear heads also
    the L2 penalties: label accuracy, grounded F1), with the cross-validated figures at the choice."""
    if kind == "mlp":
        head = {"kind": "mlp", **MLP}
        scores = _scores(rows, _held_out(x, rows, head, k))
        return {"head": head, "threshold": scores["threshold"], "scores": scores}
    scores = {l2: _scores(rows, _held_out(x, rows, {"kind": "linear", "l2_label": l2, "l2_grounded": l2}, k))
              for l2 in L2}
    l2_label = max(L2, key=lambda v: scores[v]["label_accuracy"])
    l2_grounded = max(L2, key=lambda v: scores[v]["grounded_f1"])
    return {"head": {"kind": "linear", "l2_label": l2_label, "l2_grounded": l2_grounded},
            "threshold": scores[l2_grounded]["threshold"], "scores": {str(k_): v for k_, v in scores.items()}}


def grounded_f1(rows: list[dict], predictions, threshold: float) -> float:
    tp = sum(p[0] == "followup" and p[1] >= threshold and r["grounded"] for p, r in zip(predictions, rows))
    predicted = sum(p[0] == "followup" and p[1] >= threshold for p in predictions)
    gold = sum(bool(r["grounded"]) for r in rows)
    return 2 * tp / (predicted + gold) if predicted + gold else 0.0


def _prf(gold: list[bool], predicted: list[bool]) -> dict:
    tp = sum(g and p for g, p in zip(gold, predicted))
    p_n, g_n = sum(predicted), sum(gold)
    return {"precision": tp / p_n if p_n else None, "recall": tp / g_n if g_n else None, "predicted": p_n, "gold": g_n}


def measure(rows: list[dict], labels: list[str], grounded: list[bool]) -> dict:
    """Follow-up and grounded precision and recall, Cohen's kappa for the label and for grounded, and the grounded
    rate by reading and by the decision, over `rows`."""
    n = len(rows)
    return {"n": n,
            "followup": _prf([r["label"] == "followup" for r in rows], [lab == "followup" for lab in labels]),
            "grounded": _prf([bool(r["grounded"]) for r in rows], grounded),
            "kappa_label": cohen_kappa([r["label"] for r in rows], labels) if n else None,
            "kappa_grounded": cohen_kappa([str(bool(r["grounded"])) for r in rows], [str(g) for g in grounded])
            if n else None,
            "grounded_rate_read": sum(bool(r["grounded"]) for r in rows) / n if n else None,
            "grounded_rate_decided": sum(grounded) / n if n else None}


def by_cell(rows: list[dict], labels: list[str], grounded: list[bool]) -> dict[str, dict]:
    """`measure` per source (`group` without its temperature), per kind of constructed turn (`kind generic`: the
    requests that fit any answer), per task x temperature, and pooled."""
    cells = defaultdict(list)
    for i, r in enumerate(rows):
        cells["all"].append(i)
        cells[f"source {r['source']}"].append(i)
        if r.get("kind"):
            cells[f"kind {r['kind']}"].append(i)
        cells[f"{r['task']} T={r['temperature']}"].append(i)
    return {name: measure([rows[i] for i in idx], [labels[i] for i in idx], [grounded[i] for i in idx])
            for name, idx in sorted(cells.items())}


def train_judge(rows: list[dict], likelihoods, out: Path, cache: Path | None, feature_model: str,
                name: str | None = None) -> dict:
    """Fit on the dev rows (see the module docstring), write the weights to `out` atomically; returns them."""
    start = time.perf_counter()
    dev = [r for r in rows if r["split"] == "dev"]
    x = features(dev, likelihoods, cache)
    chosen = cross_validate(x, dev)
    weights = fit(x, dev, chosen["head"], chosen["threshold"], feature_names(likelihoods))
    weights.update(name=name or out.stem, feature_model=feature_model,
                   likelihoods={"turn_tokens": likelihoods.turn_tokens, "context_tokens": likelihoods.context_tokens,
                                "state_layer": likelihoods.state_layer},
                   trained_on={"rows": len(dev), "labels": {lab: sum(r["label"] == lab for r in dev) for lab in LABELS},
                               "grounded": sum(bool(r["grounded"]) for r in dev)},
                   cross_validation=chosen, seconds=round(time.perf_counter() - start, 1))
    write_json(out, weights)
    return weights


def learning_curve(dev: list[dict], x_dev: torch.Tensor, test: list[dict], x_test: torch.Tensor, chosen: dict,
                   shares=(0.25, 0.5, 1.0), seed: int = 0) -> list[dict]:
    """The test figures of judges fitted on a share of the dev conversations, with the penalties and threshold
    `chosen` for the whole of dev (the weights' `cross_validation`)."""
    import random

    queries = sorted({r["query"] for r in dev})
    random.Random(seed).shuffle(queries)
    curve = []
    for share in shares:
        keep = set(queries[: math.ceil(share * len(queries))])
        idx = [i for i, r in enumerate(dev) if r["query"] in keep]
        weights = fit(x_dev[idx], [dev[i] for i in idx], chosen["head"], chosen["threshold"])
        verdicts = _verdicts(weights, x_test)
        figures = measure(test, [v.label for v in verdicts], [v.grounded for v in verdicts])
        curve.append({"share": share, "rows": len(idx), **figures})
    return curve


def without_states(x: torch.Tensor) -> torch.Tensor:
    """The alternative without the hidden state: likelihoods, rules and cues only (the columns dropped)."""
    return x[:, : len(FEATURE_NAMES)]


def without_likelihoods(x: torch.Tensor) -> torch.Tensor:
    """The alternative without a language model: rules and cues only (the likelihood features zeroed: a constant,
    which the fit ignores; the hidden state dropped)."""
    x = without_states(x).clone()
    x[:, : len(LM_FEATURES)] = 0.0
    return x


def rules_verdicts(x: torch.Tensor) -> tuple[list[str], list[bool]]:
    """The rules' own label and grounded decision, as the features hold them (the baseline the judge replaces)."""
    first = FEATURE_NAMES.index(f"rules_{LABELS[0]}")
    labels = [LABELS[i] for i in x[:, first: first + len(LABELS)].argmax(-1).tolist()]
    grounded = x[:, FEATURE_NAMES.index("rules_grounded")] > 0.5
    return labels, [lab == "followup" and bool(g) for lab, g in zip(labels, grounded.tolist())]


def compare(dev: list[dict], x_dev: torch.Tensor, test: list[dict], x_test: torch.Tensor, weights: dict) -> dict:
    """The test figures (`by_cell`) of the judge, of the linear heads on the same features (v2's), of the same head
    without the hidden state and without the language model at all (each with its own cross-validated threshold), and
    of the rules."""
    verdicts = _verdicts(weights, x_test)
    report = {"judge": by_cell(test, [v.label for v in verdicts], [v.grounded for v in verdicts])}
    kind = weights["head"]["kind"]
    for name, columns, head in (("linear heads", lambda x: x, "linear"), ("without states", without_states, kind),
                                ("without likelihoods", without_likelihoods, kind)):
        chosen = cross_validate(columns(x_dev), dev, head)
        other = fit(columns(x_dev), dev, chosen["head"], chosen["threshold"])
        other_verdicts = _verdicts(other, columns(x_test))
        report[name] = by_cell(test, [v.label for v in other_verdicts], [v.grounded for v in other_verdicts])
    report["rules"] = by_cell(test, *rules_verdicts(x_test))
    return report
