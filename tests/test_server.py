"""The server backend against a real `transformers serve` on the tiny Qwen3.5, and against scripted vLLM-style
replies."""

import threading
import time

import pytest
import torch
from helpers import tiny
from helpers.serve import ScriptedServer, TransformersServer
from transformers import AutoModelForCausalLM, AutoTokenizer

from uturn_train.chat import stop_strings, user_turn_prompt
from uturn_train.generation import generate
from uturn_train.server import CompletionsClient


def conversations(tokenizer, n: int = 8) -> list[str]:
    lines = tiny.chat_corpus(2 * n, seed=1)
    return [user_turn_prompt(tokenizer, [{"role": "user", "content": lines[2 * i]},
                                         {"role": "assistant", "content": lines[2 * i + 1]}]) for i in range(n)]


@pytest.fixture(scope="module")
def local(tiny_qwen_dir):
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.float32).eval()
    return model, tokenizer, conversations(tokenizer)


@pytest.fixture(scope="module")
def server(tiny_qwen_dir, tmp_path_factory):
    server = TransformersServer(tiny_qwen_dir, tmp_path_factory.mktemp("serve") / "server.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(local):
    """Local greedy turns: 48 tokens is enough for some to end on `<|im_end|>`, not for all."""
    model, tokenizer, prompts = local
    return generate(model, tokenizer, prompts, max_new_tokens=48, disable_progress=True)


def test_greedy_turns_equal_the_local_backend(local, server, reference):
    _, tokenizer, prompts = local
    client = CompletionsClient(server.base_url, tokenizer, concurrency=3).check()
    assert client.flavour == "transformers" and client.model == str(server.model_dir)
    remote = client.generate(prompts, max_new_tokens=48, disable_progress=True)
    assert client.errors == 0 and [len(g) for g in remote] == [1] * len(prompts)
    ended = 0
    for (want,), (got,) in zip(reference, remote):
        assert (got.text, got.finish_reason, got.prompt_tokens, got.completion_tokens) == (
            want.text, want.finish_reason, want.prompt_tokens, want.completion_tokens)
        if want.finish_reason == "stop":
            # transformers serve decodes without special tokens and does not say which end token it met.
            assert want.stop == "<|im_end|>" and got.stop is None
            ended += 1
    assert 0 < ended < len(prompts)


def test_stop_strings_cut_like_the_local_backend(local, server, reference):
    model, tokenizer, prompts = local
    # A two-character string that the greedy turns contain past their start: both backends must stop right there.
    texts = [g.text for (g,) in reference if len(g.text) > 6]
    cut = next(t[3:5] for t in texts if sum(t[3:5] in u[1:] for u in texts) >= 3)
    stops = [*stop_strings(tokenizer), cut]
    want = generate(model, tokenizer, prompts, max_new_tokens=48, stop=stops, disable_progress=True)
    got = CompletionsClient(server.base_url, tokenizer).generate(prompts, max_new_tokens=48, stop=stops,
                                                                 disable_progress=True)
    assert sum(w.stop == cut for (w,) in want) >= 3
    for (w,), (g,) in zip(want, got):
        assert (g.text, g.finish_reason, g.completion_tokens) == (w.text, w.finish_reason, w.completion_tokens)
        if w.stop == cut:
            assert g.stop == cut and cut not in g.text


def test_sampling_is_seeded_per_request(local, server, reference):
    _, tokenizer, prompts = local
    # transformers serve seeds its global RNG when a request arrives: only one request at a time is reproducible.
    client = CompletionsClient(server.base_url, tokenizer, concurrency=1)
    first = client.generate(prompts[:3], max_new_tokens=16, temperature=1.0, num_samples=2, seed=7,
                            disable_progress=True)
    again = client.generate(prompts[:3], max_new_tokens=16, temperature=1.0, num_samples=2, seed=7,
                            disable_progress=True)
    other = client.generate(prompts[:3], max_new_tokens=16, temperature=1.0, num_samples=2, seed=8,
                            disable_progress=True)
    texts = [[g.text for g in gens] for gens in first]
    assert texts == [[g.text for g in gens] for gens in again]
    assert texts != [[g.text for g in gens] for gens in other]
    # It samples (transformers serve alone would decode greedily: the tiny checkpoint says do_sample=False), and
    # the two samples of a prompt are different draws.
    assert all(a != b for a, b in texts)
    assert sum(a != g.text[: len(a)] for (a, _), (g,) in zip(texts, reference)) >= 2


def test_preflight_fails_before_the_run(local, server, tiny_llama_dir):
    _, tokenizer, _ = local
    root = server.base_url.removesuffix("/v1")
    with pytest.raises(ValueError, match="ending in /v1"):
        CompletionsClient(root, tokenizer, retries=0).check()
    with pytest.raises(ValueError, match="GET /models failed"):
        CompletionsClient("http://127.0.0.1:9/v1", tokenizer, retries=0).check()
    with pytest.raises(ValueError, match="does not serve 'gpt-4o'"):
        CompletionsClient(server.base_url, tokenizer, model="gpt-4o").check()
    with pytest.raises(ValueError, match="counts .* tokens in a prompt of .* tokens"):
        CompletionsClient(server.base_url, AutoTokenizer.from_pretrained(tiny_llama_dir)).check()


@pytest.mark.slow
def test_server_stopped_mid_run(local, reference, tiny_qwen_dir, tmp_path):
    """Killed mid-run: with retries long enough to span a restart nothing fails; without, the rest are error rows."""
    _, tokenizer, prompts = local
    prompts, reference = prompts * 3, reference * 3
    server = TransformersServer(tiny_qwen_dir, tmp_path / "server.log").start()
    try:
        for restart in (True, False):
            server.log_path.write_text("")
            client = CompletionsClient(server.base_url, tokenizer, concurrency=1,
                                       retries=7 if restart else 1, backoff=0.5 if restart else 0.05).check()
            out = {}
            run = threading.Thread(target=lambda c=client, o=out: o.update(
                gens=c.generate(prompts, max_new_tokens=48, disable_progress=True)))
            run.start()
            while server.completed_requests() < 4:
                time.sleep(0.05)
            server.stop()
            if restart:
                server.start()
            run.join(timeout=300)
            gens = [g for (g,) in out["gens"]]
            assert len(gens) == len(prompts)
            failed = [g for g in gens if g.finish_reason == "error"]
            assert client.errors == len(failed)
            for g, (want,) in zip(gens, reference):
                if g.finish_reason != "error":
                    assert (g.text, g.completion_tokens) == (want.text, want.completion_tokens)
            if restart:
                assert not failed and client.endpoint.attempts > len(prompts) + 2
            else:
                assert 4 <= len(prompts) - len(failed) < len(prompts)
                assert all(g.text == "" and g.error and "attempts" in g.error for g in failed)
    finally:
        server.stop()


# --- scripted replies: what vLLM answers --------------------------------------------------------------------------
def vllm_like(replies: dict):
    """A server that takes vLLM's sampling parameters and answers each prompt's last word with a scripted choice."""

    def respond(path, body):
        if path.endswith("/models"):
            return 200, {"object": "list", "data": [{"id": "served"}]}
        choice = dict(replies.get(body["prompt"].split()[-1], {"text": "", "finish_reason": "length"}))
        return 200, {"choices": [{"index": 0, **choice}], "usage": {"completion_tokens": choice.pop("_tokens", 1)}}

    return respond


def test_vllm_stop_reasons_map_to_the_local_meaning(tiny_qwen_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    replies = {  # word ending the prompt -> the choice vLLM sends back (usage.completion_tokens in `_tokens`)
        "eos": {"text": "Thanks!", "finish_reason": "stop", "stop_reason": None, "_tokens": 4},
        "header": {"text": "Sure, here", "finish_reason": "stop", "stop_reason": im_start, "_tokens": 5},
        "string": {"text": "Why", "finish_reason": "stop", "stop_reason": "\nUser:", "_tokens": 6},
        "long": {"text": "a b c", "finish_reason": "length", "stop_reason": None, "_tokens": 8},
        "odd": {"text": "x", "finish_reason": "abort", "stop_reason": None, "_tokens": 1},
    }
    with ScriptedServer(vllm_like(replies)) as fake:
        client = CompletionsClient(fake.base_url, tokenizer, concurrency=2).check()
        assert client.flavour == "vllm" and client.model == "served"
        gens = client.generate(list(replies), max_new_tokens=8, temperature=1.0, num_samples=2, seed=100)
        bodies = fake.posts("/completions")[1:]
    assert [(g.text, g.finish_reason, g.stop, g.completion_tokens) for g, _ in gens] == [
        ("Thanks!", "stop", "<|im_end|>", 3),
        ("Sure, here", "stop", "<|im_start|>", 4),
        ("Why", "stop", "\nUser:", 6),
        ("a b c", "length", None, 8),
        ("", "error", None, 0),
    ]
    assert "abort" in gens[4][0].error and client.errors == 2
    # One request per sample, seeded by position; plain sampling and the template's stop tokens, whatever the order.
    assert sorted(b["seed"] for b in bodies) == list(range(100, 110)) and all("n" not in b for b in bodies)
    assert {(b["top_k"], b["top_p"], b["min_p"], b["repetition_penalty"]) for b in bodies} == {(-1, 1.0, 0.0, 1.0)}
    assert all(b["stop_token_ids"] == sorted(tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>",
                                                                                "<|im_end|>"])) for b in bodies)


