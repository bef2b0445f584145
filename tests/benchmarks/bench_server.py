"""User turns/s through `transformers serve` (the server backend) vs the local batched `generate`, same model and
prompts, greedy (not part of tests).

    python tests/benchmarks/bench_server.py [--model DIR] [--n 64] [--max_new_tokens 256] [--batch_size 16]
                                            [--concurrency 1 4] [--threads 1]

`--model` defaults to the testbed (`$UTURN_HOME/testbed`) when it is built; `tiny` is the tiny random Qwen3.5. Prompts
are user-turn prompts after the testbed's held-out (query, answer) pairs when the model folder has them, GSM8K pairs
from ../shared/data otherwise. The server runs in its own process with `OMP_NUM_THREADS=--threads`, the local side on
`--threads` intra-op threads. Prints the CPU capability, both rates, their ratio, and how many greedy turns agree: as
text, as the probe's user turn, which keeps a role header that ended the turn (`text + stop`; transformers serve does
not say which end token it met, so a turn that opened `<|im_start|>` loses it), and as the rule classifier's label.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from helpers import tiny  # noqa: E402
from helpers.serve import TransformersServer  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from uturn_train.chat import role_header_starts, user_turn_prompt  # noqa: E402
from uturn_train.generation import generate  # noqa: E402
from uturn_train.probe.rules.classify import classify_turn  # noqa: E402
from uturn_train.server import CompletionsClient  # noqa: E402
from uturn_train.testbed import testbed_dir  # noqa: E402

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def pairs(model_dir: Path, n: int) -> list[tuple[str, str]]:
    if (model_dir / "heldout_triples.jsonl").exists():  # the testbed's own held-out problems
        rows = [json.loads(line) for line in (model_dir / "heldout_triples.jsonl").read_text().splitlines()[:n]]
        return [(r["query"], r["answer"]) for r in rows]
    if GSM8K.exists():
        rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:n]]
        return [(r["question"], r["answer"]) for r in rows]
    lines = tiny.chat_corpus(n)  # neither a testbed nor ../shared/data: synthetic pairs, as bench_probe does
    return [(lines[4 * i], lines[4 * i + 1]) for i in range(n)]


def probe_turn(g, headers: list[str]) -> str:
    """The user turn as the probe's runner builds it: a role header that ended it stays."""
    return g.text + g.stop if g.stop in headers else g.text


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_server."))
    model_dir = Path(args.model) if args.model not in (None, "tiny") else testbed_dir()
    if args.model == "tiny" or not (model_dir / "config.json").exists():
        tokenizer = tiny.qwen_tokenizer()
        model_dir = tiny.save(tiny.tiny_causal_lm(tokenizer), tokenizer, work / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    headers = role_header_starts(tokenizer)
    conversations = pairs(model_dir, args.n)
    prompts = [user_turn_prompt(tokenizer, [{"role": "user", "content": q}, {"role": "assistant", "content": a}])
               for q, a in conversations]

    def labels(gens):
        return [classify_turn(q, a, probe_turn(g, headers), finish_reason=g.finish_reason).label
                for (q, a), (g,) in zip(conversations, gens)]

    print(f"model {model_dir}, {len(prompts)} prompts, max_new_tokens {args.max_new_tokens}, threads {args.threads}, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cpus")

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generate(model, tokenizer, prompts[:2], max_new_tokens=8, disable_progress=True)  # warm-up
    start = time.perf_counter()
    local = generate(model, tokenizer, prompts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                     disable_progress=True)
    local_s = time.perf_counter() - start
    tokens = sum(g.completion_tokens for (g,) in local)
    print(f"local generate (batch {args.batch_size}): {local_s:.1f} s, {len(prompts) / local_s:.2f} turns/s, "
          f"{tokens / local_s:.0f} tokens/s")
    del model

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    server = TransformersServer(model_dir, work / "server.log")
    start = time.perf_counter()
    server.start()
    print(f"transformers serve ready in {time.perf_counter() - start:.1f} s")
    try:
        for concurrency in args.concurrency:
            client = CompletionsClient(server.base_url, tokenizer, concurrency=concurrency).check()
            client.generate(prompts[:2], max_new_tokens=8, disable_progress=True)  # warm-up
            start = time.perf_counter()
            remote = client.generate(prompts, max_new_tokens=args.max_new_tokens, disable_progress=True)
            remote_s = time.perf_counter() - start
            same = sum(r.text == g.text and r.finish_reason == g.finish_reason for (r,), (g,) in zip(remote, local))
            turns = sum(probe_turn(r, headers) == probe_turn(g, headers) for (r,), (g,) in zip(remote, local))
            same_labels = sum(a == b for a, b in zip(labels(remote), labels(local)))
            print(f"server, concurrency {concurrency}: {remote_s:.1f} s, {len(prompts) / remote_s:.2f} turns/s; "
                  f"local/server speed {remote_s / local_s:.2f}x; greedy texts identical {same}/{len(prompts)}, "
                  f"probe turns {turns}/{len(prompts)}, labels {same_labels}/{len(prompts)}; errors {client.errors}")
    finally:
        server.stop()
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
