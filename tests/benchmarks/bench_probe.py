"""The probe's generation engine against `model.generate`, phase by phase, as a share of this machine's matmul rate.

    python tests/benchmarks/bench_probe.py                                   # the built testbed
    python tests/benchmarks/bench_probe.py --model smollm2-135m-instruct --limit 32 --batch_size 32 \
        --max_new_tokens 128 --answer_max_new_tokens 256
    python tests/benchmarks/bench_probe.py --model smollm2-135m-instruct --continuous_batching   # + generate_batch

`--model` is anything `uturn probe --model` takes (default: the built testbed). The problems are the testbed's held-out
ones for the testbed, else GSM8K's test set from `../shared/data` (or `--data`). Three phases, as the probe runs them in
its self setting: the **answers** (greedy), the **greedy user turns** after them, and **T=1.0 x k** user turns
(`--samples`). Each phase runs on these sides, in this order:

- **engine**: `uturn_train.generation.generate` (each prompt computed once, its k rows reading its keys and values
  where they are, `uturn_train.shared_prefix`; rows that end leave the batch);
- **copied** (sampled phase only): the engine with the prompt's cache copied k ways instead, as it was before;
- **generate**: the engine as it was, one batched `model.generate(num_return_sequences=k)` per batch of prompts;
- **per-example**: one unpadded `model.generate` per prompt (`num_return_sequences=k` when sampling), `--per_example`
  phases only (slow on a real model).

Per phase and side: user turns/s, *useful* tokens/s (each prompt's tokens once, plus the tokens generated), and the
achieved rate as a share of a 2048 x 2048 fp32 matmul timed in the same run on the same threads (the best of two
timings, one at the start and one at the end; rate = 2 x parameters x useful tokens / seconds). Outputs are checked:
greedy token ids identical across the three sides, the engine's samples reproducible for the seed (they are other draws
than `generate`'s, which spends a random number per vocabulary entry); the script exits non-zero otherwise. Also
printed: the bound a decode step meets at the batch's row count, as shares of the 2048 x 2048 matmul: the rate of a
`[rows, hidden] x [hidden, 4 hidden]` matmul and of the LM head's with their weights in cache, and the rate of every
linear layer of the model in turn, as a decode step runs them, its weights read from memory. `--continuous_batching`
also times transformers' `generate_batch` on the greedy user turns (Llama-type models only: its paged cache has no
linear-attention layer type, so Qwen3.5 raises). Targets (issue 39, SmolLM2): T=1.0 x 4 in at most a third of
`generate`'s time, every engine phase at 45% or more of the matmul rate; on the testbed, greedy user turns no slower
against per-example than the engine as it was (9.6x on the AVX2 machine the issue was filed on; the ratio moves with the
CPU, so both are printed from the same run). CPU capability and threads are printed with the figures.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from uturn_train import generation  # noqa: E402
from uturn_train.chat import answer_prompt, stop_strings, user_turn_prompt  # noqa: E402
from uturn_train.generation import PLAIN_DECODING, PLAIN_SAMPLING, finish, generate  # noqa: E402

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def matmul_gflops(n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e9


def row_gflops(model, rows: int, head: bool = False, repeats: int = 20) -> float:
    """The rate of a decode step's matmul at `rows` rows: the MLP's up projection, or the LM head."""
    hidden = model.config.get_text_config(decoder=True).hidden_size
    weight = model.get_output_embeddings().weight if head else torch.randn(4 * hidden, hidden)
    x = torch.randn(rows, hidden)
    torch.nn.functional.linear(x, weight)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.nn.functional.linear(x, weight)
    return 2 * rows * weight.numel() * repeats / (time.perf_counter() - start) / 1e9


def decode_matmuls_gflops(model, rows: int, repeats: int = 3) -> float:
    """The rate of a decode step's matmuls at `rows` rows: every linear layer's weight (and the LM head's) in turn,
    read from memory as a decode step reads them (135M parameters are 540 MB, far over the caches)."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    flops = 2 * rows * sum(w.numel() for w in weights)
    x = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for w in weights:
            torch.nn.functional.linear(x[w.shape[1]], w)
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


def model_and_problems(name: str | None, data: str | None, n: int):
    from uturn_train.models import load_model, load_tokenizer
    from uturn_train.tasks import load_task
    from uturn_train.zoo import resolve

    args = argparse.Namespace(model=name or "testbed")
    resolve(args)  # `testbed`, `smollm2-135m-instruct`, a .gguf file -> a folder
    heldout = Path(args.model) / "heldout.jsonl"
    data = data or str(heldout if heldout.exists() else GSM8K)
    queries = [ex.query for ex in load_task("gsm8k", data, limit=n)]
    return load_model(args.model, device="cpu"), load_tokenizer(args.model), queries, f"{args.model}, problems {data}"


class Baselines:
    """`model.generate` as the engine called it before (batched), and one prompt at a time; same stops and seed."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.stops = stop_strings(tokenizer)
        added = tokenizer.get_added_vocab()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.end_ids = {added[s] for s in self.stops if s in added} | {self.pad_id, tokenizer.eos_token_id} - {None}
        self.string_stops = [s for s in self.stops if s not in added]

    def _call(self, input_ids, attention_mask, max_new_tokens, temperature, k):
        sampling = temperature > 0
        return self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, do_sample=sampling,
            num_return_sequences=k, eos_token_id=sorted(self.end_ids), pad_token_id=self.pad_id,
            stop_strings=self.string_stops or None, tokenizer=self.tokenizer if self.string_stops else None,
            **PLAIN_DECODING, **({"temperature": temperature, **PLAIN_SAMPLING} if sampling else {}))

    def batched(self, prompts, max_new_tokens, temperature, k, batch_size, seed):
        encoded = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
        results = [[] for _ in prompts]
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(seed)
            for batch in [order[i:i + batch_size] for i in range(0, len(order), batch_size)]:
                width = max(len(encoded[i]) for i in batch)
                input_ids = torch.full((len(batch), width), self.pad_id)
                attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, i in enumerate(batch):
                    input_ids[row, width - len(encoded[i]):] = torch.tensor(encoded[i])
                    attention_mask[row, width - len(encoded[i]):] = 1
                out = self._call(input_ids, attention_mask, max_new_tokens, temperature, k)[:, width:].tolist()
                for row, i in enumerate(batch):
                    results[i] = [finish(self.tokenizer, ids, self.end_ids, self.stops, len(encoded[i]))
                                  for ids in out[row * k:(row + 1) * k]]
        return results

    def per_example(self, prompts, max_new_tokens, temperature, k, seed):
        results = []
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(seed)
            for prompt in prompts:
                ids = self.tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
                out = self._call(ids, torch.ones_like(ids), max_new_tokens, temperature, k)[:, ids.shape[1]:].tolist()
                results.append([finish(self.tokenizer, o, self.end_ids, self.stops, ids.shape[1]) for o in out])
        return results


def continuous_batching(model, tokenizer, prompts, max_new_tokens, end_ids):
    """transformers' `generate_batch` (paged cache, a scheduler thread), greedy; its outputs' token ids."""
    from transformers import GenerationConfig

    encoded = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(end_ids),
                              pad_token_id=tokenizer.pad_token_id)
    outputs = model.generate_batch(encoded, generation_config=config)
    out = list(outputs.values())
    return [tuple(t for t in o.generated_tokens if t not in end_ids) for o in out]


def useful_tokens(prompt_lengths: list[int], results) -> int:
    return sum(prompt_lengths) + sum(g.completion_tokens for gens in results for g in gens)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="as `uturn probe --model` (default: the built testbed)")
    parser.add_argument("--data", default=None, help="GSM8K-format jsonl (default: the testbed's held-out problems, "
                        "else ../shared/data/gsm8k/test.jsonl)")
    parser.add_argument("--limit", type=int, default=128, help="prompts")
    parser.add_argument("--max_new_tokens", type=int, default=128, help="token limit of a user turn")
    parser.add_argument("--answer_max_new_tokens", type=int, default=256)
    parser.add_argument("--samples", type=int, default=4, help="k of the sampled phase")
    parser.add_argument("--batch_size", type=int, default=32, help="prompts per batch (all sides)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per_example", nargs="*", default=["answers", "greedy", "T=1"],
                        help="the phases to time one prompt at a time too (none: pass the flag alone)")
    parser.add_argument("--continuous_batching", action="store_true", help="also time generate_batch (greedy turns)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer, queries, description = model_and_problems(args.model, args.data, args.limit)
    params = sum(p.numel() for p in model.parameters())
    base = Baselines(model, tokenizer)
    peak = matmul_gflops()
    print(f"{description}; {params / 1e6:.1f}M parameters; CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"torch threads {torch.get_num_threads()}; {len(queries)} prompts, batch {args.batch_size}, user turns <= "
          f"{args.max_new_tokens} tokens, answers <= {args.answer_max_new_tokens}; matmul {peak:.0f} GFLOP/s")
    generate(model, tokenizer, [answer_prompt(tokenizer, [{"role": "user", "content": "Hi"}])], max_new_tokens=4,
             disable_progress=True)  # warm up (the first forward of the torch fallbacks costs ~2 s)

    answer_prompts = [answer_prompt(tokenizer, [{"role": "user", "content": q}]) for q in queries]
    rows, failures, answers = [], [], None

    def phase(name, prompts, max_new_tokens, temperature, k):
        lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts]
        sides = {}
        for side in ("engine", "copied", "generate", "per-example"):
            if side == "per-example" and name not in args.per_example or side == "copied" and k == 1:
                continue
            start = time.perf_counter()
            if side in ("engine", "copied"):
                share = generation._share_prompts
                if side == "copied":  # the engine as it was: the prompt's cache copied k ways
                    generation._share_prompts = lambda *a: False
                try:
                    out = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                   num_samples=k, batch_size=args.batch_size, seed=args.seed, desc=f"{name} {side}")
                finally:
                    generation._share_prompts = share
            elif side == "generate":
                out = base.batched(prompts, max_new_tokens, temperature, k, args.batch_size, args.seed)
            else:
                out = base.per_example(prompts, max_new_tokens, temperature, k, args.seed)
            seconds = time.perf_counter() - start
            sides[side] = out
            tokens = useful_tokens(lengths, out)
            rows.append((name, side, seconds, len(prompts) * k / seconds, tokens / seconds,
                         2 * params * tokens / seconds / 1e9))
        ids = {side: [[g.token_ids for g in gens] for gens in out] for side, out in sides.items()}
        if temperature == 0:
            for side in ids:
                if ids[side] != ids["engine"]:
                    failures.append(f"{name}: greedy token ids of {side} differ from the engine's on "
                                    f"{sum(a != b for a, b in zip(ids[side], ids['engine']))} prompts")
        else:
            again = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                             num_samples=k, batch_size=args.batch_size, seed=args.seed, disable_progress=True)
            if [[g.token_ids for g in gens] for gens in again] != ids["engine"]:
                failures.append(f"{name}: the engine's samples are not reproducible for seed {args.seed}")
        return sides["engine"]

    answers = phase("answers", answer_prompts, args.answer_max_new_tokens, 0.0, 1)
    prompts = [user_turn_prompt(tokenizer, [{"role": "user", "content": q}, {"role": "assistant", "content": a.text}])
               for q, (a,) in zip(queries, answers)]
    phase("greedy", prompts, args.max_new_tokens, 0.0, 1)
    phase("T=1", prompts, args.max_new_tokens, 1.0, args.samples)
    if args.continuous_batching:
        start = time.perf_counter()
        try:
            continuous_batching(model, tokenizer, prompts, args.max_new_tokens, base.end_ids)
            seconds = time.perf_counter() - start
            rows.append(("greedy", "generate_batch", seconds, len(prompts) / seconds, float("nan"), float("nan")))
        except Exception as e:  # noqa: BLE001 - reported, not hidden: what it does on this model
            print(f"generate_batch: {type(e).__name__}: {str(e)[:300]}")
    peak = max(peak, matmul_gflops())

    print(f"\n{'phase':<8} {'side':<15} {'seconds':>8} {'turns/s':>8} {'tokens/s':>9} {'GFLOP/s':>8} {'of matmul':>9}")
    for name, side, seconds, turns, tokens, gflops in rows:
        print(f"{name:<8} {side:<15} {seconds:8.1f} {turns:8.2f} {tokens:9.0f} {gflops:8.1f} {gflops / peak:9.0%}")
    times = {(n, s): t for n, s, t, *_ in rows}
    share = {(n, s): g / peak for n, s, *_, g in rows}
    print(f"\nmatmul {peak:.0f} GFLOP/s (best of two, same threads)")
    if ("T=1", "copied") in times:  # not with --samples 1
        print(f"T=1 x{args.samples}: the prompt shared {times['T=1', 'engine']:.1f} s against copied k ways "
              f"{times['T=1', 'copied']:.1f} s: {times['T=1', 'engine'] / times['T=1', 'copied']:.2f} of its time")
    print(f"T=1 x{args.samples}: engine {times['T=1', 'engine']:.1f} s against generate's "
          f"{times['T=1', 'generate']:.1f} s: {times['T=1', 'engine'] / times['T=1', 'generate']:.2f} of its time")
    if ("greedy", "per-example") in times:
        # The "no worse than today" on any machine: today's engine (batched generate) timed in the same run.
        print(f"greedy user turns: speedup={times['greedy', 'per-example'] / times['greedy', 'engine']:.1f} over "
              f"per-example; the engine as it was (batched generate) "
              f"{times['greedy', 'per-example'] / times['greedy', 'generate']:.1f}x, same run")
    print("engine phases at: " + ", ".join(f"{n} {share[n, 'engine']:.0%}" for n in ("answers", "greedy", "T=1")) +
          " of the matmul rate (useful tokens)")
    rows = args.batch_size
    print(f"bound at {rows} rows: a decode step's matmuls {row_gflops(model, rows) / peak:.0%}, the LM head's "
          f"{row_gflops(model, rows, head=True) / peak:.0%} of the matmul rate, weights in cache; every layer in "
          f"turn, weights read from memory: {decode_matmuls_gflops(model, rows) / peak:.0%} "
          f"({decode_matmuls_gflops(model, 4 * rows) / peak:.0%} at {4 * rows} rows)")
    print("outputs: " + ("greedy identical on every side, samples reproducible" if not failures else
                         "; ".join(failures)))
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
