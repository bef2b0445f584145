"""Prompts and stop strings from the model's own chat template.

The user-turn probe makes a chat model write the *user's* next turn. The prompt is the conversation rendered by the
model's template, followed by a user message whose content is a sentinel, cut right before the sentinel: it ends with
exactly the header this template puts before user content (`<|im_start|>user\\n`, `<|start_header_id|>user
<|end_header_id|>\\n\\n`, `<start_of_turn>user\\n`, `User: `...). Nothing is hard-coded per template, so earlier turns
are rendered exactly as the template renders them (Qwen3.5 drops the think blocks of earlier assistant turns).
"""

import jinja2

# Sentinels hold characters that HTML or JSON escaping rewrites, so a template that escapes content fails loudly
# instead of yielding a prompt that ends inside an escaped string.
SENTINEL = "<&\"uturn-sentinel-0\"&>"
_SENTINELS = tuple(SENTINEL.replace("0", str(i)) for i in (1, 2, 3))


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot render the conversation the probe needs."""


def _name(tokenizer) -> str:
    return tokenizer.name_or_path or type(tokenizer).__name__


def render(tokenizer, messages: list[dict], *, add_generation_prompt: bool, enable_thinking: bool = False) -> str:
    if not tokenizer.chat_template:
        raise ChatTemplateError(
            f"the tokenizer of {_name(tokenizer)!r} has no chat template: the probe renders turns with the model's "
            "own template. Use a chat (instruct) checkpoint, or set `tokenizer.chat_template` and save the tokenizer."
        )
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking
        )
    except jinja2.TemplateError as e:
        roles = [m.get("role") for m in messages]
        raise ChatTemplateError(
            f"the chat template of {_name(tokenizer)!r} rejects the conversation with roles {roles}: {e} "
            "Fix the messages so that they follow this template's rules."
        ) from e


def _find(tokenizer, rendered: str, sentinel: str) -> int:
    count = rendered.count(sentinel)
    if count != 1:
        raise ChatTemplateError(
            f"the chat template of {_name(tokenizer)!r} does not render message content verbatim (a sentinel message "
            f"appears {count} times instead of once: the template drops, escapes, rewrites or repeats content), so "
            "the prompt cannot be cut at the start of a turn. Use a template that renders `message.content` as is."
        )
    return rendered.index(sentinel)


def user_turn_prompt(tokenizer, messages: list[dict], *, enable_thinking: bool = False) -> str:
    """The text that makes the model write the next **user** turn after `messages`.

    Args:
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): tokenizer with a chat template.
        messages (`list[dict]`): the conversation so far, e.g. `[{"role": "user", ...}, {"role": "assistant", ...}]`.
        enable_thinking (`bool`, *optional*, defaults to `False`): passed to the template (Qwen3-style templates).

    Returns:
        `str`: the conversation followed by the template's user header, e.g. `...<|im_end|>\\n<|im_start|>user\\n`.

    Raises:
        [`ChatTemplateError`]: no template, a template that rejects the conversation or that mangles content.
    """
    rendered = render(
        tokenizer,
        [*messages, {"role": "user", "content": SENTINEL}],
        add_generation_prompt=False,
        enable_thinking=enable_thinking,
    )
    return rendered[: _find(tokenizer, rendered, SENTINEL)]


def answer_prompt(tokenizer, messages: list[dict], *, enable_thinking: bool = False) -> str:
    """The text that makes the model write the next **assistant** turn (`add_generation_prompt=True`).

    Args:
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): tokenizer with a chat template.
        messages (`list[dict]`): the conversation so far, ending with a user message.
        enable_thinking (`bool`, *optional*, defaults to `False`): always passed to the template, so thinking is off
            unless asked for, even with a template that thinks by default (Qwen3.5 then opens the answer with an empty
            think block, `<think>\\n\\n</think>\\n\\n`).

    Raises:
        [`ChatTemplateError`]: no template, or a template that rejects the conversation.
    """
    return render(tokenizer, messages, add_generation_prompt=True, enable_thinking=enable_thinking)


def _header_after(separator: str, end_of_turn: str) -> str:
    # A separator is "end of the previous turn + header of the next". Whitespace right after an end-of-turn token is
    # template layout; without an end-of-turn token (plain-text templates) the newline *is* the turn boundary.
    if end_of_turn and end_of_turn in separator:
        return separator.split(end_of_turn, 1)[1].lstrip()
    return separator


def _turn_markers(tokenizer) -> tuple[list[str], list[str]]:
    """(end-of-turn markers, role-header starts) of the tokenizer's template; see [`stop_strings`]."""
    u1, a1, u2 = _SENTINELS
    conversation = [
        {"role": "user", "content": u1},
        {"role": "assistant", "content": a1},
        {"role": "user", "content": u2},
    ]
    full = render(tokenizer, conversation, add_generation_prompt=False)
    answered = render(tokenizer, conversation[:2], add_generation_prompt=False)
    i_u1, i_a1, i_u2 = (_find(tokenizer, full, s) for s in _SENTINELS)
    user_end = full[i_u2 + len(u2) :].strip()
    assistant_end = answered[_find(tokenizer, answered, a1) + len(a1) :].strip()
    assistant_header = _header_after(full[i_u1 + len(u1) : i_a1], user_end)
    user_header = _header_after(full[i_a1 + len(a1) : i_u2], assistant_end)

    # Compare tokens, not characters: `<user>` and `<assistant>` share "<" but no token.
    ids_user = tokenizer.encode(user_header, add_special_tokens=False)
    ids_assistant = tokenizer.encode(assistant_header, add_special_tokens=False)
    n = 0
    while n < min(len(ids_user), len(ids_assistant)) and ids_user[n] == ids_assistant[n]:
        n += 1
    header_start = tokenizer.decode(ids_user[:n], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    headers = [header_start.rstrip()] if header_start.strip() else [assistant_header.rstrip(), user_header.rstrip()]

    ends = [s for s in dict.fromkeys([user_end, assistant_end, tokenizer.eos_token]) if s and s.strip()]
    return ends, [h for h in headers if h not in ends]


def role_header_starts(tokenizer) -> list[str]:
    """The stop strings that open another role's header (`<|im_start|>`, `<|start_header_id|>`, `"\\nBot:"`)."""
    return _turn_markers(tokenizer)[1]


def stop_strings(tokenizer) -> list[str]:
    """Strings that end a generated turn: the template's end-of-turn marker(s), eos, and the start of a role header.

    Found by rendering `[user, assistant, user]` with sentinel contents: what follows a turn's content is its end of
    turn (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`), what precedes the next content is that role's header. The
    leading tokens shared by the user and assistant headers start any header (`<|im_start|>`, `<|start_header_id|>`,
    `<start_of_turn>`); templates whose headers share none (`User: ` / `Bot: `) stop on the full headers instead
    (`"\\nUser:"`, `"\\nBot:"`).

    Raises:
        [`ChatTemplateError`]: no template, or a template that rejects or mangles the probe conversation.
    """
    ends, headers = _turn_markers(tokenizer)
    return ends + headers
