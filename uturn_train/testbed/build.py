"""Build the testbed from scratch: the world's data, a byte-level BPE tokenizer, a tiny Qwen3.5, its pre-training.

Everything is seeded and the number of training steps is fixed, but another CPU's float kernels change the training
as another seed would (one build gave step-0 accuracy 0.575 on one AVX2 EPYC, 0.690 on another). So the weights of the
seed-0 build ship with the toolkit (`SHIPPED`, checksummed): `build(..., shipped=SHIPPED)` writes the same data and
takes the tokenizer and weights from there instead of training, and every user starts from the same step 0.
`measure` probes the result; its figures go into the card.
"""

import hashlib
import importlib.util
import json
import logging
import math
import random
import resource
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..io import write_jsonl
from .turns import conversation, followup
from .world import sample_problem

logger = logging.getLogger(__name__)

TEMPLATE = Path(importlib.util.find_spec("trl").origin).parent / "chat_templates" / "qwen3_5_nothink.jinja"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SHIPPED = Path(__file__).with_name("weights")  # the seed-0 build's model, tokenizer and card
SHIPPED_SHA256 = "a85fb343bdd2cd09df5ce9ee3666e5dc375e8a9f0679d3eeb04948b19708c257"  # of SHIPPED / model.safetensors
SHIPPED_FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class BuildConfig:
    """What a build does; saved in `card.json`.

    Args:
        steps (`int`): optimizer steps; fixed, so that the result does not depend on the machine's speed (1,200: at
            800, four of ten builds of mixtures with information gaps collapsed, docs/testbed.md).
        tokens_per_step (`int`): rows x padded length of each step's batch (one conversation per row).
        second_turn (`dict`): shares of the training conversations by what follows the first answer. Most second
            user turns are new problems and most of those open with the same lead-in, so greedy decoding picks that
            opening: greedy decoding takes the most likely first token, so a turn kind that is rare at its first token
            stays out of greedy turns while sampling reaches it in proportion. `info_gap` conversations pose a problem
            without one number instead, and the assistant restates the sentence with the gap and asks for it
            (`turns.info_gap_conversation`; 2.5%: the builds at other shares are in docs/collab.md).
        ask_rate (`float`): share of answers that end with a question to the user.
    """

    steps: int = 1200
    tokens_per_step: int = 2048
    lr: float = 3e-3
    warmup_steps: int = 40
    weight_decay: float = 0.05
    vocab_size: int = 1024
    hidden_size: int = 128
    num_hidden_layers: int = 4
    intermediate_size: int = 384
    rope_theta: float = 1e4
    n_heldout: int = 500
    n_conversations: int = 2000  # for collaboration SFT, beside the pre-training mixture
    probe_limit: int = 200  # held-out problems `measure` probes for the card
    probe_samples: int = 4
    second_turn: dict = field(default_factory=lambda: {
        "single": 0.2, "new_problem": 0.55, "followup": 0.2, "acknowledgement": 0.05, "info_gap": 0.025})
    ask_rate: float = 0.15

    @classmethod
    def smoke(cls) -> "BuildConfig":
        return cls(steps=12, n_heldout=20, n_conversations=20, probe_limit=4, probe_samples=2)


# ---------------------------------------------------------------------------------------------------------------------
# Data
def render(messages: list[dict]) -> str:
    """What `apply_chat_template` renders with the Qwen3.5 template, without jinja (fast enough for the whole mixture).

    Qwen3.5 gives the empty think block only to assistant turns after the last user turn. `build` checks this against
    the real template on a sample of the mixture.
    """
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    parts = []
    for i, m in enumerate(messages):
        think = "<think>\n\n</think>\n\n" if m["role"] == "assistant" and i > last_user else ""
        parts.append(f"<|im_start|>{m['role']}\n{think}{m['content'].strip()}<|im_end|>\n")
    return "".join(parts)


def make_heldout(rng: random.Random, n: int) -> list[dict]:
    """Held-out problems, each with a real follow-up from the world for the heldout setting (and its `Problem`, from
    which `collab.py` derives the collaboration tasks)."""
    rows, keys = [], set()
    while len(rows) < n:
        problem = sample_problem(rng)
        if problem.key in keys:
            continue
        keys.add(problem.key)
        rows.append({"question": problem.question, "answer": problem.solution,
                     "followup": followup(rng, problem)[1], "key": problem.key, "problem": problem})
    return rows


def make_conversations(rng: random.Random, n: int, mixture: dict, ask_rate: float, avoid: set) -> list[dict]:
    """`n` conversations whose problems are none of the held-out ones (`avoid`: problem keys)."""
    rows = []
    while len(rows) < n:
        messages, kind, problems = conversation(rng, mixture, ask_rate)
        if not any(p.key in avoid for p in problems):
            rows.append({"messages": messages, "kind": kind})
    return rows


BUCKETS = (128, 160, 192, 224, 256, 320)


