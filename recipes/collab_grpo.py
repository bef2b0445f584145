"""Collaboration GRPO: online RL on the **user** turn, rewarded by grounded follow-ups and kept honest by accuracy; or,
with `--objective collab`, on whole conversations with an oracle partner, rewarded by how they end and shaped by the
probe's verdict on the first user turn (`uturn_train/training/collab_rl.py`: the policy plays the user in peer_check
and the assistant in info_gap).

The prompts are user-turn prompts, the conversation (query, then the policy's own answer, generated once before
training, or the data's with `--prompt_setting heldout`) cut at the user header exactly as the probe builds them, and
`anchor_share` of ordinary problems that the policy answers (`uturn_train/training/rl_data.py`). Generation stops at the
template's end of turn and at any role header. Rewards (`uturn_train/training/rewards.py`, weights in `reward_weights`): the
probe's verdict on the user turn (+1 grounded follow-up, +0.5 one specific to its conversation but not to its answer,
0 a follow-up that fits any answer, a new topic or thanks, -1 drift, repetition, empty or degenerate; decided by the
rules on the testbed and by the trained judge elsewhere, `--reward_labeler`), a length guard,
and GSM8K-style correctness on the anchors; TRL logs each as `rewards/<name>/mean`. LoRA, the user-turn probe at step
0 and at every save, and at the end a table of the probe history and `output_dir/probe_history.png`.

# The testbed on a CPU (builds the testbed first if it is missing)
```bash
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_grpo.py --config recipes/testbed/collab_grpo.yaml
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_grpo.py --config recipes/testbed/collab_grpo.yaml --loss_type dr_grpo --beta 0.04
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_grpo.py --config recipes/testbed/collab_objective.yaml
```

# A real model on a CPU: SmolLM2-135M-Instruct, the collaboration objective on GSM8K (a short schedule: see the YAML)
```bash
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_grpo.py --config recipes/smollm2/collab_objective.yaml --seed 0
```

# Qwen3.5-2B with LoRA: one GPU (generation with transformers), or vLLM as a server. vLLM pins an older transformers
# than this stack's, so it cannot be colocated in the training process (`--vllm_mode colocate`): it runs in its own
# environment, `CUDA_VISIBLE_DEVICES=7 trl vllm-serve --model Qwen/Qwen3.5-2B` there, then on the other seven GPUs
```bash
accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/collab_grpo.py --config recipes/qwen3.5-2b/collab_grpo.yaml
accelerate launch --config_file accelerate_configs/multi_gpu.yaml --num_processes 7 recipes/collab_grpo.py --config recipes/qwen3.5-2b/collab_grpo.yaml --use_vllm --vllm_mode server
```
"""


