"""Collaboration SFT: multi-turn conversations with grounded follow-ups, LoRA, the user-turn probe at every checkpoint.

`loss_scope` picks the turns in the loss: `assistant` (the usual), `all` (every turn) or `user` (user turns only);
`collab_source` the conversations: the testbed's, OASST trees, or any `{"messages"}` jsonl (`uturn_train/training/data.py`).
At the end: a table of the probe history and `output_dir/probe_history.png`.

# The testbed on a CPU (builds the testbed first if it is missing)
```bash
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_sft.py --config recipes/testbed/collab_sft.yaml
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_sft.py --config recipes/testbed/collab_sft.yaml --loss_scope user
```

# Qwen3.5-2B with LoRA on OASST trees: one GPU, DeepSpeed ZeRO-3
```bash
accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/collab_sft.py --config recipes/qwen3.5-2b/collab_sft.yaml
accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml recipes/collab_sft.py --config recipes/qwen3.5-2b/collab_sft.yaml \\
    --collab_data ../shared/data/oasst/en_100_tree.jsonl --loss_scope all
```

# A conversational data set with a `messages` column (hub name or `save_to_disk` folder) instead of a source
```bash
accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/collab_sft.py --config recipes/qwen3.5-2b/collab_sft.yaml \\
    --dataset_name my_conversations
```
"""


def main(script_args, training_args, model_args, probe_args, data_args):
    from pathlib import Path

    from datasets import load_dataset, load_from_disk
    from trl import SFTTrainer

    from uturn_train import UserTurnProbeCallback
    from uturn_train.distributed import keep_non_reentrant_checkpointing
    from uturn_train.models import load_model, load_tokenizer, lora_config
    from uturn_train.probe.history import report_probe_history
    from uturn_train.tracking import name_run_by_seed, wandb_offline_unless_logged_in
    from uturn_train.training.data import apply_loss_scope, check_messages, load_conversations, sft_dataset
    from uturn_train.zoo import resolve

    apply_loss_scope(training_args, data_args.loss_scope)
    wandb_offline_unless_logged_in(training_args.report_to, training_args.output_dir)
    name_run_by_seed(training_args)
    name = model_args.model_name_or_path
    with training_args.main_process_first(desc="resolving model names"):  # one process builds or fetches a model
        resolve(model_args, probe_args, data_args)
    tokenizer = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    model = load_model(model_args.model_name_or_path, model_args.dtype, revision=model_args.model_revision,
                       attn_implementation=model_args.attn_implementation)
    callback = UserTurnProbeCallback(probe_args, tokenizer)  # bad probe options fail here, before training

    if script_args.dataset_name:
        dataset_name = script_args.dataset_name
        rows = (load_from_disk(dataset_name) if Path(dataset_name, "dataset_info.json").exists() else
                load_dataset(dataset_name, name=script_args.dataset_config, split=script_args.dataset_train_split))
        if "messages" not in rows.column_names:
            raise ValueError(f"--dataset_name {dataset_name}: no `messages` column (columns: {rows.column_names})")
        conversations = [check_messages(m, f"{dataset_name} row {i}") for i, m in enumerate(rows["messages"])]
    else:
        conversations = load_conversations(data_args)
    dataset = sft_dataset(conversations, tokenizer, data_args.loss_scope)

    requested = dict(training_args.gradient_checkpointing_kwargs or {})  # TRL's trainer rewrites it
    trainer = SFTTrainer(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=lora_config(model_args))
    trainer.add_callback(callback.bind(trainer))
    keep_non_reentrant_checkpointing(trainer, requested)  # ZeRO-3 + LoRA: see its docstring
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        report_probe_history(training_args.output_dir, title=f"{name} · collab SFT ({data_args.loss_scope})")
    trainer.end()


def make_parser():
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

    from uturn_train import ProbeArguments
    from uturn_train.training.data import CollabDataArguments

    return TrlParser((ScriptArguments, SFTConfig, ModelConfig, ProbeArguments, CollabDataArguments))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
