"""Generation through any OpenAI-compatible server: `vllm serve`, SGLang, `transformers serve`...

The prompts are rendered here, by the model's own chat template exactly as for the local backend, and sent as raw text
to `/v1/completions`, one request per continuation (servers ignore `n`: `transformers serve` answered one choice for
`n=2`), each with its own seed, so results do not depend on the order in which concurrent requests finish.

```python
client = CompletionsClient("http://127.0.0.1:8000/v1", tokenizer, concurrency=16).check()
turns = client.generate(prompts, max_new_tokens=256, temperature=1.0, num_samples=4, seed=0)
```

Servers differ where the OpenAI API says nothing; [`CompletionsClient.check`] finds out which request this one takes:
- vLLM and SGLang take their sampling parameters (`top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`): decoding
  is then plain greedy / plain temperature sampling like the local backend, whatever the checkpoint's
  `generation_config.json` says, and they report which stop ended a turn (`stop_reason`, `matched_stop`).
- `transformers serve` rejects those (422) but takes a `generation_config`: the same one the local backend uses. Without
  it, it samples only if the checkpoint says `do_sample=True` (it never sets it for `temperature > 0`), and its
  answer does not say which end token stopped a turn (the text is decoded without special tokens).
- Any other server gets the standard fields; its own sampling defaults apply to what they do not cover.
"""

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

import httpx
from tqdm.auto import tqdm

from .chat import stop_strings, user_turn_prompt
from .generation import PLAIN_DECODING, PLAIN_SAMPLING, Generation

logger = logging.getLogger(__name__)


class RequestFailed(Exception):
    """A request that failed for good: a 4xx other than 408/429, or still failing after every retry.

    Args:
        message (`str`): what went wrong, with the server's answer.
        status (`int`, *optional*): the HTTP status of the last answer, `None` if there was none.
    """

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _retryable(status: int) -> bool:
    return status in (408, 429) or status >= 500


