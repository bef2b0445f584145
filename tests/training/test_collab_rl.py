"""The collaboration objective: conversations kept as the token ids the policy sampled, their reward, and a GRPO run."""

import json

import pytest
from helpers import ARITHMETIC, ROOT, load_recipe

from uturn_train.collab import CollabSettings, OraclePartner, dialogue, run_collab
from uturn_train.collab.dialogue import turn_prompt
from uturn_train.collab.tasks import CollabTask
from uturn_train.generation import Generation
from uturn_train.training.collab_rl import CollabReward, FirstUserTurn, collab_rows
from uturn_train.training.rl_data import RLArguments

INFO_GAP = CollabTask("t-info_gap", "info_gap", "5", [{"role": "user", "content": "Mia buys some pens at $2 each and "
                      "pays $10. How many pens did she buy?"}], oracle={"reveal": "The number of pens is 5."})


def scripted(tokenizer, turns: list[str], seen: list):
    """A stand-in for the engine that writes `turns` in order (one per round) and records the prompts it was given."""
    def generate(model, tok, prompts, **kwargs):
        seen.append([list(p) for p in prompts])
        text = turns[len(seen) - 1]
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return [[Generation(text, "stop", "<|im_end|>", len(p), len(ids), token_ids=tuple(ids))] for p in prompts]
    return generate


