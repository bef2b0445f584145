"""User turns/s of the batched engine vs a per-example `model.generate` loop, on the tiny Qwen3.5 (not part of tests).

    python tests/benchmarks/bench_probe.py [--n 64] [--max_new_tokens 256] [--batch_size 16] [--threads 1] [--repeats 1]

Prompts are user-turn prompts rendered with the real Qwen3.5 template from GSM8K (query, gold answer) pairs when
../shared/data is present, synthetic pairs otherwise. Both sides decode greedily with the same stops; the script
checks that every output is identical and ends with `speedup=X`. `--max_new_tokens` defaults to the probe's user-turn
limit. Both sides run on `--threads` intra-op threads, 1 by default: a 64-wide model gains nothing from more, and
OpenMP threads spin-wait when the cores are shared (a generate call measured 40x slower with 2 threads under load).
With `--repeats N` the two sides run alternately N times and each keeps its fastest run, since other work on a
shared 2-core machine slows whichever side it overlaps.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tiny  # noqa: E402

from uturn_train.chat import stop_strings, user_turn_prompt  # noqa: E402
from uturn_train.generation import generate  # noqa: E402

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def conversations(n: int) -> list[list[dict]]:
    if GSM8K.exists():
        rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:n]]
        pairs = [(row["question"], row["answer"]) for row in rows]
    else:
        lines = tiny.chat_corpus(n)
        pairs = [(lines[4 * i], lines[4 * i + 1]) for i in range(n)]
    return [[{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in pairs]


def per_example(model, tokenizer, prompts, max_new_tokens, stops):
    """The baseline: one unpadded `model.generate` per prompt, same stops, same cut at the earliest stop string."""
    added = tokenizer.get_added_vocab()
    end_ids = sorted({added[s] for s in stops if s in added} | {tokenizer.eos_token_id, tokenizer.pad_token_id})
    outputs = []
    for prompt in prompts:
        input_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.inference_mode():
            output = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=end_ids,
                pad_token_id=tokenizer.pad_token_id,
            )
        ids = output[0, input_ids.shape[1] :].tolist()
        if ids and ids[-1] in end_ids:  # the engine does not count the end-of-turn token
            ids = ids[:-1]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        cut = min((text.find(s) for s in stops if s in text), default=len(text))
        outputs.append((text[:cut], len(ids)))
    return outputs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    tokenizer = tiny.qwen_tokenizer()
    model = tiny.tiny_causal_lm(tokenizer)
    prompts = [user_turn_prompt(tokenizer, messages) for messages in conversations(args.n)]
    stops = stop_strings(tokenizer)
    lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts]
    print(f"torch threads={torch.get_num_threads()}, {len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens")
    print(f"max_new_tokens={args.max_new_tokens} batch_size={args.batch_size} stops={stops}")

    # Warm up both paths (the first forward of the torch fallbacks costs ~2 s).
    generate(model, tokenizer, prompts[:2], max_new_tokens=4, disable_progress=True)
    per_example(model, tokenizer, prompts[:1], 4, stops)

    t_engine = t_loop = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine = generate(
            model, tokenizer, prompts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, desc="engine"
        )
        t_engine = min(t_engine, time.perf_counter() - start)
        start = time.perf_counter()
        baseline = per_example(model, tokenizer, prompts, args.max_new_tokens, stops)
        t_loop = min(t_loop, time.perf_counter() - start)

    mismatches = [i for i, (g, b) in enumerate(zip(engine, baseline)) if (g[0].text, g[0].completion_tokens) != b]
    print(f"engine:      {len(prompts) / t_engine:8.2f} user turns/s ({t_engine:.2f} s)")
    print(f"per-example: {len(prompts) / t_loop:8.2f} user turns/s ({t_loop:.2f} s)")
    print(f"greedy outputs identical: {not mismatches} ({len(prompts) - len(mismatches)}/{len(prompts)})")
    print(f"speedup={t_loop / t_engine:.1f}")
    if mismatches:
        sys.exit(f"outputs differ for prompts {mismatches}")


if __name__ == "__main__":
    main()