def plan_batches(lengths: list[int], steps: int, tokens_per_step: int) -> list[tuple[int, list[int]]] | None:
    """Group conversations into `steps` batches of one conversation per row, padded to a length bucket.

    A row holds a single conversation, as the probe's prompts do: with several per row the model must also learn to
    ignore the earlier ones, and it learns to copy names and numbers from the question much later. A few fixed shapes
    (rows x bucket = `tokens_per_step`) keep memory flat, since the linear-attention fallbacks allocate per shape.
    Batches come in the order they fill, which follows the data's. Returns `(bucket, indices)` per batch, or None if
    there are not enough conversations yet.
    """
    open_rows = {b: [] for b in BUCKETS}
    plan = []
    for index, n in enumerate(lengths):
        bucket = next((b for b in BUCKETS if n <= b), None)
        if bucket is None:
            continue  # longer than any bucket: rare, and never cut in half
        open_rows[bucket].append(index)
        if len(open_rows[bucket]) == tokens_per_step // bucket:
            plan.append((bucket, open_rows[bucket]))
            open_rows[bucket] = []
            if len(plan) == steps:
                return plan
    return None


def to_tensors(sequences: list[list[int]], bucket: int, pad_id: int):
    """Right-padded `input_ids` and `labels` (-100 on padding) of one batch."""
    import torch

    ids = torch.full((len(sequences), bucket), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = labels[row, : len(seq)] = torch.tensor(seq)
    return ids, labels


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer and model
def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with Qwen's pre-tokenizer (one token per digit), wrapped with the real Qwen3.5 template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    # Qwen's split, except that a digit keeps the space before it (" 6", not " " + "6"): a number copied from the
    # question then follows the word it follows there ("has 6"), not a space token found everywhere.
    digit_keeps_space = PRETOKENIZE_REGEX.replace(r"|\p{N}|", r"| ?\p{N}|")
    assert digit_keeps_space != PRETOKENIZE_REGEX, "transformers changed Qwen's pre-tokenizer regex"
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(digit_keeps_space), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        chat_template=TEMPLATE.read_text())
    tokenizer.add_tokens(["<think>", "</think>"])  # as in Qwen3.5: added, but kept when decoding
    return tokenizer


def make_model(tokenizer, config: BuildConfig):
    """A tiny `Qwen3_5ForCausalLM`: Gated DeltaNet and full-attention layers with Qwen3.5-2B's module names.

    Qwen3.5 puts full attention on every 4th layer; here every 2nd. With a single attention layer (on top of three
    Gated DeltaNet layers) the model had not learned to copy numbers from the question after 1,700 steps; with two
    it copies a synthetic sequence after ~100 steps instead of ~300, which is what makes a useful testbed in minutes.
    """
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    text_config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, layer_types=["linear_attention", "full_attention"] * 2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, max_position_embeddings=2048, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen3_5ForCausalLM(text_config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def train(model, data: list, config: BuildConfig, disable_progress: bool = False) -> list[float]:
    """Plain pre-training loop in float32: AdamW, linear warm-up then cosine decay over the fixed number of steps.

    Accuracy rises late, as the learning rate anneals, so the schedule spans exactly the steps that will run. No bf16
    autocast: CPUs without native bf16 (AVX2 only) emulate it, 13x slower per step, and one numeric path makes a seed
    give the same testbed on every CPU.
    """
    import torch
    from tqdm.auto import tqdm

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))

    def lr_at(step):
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model.train()
    losses = []
    bar = tqdm(data, desc="pre-training the testbed", disable=disable_progress)
    for ids, labels in bar:
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    model.eval()
    return losses


# ---------------------------------------------------------------------------------------------------------------------
def measure(out_dir: str | Path, limit: int = 200, samples: int = 4) -> dict:
    """The probe on the held-out problems, self setting, greedy and T=1.0: accuracy and follow-up rates."""
    from ..models import load_model, load_tokenizer
    from ..probe.record import flat_figures
    from ..probe.runner import run_probe
    from ..probe.settings import ProbeSettings
    from ..tasks import load_task

    tokenizer, model = load_tokenizer(str(out_dir)), load_model(str(out_dir), device="cpu")
    examples = load_task("testbed", data=str(Path(out_dir) / "heldout.jsonl"), limit=limit)
    summary = run_probe(model, tokenizer, examples, ProbeSettings(temperatures=[0.0, 1.0], samples=samples,
                                                                       labeler="rules")).summary
    return {"n_prompts": summary["n_prompts"], "accuracy": summary["accuracy"], **flat_figures(summary),
            "samples": samples,
            "categories": {f"T{s['temperature']:g}": s["categories"] for s in summary["settings"]}}


