"""Tiny offline Qwen3.5 models and tokenizers for tests and benchmarks (the hub is never reached).

A byte-level BPE is trained on the fly on generated chat-like text (~0.1 s) and paired with a real chat template; the
model is a 4-layer `Qwen3_5ForCausalLM` (3 Gated DeltaNet layers + 1 full-attention layer, as in the real model) with
seeded random weights. Its output is gibberish, which is all plumbing tests need.
"""

import importlib.util
import random
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5TextConfig,
)
from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

from uturn_train.chat import user_turn_prompt

# The real templates TRL ships (qwen3_5_*, llama3, gemma, ...), found without importing trl.
CHAT_TEMPLATES = Path(importlib.util.find_spec("trl").origin).parent / "chat_templates"
QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIAL_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

_NAMES = "Ana Ben Chloe Dev Emma Farid Grace Hugo Ivy Jon Kara Liam Maya Noah Olga Priya Quinn Rosa Sam Tara".split()
_THINGS = (
    "apples books eggs marbles pencils stamps tickets cookies shells coins bottles flowers chairs candles shirts "
    "lemons boxes cards stickers oranges baskets cupcakes puzzles balloons notebooks sandwiches dollars minutes"
).split()
_VERBS = "buys sells finds loses gives bakes collects paints reads plants earns spends saves shares packs".split()
_WORDS = (
    "because therefore however answer question explain example problem solution number total each every half "
    "twice percent average price cost week month year hour morning evening market school garden kitchen friend "
    "teacher students family brother sister remainder difference product quotient equation simplify calculate "
    "check again wrong right correct mistake understand clarify simpler longer detail step next another variant "
    "please thanks great sorry maybe probably really actually different similar original assistant user model "
    "function python code write list string value return error test result output input file table chart data"
).split()
_OPENERS = [
    "Can you explain why",
    "Thanks! What if",
    "Wait, how did you get",
    "Could you show me how",
    "I don't understand why",
    "Sure! Here is how",
    "Great question. First,",
    "That makes sense, but what about",
]


def chat_corpus(n: int = 800, seed: int = 0) -> list[str]:
    """Generated chat-like English with arithmetic, enough for a ~1-2k byte-level BPE vocabulary."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        name, thing, verb = rng.choice(_NAMES), rng.choice(_THINGS), rng.choice(_VERBS)
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        words = " ".join(rng.sample(_WORDS, 8))
        lines += [
            f"{name} has {a} {thing} and {verb} {b} more. How many {thing} does {name} have now?",
            f"{name} has {a} + {b} = {a + b} {thing}. The answer is {a + b}.\n#### {a + b}",
            f"{rng.choice(_OPENERS)} {name} ends up with {a * b} {thing} after {b} days? {words.capitalize()}.",
            f"Step {rng.randint(1, 9)}: {a} * {b} = {a * b}, so {a * b} / {b} = {a}. ({words})",
        ]
    return lines


def build_tokenizer(
    chat_template: str,
    special_tokens: list[str],
    *,
    eos_token: str,
    pad_token: str | None = None,
    bos_token: str | None = None,
    added_tokens: list[str] | None = None,
    vocab_size: int = 2048,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on [`chat_corpus`] and wrap it with a chat template.

    Args:
        chat_template (`str`): Jinja chat template.
        special_tokens (`list[str]`): special tokens (never split, skipped when decoding with `skip_special_tokens`).
        eos_token, pad_token, bos_token (`str`): must be among `special_tokens`; no pad token is a valid setup.
        added_tokens (`list[str]`, *optional*): non-special added tokens (e.g. `<think>`), kept when decoding.
        vocab_size (`int`): BPE vocabulary size, special tokens included.
    """
    backend = Tokenizer(models.BPE())
    # Qwen3.5's own normalizer and pre-tokenizer: AutoTokenizer loads a folder whose config is `qwen3_5` (the VL
    # layout) as `Qwen3_5Tokenizer`, which rebuilds them in Python; training with them keeps both loads identical.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(chat_corpus(), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=eos_token,
        pad_token=pad_token,
        bos_token=bos_token,
        chat_template=chat_template,
    )
    if added_tokens:
        tokenizer.add_tokens(added_tokens)
    return tokenizer


def qwen_tokenizer(template: str = "qwen3_5_nothink") -> PreTrainedTokenizerFast:
    """The real Qwen3.5 template with Qwen's special tokens (eos `<|im_end|>`, pad `<|endoftext|>`)."""
    return build_tokenizer(
        (CHAT_TEMPLATES / f"{template}.jinja").read_text(),
        QWEN_SPECIAL_TOKENS,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        added_tokens=["<think>", "</think>"],
    )


def llama_tokenizer() -> PreTrainedTokenizerFast:
    """TRL's Llama-3 template; like Llama-3-Instruct it has no pad token (eos `<|eot_id|>`)."""
    return build_tokenizer(
        (CHAT_TEMPLATES / "llama3.jinja").read_text(),
        LLAMA_SPECIAL_TOKENS,
        eos_token="<|eot_id|>",
        bos_token="<|begin_of_text|>",
    )


def tiny_text_config(tokenizer) -> Qwen3_5TextConfig:
    """Qwen3.5 decoder at toy size: 4 layers, every 4th full attention (the default `layer_types`)."""
    return Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        # Wider than the default 0.02: at 0.02 every prompt greedily decodes to the same repeated token, which would
        # make tests of batching, ordering and stop strings pass vacuously.
        initializer_range=0.1,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


def tiny_causal_lm(tokenizer, seed: int = 0) -> Qwen3_5ForCausalLM:
    """A seeded random-init tiny `Qwen3_5ForCausalLM` (fp32, eval mode); the caller's CPU RNG is untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3_5ForCausalLM(tiny_text_config(tokenizer)).eval()


def tiny_llama_lm(tokenizer, seed: int = 0):
    """A seeded random-init tiny `LlamaForCausalLM` (attention layers only, as SmolLM2): the engine computes its prompts
    one by one, which it cannot for Qwen3.5's recurrent layers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         initializer_range=0.1, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


def tiny_vl_model(tokenizer, seed: int = 0) -> Qwen3_5ForConditionalGeneration:
    """The hub layout of Qwen3.5 (`Qwen3_5ForConditionalGeneration`) with a 1-block vision tower."""
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 4,
        "out_hidden_size": 64,  # = text hidden_size: the merger projects into the decoder's width
        "num_position_embeddings": 64,
    }
    config = Qwen3_5Config(
        text_config=tiny_text_config(tokenizer).to_dict(), vision_config=vision, tie_word_embeddings=True
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3_5ForConditionalGeneration(config).eval()


def save(model, tokenizer, path) -> Path:
    """`save_pretrained` model and tokenizer into one folder, as a hub checkpoint is laid out."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def conversations(tokenizer, n: int = 7) -> list[str]:
    """User-turn prompts of clearly different lengths, in no particular length order."""
    lines = chat_corpus(2 * n, seed=1)
    prompts = []
    for i in range(n):
        answer = " ".join(lines[2 * i + 1 : 2 * i + 2 + (i * 3) % 5])
        messages = [{"role": "user", "content": lines[2 * i]}, {"role": "assistant", "content": answer}]
        prompts.append(user_turn_prompt(tokenizer, messages))
    return prompts
