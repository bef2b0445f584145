#!/bin/bash
# Collaboration DPO on Qwen3.5-2B over several nodes with DeepSpeed ZeRO-3, one task per node starting accelerate.
#   mkdir -p logs && sbatch --nodes 2 accelerate_configs/slurm_multi_node.sh       # the DPO recipe
#   mkdir -p logs && sbatch --nodes 4 accelerate_configs/slurm_multi_node.sh recipes/collab_sft.py recipes/qwen3.5-2b/collab_sft.yaml
# SLURM opens --output before the script runs: without logs/ the job fails with no log at all, hence the mkdir.
# Adapt the partition, time and environment lines to your cluster. Extra recipe flags go after the two arguments.
#SBATCH --job-name=uturn-collab
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --time=12:00:00
#SBATCH --output=logs/%x-%j.out
set -euo pipefail

RECIPE=${1:-recipes/collab_dpo.py}
CONFIG=${2:-recipes/qwen3.5-2b/collab_dpo.yaml}
shift $(( $# < 2 ? $# : 2 ))

GPUS_PER_NODE=8
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export HEAD_NODE GPUS_PER_NODE RECIPE CONFIG

source .venv/bin/activate
# srun starts one task per node; SLURM_NODEID (set per task, hence the single quotes) is its machine rank.
srun --kill-on-bad-exit=1 bash -c 'accelerate launch \
    --config_file accelerate_configs/multi_node_zero3.yaml \
    --num_machines "$SLURM_NNODES" \
    --num_processes $(( SLURM_NNODES * GPUS_PER_NODE )) \
    --machine_rank "$SLURM_NODEID" \
    --main_process_ip "$HEAD_NODE" \
    --main_process_port 29500 \
    "$RECIPE" --config "$CONFIG" "$@"' bash "$@"
