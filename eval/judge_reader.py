"""The trained judge's measured alternatives (issue 36): an attention reader over the feature model's token states.

The judge reads one vector of a turn (SmolLM2's layer-16 state, averaged over the turn) beside likelihoods, rules
and cues. This reader keeps every token's layer-16 state of the conversation (query, answer, turn), projects them to
`--width` dimensions with a segment embedding (query / answer / turn), lets the turn's tokens attend to the whole
conversation (one multi-head attention layer, trained), pools over the turn and decides label and grounded with two
heads, optionally with the judge's scalar features as extra inputs. It is scored as the judge's threshold is chosen:
5-fold cross-validation by prompt on the dev split (grounded F1 at the best threshold, label accuracy, kappa), alone
and averaged with v2's linear heads, beside v3's MLP ensemble (the shipped head); the test split is not read.

    python eval/judge_reader.py                    # states + v2 features (cached in $UTURN_HOME), then the CV table
    python eval/judge_reader.py --seeds 0 1        # the reader on two seeds
    python eval/judge_reader.py --seeds 0 1 --width 256 --epochs 20

Measured 2026-12-06 on the project's 2-core machine (Intel Xeon, CPU capability AVX512, fp32, 2 threads), 1,611 dev
turns: the states and features of all 3,289 labelled turns 54 min from an empty cache; each 5-fold CV 2.5-6 min.
Grounded F1 (kappa grounded): v2 0.771 (0.701); the reader with v2's scalars 0.773 / 0.778 (seeds 0, 1; 0.702 /
0.703), width 256 0.769; without them 0.769 (0.698); averaged with v2 (reader weight 0.3) 0.780 / 0.781 / 0.781
(0.708 / 0.714 / 0.711). Every token's state adds about 0.01 over v2's one vector, far from the readers' agreement
(kappa 0.85): not shipped (`probe/labelers/judge_v5.md`). The second alternative, an MLP (one hidden layer of 64,
dropout) over v2's own features, beat v2's linear heads on every one of 8 configuration x seed draws (hidden 32-256,
seeds 0, 1): grounded F1 0.783-0.793 (kappa grounded 0.714-0.733) against 0.771 (0.701); five of them averaged (seeds
0-4, `judge_training.MLP`) 0.797: shipped as uturn-judge-v3 (the same head, refitted on more labels, is v4, then v5).
"""

import argparse
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


class Reader(nn.Module):
    def __init__(self, hidden: int, labels: int, extra: int, width: int = 128, heads: int = 4):
        super().__init__()
        self.proj, self.segment = nn.Linear(hidden, width), nn.Embedding(3, width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True, dropout=0.1)
        self.mix = nn.Sequential(nn.Linear(2 * width + extra, width), nn.GELU(), nn.Dropout(0.2))
        self.label, self.grounded = nn.Linear(width, labels), nn.Linear(width, 1)

    def forward(self, states, segments, keys, turn, extra):
        h = self.proj(states) + self.segment(segments)
        q = h[:, -turn.shape[1]:]  # the turn's block is the last positions
        a, _ = self.attn(q, h, h, key_padding_mask=~keys)
        m = turn.unsqueeze(-1).float()
        n = m.sum(1).clamp(min=1)
        z = self.mix(torch.cat([(a * m).sum(1) / n, (q * m).sum(1) / n, *([extra] if extra is not None else [])], -1))
        return self.label(z), self.grounded(z).squeeze(-1)


