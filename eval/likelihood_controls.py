"""Would a likelihood test tell a turn that reacts to its answer? Measured on the real-model turns labelled by reading.

```bash
python eval/likelihood_controls.py                       # SmolLM2-135M-Instruct as the fixed scorer (~9 min, 2 cores)
python eval/likelihood_controls.py --scorer PATH --limit 100
```

For every turn of `tests/data/smollm2_turns.jsonl` (rubric in `tests/data/README.md`), a fixed scorer model reads
the turn under the user role twice, rendered with the scorer's own chat template: after the turn's own query and
answer, and after the same query with an empty answer (the control that keeps the query and drops the answer). Per
turn token (the first 48):

- **answer PMI** = mean log p(turn | query, answer) - mean log p(turn | query, no answer): how much more likely the
  answer makes the turn; a turn that reacts to its answer should gain, the query restated or another question about
  its story should not;
- **coherence** = mean log p(turn | query, answer): incoherent text should be unlikely even in context.

It prints the quantiles of both per gold label, thresholds chosen on the dev split applied to the probe's decisions
on the test split, and the cost per 1,000 turns. Measured with SmolLM2-135M-Instruct as scorer (2026-12-01, 480 turns,
CPU capability AVX2, 2 threads): median PMI 0.72 (dev) and 0.33 (test) on grounded follow-ups against 0.11-0.18 on
the other labels, whose top tenth reaches 0.3-0.7; PMI >= 0.5 and coherence >= -3.0 (chosen on dev) raise grounded
precision on the test split from 0.10 to 0.57 at recall 0.36 (7 turns kept); 1.37 s per turn (two forward passes of
up to 816 tokens), 23 min per 1,000 turns. What was adopted instead, as an option: `--scorer`
(`uturn_train/probe/labelers/scorer.py`), whose control keeps the query and changes the answer (docs/probe.md, A real
model).
"""

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from uturn_train.probe.validity import model_turns as validity

CONTEXT_TOKENS, TURN_TOKENS = 768, 48


def _scores(model, context: list[int], turn: list[int]) -> torch.Tensor:
    ids = torch.tensor([context + turn])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0, len(context) - 1 : -1].float(), -1)
    return logprobs.gather(1, torch.tensor(turn)[:, None])[:, 0]


def measure(rows: list[dict], scorer: str) -> list[dict]:
    """Adds `pmi` and `coherence` (None for an empty turn) to every row; returns the rows."""
    from uturn_train.chat import user_turn_prompt
    from uturn_train.models import load_model, load_tokenizer

    tokenizer, model = load_tokenizer(scorer), load_model(scorer, dtype="float32").eval()

    def context(query: str, answer: str) -> list[int]:
        prompt = user_turn_prompt(tokenizer, [{"role": "user", "content": query},
                                              {"role": "assistant", "content": answer}])
        return tokenizer(prompt, add_special_tokens=False).input_ids[-CONTEXT_TOKENS:]

    for row in rows:
        text = row["user_turn"].replace(tokenizer.eos_token or "\0", "").strip()
        turn = tokenizer(text, add_special_tokens=False).input_ids[:TURN_TOKENS] if text else []
        if not turn:
            row["pmi"] = row["coherence"] = None
            continue
        own = _scores(model, context(row["query"], row["answer"] or ""), turn).mean().item()
        none = _scores(model, context(row["query"], ""), turn).mean().item()
        row["pmi"], row["coherence"] = own - none, own
    return rows


def _quantiles(values: list[float]) -> str:
    values = sorted(values)
    return " / ".join(f"{values[int(q * (len(values) - 1))]:+.2f}" for q in (0.1, 0.5, 0.9)) if values else "-"


def _precision_recall(rows, predicted, gold) -> tuple[float, float, int]:
    hits = sum(predicted(r) and gold(r) for r in rows)
    n_predicted, n_gold = sum(map(predicted, rows)), sum(map(gold, rows))
    return hits / max(n_predicted, 1), hits / max(n_gold, 1), n_predicted


def report(rows: list[dict]) -> None:
    rows = [r for r in rows if r["pmi"] is not None]
    print("| split | gold label | n | PMI q10 / q50 / q90 | coherence q10 / q50 / q90 |\n|---|---|---|---|---|")
    for split, label in itertools.product(("dev", "test"), ("grounded", "followup", "repetition", "new_topic",
                                                            "degenerate")):
        group = [r for r in rows if r["split"] == split and (r["grounded"] if label == "grounded" else
                                                             r["label"] == label and not r["grounded"])]
        print(f"| {split} | {label} | {len(group)} | {_quantiles([r['pmi'] for r in group])} | "
              f"{_quantiles([r['coherence'] for r in group])} |")

    def decide(r, tau, kappa):  # the probe's decision, and the likelihood test on top of it
        return bool(r["predicted_grounded"]) and r["pmi"] >= tau and r["coherence"] >= kappa

    dev, test = ([r for r in rows if r["split"] == s] for s in ("dev", "test"))
    grid = itertools.product((0.0, 0.2, 0.3, 0.4, 0.5, 0.6), (-9.0, -3.5, -3.0, -2.5))
    tau, kappa = max(grid, key=lambda t: sum(_precision_recall(dev, lambda r: decide(r, *t),
                                                               lambda r: r["grounded"])[:2]))
    for name, group in (("dev", dev), ("test", test)):
        before = _precision_recall(group, lambda r: bool(r["predicted_grounded"]), lambda r: r["grounded"])
        after = _precision_recall(group, lambda r: decide(r, tau, kappa), lambda r: r["grounded"])
        print(f"{name}: grounded precision/recall/predicted {before[0]:.2f}/{before[1]:.2f}/{before[2]} -> "
              f"{after[0]:.2f}/{after[1]:.2f}/{after[2]} with PMI >= {tau} and coherence >= {kappa} (chosen on dev)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scorer", default="smollm2-135m-instruct", help="a model folder, or a name `uturn` knows")
    parser.add_argument("--limit", type=int, default=None, help="score the first N turns only")
    parser.add_argument("--shared_data", type=Path, default=validity.SHARED_DATA)
    parser.add_argument("--out", type=Path, default=None, help="write the scored rows (jsonl) here")
    args = parser.parse_args()
    from types import SimpleNamespace

    from uturn_train.zoo import resolve

    named = SimpleNamespace(model=args.scorer)  # the scorer is named like a model
    resolve(named)
    args.scorer = named.model
    rows = validity.load(args.shared_data)[: args.limit]
    validity.predict(rows)
    start = time.perf_counter()
    measure(rows, args.scorer)
    seconds = time.perf_counter() - start
    print(f"{len(rows)} turns scored in {seconds:.0f} s: {1000 * seconds / len(rows) / 60:.1f} min per 1,000 turns "
          f"(CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)\n")
    report(rows)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
