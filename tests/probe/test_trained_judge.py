"""The trained judge's parts: the likelihood features, the logistic heads, the labelled rows' loader, a fit."""

import json

import pytest
import torch
from helpers import tiny

from uturn_train.chat import user_turn_prompt
from uturn_train.probe.labelers.features import LM_FEATURES, TurnLikelihoods, context_messages
from uturn_train.probe.labelers.judge import FEATURE_NAMES, Judge, feature_names, featurize
from uturn_train.probe.labelers.judge_training import by_cell, features, fit_logistic, measure, train_judge
from uturn_train.probe.validity.reading import load_reading, pair_contexts

QUERY = "Ana buys 3 boxes of 4 pens. How many pens?"
ANSWER = "Each box holds 4 pens, so 3 * 4 = 12 pens."
TURNS = ["Why did you multiply 3 by 4?", "Can you explain that more simply?", "Next: 5 * 6?"]


@pytest.fixture(scope="module", params=["llama", "qwen3.5"])
def likelihoods(request):
    tokenizer = tiny.qwen_tokenizer()
    model = tiny.tiny_llama_lm(tokenizer) if request.param == "llama" else tiny.tiny_causal_lm(tokenizer)
    return TurnLikelihoods(model, tokenizer, turn_tokens=12, context_tokens=64)


def test_likelihoods_equal_a_plain_forward_of_context_and_turn(likelihoods):
    # The context is computed once and its cache expanded to every turn (Gated DeltaNet's states too); each turn's NLL
    # must be what one forward pass of context + turn gives.
    # So must its hidden state at the chosen layer, averaged over the turn's tokens.
    messages = context_messages(QUERY, ANSWER)
    got = likelihoods(messages, TURNS)
    states = [h for _, h in likelihoods(messages, TURNS, states=True)]
    for one, whole in zip(likelihoods(messages, TURNS, chunk=2), got):  # read in chunks: the same
        torch.testing.assert_close(one, whole, atol=1e-5, rtol=1e-5)
    tokenizer, model = likelihoods.tokenizer, likelihoods.model
    context = tokenizer(user_turn_prompt(tokenizer, messages), add_special_tokens=False).input_ids[-64:]
    for turn, nll, state in zip(TURNS, got, states):
        ids = likelihoods.turn_ids(turn)
        assert ids[-len(likelihoods.end_ids):] == likelihoods.end_ids and len(nll) == len(ids)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([context + ids]), output_hidden_states=True)
        logits = out.logits[0, len(context) - 1: -1]
        want = -torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        torch.testing.assert_close(nll, want, atol=2e-4, rtol=1e-4)
        assert state.shape == (likelihoods.state_size,)
        layer = model.config.get_text_config().num_hidden_layers // 2 + 1
        assert likelihoods.state_layer == layer
        torch.testing.assert_close(state, out.hidden_states[layer][0, len(context):].mean(0), atol=2e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"state_layer 99: the model has layers 0 \(embeddings\) to"):
        TurnLikelihoods(model, tokenizer, state_layer=99)


def _item(turn, query=QUERY, answer=ANSWER):
    return {"query": query, "answer": answer, "user_turn": turn, "other_query": "Ben has 7 cats. He gives 2 away.",
            "other_answer": "7 - 2 = 5 cats."}


def test_features_do_not_depend_on_what_is_read_beside(likelihoods):
    items = [_item(t) for t in TURNS] + [_item("How did you get 5?", "Ben has 7 cats.", "7 - 2 = 5 cats.")]
    together = featurize(items, likelihoods)
    alone = torch.cat([featurize([item], likelihoods) for item in items])
    assert together.shape == (4, len(feature_names(likelihoods)))
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=1e-4)
    # The turn that quotes this answer's operation gains more from its own answer than the generic request does.
    gain = FEATURE_NAMES.index("gain_answer")
    assert torch.isfinite(together).all() and together[:, gain].abs().sum() > 0


def test_cells_split_constructed_turns_by_kind_and_the_rest_by_source_and_task():
    def row(source, kind, grounded):
        return {"source": source, "kind": kind, "task": "oasst", "temperature": None, "label": "followup",
                "grounded": grounded}

    rows = [row("constructed", "generic", False), row("constructed", "generic", False),
            row("constructed", "grounded_short", True), row("people", None, True)]
    cells = by_cell(rows, ["followup"] * 4, [True, False, True, True])
    assert set(cells) == {"all", "source constructed", "source people", "kind generic", "kind grounded_short",
                          "oasst T=None"}
    # One of the two requests that fit any answer decided grounded: the figure issue 36 holds at 0.05.
    assert cells["kind generic"]["n"] == 2 and cells["kind generic"]["grounded_rate_decided"] == 0.5
    assert cells["kind generic"]["grounded_rate_read"] == 0.0