def test_request_forms_fall_back_and_retries_back_off(tiny_qwen_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    calls = []

    def plain_server(path, body):  # rejects every extension, throttles then fails once before answering
        if path.endswith("/models"):
            return 200, {"data": [{"id": "m"}]}
        calls.append(body)
        if "stop_token_ids" in body or "generation_config" in body:
            return 422, {"detail": "Unexpected fields"}
        if len(calls) == 3:
            return 429, {"error": "slow down"}
        if len(calls) == 4:
            return 503, {"error": "busy"}
        return 200, {"choices": [{"text": "ok", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}

    with ScriptedServer(plain_server) as fake:
        client = CompletionsClient(fake.base_url, tokenizer, retries=2, backoff=0.01).check()
        assert client.flavour == "openai"
        (gens,) = client.generate(["<|im_start|>user\n"], max_new_tokens=1)
    assert gens[0].text == "ok" and len(calls) == 6 and client.endpoint.attempts == 1 + 5 + 1
    assert calls[-1]["stop"] == stop_strings(tokenizer) and "top_k" not in calls[-1]


def test_prompts_lose_the_bos_a_server_adds_again(tiny_llama_dir):
    from tokenizers import processors

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    bos = tokenizer.bos_token
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.bos_token_id)])
    prompt = user_turn_prompt(tokenizer, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}])
    assert prompt.startswith(bos) and tokenizer(prompt)["input_ids"][:2] == [tokenizer.bos_token_id] * 2

    def respond(path, body):  # counts prompt tokens as vLLM does: with the tokenizer's special tokens
        if path.endswith("/models"):
            return 200, {"data": [{"id": "m"}]}
        n = len(tokenizer(body["prompt"])["input_ids"])
        return 200, {"choices": [{"text": "", "finish_reason": "stop"}], "usage": {"prompt_tokens": n,
                                                                                  "completion_tokens": 1}}

    with ScriptedServer(respond) as fake:
        client = CompletionsClient(fake.base_url, tokenizer).check()
        ((g,),) = client.generate([prompt], disable_progress=True)
        sent = fake.posts("/completions")[-1]["prompt"]
    assert tokenizer(sent)["input_ids"] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert g.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def test_api_key_is_a_header_only_when_given(tiny_qwen_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)

    def guarded(path, body):  # like `vllm serve --api-key k`
        if fake.requests[-1][3].get("Authorization") != "Bearer k":
            return 401, {"error": "Unauthorized"}
        if path.endswith("/models"):
            return 200, {"data": [{"id": "m"}]}
        return 200, {"choices": [{"text": "ok", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}

    with ScriptedServer(guarded) as fake:
        with pytest.raises(ValueError, match="HTTP 401.*Check the API key"):
            CompletionsClient(fake.base_url, tokenizer).check()
        assert "Authorization" not in fake.requests[0][3]
        ((g,),) = CompletionsClient(fake.base_url, tokenizer, api_key="k").generate(["x"], disable_progress=True)
    assert g.text == "ok"