def token_states(rows, likelihoods, cache: Path) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(context states, turn states, where the answer starts) of each row's own conversation at the judge's state
    layer, layer-normed, fp16; cached by row key."""
    from tqdm.auto import tqdm

    from uturn_train.chat import user_turn_prompt
    from uturn_train.probe.labelers.features import context_messages
    from uturn_train.probe.labelers.judge_training import _key

    known = torch.load(cache) if cache.exists() else {}
    tok, model, layer = likelihoods.tokenizer, likelihoods.model, likelihoods.state_layer
    start = tok.convert_tokens_to_ids("<|im_start|>"), tok("assistant", add_special_tokens=False).input_ids[0]
    todo = [r for r in rows if _key(r) not in known]
    for r in tqdm(todo, desc="token states", disable=not todo):
        ctx = tok(user_turn_prompt(tok, context_messages(r["query"], r["answer"])),
                  add_special_tokens=False).input_ids[-likelihoods.context_tokens:]
        turn = likelihoods.turn_ids(r["user_turn"])
        with torch.no_grad():
            h = model(input_ids=torch.tensor([ctx + turn]), output_hidden_states=True, logits_to_keep=1)
        h = F.layer_norm(h.hidden_states[layer][0].float(), (h.hidden_states[layer].shape[-1],)).half()
        answer = max((p for p in range(len(ctx) - 1) if (ctx[p], ctx[p + 1]) == start), default=0)
        known[_key(r)] = (h[: len(ctx)].clone(), h[len(ctx):].clone(), answer)
    if todo:
        torch.save(known, cache)
    return [known[_key(r)] for r in rows]


def batch(items, extra):
    C, T = max(len(c) for c, _, _ in items), max(len(t) for _, t, _ in items)
    states = torch.zeros(len(items), C + T, items[0][0].shape[-1])
    segments = torch.zeros(len(items), C + T, dtype=torch.long)
    keys = torch.zeros(len(items), C + T, dtype=torch.bool)
    turn = torch.zeros(len(items), T, dtype=torch.bool)
    for b, (c, t, answer) in enumerate(items):  # context left-padded, turn right-padded
        states[b, C - len(c): C], states[b, C: C + len(t)] = c, t
        segments[b, C - len(c) + answer: C], segments[b, C: C + len(t)] = 1, 2
        keys[b, C - len(c): C + len(t)], turn[b, : len(t)] = True, True
    return states, segments, keys, turn, extra


def fit_reader(items, extra, y, g, seed, width, epochs, lr=1e-3):
    from uturn_train.probe.labelers.judge_training import _weights
    from uturn_train.probe.rules.classify import LABELS

    torch.manual_seed(seed)
    rng = random.Random(seed)
    mean, std = (extra.mean(0), extra.std(0).clamp(min=1e-6)) if extra is not None else (0, 1)
    net = Reader(items[0][0].shape[-1], len(LABELS), 0 if extra is None else extra.shape[1], width)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.05)
    label_weight, pos_weight = _weights(y, len(LABELS)), (len(g) - g.sum()) / g.sum().clamp(min=1)
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]))  # similar lengths together
    batches = [order[k: k + 32] for k in range(0, len(order), 32)]
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * len(batches))
    net.train()
    for _ in range(epochs):
        rng.shuffle(batches)
        for b in batches:
            x = None if extra is None else (extra[b] - mean) / std
            label, grounded = net(*batch([items[i] for i in b], x))
            loss = F.cross_entropy(label, y[b], weight=label_weight) + \
                F.binary_cross_entropy_with_logits(grounded, g[b], pos_weight=pos_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
    net.eval()

    @torch.no_grad()
    def predict(held, held_extra):
        out = []
        for k in range(0, len(held), 64):
            x = None if held_extra is None else (held_extra[k: k + 64] - mean) / std
            label, grounded = net(*batch(held[k: k + 64], x))
            out += list(zip(torch.softmax(label, -1), torch.sigmoid(grounded).tolist()))
        return out

    return predict


def held_out(x, rows, head, folds):
    """(label probabilities, p(grounded)) of every row from the judge's own fit (`judge_training.fit`, `head`) on the
    other folds."""
    from uturn_train.probe.labelers.judge import Judge, forward
    from uturn_train.probe.labelers.judge_training import fit

    out = [None] * len(rows)
    for f in range(5):
        train, held = [i for i in range(len(rows)) if folds[i] != f], [i for i in range(len(rows)) if folds[i] == f]
        judge = Judge({**fit(x[train], [rows[i] for i in train], head, 0.5), "name": "cv"}, likelihoods=None)
        label, grounded = forward(judge.members, (x[held] - judge.mean) / judge.std)
        for i, a, b in zip(held, label, grounded.tolist()):
            out[i] = (a, b)
    return out


def main():
    from uturn_train.models import load_model, load_tokenizer
    from uturn_train.probe.labelers import judge_training as jt
    from uturn_train.probe.labelers.features import TurnLikelihoods
    from uturn_train.probe.labelers.judge import FEATURE_NAMES
    from uturn_train.probe.rules.classify import LABELS
    from uturn_train.probe.validity.reading import load_reading, pair_contexts
    from uturn_train.zoo import resolve

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared_data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()
    rows = load_reading(Path(args.shared_data))
    pair_contexts(rows)
    dev = [r for r in rows if r["split"] == "dev"]
    folder = argparse.Namespace(model="smollm2-135m-instruct")
    resolve(folder)
    likelihoods = TurnLikelihoods(load_model(folder.model, dtype="float32"), load_tokenizer(folder.model))
    home = Path(folder.model).parent
    x = jt.features(dev, likelihoods, home / "judge_features.jsonl")
    items = token_states(dev, likelihoods, home / f"judge_token_states{likelihoods.state_layer}.pt")
    scalars = x[:, : len(FEATURE_NAMES)]
    y, g = jt._targets(dev)
    g = g.float()
    folds = jt._folds(dev)
    linear = jt.cross_validate(x, dev, "linear")["head"]
    print(f"{len(dev)} dev turns; CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    print("| decision | seed | grounded F1 (threshold) | label accuracy | kappa label / grounded |")
    print("|---|---|---|---|---|")
    v2 = held_out(x, dev, linear, folds)
    def row(label, seed, predictions):
        threshold, f1 = max(((t, jt.grounded_f1(dev, predictions, t)) for t in jt.THRESHOLDS), key=lambda tf: tf[1])
        m = jt.measure(dev, [p[0] for p in predictions],
                       [p[0] == "followup" and p[1] >= threshold for p in predictions])
        accuracy = sum(p[0] == r["label"] for p, r in zip(predictions, dev)) / len(dev)
        print(f"| {label} | {seed} | {f1:.3f} ({threshold}) | {accuracy:.3f} | "
              f"{m['kappa_label']:.3f} / {m['kappa_grounded']:.3f} |", flush=True)

    row("v3: the ensemble of 5 MLPs", "0-4", [(LABELS[int(p[0].argmax())], p[1])
                                              for p in held_out(x, dev, {"kind": "mlp", **jt.MLP}, folds)])
    for seed in args.seeds:
        for use_scalars in (True, False):
            reader = [None] * len(dev)
            for f in range(5):
                train = [i for i in range(len(dev)) if folds[i] != f]
                held = [i for i in range(len(dev)) if folds[i] == f]
                extra = scalars if use_scalars else None
                predict = fit_reader([items[i] for i in train], None if extra is None else extra[train], y[train],
                                     g[train], seed, args.width, args.epochs)
                for i, p in zip(held, predict([items[i] for i in held], None if extra is None else extra[held])):
                    reader[i] = p
            name = "reader + v2 scalars" if use_scalars else "reader"
            for weight in ((0.0, 0.3, 1.0) if use_scalars else (1.0,)):
                if weight == 0.0 and seed != args.seeds[0]:
                    continue
                mixed = [(LABELS[int((weight * a[0] + (1 - weight) * b[0]).argmax())],
                          weight * a[1] + (1 - weight) * b[1]) for a, b in zip(reader, v2)]
                label = "v2 (logistic)" if weight == 0.0 else name if weight == 1.0 else f"{name}, {weight} with v2"
                row(label, "-" if weight == 0.0 else seed, mixed)


if __name__ == "__main__":
    main()
