"""What a generation's prefill costs at the LM head on a CPU: the last position as a strided view, as models pass it,
against the same rows copied to standard strides first (what `models.load_model` registers on the head).

    python tests/benchmarks/bench_lm_head_strides.py              # Qwen3.5-2B's head (248,320 x 2,048), frozen

The head is frozen, as under LoRA. Per dtype and row count: seconds and the peak of anonymous memory (RssAnon, sampled
every 5 ms) above what was there before the call, both ways, measured side by side. In bf16 on a CPU PyTorch's `bmm`
copies the weight once per row for a strided input (pytorch/pytorch#151934); fp32 is shown for comparison.
"""

import threading
import time

import torch
from bench_gloo_gather import anon_gib  # this folder is on the path when the script runs


def main() -> None:
    peak = [0.0]

    def watch():
        while True:
            peak[0] = max(peak[0], anon_gib())
            time.sleep(0.005)

    threading.Thread(target=watch, daemon=True).start()
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads")
    print("| dtype | rows | strided view: s, GiB | standard strides: s, GiB | time ratio |\n|---|---|---|---|---|")
    for dtype in (torch.bfloat16, torch.float32):
        head = torch.nn.Linear(2048, 248_320, bias=False, dtype=dtype).requires_grad_(False)
        for rows in (1, 2, 4):
            hidden = torch.randn(rows, 64, 2048, dtype=dtype)
            figures = []
            for standard in (False, True):
                time.sleep(0.2)
                before, peak[0] = anon_gib(), 0.0
                start = time.perf_counter()
                with torch.inference_mode():
                    last = hidden[:, -1:]
                    head(last.clone(memory_format=torch.contiguous_format) if standard else last)
                figures.append((time.perf_counter() - start, peak[0] - before))
            (t0, m0), (t1, m1) = figures
            print(f"| {str(dtype).removeprefix('torch.')} | {rows} | {t0:.2f}, {m0:.2f} | {t1:.2f}, {m1:.2f} | "
                  f"{t0 / t1:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
