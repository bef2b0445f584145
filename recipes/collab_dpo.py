"""Collaboration DPO: on-policy preference pairs for the **user** turn, LoRA, the user-turn probe at every checkpoint.

Without `--dataset_name`, the script first mines pairs with the model itself (`uturn_train/mining.py`: it answers,
samples user turns, the classifier picks a follow-up as chosen and an identity drift / repetition / new topic / empty /
degenerate turn as rejected, plus accuracy anchors) and saves them to `output_dir/pairs`. Then DPO, probing at step 0
and at every save; at the end a table of the probe history and `output_dir/probe_history.png`.

# The main job: the testbed on a CPU (builds the testbed first if it is missing)
```bash
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_dpo.py --config recipes/testbed/collab_dpo.yaml
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

import argparse


def main(script_args, training_args, model_args, probe_args, mining_args):
    from pathlib import Path

    import transformers
    from datasets import Dataset, load_dataset
    from packaging.version import Version
    from transformers.integrations import is_deepspeed_zero3_enabled
    from trl import DPOTrainer

    from uturn_train import UserTurnProbeCallback
    from uturn_train.mining import load_pairs, mine_pairs, mining_examples, save_pairs
    from uturn_train.training import (
        load_model_and_tokenizer,
        lora_config,
        report_probe_history,
        wandb_offline_unless_logged_in,
    )

    wandb_offline_unless_logged_in(training_args.report_to)
    model, tokenizer = load_model_and_tokenizer(model_args, training_args)
    callback = UserTurnProbeCallback(probe_args, tokenizer)  # bad probe options fail here, before mining

    if script_args.dataset_name:
        if Path(script_args.dataset_name).exists():  # a folder written by `uturn mine`
            pairs = load_pairs(script_args.dataset_name)
        else:  # a hub preference data set
            pairs = load_dataset(script_args.dataset_name, name=script_args.dataset_config,
                                 split=script_args.dataset_train_split)
    else:
        examples = mining_examples(mining_args)
        state = training_args.distributed_state if training_args.world_size > 1 else None
        if not is_deepspeed_zero3_enabled():  # ZeRO-3 placed its partitions already
            model.to(training_args.device)
        mined, card = mine_pairs(model, tokenizer, examples, mining_args, state=state)
        if training_args.process_index == 0:
            card = {"model": model_args.model_name_or_path, **card}
            out = save_pairs(mined, card, Path(training_args.output_dir) / "pairs")
            print(f"mined {card['n_pairs']} pairs {card['kind']} from {card['n_prompts']} prompts in "
                  f"{card['seconds']:.0f} s -> {out}")
        pairs = Dataset.from_list(mined)  # every rank holds the same gathered pairs

    trainer = DPOTrainer(model=model, args=training_args, train_dataset=pairs, processing_class=tokenizer,
                         peft_config=lora_config(model_args), callbacks=[callback])
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        report_probe_history(training_args.output_dir, title=f"{model_args.model_name_or_path} · collab DPO")
    if Version(transformers.__version__) >= Version("5.18.0"):
        trainer.end()


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import DPOConfig, ModelConfig, ScriptArguments, TrlParser

    from uturn_train import ProbeArguments
    from uturn_train.mining import MiningArguments

    dataclass_types = (ScriptArguments, DPOConfig, ModelConfig, ProbeArguments, MiningArguments)
    if subparsers is not None:
        return subparsers.add_parser("collab_dpo", help="Collaboration DPO", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