def test_fit_logistic_learns_a_rule_and_the_penalty_shrinks_it():
    x = torch.randn(400, 5, generator=torch.Generator().manual_seed(0))
    y = (x[:, 2] > 0).long()
    w, b = fit_logistic(x, y, 2, l2=1e-4)
    assert ((x @ w.T + b).argmax(-1) == y).float().mean() > 0.97
    assert (w[1, 2] - w[0, 2]).abs() > 5 * (w[1, :2] - w[0, :2]).abs().max()
    strong, _ = fit_logistic(x, y, 2, l2=1.0)
    assert strong.norm() < 0.5 * w.norm()


def test_the_mlp_ensemble_learns_and_a_column_constant_on_dev_cannot_move_it():
    from uturn_train.probe.labelers.judge_training import MLP, fit

    x = torch.randn(300, 6, generator=torch.Generator().manual_seed(0))
    x[:, 5] = 1.0  # constant where it was fitted
    rows = [{"label": "followup" if a > 0 else "new_topic", "grounded": bool(a > 0 and b > 0)}
            for a, b in x[:, :2].tolist()]
    weights = fit(x, rows, {"kind": "mlp", **MLP, "members": 2, "epochs": 10}, 0.5)
    assert len(weights["members"]) == 2 and all(len(m) == 2 for m in weights["members"])
    verdicts = Judge({**weights, "name": "m"}, likelihoods=None).predict(x)
    assert sum(v.label == r["label"] and v.grounded == r["grounded"] for v, r in zip(verdicts, rows)) > 0.9 * len(rows)
    moved = x.clone()
    moved[:, 5] = 50.0  # varies where it is read: 5e7 standard deviations away
    assert Judge({**weights, "name": "m"}, likelihoods=None).predict(moved) == verdicts


def test_judge_refuses_weights_of_other_features():
    with pytest.raises(ValueError, match=r"old: trained on features \['a'\].*uturn judge train"):
        Judge({"name": "old", "features": ["a"]}, likelihoods=None)


