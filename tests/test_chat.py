"""User-turn prompts and stop strings from real chat templates (tiny tokenizers trained offline, see
tests/helpers/tiny.py)."""

import pytest
from helpers import tiny
from transformers import AutoTokenizer

from uturn_train.chat import ChatTemplateError, answer_prompt, stop_strings, user_turn_prompt

THINKING_ANSWER = "<think>\nAdd them.\n</think>\n\n2 + 2 = 4."
CONVERSATION = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": THINKING_ANSWER}]

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PLAIN = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ 'User: ' + m['content'] + '\\n' }}"
    "{% else %}{{ 'Bot: ' + m['content'] + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Bot:' }}{% endif %}"
)
# Role tags that share only the character "<": the shared start of a header must be whole tokens.
TAGGED = "{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] + '</s>' }}{% endfor %}"


def template(name: str) -> str:
    return (tiny.CHAT_TEMPLATES / f"{name}.jinja").read_text()


@pytest.fixture(scope="module")
def qwen(tiny_qwen_dir):
    return AutoTokenizer.from_pretrained(tiny_qwen_dir)


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def test_qwen35_nothink_prompt_drops_earlier_think_blocks(qwen):
    expected = (
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n2 + 2 = 4.<|im_end|>\n<|im_start|>user\n"
    )
    assert user_turn_prompt(qwen, CONVERSATION) == expected
    # enable_thinking only changes the generation prompt of this template, never earlier turns.
    assert user_turn_prompt(qwen, CONVERSATION, enable_thinking=True) == expected
    assert answer_prompt(qwen, CONVERSATION[:1]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert answer_prompt(qwen, CONVERSATION[:1], enable_thinking=True).endswith("<|im_start|>assistant\n<think>\n")
    assert stop_strings(qwen) == ["<|im_end|>", "<|im_start|>"]


def test_qwen35_think_template_system_and_multi_turn():
    qwen = tiny.qwen_tokenizer("qwen3_5_think")
    messages = [{"role": "system", "content": "Be brief."}, *CONVERSATION, *CONVERSATION]
    prompt = user_turn_prompt(qwen, messages)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert prompt.endswith("<|im_start|>assistant\n2 + 2 = 4.<|im_end|>\n<|im_start|>user\n")
    assert prompt.count("<|im_start|>assistant\n2 + 2 = 4.") == 2 and "<think>" not in prompt
    assert user_turn_prompt(qwen, messages, enable_thinking=True) == prompt
    # This template thinks unless told otherwise; ours is told: thinking is off unless asked for.
    assert answer_prompt(qwen, CONVERSATION[:1]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert answer_prompt(qwen, CONVERSATION[:1], enable_thinking=True).endswith("<|im_start|>assistant\n<think>\n")


def test_llama3_prompt_and_stops(llama):
    assert user_turn_prompt(llama, CONVERSATION) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 2?<|eot_id|>"
        f"<|start_header_id|>assistant<|end_header_id|>\n\n{THINKING_ANSWER}<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n"
    )
    assert stop_strings(llama) == ["<|eot_id|>", "<|start_header_id|>"]


@pytest.mark.parametrize(
    "chat_template, special_tokens, eos, expected_prompt, expected_stops",
    [
        (
            CHATML,
            ["<|im_end|>", "<|im_start|>"],
            "<|im_end|>",
            f"<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n{THINKING_ANSWER}<|im_end|>\n"
            "<|im_start|>user\n",
            ["<|im_end|>", "<|im_start|>"],
        ),
        (  # Gemma maps "assistant" to "model"
            template("gemma"),
            ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
            "<eos>",
            f"<bos><start_of_turn>user\nWhat is 2 + 2?<end_of_turn>\n<start_of_turn>model\n{THINKING_ANSWER}"
            "<end_of_turn>\n<start_of_turn>user\n",
            ["<end_of_turn>", "<eos>", "<start_of_turn>"],
        ),
        (
            PLAIN,
            ["<|endoftext|>"],
            "<|endoftext|>",
            f"User: What is 2 + 2?\nBot: {THINKING_ANSWER}\nUser: ",
            ["<|endoftext|>", "\nBot:", "\nUser:"],
        ),
        (
            TAGGED,
            ["</s>", "<user>", "<assistant>"],
            "</s>",
            f"<user>What is 2 + 2?</s><assistant>{THINKING_ANSWER}</s><user>",
            ["</s>", "<assistant>", "<user>"],
        ),
    ],
    ids=["chatml", "gemma-model-role", "plain-text", "tagged"],
)
def test_other_templates(chat_template, special_tokens, eos, expected_prompt, expected_stops):
    tokenizer = tiny.build_tokenizer(chat_template, special_tokens, eos_token=eos, bos_token=special_tokens[0])
    assert user_turn_prompt(tokenizer, CONVERSATION) == expected_prompt
    assert stop_strings(tokenizer) == expected_stops


def test_no_chat_template():
    tokenizer = tiny.build_tokenizer(None, tiny.QWEN_SPECIAL_TOKENS, eos_token="<|im_end|>")
    for render in (user_turn_prompt, answer_prompt):
        with pytest.raises(ChatTemplateError, match="has no chat template.*set `tokenizer.chat_template`"):
            render(tokenizer, CONVERSATION)
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        stop_strings(tokenizer)


@pytest.mark.parametrize(
    "content",
    ["''", "m['content'] | e", "m['content'] | tojson", "m['content'] + m['content']"],
    ids=["dropped", "html-escaped", "json", "repeated"],
)
def test_template_that_mangles_content(content):
    chat_template = CHATML.replace("m['content']", content, 1)
    tokenizer = tiny.build_tokenizer(chat_template, ["<|im_end|>", "<|im_start|>"], eos_token="<|im_end|>")
    with pytest.raises(ChatTemplateError, match="does not render message content verbatim"):
        user_turn_prompt(tokenizer, CONVERSATION)
    with pytest.raises(ChatTemplateError, match="does not render message content verbatim"):
        stop_strings(tokenizer)


def test_rejected_conversations_name_the_rule(qwen, tiny_qwen_dir):
    misplaced_system = [CONVERSATION[0], {"role": "system", "content": "Be brief."}, CONVERSATION[1]]
    with pytest.raises(ChatTemplateError, match=r"rejects .*'system'.*System message must be at the beginning\."):
        user_turn_prompt(qwen, misplaced_system)
    with pytest.raises(ChatTemplateError, match="No user query found in messages.") as error:
        answer_prompt(qwen, [{"role": "system", "content": "Be brief."}])
    assert str(tiny_qwen_dir) in str(error.value)

    gemma = tiny.build_tokenizer(template("gemma"), ["<bos>", "<eos>"], eos_token="<eos>", bos_token="<bos>")
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        user_turn_prompt(gemma, CONVERSATION[:1])  # user followed by the probe's user turn