def main(training_args, model_args, probe_args, rl_args):
    from pathlib import Path

    from datasets import Dataset
    from transformers.integrations import is_deepspeed_zero3_enabled
    from trl import GRPOTrainer

    from uturn_train import UserTurnProbeCallback
    from uturn_train.chat import role_header_starts, stop_strings
    from uturn_train.collab import CollabSettings, load_collab_tasks
    from uturn_train.collab.gsm8k import gsm8k_collab_tasks
    from uturn_train.distributed import gathered_if_zero3, keep_non_reentrant_checkpointing, never_replay_zero3_trace
    from uturn_train.models import load_model, load_tokenizer, lora_config
    from uturn_train.probe.history import report_probe_history
    from uturn_train.probe.labelers.judge import load_judge
    from uturn_train.probe.settings import labeler_for
    from uturn_train.testbed.collab import training_collab_tasks
    from uturn_train.tracking import name_run_by_seed, wandb_offline_unless_logged_in
    from uturn_train.training.collab_rl import CollabReward, CollabRollout, FirstUserTurn, collab_rows
    from uturn_train.training.rewards import LengthGuard, UserTurnReward, accuracy
    from uturn_train.training.rl_data import grpo_rows, rl_examples
    from uturn_train.zoo import resolve

    if training_args.use_vllm and training_args.vllm_mode == "colocate":
        raise ValueError("--vllm_mode colocate loads vLLM into this process, and vLLM pins an older transformers than "
                         "this stack's: run `trl vllm-serve` in vLLM's own environment and pass --vllm_mode server")
    wandb_offline_unless_logged_in(training_args.report_to, training_args.output_dir)
    name_run_by_seed(training_args)
    name = model_args.model_name_or_path
    with training_args.main_process_first(desc="resolving model names"):  # one process builds or fetches a model
        resolve(model_args, probe_args, rl_args)
    tokenizer = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    model = load_model(model_args.model_name_or_path, model_args.dtype, revision=model_args.model_revision,
                       attn_implementation=model_args.attn_implementation)
    # GRPOTrainer ends a completion at any of the model's eos ids: make those the template's end-of-turn and role-header
    # tokens, as the probe stops. Stops that are plain text (`"\nUser:"`) would need `stop_strings`, which TRL's
    # generate call cannot take (it passes no tokenizer).
    added, stops = tokenizer.get_added_vocab(), stop_strings(tokenizer)
    if any(s not in added for s in stops):
        raise ValueError(f"the chat template of {name!r} ends turns with plain text {[s for s in stops if s not in added]}"
                         ", not special tokens: GRPO generation cannot stop there")
    model.generation_config.eos_token_id = sorted({added[s] for s in stops})
    callback = UserTurnProbeCallback(probe_args, tokenizer)  # bad probe options fail here, before any generation

    examples = rl_examples(rl_args)
    state = training_args.distributed_state if training_args.world_size > 1 else None
    if not is_deepspeed_zero3_enabled():  # ZeRO-3 placed its partitions already
        model.to(training_args.device)
    rollout_func = None
    judge = None
    if labeler_for(rl_args.reward_labeler, rl_args.prompt_source) == "trained":
        judge = load_judge(device=str(training_args.device))
    turn_reward = UserTurnReward(tokenizer, role_header_starts(tokenizer), judge)
    if rl_args.objective == "collab":  # whole conversations with the oracle partner, rewarded by how they end
        if is_deepspeed_zero3_enabled():
            # Under ZeRO-3 every forward of the model is a collective (DeepSpeed's start-of-forward hook), and the
            # processes' conversations differ in turns and lengths: they would wait on each other for ever.
            raise ValueError("objective `collab` cannot run under DeepSpeed ZeRO-3 (the processes' conversations take "
                             "different numbers of forwards): use DDP or ZeRO-2 (`uturn plan` gives their memory)")
        if rl_args.prompt_source == "testbed":  # world problems apart from the held-out ones the probe measures
            drawn = training_collab_tasks(Path(rl_args.prompt_data).parent, rl_args.prompt_limit, rl_args.prompt_seed,
                                          rl_args.collab_wrong_share)
        else:  # GSM8K's train split (`uturn collab --task gsm8k` measures on its test split)
            drawn = gsm8k_collab_tasks(rl_args.prompt_data, rl_args.prompt_seed, rl_args.collab_wrong_share, "train",
                                       limit=rl_args.prompt_limit, option="--prompt_data")
        tasks = load_collab_tasks(drawn, rl_args.collab_families, option="--prompt_source", oracle=True)
        rows = collab_rows(tokenizer, tasks, examples, rl_args.anchor_share, rl_args.prompt_seed)
        settings = CollabSettings(families=rl_args.collab_families, max_turns=rl_args.collab_max_turns,
                                  max_new_tokens=training_args.max_completion_length,
                                  batch_size=training_args.per_device_train_batch_size)
        rollout_func = CollabRollout(tokenizer, tasks, settings)
        rewards = [CollabReward(rl_args.collab_turn_cost), FirstUserTurn(turn_reward), accuracy]
        print(f"{len(tasks)} collaboration tasks ({', '.join(rl_args.collab_families)}) and "
              f"{len(rows) - len(tasks)} anchor problems from {rl_args.prompt_source!r}")
    else:
        with gathered_if_zero3(model, whole=training_args.ds3_gather_for_generation):  # the answers, as the rollouts
            rows = grpo_rows(model, tokenizer, examples, rl_args, state=state)
        n_anchors = sum(r["kind"] == "anchor" for r in rows)
        print(f"{len(rows) - n_anchors} user-turn prompts ({rl_args.prompt_setting} answers) and {n_anchors} anchor "
              f"problems from {rl_args.prompt_source!r}")
        rewards = [turn_reward, LengthGuard(rl_args.user_turn_budget), accuracy]
    requested = dict(training_args.gradient_checkpointing_kwargs or {})  # TRL's trainer rewrites it
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=training_args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, peft_config=lora_config(model_args), rollout_func=rollout_func)
    trainer.add_callback(callback.bind(trainer))
    keep_non_reentrant_checkpointing(trainer, requested)  # ZeRO-3 + LoRA: see its docstring
    never_replay_zero3_trace(trainer)  # ZeRO-3: see its docstring
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        report_probe_history(training_args.output_dir, title=f"{name} · collab GRPO ({training_args.loss_type})")
    trainer.end()


def make_parser():
    from trl import GRPOConfig, ModelConfig, TrlParser

    from uturn_train import ProbeArguments
    from uturn_train.training.rl_data import RLArguments

    return TrlParser((GRPOConfig, ModelConfig, ProbeArguments, RLArguments))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
