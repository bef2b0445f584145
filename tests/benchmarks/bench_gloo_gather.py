"""What one ZeRO-3 gather costs on CPU processes: torch's gloo `all_gather_into_tensor` against the output it fills.

    python tests/benchmarks/bench_gloo_gather.py             # 2 processes, Qwen3.5-2B's embedding (1.89 GiB fp32)

Each rank holds half of a tensor of Qwen3.5-2B's embedding shape (248,320 x 2,048, float32) and gathers it, as
DeepSpeed ZeRO-3 gathers a module's parameters before its forward. Printed per rank: the anonymous memory (RssAnon)
before, after, and its peak during the call (sampled every 20 ms), and the transient (peak - after) over the gathered
size. On gloo the call passes through a temporary as large as the output, so a CPU run of ZeRO-3 needs that much more
than a GPU run whose NCCL gathers in place: the figure behind the ZeRO-3 smoke in recipes/README.md.
"""

import os
import re
import subprocess
import sys
import threading
import time


def anon_gib() -> float:
    return int(re.search(r"RssAnon:\s+(\d+)", open("/proc/self/status").read()).group(1)) / 2**20


def worker() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    peak = [0.0]

    def watch():
        while True:
            peak[0] = max(peak[0], anon_gib())
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    numel = 248_320 * 2_048
    shard, out = torch.ones(numel // dist.get_world_size()), torch.empty(numel)
    time.sleep(0.3)
    before, peak[0] = anon_gib(), 0.0
    dist.all_gather_into_tensor(out, shard)
    out.add_(0)  # every page of the output touched, as a forward would
    time.sleep(0.3)
    after, size = anon_gib(), numel * 4 / 2**30
    print(f"rank {dist.get_rank()}: gathered {size:.2f} GiB; RssAnon before {before:.2f}, after {after:.2f}, peak "
          f"{peak[0]:.2f} GiB; transient (peak - after) / gathered = {(peak[0] - after) / size:.2f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    import torch

    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", __file__, "--worker"]
    sys.exit(subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode)


if __name__ == "__main__":
    worker() if "--worker" in sys.argv else main()