def test_a_traced_conversation_is_the_ids_the_policy_sampled_from(monkeypatch):
    from helpers import tiny

    tokenizer = tiny.qwen_tokenizer()
    seen = []
    turns = ["How many pens?", "She bought 5 pens. #### 5"]
    monkeypatch.setattr(dialogue, "generate", scripted(tokenizer, turns, seen))
    run = run_collab(None, tokenizer, [INFO_GAP], OraclePartner(), CollabSettings(), trace=True,
                     disable_progress=True)
    (record,) = run.conversations
    assert record["success"] is True and record["turns"] == 2 and record["ended"] == "answered"
    trace = record["trace"]
    prompt, completion, mask = trace["prompt_ids"], trace["completion_ids"], trace["env_mask"]
    assert prompt == tokenizer(turn_prompt(tokenizer, INFO_GAP), add_special_tokens=False).input_ids
    # Each turn was sampled after exactly the ids that precede it in the sequence: the second after the first turn,
    # its end and the partner's reply as the template renders it.
    assert seen[0] == [prompt]
    first = len(tokenizer("How many pens?", add_special_tokens=False).input_ids) + 1
    assert seen[1][0] == (prompt + completion)[: len(seen[1][0])] and len(seen[1][0]) > len(prompt) + first
    text = tokenizer.decode(completion)
    assert text.startswith("How many pens?<|im_end|>\n<|im_start|>user\nThe number of pens is 5.<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert text.endswith("She bought 5 pens. #### 5<|im_end|>")
    # The loss sees the policy's own tokens (and the end tokens it sampled), never the partner's or the template's.
    own = [t for t, m in zip(completion, mask) if m]
    assert tokenizer.decode(own) == "How many pens?<|im_end|>She bought 5 pens. #### 5<|im_end|>"
    assert len(mask) == len(completion) and sum(mask) == len(own) < len(completion)


def test_reward_is_success_less_a_cost_per_extra_turn():
    reward, logged = CollabReward(turn_cost=0.1), {}
    got = reward(completions=["a", "b", "c", "d"], kind=["collab", "collab", "collab", "anchor"],
                 collab_success=[True, True, False, None], collab_turns=[1, 2, 3, None],
                 family=["info_gap", "peer_check", "peer_check", None], answer_right=[None, False, False, None],
                 log_metric=logged.__setitem__)
    assert got[:3] == [1.0, pytest.approx(0.9), pytest.approx(-0.2)] and got[3] is None
    assert logged == {"collab/rollout_success/info_gap": 1.0, "collab/rollout_success/peer_check_wrong_start": 0.5}
    with pytest.raises(ValueError, match="collab_turn_cost"):
        CollabReward(turn_cost=1.0)


def peer_check(i: int, pens: int, price: int) -> CollabTask:
    question = f"Ann buys {pens} pens at ${price} each. How much does she pay?"
    answer = f"She pays {pens} * {price} = {pens * price + 1} dollars. #### {pens * price + 1}"
    return CollabTask(f"t{i}-peer_check", "peer_check", str(pens * price), [
        {"role": "user", "content": question}, {"role": "assistant", "content": answer}], answer_right=False,
        oracle={"wrong_step": 0, "values": [str(pens * price + 1)], "operands": [str(pens), str(price)],
                "ordinal": "first", "fix": "...", "solution": "..."})


def test_shaping_rewards_a_first_user_turn_that_reacts_to_its_own_answer():
    from helpers import tiny

    from uturn_train.chat import role_header_starts
    from uturn_train.training.rewards import UserTurnReward

    tokenizer = tiny.qwen_tokenizer()
    tasks = [peer_check(0, 3, 4), peer_check(1, 6, 7), peer_check(2, 8, 9), INFO_GAP]
    rows = collab_rows(tokenizer, tasks, [], 0.0, seed=0)
    by_id = {r["id"]: r for r in rows}
    # Every peer_check row is controlled with the other tasks' openings, never its own; info_gap has none.
    first = by_id["t0-peer_check"]
    assert first["query"] == tasks[0].messages[0]["content"] and len(first["controls"]) >= 1
    assert all(c[0] != first["query"] for c in first["controls"])
    assert by_id["t-info_gap"]["controls"] == [] and by_id["t-info_gap"]["query"] is None
    shaping = FirstUserTurn(UserTurnReward(tokenizer, role_header_starts(tokenizer)))
    order = ["t0-peer_check", "t0-peer_check", "t0-peer_check", "t-info_gap"]
    batch = {k: [by_id[i][k] for i in order] for k in ("kind", "family", "query", "answer", "controls")}
    got = shaping(completions=["", "", "", ""], first_turn=[
        "Why is it 13 dollars? 3 * 4 is 12.", "Thanks, that helps!", "She pays 12 dollars. #### 12",
        "How many pens?"], **batch)
    # Grounded in its own answer; thanks; the answer given again under the user role (identity drift); not shaped.
    assert got == [1.0, 0.0, -1.0, None]


def test_training_tasks_are_never_the_measured_ones(shared_data, tmp_path):
    import random

    from uturn_train.collab import load_collab_tasks
    from uturn_train.collab.gsm8k import gsm8k_collab_tasks
    from uturn_train.testbed.build import make_heldout
    from uturn_train.testbed.collab import collab_tasks, training_collab_tasks

    train = gsm8k_collab_tasks(str(shared_data / "gsm8k" / "train.jsonl"), split="train", limit=20)
    test = gsm8k_collab_tasks(str(shared_data / "gsm8k" / "test.jsonl"))
    assert all(t["id"].startswith("gsm8k-train-") for t in train)
    assert not {t["messages"][0]["content"] for t in train} & {r["messages"][0]["content"] for r in test}
    # The testbed's: world problems whose keys are none of the held-out ones (a testbed of 300 held-out problems).
    heldout = make_heldout(random.Random(0), 300)
    testbed = tmp_path / "testbed"
    testbed.mkdir()
    (testbed / "card.json").write_text(json.dumps({"seed": 0, "config": {"n_heldout": 300}}))
    (testbed / "heldout.jsonl").write_text("".join(json.dumps({"question": r["question"]}) + "\n" for r in heldout))
    rows = training_collab_tasks(testbed, 200, seed=0)
    # Whole questions (peer_check's): an info_gap question without its number may read as a held-out one's.
    measured = {r["messages"][0]["content"] for r in collab_tasks([r["problem"] for r in heldout])
                if r["family"] == "peer_check"}
    drawn = {r["messages"][0]["content"] for r in rows if r["family"] == "peer_check"}
    assert len(drawn) > 150 and not drawn & measured
    assert all(r["id"].startswith("testbed-train-") for r in rows)
    assert len(load_collab_tasks(rows, ["peer_check"], oracle=True)) == 200
    # `collab_wrong_share`: the training peer_check tasks may all start wrong (their slip in the oracle's lines).
    right = [r["answer_right"] for r in rows if r["family"] == "peer_check"]
    assert 60 < sum(right) < 140
    wrong = [r for r in training_collab_tasks(testbed, 200, seed=0, wrong_share=1.0) if r["family"] == "peer_check"]
    assert len(wrong) == 200 and not any(r["answer_right"] or r["oracle"]["wrong_step"] is None for r in wrong)
    with pytest.raises(ValueError, match="collab_wrong_share"):
        RLArguments(objective="collab", collab_wrong_share=0.0)


def test_rows_hold_the_anchor_share():
    from helpers import tiny

    from uturn_train.tasks import load_task

    tokenizer = tiny.qwen_tokenizer()
    tasks = [INFO_GAP] * 8
    rows = collab_rows(tokenizer, tasks, list(load_task("gsm8k", str(ARITHMETIC))), 0.2, seed=0)
    assert sum(r["kind"] == "anchor" for r in rows) == 2 and sum(r["kind"] == "collab" for r in rows) == 8
    with pytest.raises(ValueError, match="lower anchor_share or raise prompt_limit"):
        collab_rows(tokenizer, tasks * 4, list(load_task("gsm8k", str(ARITHMETIC))), 0.5, seed=0)


def test_collab_objective_trains_through_trls_rollout_func(tiny_qwen_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    from uturn_train.collab.gsm8k import gsm8k_collab_tasks
    from uturn_train.io import write_jsonl

    probe_tasks = tmp_path / "collab.jsonl"
    write_jsonl(probe_tasks, gsm8k_collab_tasks(str(ARITHMETIC)))
    recipe = load_recipe("collab_grpo")
    out = tmp_path / "grpo"
    args = recipe.make_parser().parse_args_and_config([
        "--config", str(ROOT / "recipes" / "testbed" / "collab_objective.yaml"), "--model_name_or_path",
        str(tiny_qwen_dir), "--output_dir", str(out), "--report_to", "none", "--probe_task", "gsm8k",
        "--probe_data", str(ARITHMETIC), "--probe_labeler", "rules", "--probe_limit", "2", "--probe_samples", "2",
        "--probe_max_new_tokens", "8", "--probe_answer_max_new_tokens", "8", "--probe_collab", str(probe_tasks),
        "--probe_collab_limit", "2", "--prompt_source", "gsm8k", "--prompt_data", str(ARITHMETIC),
        "--prompt_limit", "6", "--anchor_share", "0.2", "--num_generations", "2", "--per_device_train_batch_size", "4",
        "--max_completion_length", "8", "--max_steps", "2", "--save_steps", "2", "--logging_steps", "1"])
    recipe.main(*args)
    printed = capsys.readouterr().out
    tasks = len(gsm8k_collab_tasks(str(ARITHMETIC), split="train"))
    assert f"{tasks} collaboration tasks (info_gap, peer_check) and " in printed
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    steps = [h for h in state["log_history"] if "rewards/collab_success/mean" in h]
    assert len(steps) == 2
    for h in steps:
        # Only the policy's own tokens count as its completion (8 per turn at most, 3 turns).
        assert 1 <= h["completions/max_length"] <= 3 * 9
        assert -0.2 <= h["rewards/collab_success/mean"] <= 1.0
        success = {k: v for k, v in h.items() if k.startswith("collab/rollout_success/")}
        assert success and all(0 <= v <= 1 for v in success.values())  # the rollouts' families, logged
    assert any("collab/success_rate/peer_check" in h for h in state["log_history"])  # the held-out tasks, probed
    # The shaping reward is computed and logged where a step held peer_check rows (NaN where it held none).
    shaped = [h["rewards/first_user_turn/mean"] for h in steps]
    assert all(-1 <= v <= 1 for v in shaped if v == v) and any(v == v for v in shaped)


@pytest.mark.slow
def test_collab_objective_under_two_processes_and_refused_under_zero3(tiny_qwen_dir, tmp_path):
    """DDP: each process holds its own conversations. ZeRO-3 would deadlock (every forward a collective, the
    processes' conversations of different lengths): refused before training, with the way out."""
    import os
    import subprocess
    import sys

    from uturn_train.collab.gsm8k import gsm8k_collab_tasks
    from uturn_train.io import write_jsonl

    probe_tasks = tmp_path / "collab.jsonl"
    write_jsonl(probe_tasks, gsm8k_collab_tasks(str(ARITHMETIC)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    recipe_args = [
        str(ROOT / "recipes" / "collab_grpo.py"),
        "--config", str(ROOT / "recipes" / "testbed" / "collab_objective.yaml"),
        "--model_name_or_path", str(tiny_qwen_dir), "--report_to", "none", "--probe_task", "gsm8k", "--probe_data",
        str(ARITHMETIC), "--probe_labeler", "rules", "--probe_limit", "2", "--probe_samples", "2",
        "--probe_max_new_tokens", "8", "--probe_answer_max_new_tokens", "8", "--probe_collab", str(probe_tasks),
        "--probe_collab_limit", "2", "--prompt_source", "gsm8k", "--prompt_data", str(ARITHMETIC), "--prompt_limit",
        "6", "--num_generations", "2", "--per_device_train_batch_size", "4", "--max_completion_length", "8",
        "--max_steps", "2", "--save_steps", "2", "--logging_steps", "1"]
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    out = tmp_path / "ddp"
    done = subprocess.run([*launch, "--multi_gpu", "--num_processes", "2", *recipe_args, "--output_dir", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert sum("rewards/collab_success/mean" in h for h in state["log_history"]) == 2
    zero3 = ["--config_file", str(ROOT / "accelerate_configs" / "deepspeed_zero3.yaml"), "--num_processes", "2"]
    refused = subprocess.run([*launch, *zero3, *recipe_args, "--output_dir", str(tmp_path / "z3")], env=env,
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "cannot run under DeepSpeed ZeRO-3" in refused.stderr
