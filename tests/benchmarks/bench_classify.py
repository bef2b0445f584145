"""Turns/s of `classify_turn` on real OASST turns, on one core (not part of tests).

    python tests/benchmarks/bench_classify.py [--repeats 20]

Classifies every real (query, answer, follow-up) triple of `../shared/data/oasst/en_100_tree.jsonl` and the same
follow-ups paired with another conversation, `--repeats` times. "warm" is how the probe runs: many turns per context,
so each context's features come from the cache; "cold" clears the cache before every pass. Each keeps its fastest
pass, timed in process CPU time, since other work on a shared machine slows whichever pass it overlaps. Ends with
`turns_per_s=X` (warm), the figure the >= 20k turns/s goal is about.
"""

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from uturn_train.probe.classify import _context, classify_turn  # noqa: E402
from uturn_train.tasks import load_task  # noqa: E402


OASST = Path(__file__).resolve().parents[3] / "shared" / "data" / "oasst" / "en_100_tree.jsonl"


def turns_per_s(triples: list[tuple[str, str, str]], repeats: int, cold: bool) -> float:
    best = 0.0
    for _ in range(repeats):
        if cold:
            _context.cache_clear()
        start = time.process_time()
        for query, answer, turn in triples:
            classify_turn(query, answer, turn)
        best = max(best, len(triples) / (time.process_time() - start))
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

    cold = turns_per_s(triples, args.repeats, cold=True)
    warm = turns_per_s(triples, args.repeats, cold=False)
    print(f"cold cache: {cold:,.0f} turns/s | warm cache: {warm:,.0f} turns/s | warm/cold: {warm / cold:.1f}x")
    print(f"turns_per_s={warm:.0f}")


if __name__ == "__main__":
    main()