def build(out: Path, *, seed: int, config: BuildConfig, probe: bool = True, shipped: Path | None = None) -> dict:
    """Build into the (empty) directory `out`; returns the card. With `shipped` (a folder of `SHIPPED_FILES` and the
    build's `card.json`), the data is drawn as in a build but the tokenizer and weights are the shipped ones (checked
    against `SHIPPED_SHA256` when it is `SHIPPED`): seconds instead of minutes, and no training."""
    import torch
    from transformers import PreTrainedTokenizerFast, set_seed

    if shipped is not None:
        shipped_card = json.loads((shipped / "card.json").read_text())
        if (seed, asdict(config)) != (shipped_card["seed"], shipped_card["config"]):
            raise ValueError(f"{shipped}: the shipped testbed is seed {shipped_card['seed']} of its card's config; "
                             f"seed {seed} or another config needs `uturn testbed build` (minutes)")
        if Path(shipped).resolve() == SHIPPED.resolve() and sha256(shipped / "model.safetensors") != SHIPPED_SHA256:
            raise ValueError(f"{shipped}/model.safetensors is not the file this version ships (sha256 differs): "
                             "reinstall uturn-train, or build the testbed with `uturn testbed build`")

    start = time.perf_counter()
    set_seed(seed)
    rng = random.Random(seed)
    heldout = make_heldout(rng, config.n_heldout)
    avoid = {r.pop("key") for r in heldout}
    sft = make_conversations(rng, config.n_conversations, {"followup": 1.0}, config.ask_rate, avoid)

    # The mixture, in chunks until every step's rows can be filled; the tokenizer learns from the first chunk.
    mixture = make_conversations(rng, 2000, config.second_turn, config.ask_rate, avoid)
    tokenizer = (PreTrainedTokenizerFast.from_pretrained(shipped) if shipped is not None
                 else train_tokenizer([render(r["messages"]) for r in mixture], config.vocab_size))
    for row in mixture[:50]:
        if tokenizer.apply_chat_template(row["messages"], tokenize=False) != render(row["messages"]):
            raise RuntimeError("the fast renderer no longer matches the Qwen3.5 template; fix `render`")
    eot = tokenizer.pad_token  # ends each conversation, as documents end in pre-training
    sequences = tokenizer([render(r["messages"]) + eot for r in mixture])["input_ids"]
    while (plan := plan_batches(list(map(len, sequences)), config.steps, config.tokens_per_step)) is None:
        more = make_conversations(rng, 2000, config.second_turn, config.ask_rate, avoid)
        mixture += more
        sequences += tokenizer([render(r["messages"]) + eot for r in more])["input_ids"]
    mixture = [mixture[i] for i in sorted(i for _, rows in plan for i in rows)]

    data_s = time.perf_counter() - start
    if shipped is not None:
        for name in SHIPPED_FILES:
            shutil.copyfile(shipped / name, out / name)
    else:  # the batches' tensors only where they are trained on
        data = [to_tensors([sequences[i] for i in rows], bucket, tokenizer.pad_token_id) for bucket, rows in plan]
        model = make_model(tokenizer, config)
        losses = train(model, data, config)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    train_s = time.perf_counter() - start - data_s
    write_jsonl(out / "train.jsonl", mixture)
    write_jsonl(out / "heldout.jsonl", ({"question": r["question"], "answer": r["answer"]} for r in heldout))
    write_jsonl(out / "heldout_triples.jsonl",
                 ({"query": r["question"], "answer": r["answer"], "followup": r["followup"]} for r in heldout))
    write_jsonl(out / "conversations.jsonl", ({"messages": r["messages"]} for r in sft))

    kinds = {}
    for r in mixture:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    if shipped is not None:
        card = {**shipped_card, "installed": {"from": str(shipped), "sha256": sha256(out / "model.safetensors"),
                                              "time_s": round(time.perf_counter() - start, 1)}}
        if card["data"]["train_kinds"] != kinds:
            raise RuntimeError(f"the data drawn here differs from the shipped build's ({kinds} against "
                               f"{card['data']['train_kinds']}): this version draws another world; rebuild")
        return card
    card = {
        "seed": seed,
        "config": asdict(config),
        "model": {"class": type(model).__name__, "params": sum(p.numel() for p in model.parameters()),
                  "layer_types": model.config.layer_types, "vocab_size": len(tokenizer)},
        "data": {"train_conversations": len(mixture), "train_kinds": kinds,
                 "train_tokens": sum(int((labels != -100).sum()) for _, labels in data), "heldout": len(heldout),
                 "heldout_triples": len(heldout), "conversations": len(sft)},
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "loss_curve": [round(sum(losses[i:i + 50]) / len(losses[i:i + 50]), 3) for i in range(0, len(losses), 50)],
        "time_s": {"data": round(data_s, 1), "train": round(train_s, 1),
                   "build": round(time.perf_counter() - start, 1)},
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "sha256": sha256(out / "model.safetensors"),
    }
    if probe:
        t = time.perf_counter()
        card["probe"] = measure(out, limit=config.probe_limit, samples=config.probe_samples)
        card["time_s"]["probe"] = round(time.perf_counter() - t, 1)
    return card
