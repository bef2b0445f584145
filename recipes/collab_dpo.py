"""Collaboration DPO: on-policy preference pairs for the **user** turn, LoRA, the user-turn probe at every checkpoint.

Without `--dataset_name`, the script first mines pairs with the model itself (`uturn_train/training/mining.py`: it answers,
samples user turns; a follow-up grounded against three mismatched contexts is chosen, and an identity drift /
repetition / new topic / empty / degenerate turn or a follow-up that fits any answer is rejected; plus accuracy
anchors) and saves them to `output_dir/pairs`; a resumed run reuses them.
Then DPO, probing at step 0 and at every save; at the end a table of the probe history and
`output_dir/probe_history.png`.

# The main job: the testbed on a CPU (builds the testbed first if it is missing)
```bash
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_dpo.py --config recipes/testbed/collab_dpo.yaml
```

# Resume after a crash (the pairs in output_dir/pairs are reused, the lost probe of the checkpoint is redone)
```bash
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_dpo.py --config recipes/testbed/collab_dpo.yaml \\
    --resume_from_checkpoint outputs/testbed-collab-dpo/checkpoint-40
```

# Qwen3.5-2B with LoRA: one GPU, DDP, DeepSpeed ZeRO-3
```bash
accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/collab_dpo.py --config recipes/qwen3.5-2b/collab_dpo.yaml
accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/collab_dpo.py --config recipes/qwen3.5-2b/collab_dpo.yaml
accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml recipes/collab_dpo.py --config recipes/qwen3.5-2b/collab_dpo.yaml
```

# Pairs mined beforehand (`uturn mine --model Qwen/Qwen3.5-2B --mine_source gsm8k --out pairs`), other knobs
```bash
accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/collab_dpo.py \\
    --config recipes/qwen3.5-2b/collab_dpo.yaml --dataset_name pairs --loss_type sigmoid sft --beta 0.2 --lora_r 16
```
"""


def main(script_args, training_args, model_args, probe_args, mining_args):
    from pathlib import Path

    from datasets import Dataset, load_dataset
    from transformers.integrations import is_deepspeed_zero3_enabled
    from trl import DPOTrainer

    from uturn_train import UserTurnProbeCallback
    from uturn_train.distributed import keep_non_reentrant_checkpointing
    from uturn_train.models import load_model, load_tokenizer, lora_config
    from uturn_train.probe.history import report_probe_history
    from uturn_train.tracking import name_run_by_seed, wandb_offline_unless_logged_in
    from uturn_train.training.mining import load_pairs, mine_pairs, mining_examples, resumable_pairs, save_pairs
    from uturn_train.zoo import resolve

    wandb_offline_unless_logged_in(training_args.report_to, training_args.output_dir)
    name_run_by_seed(training_args)
    name = model_args.model_name_or_path
    with training_args.main_process_first(desc="resolving model names"):  # one process builds or fetches a model
        resolve(model_args, probe_args, mining_args)
    tokenizer = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    model = load_model(model_args.model_name_or_path, model_args.dtype, revision=model_args.model_revision,
                       attn_implementation=model_args.attn_implementation)
    callback = UserTurnProbeCallback(probe_args, tokenizer)  # bad probe options fail here, before mining

    mined_dir = Path(training_args.output_dir) / "pairs"
    if script_args.dataset_name:
        if Path(script_args.dataset_name).exists():  # a folder written by `uturn mine`
            pairs = load_pairs(script_args.dataset_name)
        else:  # a hub preference data set
            pairs = load_dataset(script_args.dataset_name, name=script_args.dataset_config,
                                 split=script_args.dataset_train_split)
    elif training_args.resume_from_checkpoint and (pairs := resumable_pairs(mined_dir, name, mining_args)):
        print(f"resuming: reusing the {len(pairs)} pairs mined before in {mined_dir} (its mining card matches)")
    else:
        examples = mining_examples(mining_args)
        state = training_args.distributed_state if training_args.world_size > 1 else None
        if not is_deepspeed_zero3_enabled():  # ZeRO-3 placed its partitions already
            model.to(training_args.device)
        mined, card = mine_pairs(model, tokenizer, examples, mining_args, state=state)
        if training_args.process_index == 0:
            out = save_pairs(mined, {"model": name, **card}, mined_dir)
            print(f"mined {card['n_pairs']} pairs {card['kind']} from {card['n_prompts']} prompts in "
                  f"{card['seconds']:.0f} s -> {out}")
        pairs = Dataset.from_list(mined)  # every rank holds the same gathered pairs

    requested = dict(training_args.gradient_checkpointing_kwargs or {})  # TRL's trainer rewrites it
    trainer = DPOTrainer(model=model, args=training_args, train_dataset=pairs, processing_class=tokenizer,
                         peft_config=lora_config(model_args))
    trainer.add_callback(callback.bind(trainer))
    keep_non_reentrant_checkpointing(trainer, requested)  # ZeRO-3 + LoRA: see its docstring
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        report_probe_history(training_args.output_dir, title=f"{name} · collab DPO")
    trainer.end()


def make_parser():
    from trl import DPOConfig, ModelConfig, ScriptArguments, TrlParser

    from uturn_train import ProbeArguments
    from uturn_train.training.mining import MiningArguments

    return TrlParser((ScriptArguments, DPOConfig, ModelConfig, ProbeArguments, MiningArguments))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