def _write(tmp_path, rows):
    (tmp_path / "read_turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(i, turn, label, grounded, query=QUERY, answer=ANSWER):
    return {"row": f"t{i}", "source": "testbed", "task": "testbed", "id": f"q{i % 7}", "temperature": 1.0,
            "query": f"{query} ({i % 7})", "answer": answer, "user_turn": turn, "label": label, "grounded": grounded}


@pytest.mark.parametrize("bad, message", [
    ({"label": "followups"}, r"read_turns.jsonl: row t0: label 'followups' is not one of"),
    ({"label": "new_topic", "grounded": True}, r"row t0: grounded but labelled new_topic"),
    ({"grounded": None}, r"row t0: no `grounded`; read the turn again"),
    ({"user_turn": None}, r"row t0: query, answer and user_turn must be stored"),
])
def test_a_bad_labelled_row_is_named(tmp_path, bad, message):
    _write(tmp_path, [{**_row(0, TURNS[0], "followup", True), **bad}])
    with pytest.raises(ValueError, match=message):
        load_reading(tmp_path, files=("read_turns.jsonl",), data=tmp_path)


def test_model_text_with_a_unicode_line_separator_stays_one_row(tmp_path):
    # Stored unescaped (json.dumps(..., ensure_ascii=False)), U+2028 in a model's turn is not a row boundary.
    rows = [_row(0, "How did you get 24?\u2028Thanks.", "followup", True), _row(1, TURNS[1], "followup", False)]
    (tmp_path / "read_turns.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    read = load_reading(tmp_path, files=("read_turns.jsonl",), data=tmp_path)
    assert [r["user_turn"] for r in read] == ["How did you get 24?\u2028Thanks.", TURNS[1]]


def _synthetic(n):
    """Turns whose label a tiny model's features can tell: quoting the answer's numbers (grounded), a request that
    fits any answer, a new problem."""
    rows = []
    for i in range(n):
        a, b = 2 + i % 5, 3 + i % 4
        answer = f"Each box holds {a} pens, so {b} * {a} = {a * b} pens."
        kind = i % 3
        turn = (f"Why did you multiply {b} by {a}?", "Can you explain that more simply?",
                f"Next: what is {a + 4} * {b + 5}?")[kind]
        rows.append(_row(i, turn, ("followup", "followup", "new_topic")[kind], kind == 0, answer=answer))
        rows[-1]["id"] = rows[-1]["query"] = f"Ana buys {b} boxes of {a} pens ({i}). How many pens?"
    return rows


def test_train_writes_weights_that_separate_what_the_rows_separate(tmp_path, likelihoods):
    _write(tmp_path, _synthetic(90))
    rows = load_reading(tmp_path, files=("read_turns.jsonl",), data=tmp_path)
    pair_contexts(rows)
    assert {r["split"] for r in rows} == {"dev", "test"} and all(
        (r["other_query"], r["other_answer"]) != (r["query"], r["answer"]) for r in rows)
    cache = tmp_path / "features.jsonl"
    weights = train_judge(rows, likelihoods, tmp_path / "judge.json", cache, "tiny")
    saved = json.loads((tmp_path / "judge.json").read_text())
    assert saved["trained_on"]["rows"] == sum(r["split"] == "dev" for r in rows) == weights["trained_on"]["rows"]
    test = [r for r in rows if r["split"] == "test"]
    x = features(test, likelihoods, cache)
    verdicts = Judge(saved, likelihoods).predict(x)
    assert saved["likelihoods"]["state_layer"] == likelihoods.state_layer
    other_layer = TurnLikelihoods(likelihoods.model, likelihoods.tokenizer, state_layer=0)
    with pytest.raises(ValueError, match=r"trained on a feature model's states state\d+_0\.\.state\d+_\d+, this one "
                                         r"reads state0_0"):
        Judge(saved, other_layer)
    figures = measure(test, [v.label for v in verdicts], [v.grounded for v in verdicts])
    assert figures["followup"]["precision"] == figures["followup"]["recall"] == 1.0, figures
    assert figures["grounded"]["precision"] == figures["grounded"]["recall"] == 1.0, figures
    # The cache answers a second time: no turn is read again.
    calls = []
    counting = type("Counting", (), {"__call__": lambda self, *a, **k: calls.append(a) or likelihoods(*a, **k),
                                     "state_size": likelihoods.state_size, "state_layer": likelihoods.state_layer})()
    torch.testing.assert_close(features(test, counting, cache), x)
    assert calls == []
    # It holds what the model read only: the rules' and lexical columns are computed again, so changing them does
    # not make every labelled turn be read again; assembled, the columns are featurize's.
    entry = json.loads(cache.read_text().splitlines()[0])
    assert len(entry["x"]) == len(LM_FEATURES) + likelihoods.state_size
    torch.testing.assert_close(x, featurize(test, likelihoods), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def small_judge(tmp_path_factory):
    """A judge fitted on synthetic rows over the tiny Llama's likelihoods (the shipped one needs SmolLM2)."""
    tokenizer = tiny.qwen_tokenizer()
    likelihoods = TurnLikelihoods(tiny.tiny_llama_lm(tokenizer), tokenizer, turn_tokens=12, context_tokens=64)
    folder = tmp_path_factory.mktemp("small_judge")
    _write(folder, _synthetic(90))
    rows = load_reading(folder, files=("read_turns.jsonl",), data=folder)
    pair_contexts(rows)
    weights = train_judge(rows, likelihoods, folder / "judge.json", None, "tiny")
    return Judge({**weights, "name": "small"}, likelihoods)


def test_probe_with_the_trained_judge_keeps_the_rules_beside(small_judge, tiny_qwen_dir):
    from uturn_train.models import load_model, load_tokenizer
    from uturn_train.probe.runner import run_probe
    from uturn_train.probe.settings import ProbeSettings
    from uturn_train.tasks.base import Example

    model, tokenizer = load_model(str(tiny_qwen_dir), device="cpu"), load_tokenizer(str(tiny_qwen_dir))
    examples = [Example(id=f"e{i}", query=f"Ana buys {i + 2} boxes of 4 pens. How many pens?",
                        answer=f"{i + 2} * 4 = {4 * i + 8} pens.") for i in range(3)]
    settings = ProbeSettings(setting="heldout", temperatures=[0.0, 1.0], samples=2, max_new_tokens=6,
                             labeler="trained")
    run = run_probe(model, tokenizer, examples, settings, judge=small_judge)
    rules = run_probe(model, tokenizer, examples, ProbeSettings(**{**settings.__dict__, "labeler": "rules"}))
    assert [r["rules_label"] for r in run.rows] == [r["label"] for r in rules.rows]
    assert [r["rules_grounded"] for r in run.rows] == [r["grounded"] for r in rules.rows]
    items = [{**r, "other_query": run.answers[r["mismatch_index"]]["query"],
              "other_answer": run.answers[r["mismatch_index"]]["answer"]} for r in run.rows]
    verdicts = small_judge.label(items)
    assert [r["label"] for r in run.rows] == [v.label for v in verdicts]
    assert [r["grounded"] for r in run.rows] == [v.grounded for v in verdicts]
    assert run.summary["labeler"] == "trained" and run.summary["judge"]["turns"] == 9
    grounded = sum(r["grounded"] for r in run.rows if r["temperature"] == 0) / 3
    assert run.summary["settings"][0]["grounded_followup_rate"] == pytest.approx(grounded)
    # What the training callback logs of it: the trained judge's record has no request errors (an LLM judge's has);
    # reading them raised a KeyError at the step-0 probe of every run with the trained judge.
    from uturn_train.probe.record import log_scalars

    logs = log_scalars(run.summary, "gsm8k", "trained")
    assert logs["probe/grounded_followup_rate/T0.0"] == pytest.approx(grounded) and "probe/judge_errors" not in logs


def test_classify_with_the_trained_judge(small_judge, tmp_path):
    from uturn_train.commands.classify import classify_file

    rows = [{"query": f"Ana buys {b} boxes of 4 pens. How many pens?", "answer": f"{b} * 4 = {4 * b} pens.",
             "user_turn": turn} for b in (2, 3) for turn in (f"Why did you multiply {b} by 4?", "Next: 9 * 9?")]
    path = tmp_path / "turns.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = classify_file(str(path), str(tmp_path / "out.jsonl"), judge=small_judge)
    assert [r["rules_label"] for r in out] == [r["label"] for r in classify_file(str(path), str(tmp_path / "r.jsonl"))]
    assert [r["label"] for r in out] == ["followup", "new_topic"] * 2
    assert [r["grounded"] for r in out] == [True, False] * 2
    # One context only: the judge labels, grounded is undefined.
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    assert [r["grounded"] for r in classify_file(str(path), str(tmp_path / "one.jsonl"), judge=small_judge)] == \
        [None, None]


def test_the_llm_judge_still_needs_its_endpoint_the_trained_one_none():
    from uturn_train.probe.settings import ProbeSettings

    assert ProbeSettings(labeler="trained").labeler == "trained"
    with pytest.raises(ValueError, match="labeler 'judge' needs judge_base_url.*or use labeler rules or trained"):
        ProbeSettings(labeler="judge")
    with pytest.raises(ValueError, match=r"labeler 'model' is not one of \('auto', 'rules', 'trained', 'judge'"):
        ProbeSettings(labeler="model")


def test_auto_is_the_rules_on_the_testbed_and_the_judge_elsewhere(tiny_qwen_dir):
    from uturn_train import ProbeArguments
    from uturn_train.commands.probe import ProbeScriptArguments
    from uturn_train.models import load_model, load_tokenizer
    from uturn_train.probe.runner import run_probe
    from uturn_train.probe.settings import ProbeSettings, resolve_labelers
    from uturn_train.tasks.base import Example
    from uturn_train.training.mining import MiningArguments
    from uturn_train.training.rl_data import RLArguments

    for task, want in (("testbed", "rules"), ("gsm8k", "trained"), ("oasst", "trained")):
        script, settings = ProbeScriptArguments(task=task), ProbeSettings()
        probe = ProbeArguments(probe_task=task, probe_data="x.jsonl" if task == "testbed" else None)
        mine = MiningArguments(mine_source=task, mine_data="x.jsonl")
        rl = RLArguments(prompt_source=task, prompt_data="x.jsonl")
        resolve_labelers(script, settings, probe, mine, rl)
        assert (settings.labeler, probe.probe_labeler, mine.mine_labeler, rl.reward_labeler) == (want,) * 4
        assert ProbeSettings().for_task(task).labeler == want
    chosen = ProbeSettings(labeler="rules")
    resolve_labelers(ProbeScriptArguments(task="oasst"), chosen)
    assert chosen.labeler == "rules" and ProbeSettings(labeler="trained").for_task("testbed").labeler == "trained"
    with pytest.raises(ValueError, match=r"mine_labeler 'judge' is not one of \('auto', 'rules', 'trained'\)"):
        MiningArguments(mine_source="gsm8k", mine_data="x.jsonl", mine_labeler="judge")
    with pytest.raises(ValueError, match=r"reward_labeler 'both' is not one of"):
        RLArguments(prompt_source="gsm8k", prompt_data="x.jsonl", reward_labeler="both")
    # Unresolved, the probe refuses before generating anything, and says how to choose.
    model, tokenizer = load_model(str(tiny_qwen_dir), device="cpu"), load_tokenizer(str(tiny_qwen_dir))
    with pytest.raises(ValueError, match=r"labeler 'auto' is chosen by the task: probe with `settings.for_task"):
        run_probe(model, tokenizer, [Example("e", "2 + 2?", "4")], ProbeSettings(setting="heldout"))


def test_the_grpo_reward_and_mining_follow_the_judge(small_judge):
    from uturn_train.chat import role_header_starts
    from uturn_train.tasks.base import Example
    from uturn_train.training.mining import followup_pairs
    from uturn_train.training.rewards import LABEL_REWARD, UserTurnReward

    tokenizer = small_judge.likelihoods.tokenizer
    rows = _synthetic(6)
    other = ("Ben has 7 cats. He gives 2 away.", "7 - 2 = 5 cats.")
    turns = [r["user_turn"] for r in rows] + ["7"]
    kind = ["user_turn"] * 6 + ["anchor"]
    query, answer = [r["query"] for r in rows] + ["q"], [r["answer"] for r in rows] + ["a"]
    reward = UserTurnReward(tokenizer, role_header_starts(tokenizer), small_judge)
    got = reward(turns, [tokenizer(t).input_ids for t in turns], kind, query, answer, [[other]] * 7)
    verdicts = small_judge.label([{"query": q, "answer": a, "user_turn": t, "other_query": other[0],
                                   "other_answer": other[1]} for q, a, t in zip(query, answer, turns[:6])])
    assert got[:6] == [1.0 if v.grounded else LABEL_REWARD[v.label] for v in verdicts] and got[6] is None
    assert got[:3] == [1.0, 0.0, 0.0]  # grounded; fits any answer; a new problem (as the synthetic rows are read)
    # Mining: with `judged`, the judge's grounded decision chooses; the rules' does not enter.
    ex = Example("e", QUERY, ANSWER)
    probe_rows = [{"user_turn": t, "label": "followup", "grounded": g, "temperature": 0.0 if i == 0 else 1.0,
                   "user_prompt": "p"} for i, (t, g) in enumerate([(TURNS[1], True), (TURNS[0], False)])]
    pairs = followup_pairs(ex, ANSWER, probe_rows, [other], use_reference=False, judged=True)
    assert [(p["chosen"], p["rejected"], p["rejected_label"]) for p in pairs] == \
        [(TURNS[1], TURNS[0], "ungrounded_followup")]
    assert followup_pairs(ex, ANSWER, probe_rows, [other], use_reference=False) == []  # the rules ground neither


def test_validate_decides_with_the_judge(small_judge, tiny_qwen_dir):
    from uturn_train.models import load_model, load_tokenizer
    from uturn_train.probe.rules.grounding import derangement
    from uturn_train.probe.validity.perturbations import GENERIC_QUESTIONS, ValidateSettings, validate
    from uturn_train.tasks.base import Example

    model, tokenizer = load_model(str(tiny_qwen_dir), device="cpu"), load_tokenizer(str(tiny_qwen_dir))
    rows = [r for r in _synthetic(12) if r["label"] == "followup"][:4]
    examples = [Example(f"e{i}", r["query"], r["answer"], reference_followup=r["user_turn"])
                for i, r in enumerate(rows)]
    settings = ValidateSettings(samples=2, max_new_tokens=6).settings()
    report, generated = validate(model, tokenizer, examples, settings, judge=small_judge, disable_progress=True)
    assert report["labeler"] == "trained"
    assert all("rules_label" in r for r in generated)  # the probe's turns were labelled by the judge
    # The generic questions are decided by the judge, each context against its derangement partner.
    other = derangement(4, settings.seed)
    items = [{"query": ex.query, "answer": ex.answer, "user_turn": q, "other_query": examples[other[i]].query,
              "other_answer": examples[other[i]].answer} for i, ex in enumerate(examples) for q in GENERIC_QUESTIONS]
    generic = next(c for c in report["checks"] if c["name"] == "generic questions")
    assert generic["n"] == len(items)
    assert generic["rate"] == pytest.approx(sum(v.grounded for v in small_judge.label(items)) / len(items))
    real = report["data_turns"]["real"]["grounded"]
    assert real["n"] == 4 and real["rate"] == sum(v.grounded for v in small_judge.label([
        {**items[i * len(GENERIC_QUESTIONS)], "user_turn": ex.reference_followup}
        for i, ex in enumerate(examples)])) / 4