class Endpoint:
    """An OpenAI-compatible API root (`http://host:port/v1`): JSON requests with retries, from any thread.

    Args:
        base_url (`str`): the API root, usually ending in `/v1`.
        api_key (`str`, *optional*): sent as a bearer token; never logged or written.
        timeout (`float`, *optional*, defaults to `300.0`): seconds per request attempt.
        retries (`int`, *optional*, defaults to `4`): further attempts after a connection error, a timeout, 408, 429
            or 5xx, waiting `backoff * 2**attempt` seconds in between (or the server's `Retry-After`).
        backoff (`float`, *optional*, defaults to `1.0`): first wait, in seconds.
        option (`str`, *optional*, defaults to `"--base_url"`): the option that set `base_url`, for error messages.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 300.0, retries: int = 4,
                 backoff: float = 1.0, option: str = "--base_url"):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"{option} {base_url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000/v1")
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError(f"timeout must be > 0, retries and backoff >= 0; got {timeout}, {retries}, {backoff}")
        self.base_url, self.option = base_url.rstrip("/"), option
        self.retries, self.backoff = retries, backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One pooled client for all threads (httpx clients are thread-safe); the pool fits any concurrency used here.
        self._client = httpx.Client(headers=headers, timeout=timeout, limits=httpx.Limits(max_connections=256))
        self._lock = threading.Lock()
        self.attempts = 0  # requests sent, retries included

    def _send(self, method: str, path: str, body: dict | None) -> dict:
        url = f"{self.base_url}{path}"
        for attempt in range(self.retries + 1):
            with self._lock:
                self.attempts += 1
            wait = self.backoff * 2**attempt
            try:
                response = self._client.request(method, url, json=body)
            except httpx.TransportError as e:  # refused, reset, timed out
                error, status = f"{type(e).__name__}: {e or 'no detail'}", None
            else:
                status = response.status_code
                if response.status_code < 400:
                    try:
                        return response.json()
                    except ValueError as e:
                        raise RequestFailed(f"{method} {url} answered non-JSON: {response.text[:200]!r}",
                                            status) from e
                error = f"HTTP {status}: {response.text[:500]}"
                if not _retryable(status):
                    raise RequestFailed(error, status)
                retry_after = response.headers.get("retry-after", "")
                if retry_after.replace(".", "", 1).isdigit():
                    wait = float(retry_after)
            if attempt < self.retries:
                time.sleep(wait)
        raise RequestFailed(f"{error} (after {self.retries + 1} attempts)", status)

    def post(self, path: str, body: dict) -> dict:
        """POST `body` to `base_url + path`; raises [`RequestFailed`]."""
        return self._send("POST", path, body)

    def check_model(self, model: str | None, model_option: str) -> str:
        """The served model to ask for: `model`, which the server must list, or the only one it lists."""
        try:
            listing = self._send("GET", "/models", None)
        except RequestFailed as e:
            hint = (f"Is the server running, and is {self.option} its API root, usually ending in /v1 (e.g. "
                    "http://127.0.0.1:8000/v1)?" if e.status not in (401, 403) else "Check the API key it was given.")
            raise ValueError(f"{self.option} {self.base_url}: GET /models failed ({e}). {hint}") from None
        data = listing.get("data") if isinstance(listing, dict) else None
        served = [m.get("id") for m in data or [] if isinstance(m, dict)]
        if model is None:
            if len(served) != 1:
                raise ValueError(f"{self.base_url} serves {served or 'no models'}; name one with {model_option}")
            return served[0]
        if model not in served:
            raise ValueError(f"{self.base_url} does not serve {model!r} ({model_option}); it serves {served}")
        return model


def run_concurrently(fn: Callable, items: list, *, concurrency: int, desc: str | None = None,
                     disable_progress: bool = False, on_result: Callable | None = None) -> list:
    """`[fn(x) for x in items]` on `concurrency` threads, in order; the progress bar counts finished items.

    `on_result(index, result)` runs in the calling thread as each item finishes (e.g. to append it to a cache).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    results = [None] * len(items)
    pool = ThreadPoolExecutor(max_workers=concurrency)
    try:
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        with tqdm(total=len(items), desc=desc, disable=disable_progress, unit="req") as bar:
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                if on_result is not None:
                    on_result(i, results[i])
                bar.update(1)
    finally:  # on Ctrl-C or an error, do not start the requests still queued
        pool.shutdown(wait=True, cancel_futures=True)
    return results


