#!/usr/bin/env bash
# torch 2.13.0 built for this machine, into the active environment: `bash scripts/install_torch.sh [pip options]`.
# PyPI's torch==2.13.0 is the CUDA build (several GB): right where a GPU is, wasted elsewhere. Without a GPU: a CPU
# wheel pip already finds on this machine (its find-links), else the PyTorch CPU index.
set -euo pipefail
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  exec pip install "$@" torch==2.13.0
fi
if pip install "$@" --no-index --no-deps torch==2.13.0 >/dev/null 2>&1; then
  exec pip install "$@" torch==2.13.0  # the wheel found locally; its dependencies from the index
fi
exec pip install "$@" torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple
