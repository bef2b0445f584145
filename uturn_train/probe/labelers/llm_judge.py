"""An LLM judge for generated user turns, through any OpenAI-compatible `/v1/chat/completions`, beside the rules.

The judge reads the query, the answer and the user turn with a rubric for the rule classifier's labels (`LABELS`) plus
a `grounded` decision, and must reply with one JSON object, parsed strictly. A bad reply is sent back once more with
what was wrong; a turn that still gets none is an error, never a guess. Verdicts are cached on disk by the content hash
of (judge model, rubric version, query, answer, turn): a rerun makes no request, and a run that crashes keeps every
verdict it got.

```python
judge = Judge("https://api.openai.com/v1", "gpt-4o-mini", concurrency=8)
verdicts = judge.label_many([(query, answer, user_turn), ...])   # JudgeVerdict or JudgeError, in order
judge.stats   # {"requests": ..., "cache_hits": ..., "errors": ...}
```
"""

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ...server import Endpoint, RequestFailed, run_concurrently
from ..rules.classify import LABELS

logger = logging.getLogger(__name__)

# Bump on any change to RUBRIC or to the request: cached verdicts of another version are not reused.
RUBRIC_VERSION = "2"  # 2: the reading rubric itself (`rubric.md`), which the labels of the trained judge follow
# The definition lives in one place, `rubric.md`, read by people labelling turns and sent to the judge as it is.
RUBRIC = f"""\
You label one turn of a chat. A chat model (or a person) was shown a conversation and wrote the next USER turn. \
Decide what that user turn is, by this rubric.

{(Path(__file__).with_name("rubric.md")).read_text(encoding="utf-8").strip()}

Reply with one JSON object and nothing else:
{{"label": "<one of: followup, acknowledgement, identity_drift, repetition, new_topic, empty, degenerate>", \
"grounded": <true or false>, "reason": "<at most 20 words>"}}"""


@dataclass(frozen=True)
class JudgeVerdict:
    """The judge's label of one user turn.

    Args:
        label (`str`): one of `LABELS`.
        grounded (`bool`): the turn reacts to something specific to this query and answer.
        reason (`str`): the judge's short why ("" if it gave none).
        cached (`bool`): read from the cache, no request made.
    """

    label: str
    grounded: bool
    reason: str
    cached: bool = False


class BadReply(ValueError):
    """A judge reply that is not a valid verdict."""


@dataclass(frozen=True)
class JudgeError:
    """A turn the judge gave no valid verdict for.

    Args:
        error (`str`): why: the request failed, or every reply was malformed.
        status (`int`, *optional*): the HTTP status of a request the endpoint answered with an error.
    """

    error: str
    status: int | None = None


def parse_reply(content) -> JudgeVerdict:
    """A judge reply as a verdict: one JSON object (a Markdown code fence around it is allowed) with `label` in
    `LABELS`, `grounded` a JSON boolean and an optional string `reason`, and no other key.

    Raises:
        [`BadReply`]: what is wrong with the reply, in words the judge can act on.
    """
    if not isinstance(content, str):
        raise BadReply(f"the reply has no text content (got {type(content).__name__})")
    text = content.strip()
    if text.startswith("```"):
        text = text.removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadReply(f"the reply is not one JSON object ({e.msg}): {content[:200]!r}") from None
    if not isinstance(obj, dict):
        raise BadReply(f"the reply is JSON but not an object: {content[:200]!r}")
    extra = set(obj) - {"label", "grounded", "reason"}
    if extra:
        raise BadReply(f"unexpected keys {sorted(extra)}; use only label, grounded and reason")
    if obj.get("label") not in LABELS:
        raise BadReply(f"label {obj.get('label')!r} is not one of {list(LABELS)}")
    if not isinstance(obj.get("grounded"), bool):
        raise BadReply(f"grounded must be true or false, got {obj.get('grounded')!r}")
    reason = obj.get("reason", "")
    if not isinstance(reason, str):
        raise BadReply(f"reason must be a string, got {reason!r}")
    return JudgeVerdict(obj["label"], obj["grounded"], reason)


def default_cache_dir() -> Path:
    """`$UTURN_HOME/judge_cache`, `UTURN_HOME` defaulting to `~/.cache/uturn` (as for the testbed)."""
    return Path(os.environ.get("UTURN_HOME", "~/.cache/uturn")).expanduser() / "judge_cache"


