"""User turns/s of the batched engine vs a per-example `model.generate` loop, greedy, on a trained model.

    python tests/benchmarks/bench_probe.py [--model NAME] [--data FILE] [--setting self|heldout] [--limit 128]
                                           [--max_new_tokens 256] [--batch_size 64] [--threads N] [--repeats 1]
    python tests/benchmarks/bench_probe.py --model smollm2-135m-instruct --threads 1

`--model` is anything `uturn probe --model` takes: a folder, a hub id, a `.gguf` file, `testbed` or
`smollm2-135m-instruct` (fetched and converted once, see `uturn_train/zoo/`). Without it, the built testbed
(`$UTURN_HOME/testbed`); without that, the script says so and falls back to the random-weight tiny test model, whose
near-uniform logits make argmax ties, and so differences, likely. The problems are the testbed's held-out ones for the
testbed, else GSM8K's test set from `../shared/data` (or `--data`, a GSM8K-format jsonl). As in the probe's `self`
setting (the default), the model first answers each problem greedily with the engine (`--answer_max_new_tokens`, not
timed); `--setting heldout` takes the reference solutions instead (README's testbed figure). Both sides then decode
the user turns greedily with the same stops, and the script compares the generated **token ids** of every prompt; it
ends with `speedup=X` (user turns/s of the engine over the loop) and exits non-zero if any output differs.

Why outputs can differ at all: the engine left-pads prompts to the longest of their batch. Padded positions are
masked, so the math is the same, but attention and the Gated DeltaNet fallbacks then reduce over differently shaped
tensors, which changes the order of float additions: logits agree to ~1e-6, not bit for bit. A greedy choice flips only
where the two best tokens are that close, which a trained model's peaked distributions almost never give; a random
model's do (the fallback). Both sides run on `--threads` intra-op threads, torch's default (one per core) unless given:
a batch of 64 prompts keeps 2 cores busy, one prompt at a time does not (per-example generation is latency-bound and
gains nothing from a second thread; the engine gains ~1.3x). On a machine shared with other work, OpenMP threads
spin-wait: compare `--threads 1` too. With `--repeats N` the two sides run alternately N times and each keeps its
fastest run.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from uturn_train.chat import answer_prompt, stop_strings, user_turn_prompt  # noqa: E402
from uturn_train.generation import generate  # noqa: E402

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def model_and_pairs(name: str | None, data: str | None, n: int):
    """(model, tokenizer, [(query, reference answer)], description): `name` resolved as the entry points do, else the
    built testbed, else the random tiny model."""
    from uturn_train.models import load_model, load_tokenizer
    from uturn_train.tasks import load_task
    from uturn_train.testbed import testbed_dir
    from uturn_train.zoo import resolve

    if name is not None or (testbed_dir() / "config.json").exists():
        args = argparse.Namespace(model=name or "testbed")
        resolve(args)  # `testbed`, `smollm2-135m-instruct`, a .gguf file -> a folder
        heldout = Path(args.model) / "heldout.jsonl"
        data = data or str(heldout if heldout.exists() else GSM8K)
        pairs = [(ex.query, ex.answer) for ex in load_task("gsm8k", data, limit=n)]
        return (load_model(args.model, device="cpu"), load_tokenizer(args.model), pairs,
                f"trained model {args.model}, problems {data}")
    from helpers import tiny

    print(f"NOTE: no built testbed at {testbed_dir()} (run `uturn testbed build`): falling back to the random-weight "
          "tiny model, whose near-uniform logits make argmax ties, so greedy outputs may differ")
    tokenizer = tiny.qwen_tokenizer()
    if data or GSM8K.exists():
        pairs = [(ex.query, ex.answer) for ex in load_task("gsm8k", data or str(GSM8K), limit=n)]
    else:
        lines = tiny.chat_corpus(n)
        pairs = [(lines[4 * i], lines[4 * i + 1]) for i in range(n)]
    return tiny.tiny_causal_lm(tokenizer), tokenizer, pairs, "random-weight tiny model (fallback)"


def per_example(model, tokenizer, prompts, max_new_tokens, stops):
    """The baseline: one unpadded `model.generate` per prompt, same end tokens; returns the generated ids."""
    added = tokenizer.get_added_vocab()
    end_ids = sorted({added[s] for s in stops if s in added} | {tokenizer.eos_token_id, tokenizer.pad_token_id})
    outputs = []
    for prompt in prompts:
        input_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.inference_mode():
            output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                    do_sample=False, eos_token_id=end_ids, pad_token_id=tokenizer.pad_token_id)
        ids = output[0, input_ids.shape[1]:].tolist()
        outputs.append(tuple(ids[:-1] if ids and ids[-1] in end_ids else ids))  # the engine drops the end token
    return outputs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a name or path as `uturn probe --model` takes (default: the "
                        "built testbed)")
    parser.add_argument("--data", default=None, help="GSM8K-format jsonl (default: the testbed's held-out problems, "
                        "else ../shared/data/gsm8k/test.jsonl)")
    parser.add_argument("--setting", choices=("self", "heldout"), default="self",
                        help="self: the model's own greedy answers; heldout: the reference solutions")
    parser.add_argument("--n", "--limit", dest="n", type=int, default=128, help="prompts")
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--answer_max_new_tokens", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer, pairs, description = model_and_pairs(args.model, args.data, args.n)
    if args.setting == "self":  # the probe's default: the user turn reacts to the model's own answer
        queries = [answer_prompt(tokenizer, [{"role": "user", "content": q}]) for q, _ in pairs]
        answers = generate(model, tokenizer, queries, max_new_tokens=args.answer_max_new_tokens,
                           batch_size=args.batch_size, desc="answers (not timed)")
        pairs = [(q, a.text) for (q, _), (a,) in zip(pairs, answers)]
    prompts = [user_turn_prompt(tokenizer, [{"role": "user", "content": q}, {"role": "assistant", "content": a}])
               for q, a in pairs]
    stops = stop_strings(tokenizer)
    lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts]
    print(f"{description}; setting {args.setting}; CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"torch threads {torch.get_num_threads()}; {len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens; "
          f"max_new_tokens={args.max_new_tokens} batch_size={args.batch_size}")

    # Warm up both paths (the first forward of the torch fallbacks costs ~2 s).
    generate(model, tokenizer, prompts[:2], max_new_tokens=4, disable_progress=True)
    per_example(model, tokenizer, prompts[:1], 4, stops)

    t_engine = t_loop = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine = generate(model, tokenizer, prompts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                          desc="engine")
        t_engine = min(t_engine, time.perf_counter() - start)
        start = time.perf_counter()
        baseline = per_example(model, tokenizer, prompts, args.max_new_tokens, stops)
        t_loop = min(t_loop, time.perf_counter() - start)

    differ = [i for i, (g, ids) in enumerate(zip(engine, baseline)) if g[0].token_ids != ids]
    tokens = sum(len(ids) for ids in baseline)
    print(f"engine:      {len(prompts) / t_engine:8.2f} user turns/s ({t_engine:.2f} s)")
    print(f"per-example: {len(prompts) / t_loop:8.2f} user turns/s ({t_loop:.2f} s); {tokens / len(prompts):.1f} "
          "tokens per user turn")
    print(f"greedy token ids identical: {len(prompts) - len(differ)}/{len(prompts)}"
          + ("" if differ else " (identical)"))
    print(f"speedup={t_loop / t_engine:.1f}")
    if differ:
        sys.exit(f"token ids differ for prompts {differ}")


if __name__ == "__main__":
    main()