class CompletionsClient:
    """Continuations of locally rendered prompts from a server's `/v1/completions`.

    Args:
        base_url (`str`): the server's API root, e.g. `http://127.0.0.1:8000/v1`.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): the served model's tokenizer (the one that rendered the
            prompts): it gives the stop strings and tokens, and [`check`] verifies that the server counts the same
            prompt tokens.
        model (`str`, *optional*): the served model's name; defaults to the only model the server lists.
        api_key (`str`, *optional*): bearer token, if the server wants one.
        concurrency (`int`, *optional*, defaults to `8`): requests in flight at once.
        timeout (`float`, *optional*, defaults to `300.0`): seconds per request attempt.
        retries (`int`, *optional*, defaults to `4`): further attempts on connection errors, timeouts, 429 and 5xx.
        backoff (`float`, *optional*, defaults to `1.0`): first wait between attempts, doubling each time.
    """

    def __init__(self, base_url: str, tokenizer, *, model: str | None = None, api_key: str | None = None,
                 concurrency: int = 8, timeout: float = 300.0, retries: int = 4, backoff: float = 1.0):
        if concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
        self.endpoint = Endpoint(base_url, api_key=api_key, timeout=timeout, retries=retries, backoff=backoff)
        self.tokenizer, self.model, self.concurrency = tokenizer, model, concurrency
        self.flavour: str | None = None  # set by check(): "vllm", "transformers" or "openai"
        self._server_adds_bos = False  # set by check()
        self.errors = 0
        added = tokenizer.get_added_vocab()
        # The local backend ends a turn at these tokens (its stops that are added tokens, eos, pad); see generation.py.
        self._end_ids = {added[s] for s in stop_strings(tokenizer) if s in added}
        self._end_ids |= {t for t in (tokenizer.eos_token_id, tokenizer.pad_token_id) if t is not None}
        self._added = added

    # --- preflight ------------------------------------------------------------------------------------------------
    def _extras(self, flavour: str, temperature: float) -> dict:
        sampling = temperature > 0
        if flavour == "vllm":
            # vLLM matches stop *strings* on text decoded without special tokens, so `<|im_end|>` and `<|im_start|>`
            # only stop as token ids (vllm-project/vllm#2123); top_k=-1 and the rest switch off the checkpoint's
            # sampling defaults, which vLLM applies by default.
            return {"stop_token_ids": sorted(self._end_ids), "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
        if flavour == "transformers":
            # transformers serve sets do_sample=False for temperature 0 but never True otherwise: send the local
            # backend's plain decoding, with its end tokens.
            config = {**PLAIN_DECODING, "do_sample": sampling, **(PLAIN_SAMPLING if sampling else {}),
                      "eos_token_id": sorted(self._end_ids), "pad_token_id": self.tokenizer.pad_token_id}
            return {"generation_config": json.dumps(config)}
        return {}

    def _body(self, prompt: str, max_tokens: int, temperature: float, seed: int, stops: list[str]) -> dict:
        # A tokenizer that adds BOS would add a second one to a prompt whose template already starts with it
        # (Llama 3, Gemma): let the server add it.
        bos = self.tokenizer.bos_token
        if self._server_adds_bos and bos and prompt.startswith(bos):
            prompt = prompt[len(bos):]
        return {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                "top_p": 1.0, "seed": seed, "stop": stops, **self._extras(self.flavour, temperature)}

    def check(self) -> "CompletionsClient":
        """Fail now, before any work, unless the server is up, serves the model and tokenizes prompts as we do.

        Lists the models (`GET /models`), then sends a one-token completion of a rendered conversation with each
        request flavour in turn (vLLM's sampling parameters, transformers serve's `generation_config`, plain) and
        keeps the first that the server accepts.

        Raises:
            `ValueError`: wrong URL, unknown model, no `/completions`, or a server that counts other prompt tokens.
        """
        if self.flavour is not None:
            return self
        self.model = self.endpoint.check_model(self.model, "--served_model")
        prompt = user_turn_prompt(self.tokenizer, [{"role": "user", "content": "Hi"},
                                                   {"role": "assistant", "content": "Hello! How can I help?"}])
        local = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        self._server_adds_bos = len(self.tokenizer(prompt)["input_ids"]) > local
        rejected = []
        for flavour in ("vllm", "transformers", "openai"):
            self.flavour = flavour
            try:
                reply = self.endpoint.post("/completions", self._body(prompt, 1, 0.0, 0, stop_strings(self.tokenizer)))
                break
            except RequestFailed as e:
                if e.status not in (400, 422):  # only a rejected request body means "try the next form"
                    self.flavour = None
                    raise ValueError(f"{self.endpoint.base_url}/completions failed: {e}") from None
                rejected.append(f"{flavour}: {e}")
        else:
            self.flavour = None
            raise ValueError(f"{self.endpoint.base_url}/completions rejected every request form: {rejected}")
        counted = (reply.get("usage") or {}).get("prompt_tokens")
        if counted is not None and counted != local:
            self.flavour = None
            raise ValueError(
                f"{self.endpoint.base_url} counts {counted} tokens in a prompt of {local} tokens for the local "
                f"tokenizer of {self.tokenizer.name_or_path!r}: it serves another tokenizer or adds special tokens. "
                "Serve the same checkpoint as --model."
            )
        logger.info("%s serves %r; request form: %s", self.endpoint.base_url, self.model, self.flavour)
        return self

    # --- generation -----------------------------------------------------------------------------------------------
    def _generation(self, reply: dict, stops: list[str], local_tokens: int) -> Generation:
        choices = reply.get("choices") or [{}]
        choice, usage = choices[0], reply.get("usage") or {}
        text, finish = choice.get("text"), choice.get("finish_reason")
        if not isinstance(text, str) or finish not in ("stop", "length"):
            return _failed(f"unexpected reply: text {type(text).__name__}, finish_reason {finish!r}", local_tokens)
        # transformers serve leaves a stop string in the text; vLLM cuts it and names it (`stop_reason`).
        found = min(((text.find(s), s) for s in stops if s in text), default=None)
        reported = choice.get("stop_reason", choice.get("matched_stop"))
        if found is not None:
            text, finish, stop = text[: found[0]], "stop", found[1]
        elif finish == "length":
            stop = None
        elif isinstance(reported, str):
            stop = reported
        elif isinstance(reported, int):
            stop = self.tokenizer.convert_ids_to_tokens(reported)
        elif self.flavour == "vllm":  # vLLM reports the model's own eos as `stop_reason: null`
            stop = self.tokenizer.eos_token
        else:  # the server decoded without special tokens and does not say which end token it met
            stop = None
        tokens = usage.get("completion_tokens")
        if tokens is None:  # no usage: count the text (tokens that decode to nothing are missed)
            tokens = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        elif finish == "stop" and (stop is None or stop in self._added):
            tokens -= 1  # the end token itself, which the local backend does not count either
        prompt_tokens = usage.get("prompt_tokens")
        return Generation(text, finish, stop, local_tokens if prompt_tokens is None else prompt_tokens, tokens)

    def generate(self, prompts: list[str], *, max_new_tokens: int = 256, temperature: float = 0.0,
                 num_samples: int = 1, seed: int = 0, stop: list[str] | None = None, desc: str | None = None,
                 disable_progress: bool = False) -> list[list[Generation]]:
        """Continue rendered prompts; the same contract as [`~uturn_train.generation.generate`].

        Request `j` of prompt `i` is seeded with `seed + i * k + j` (`k` continuations per prompt). A request that
        still fails after every retry gives a `Generation` with `finish_reason="error"` and the reason in `error`, in
        its place: nothing is dropped; `self.errors` counts them.

        Args:
            prompts (`list[str]`): full prompt texts, e.g. from [`~uturn_train.chat.user_turn_prompt`].
            max_new_tokens (`int`, *optional*, defaults to `256`): token limit per continuation.
            temperature (`float`, *optional*, defaults to `0.0`): `0` is greedy with one continuation per prompt.
            num_samples (`int`, *optional*, defaults to `1`): continuations per prompt when sampling.
            seed (`int`, *optional*, defaults to `0`): base seed.
            stop (`list[str]`, *optional*): stop strings; defaults to [`~uturn_train.chat.stop_strings`].
            desc (`str`, *optional*): progress bar label.
            disable_progress (`bool`, *optional*, defaults to `False`): hide the progress bar.

        Returns:
            `list[list[Generation]]`: per prompt, in the order given, its continuations.
        """
        if temperature < 0 or num_samples < 1 or max_new_tokens < 1:
            raise ValueError(f"need temperature >= 0, num_samples >= 1 and max_new_tokens >= 1; got {temperature}, "
                             f"{num_samples}, {max_new_tokens}")
        self.check()
        stops = stop_strings(self.tokenizer) if stop is None else list(stop)
        k = num_samples if temperature > 0 else 1
        local = [len(ids) for ids in self.tokenizer(prompts, add_special_tokens=False)["input_ids"]] if prompts else []
        requests = [(i, j) for i in range(len(prompts)) for j in range(k)]

        def one(request: tuple[int, int]) -> dict | str:
            i, j = request
            body = self._body(prompts[i], max_new_tokens, temperature, seed + i * k + j, stops)
            try:
                return self.endpoint.post("/completions", body)
            except RequestFailed as e:
                return str(e)

        replies = run_concurrently(one, requests, concurrency=self.concurrency, desc=desc,
                                   disable_progress=disable_progress)
        results: list[list[Generation]] = [[] for _ in prompts]
        for (i, _), reply in zip(requests, replies):
            g = _failed(reply, local[i]) if isinstance(reply, str) else self._generation(reply, stops, local[i])
            self.errors += g.finish_reason == "error"
            results[i].append(g)
        return results


def _failed(error: str, prompt_tokens: int) -> Generation:
    return Generation("", "error", None, prompt_tokens, 0, error=error)
