"""Turns/s of `classify_turn` on real OASST turns, on one core (not part of tests).

    taskset -c 0 python tests/benchmarks/bench_classify.py [--repeats 20]

Classifies every real (query, answer, follow-up) triple of `../shared/data/oasst/en_100_tree.jsonl` and the same
follow-ups paired with another conversation, `--repeats` times. "warm" is how the probe runs: many turns per context,
so each context's features come from the cache; "cold" clears the cache before every pass (a mismatched turn still
finds its context computed for a real one earlier in the pass). Passes are timed in slices of 40 turns, in process
CPU time, and each slice keeps its fastest repeat: other work on a shared machine slows whichever slice it overlaps,
and a whole pass is rarely left alone. Prints the time per turn of each label next to the mean, and ends with
`turns_per_s=X` (warm), the figure the >= 20k turns/s goal is about.
"""

import argparse
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from uturn_train.probe.rules.classify import classify_turn  # noqa: E402
from uturn_train.probe.rules.text import context  # noqa: E402
from uturn_train.tasks import load_task  # noqa: E402

OASST = Path(__file__).resolve().parents[3] / "shared" / "data" / "oasst" / "en_100_tree.jsonl"
SLICE = 40


def seconds_per_slice(triples: list[tuple[str, str, str]], repeats: int, cold: bool) -> list[float]:
    """The fastest of `repeats` timings of each slice of `SLICE` turns, in passes over all of them."""
    slices = [triples[i : i + SLICE] for i in range(0, len(triples), SLICE)]
    best = [float("inf")] * len(slices)
    for _ in range(repeats):
        if cold:
            context.cache_clear()
        for i, turns in enumerate(slices):
            start = time.process_time()
            for query, answer, turn in turns:
                classify_turn(query, answer, turn)
            best[i] = min(best[i], time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not OASST.exists():
        sys.exit(f"real data not found at {OASST}: the benchmark needs ../shared/data (see its README)")

    examples = load_task("oasst", data=str(OASST))
    real = [(ex.query, ex.answer, ex.reference_followup) for ex in examples]
    others = random.Random(0).sample(real, len(real))
    shuffled = [(q, a, turn) for (_, _, turn), (q, a, _) in zip(real, others)]
    triples = real + shuffled
    words = sum(len(turn.split()) for _, _, turn in triples) / len(triples)
    print(f"{len(triples)} turns ({len(real)} real follow-ups + as many mismatched), {words:.0f} words per turn")

    cold = len(triples) / sum(seconds_per_slice(triples, args.repeats, cold=True))
    warm = len(triples) / sum(seconds_per_slice(triples, args.repeats, cold=False))
    print(f"cold cache: {cold:,.0f} turns/s | warm cache: {warm:,.0f} turns/s | warm/cold: {warm / cold:.1f}x")

    # Where the warm time goes: each turn alone, fastest of a few repeats, grouped by its label.
    costs = defaultdict(list)
    for query, answer, turn in triples:
        label = classify_turn(query, answer, turn).label
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            classify_turn(query, answer, turn)
            best = min(best, time.perf_counter() - start)
        costs[label].append(best)
    mean = sum(map(sum, costs.values())) / len(triples)
    for label, seconds in sorted(costs.items(), key=lambda item: -len(item[1])):
        per_turn = sum(seconds) / len(seconds)
        print(f"  {label:16s} {len(seconds):4d} turns  {per_turn * 1e6:6.1f} us/turn  {per_turn / mean:4.2f}x the mean")
    print(f"turns_per_s={warm:.0f}")


if __name__ == "__main__":
    main()