class _Cache:
    """Append-only `verdicts.jsonl`: one line per verdict, flushed and fsynced as it arrives."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "verdicts.jsonl"
        self.entries: dict[str, JudgeVerdict] = {}
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        for line_no, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                self.entries[row["key"]] = JudgeVerdict(row["label"], row["grounded"], row["reason"], cached=True)
            except (ValueError, KeyError, TypeError) as e:
                if line_no == len(lines):  # a crash while writing: drop the partial last line and append after it
                    logger.warning("%s: dropping a truncated last line", self.path)
                    with open(self.path, "r+b") as f:
                        f.truncate(len(data) - len(line))
                    break
                raise ValueError(
                    f"{self.path}:{line_no}: not a cache record ({e}); delete the file to start over") from e

    def add(self, key: str, verdict: JudgeVerdict) -> None:
        self.entries[key] = JudgeVerdict(verdict.label, verdict.grounded, verdict.reason, cached=True)
        record = {"key": key, "label": verdict.label, "grounded": verdict.grounded, "reason": verdict.reason}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())


class Judge:
    """Labels user turns with an LLM through an OpenAI-compatible `/chat/completions` endpoint.

    Args:
        base_url (`str`): the API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8001/v1`.
        model (`str`): the judge model's name, as the endpoint lists it.
        api_key_env (`str`, *optional*, defaults to `"OPENAI_API_KEY"`): the environment variable holding the key.
            Unset is fine for the default (a local server needs none); a variable named on purpose must be set. The
            key is only ever sent in the request header.
        cache_dir (`str` or `Path`, *optional*): where verdicts are cached; defaults to [`default_cache_dir`].
        concurrency (`int`, *optional*, defaults to `4`): requests in flight at once.
        timeout (`float`, *optional*, defaults to `120.0`): seconds per request attempt.
        retries (`int`, *optional*, defaults to `4`): further attempts on connection errors, timeouts, 429 and 5xx.
        backoff (`float`, *optional*, defaults to `1.0`): first wait between attempts, doubling each time.
        reply_retries (`int`, *optional*, defaults to `1`): how many times a malformed reply is sent back with what
            was wrong before the turn counts as an error.
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY",
                 cache_dir: str | Path | None = None, concurrency: int = 4, timeout: float = 120.0, retries: int = 4,
                 backoff: float = 1.0, reply_retries: int = 1):
        api_key = os.environ.get(api_key_env)
        if api_key is None and api_key_env != "OPENAI_API_KEY":
            raise ValueError(f"--judge_api_key_env names {api_key_env}, which is not set; export it first")
        if concurrency < 1 or reply_retries < 0:
            raise ValueError(f"judge concurrency must be >= 1 and reply_retries >= 0, got {concurrency}, "
                             f"{reply_retries}")
        self.endpoint = Endpoint(base_url, api_key=api_key, timeout=timeout, retries=retries, backoff=backoff,
                                 option="--judge_base_url")
        self.model, self.concurrency, self.reply_retries = model, concurrency, reply_retries
        self.cache = _Cache(Path(cache_dir) if cache_dir is not None else default_cache_dir())
        self.stats = {"requests": 0, "cache_hits": 0, "errors": 0}
        self._listed = self._answered = False

    def check(self) -> "Judge":
        """Fail now, before any work, unless the endpoint answers and lists `model` (`GET /models`).

        Raises:
            `ValueError`: wrong URL or key, or a model the endpoint does not serve.
        """
        if not self._listed:
            self.endpoint.check_model(self.model, "--judge_model")
            self._listed = True
        return self

    def key(self, query: str, answer: str, turn: str) -> str:
        blob = json.dumps([self.model, RUBRIC_VERSION, query, answer, turn], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _ask(self, item: tuple[str, str, str]) -> JudgeVerdict | JudgeError:
        query, answer, turn = item
        conversation = json.dumps({"query": query, "answer": answer, "user_turn": turn}, ensure_ascii=False, indent=1)
        messages = [{"role": "system", "content": RUBRIC}, {"role": "user", "content": conversation}]
        for _ in range(self.reply_retries + 1):
            body = {"model": self.model, "messages": messages, "temperature": 0.0}
            try:
                reply = self.endpoint.post("/chat/completions", body)
            except RequestFailed as e:
                return JudgeError(f"request failed: {e}", e.status)
            try:
                content = reply["choices"][0]["message"]["content"]
            except (KeyError, IndexError, TypeError):
                return JudgeError(f"not a chat completion: {json.dumps(reply)[:300]}")
            try:
                return parse_reply(content)
            except BadReply as e:
                problem = str(e)
            # Show the judge its reply and what is wrong with it; greedy decoding would repeat the same reply.
            messages = [*messages, {"role": "assistant", "content": str(content)},
                        {"role": "user", "content": f"That reply is invalid: {problem}. Reply with the JSON object "
                                                    "only."}]
        return JudgeError(f"no valid reply after {self.reply_retries + 1} tries; last problem: {problem}")

    def label_many(self, items: list[tuple[str, str, str]], *, desc: str = "judge",
                   disable_progress: bool = False) -> list[JudgeVerdict | JudgeError]:
        """Judge `(query, answer, user_turn)` triples; results in the same order.

        Cached verdicts cost nothing; identical triples are asked once; every new verdict is in the cache as soon as
        it arrives. Errors are not cached, so a rerun asks again.

        Raises:
            `ValueError`: before any judging, when the endpoint is unreachable, does not serve `model`, or rejects the
                request itself (e.g. a bad key).
        """
        keys = [self.key(*item) for item in items]
        todo = {k: item for k, item in zip(keys, items) if k not in self.cache.entries}
        self.stats["cache_hits"] += sum(k in self.cache.entries for k in keys)
        fresh: dict[str, JudgeVerdict | JudgeError] = {}
        if todo:
            pending = list(todo)
            self.check()
            attempts = self.endpoint.attempts
            if not self._answered:
                # A bad key or a request form the endpoint refuses fails every request alike: find out on one.
                first = self._ask(todo[pending[0]])
                if isinstance(first, JudgeError) and first.status is not None and 400 <= first.status < 500:
                    raise ValueError(f"the judge at {self.endpoint.base_url} rejects the request: {first.error}")
                self._answered = True
                fresh[pending[0]] = first
                self._store(pending[0], first)
                pending = pending[1:]

            def store(i, result):
                fresh[pending[i]] = result
                self._store(pending[i], result)

            run_concurrently(self._ask, [todo[k] for k in pending], concurrency=self.concurrency, desc=desc,
                             disable_progress=disable_progress, on_result=store)
            self.stats["requests"] += self.endpoint.attempts - attempts
        results = [fresh[k] if k in fresh else self.cache.entries[k] for k in keys]
        self.stats["errors"] += sum(isinstance(r, JudgeError) for r in results)
        return results

    def _store(self, key: str, result: JudgeVerdict | JudgeError) -> None:
        if isinstance(result, JudgeVerdict):
            self.cache.add(key, result)
        else:
            logger.warning("judge error: %s", result.error)
