"""What a probe sends: prompt and output lengths, synthetic or file prompts, and OpenAI request bodies (pure).

Lengths: ``512`` (fixed), ``uniform:256:1024`` (integers, both ends included), ``normal:512:64`` (mean, std,
rounded and clipped to [1, mean + 4 std]).

Synthetic prompts of exactly N tokens: each word is drawn from a list of short, common lower-case English words of
at most 8 letters. Under the lab engine's token rule (`dsctl.core.load.tokens.count_tokens`: one token per word and
punctuation mark, a word longer than 8 characters one per started 8) each is one token, so a prompt of N words is
exactly N tokens there; BPE tokenizers (Qwen, DeepSeek, Llama) also encode nearly all of them as one token with
their leading space. With a tokenizer (``counter``, `dsctl probe --tokenizer`) the prompt is fitted to exactly N
of its tokens: the words are cut where the count reaches N, and when a word boundary skips over N (a word of two
tokens at the end) shorter words pad the gap (`fit_words`). Chat requests add the chat template's
tokens. The server's ``usage.prompt_tokens``, when returned, is what the metrics use.

Shared prefix: with share s, the first round(s * L) words of a prompt of L words come from one common text (the same
for every request of the probe); the rest is unique to the request and starts with the request's index (spelled
with words as digits), so no two prompts share more than the intended prefix and the engine's prefix cache sees
exactly that share.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsctl.core.load import dataset, limits
from dsctl.core.load.tokens import count_tokens

Counter = Callable[[str], int]  # tokens of a text

# Short common words; each one token with its leading space in the usual BPE vocabularies.
WORDS = tuple("""
the of and to in is was for on that with as by at from his her they this be are have had not but what all were
when we there can an your which their said if do will each about how up out them then she many some so these would
other into has more two time like him see no way could people my than first water been who its now find long down
day did get come made may part over new sound take only little work know place year live me back give most very
after thing our just name good man think say great where help through much before line right too mean old any same
tell boy follow came want show also around form three small set put end does another well large must big even such
because turn here why ask went men read need land different home us move try kind hand picture again change off play
spell air away animal house point page letter mother answer found study still learn should world high every near add
food between own below country plant last school father keep tree never start city earth eye light thought head under
story saw left few while along might close something seem next hard open example begin life always those both paper
together got group often run important until children side feet car mile night walk white sea began grow took river
four carry state once book hear stop without second late miss idea enough eat face watch far real almost let above
girl sometimes mountain cut young talk soon list song being leave family
""".split())
WORDS = tuple(w for w in WORDS if len(w) <= 8)  # the engine's rule counts a longer word as 2 tokens
FIT_ALTERNATES = 64  # words tried as padding when a tokenizer's count skips over N at a word boundary

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class LengthSpec:
    kind: str  # fixed | uniform | normal
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str, what: str = "length") -> LengthSpec:
        parts = text.strip().lower().split(":")
        try:
            if len(parts) == 1:
                numbers: list[int | float] = [int(parts[0])]
            elif parts[0] in ("uniform", "normal") and len(parts) == 3:
                convert = int if parts[0] == "uniform" else float
                numbers = [convert(parts[1]), convert(parts[2])]
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"{what} {text!r}: expected N, uniform:LO:HI or normal:MEAN:STD") from None
        for number in numbers:  # the one number rule before any arithmetic: 1e308 or 400 digits overflow it
            limits.number(f"{what} {text!r}:", number, None, limits.MAX_TOKENS, "tokens per request")
        kind = "fixed" if len(parts) == 1 else parts[0]
        spec = cls(kind, *(float(number) for number in numbers))
        if spec.kind == "fixed" and spec.a < 1:
            raise ValueError(f"{what} {text!r}: must be at least 1")
        if spec.kind == "uniform" and not 1 <= spec.a <= spec.b:
            raise ValueError(f"{what} {text!r}: needs 1 <= LO <= HI")
        if spec.kind == "normal" and not (spec.a >= 1 and spec.b >= 0):
            raise ValueError(f"{what} {text!r}: needs MEAN >= 1 and STD >= 0")
        if spec.longest > limits.MAX_TOKENS:  # a prompt is built word by word: bound it before the first one
            raise ValueError(f"{what} {text!r}: requests of up to {spec.longest} tokens, more than the "
                             f"{limits.MAX_TOKENS} tokens per request dsctl allows; lower it")
        return spec

    @property
    def longest(self) -> int:
        """The most tokens one request of this spec has (a normal's draws are clipped at MEAN + 4 STD)."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return int(self.b)
        return max(1, round(self.a + 4 * self.b))

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        value = round(rng.gauss(self.a, self.b))
        return int(min(max(1, value), max(1, round(self.a + 4 * self.b))))

    @property
    def mean(self) -> float:
        return self.a if self.kind != "uniform" else (self.a + self.b) / 2

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}:{int(self.b)}"
        return f"normal:{self.a:g}:{self.b:g}"


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    prompt: str | None  # completions prompt (or the user message of a chat request)
    messages: list[dict[str, Any]] | None  # chat messages from a prompts file
    prompt_tokens: int  # planned (approximate) prompt length
    output_tokens: int  # max_tokens


def load_prompts(path: Path, count: Counter | None = None) -> list[dict[str, Any]]:
    """A JSONL prompts file (`dsctl.core.load.dataset`'s JSONL format); ``count``: tokens of a text (default: the
    engine's rule), for entries without "prompt_tokens"."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"prompts file {path}: {exc.strerror or exc}") from None
    return dataset.parse(text, f"prompts file {path}", count or engine_tokens, sharegpt=False).items


def engine_tokens(text: str) -> int:
    """The lab engine's token count of ``text`` (at least 1)."""
    return max(1, count_tokens(text))


def fit_words(fixed: list[str], filler: list[str], n: int, count: Counter) -> tuple[str, int]:
    """The words ``fixed`` then as many of ``filler`` as make exactly ``n`` tokens by ``count``, joined by spaces;
    returns (text, its count), the count differing from ``n`` only when padding with the first ``FIT_ALTERNATES``
    words cannot fill the gap (or ``fixed`` alone is longer). ``filler`` should hold at least ``n`` words."""
    def text(k: int) -> str:
        return " ".join(fixed + filler[:k])

    guess = max(0, min(len(filler), n - len(fixed)))
    got = count(text(guess))
    if got == n:  # the usual case: one token per word
        return text(guess), n
    lo, hi = 0, len(filler)  # the largest k whose count is at most n (counts grow with k)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text(mid)) <= n:
            lo = mid
        else:
            hi = mid - 1
    best, got = text(lo), count(text(lo))
    for word in WORDS[:FIT_ALTERNATES]:  # pad with short words, keeping each that does not overshoot
        if got == n:
            break
        candidate = f"{best} {word}" if best else word
        c = count(candidate)
        if c <= n:
            best, got = candidate, c
    return best, got


class Workload:
    """Produces request i deterministically from the seed, lazily (cheap: slices of a pre-drawn word pool)."""

    POOL = 1 << 16

    def __init__(self, prompt_len: LengthSpec, output_len: LengthSpec, *, shared_prefix: float = 0.0,
                 prompts: list[dict[str, Any]] | None = None, seed: int = 0, counter: Counter | None = None,
                 server_scale: float | None = None):
        """``counter``: a tokenizer's count of a text; synthetic prompts are then fitted to exactly N of its tokens
        (without one, N words are N tokens under the engine's rule). ``server_scale``: without a counter, the
        server's tokens per engine-rule token, as measured (`dsctl.core.load.prompt_lengths`): synthetic prompts
        are then fitted to N of the server's tokens as that scale predicts them."""
        if not 0.0 <= shared_prefix <= 1.0:
            raise ValueError(f"shared prefix {shared_prefix:g}: must be between 0 and 1")
        if server_scale is not None and not (counter is None and 0.0 < server_scale < float("inf")):
            raise ValueError(f"server scale {server_scale!r}: a positive finite number, and only without a counter")
        self.server_scale = server_scale
        if server_scale is not None:
            counter = ScaledCount(server_scale)
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.shared_prefix = shared_prefix
        self.prompts = prompts
        self.seed = seed
        self.counter = counter
        self._prefix_cache: dict[int, str] = {}
        pool_rng = random.Random(f"{seed}:pool")
        # one choices() call, not 65536 choice() calls: 0.005 s instead of 0.12 s per workload (that was most of
        # a simulated trial's set-up, and each probe builds one)
        self._pool = pool_rng.choices(WORDS, k=self.POOL)
        self._prefix = pool_rng.choices(WORDS, k=prompt_len.longest) if shared_prefix > 0 else []

    def _prefix_text(self, tokens: int) -> str:
        """The common prefix fitted to ``tokens`` of the tokenizer's tokens (one per prompt length, cached)."""
        text = self._prefix_cache.get(tokens)
        if text is None:
            text = fit_words([], self._prefix, tokens, self.counter)[0]  # type: ignore[arg-type]
            self._prefix_cache[tokens] = text
        return text

    def _words(self, rng: random.Random, n: int) -> list[str]:
        start = rng.randrange(self.POOL)
        words = self._pool[start:start + n]
        while len(words) < n:
            words += self._pool[: n - len(words)]
        return words

    def request(self, index: int) -> PlannedRequest:
        rng = random.Random(f"{self.seed}:{index}")
        if self.prompts is not None:
            item = self.prompts[index % len(self.prompts)]
            out = item.get("output_tokens", item.get("max_tokens")) or self.output_len.sample(rng)
            count = self.counter or engine_tokens
            if isinstance(item.get("messages"), list):
                text = " ".join(str(m.get("content", "")) for m in item["messages"] if isinstance(m, dict))
                tokens = int(item.get("prompt_tokens") or count(text))
                return PlannedRequest(index, None, item["messages"], tokens, int(out))
            tokens = int(item.get("prompt_tokens") or count(item["prompt"]))
            return PlannedRequest(index, item["prompt"], None, tokens, int(out))
        length = self.prompt_len.sample(rng)
        shared = min(length - 1, round(self.shared_prefix * length)) if self.shared_prefix > 0 else 0
        tag = _tag(index)[: length - shared]
        if self.server_scale is not None:
            # every word is `server_scale` tokens by that count: the word counts follow directly (fitting word by
            # word, as for a tokenizer, tried 64 padding words per prompt when no count hits N exactly, and cost the
            # probe's event loop 3-4 ms a request at send time)
            scale = self.server_scale
            prefix = min(len(self._prefix), round(shared / scale)) if shared else 0
            total = max(1, prefix + len(tag), round(length / scale))
            words = self._prefix[:prefix] + tag[: total - prefix] + self._words(rng, max(0, total - prefix - len(tag)))
            text = " ".join(words)
            return PlannedRequest(index, text, None, self.counter(text), self.output_len.sample(rng))  # type: ignore[misc]
        if self.counter is not None:  # the shared share and the whole prompt in the tokenizer's tokens
            fixed = ([self._prefix_text(shared)] if shared else []) + tag
            text, tokens = fit_words(fixed, self._words(rng, length + 16), length, self.counter)
            return PlannedRequest(index, text, None, tokens, self.output_len.sample(rng))
        words = self._prefix[:shared] + tag + self._words(rng, length - shared - len(tag))
        return PlannedRequest(index, " ".join(words), None, length, self.output_len.sample(rng))


    def rescaled(self, server_scale: float) -> Workload:
        """The same workload (lengths, prefix share, seed) with synthetic prompts fitted to the server's tokens at
        ``server_scale`` of them per engine-rule token."""
        return Workload(self.prompt_len, self.output_len, shared_prefix=self.shared_prefix, prompts=self.prompts,
                        seed=self.seed, server_scale=server_scale)


@dataclass(frozen=True)
class ScaledCount:
    """A text's tokens as a server whose tokenizer gives ``scale`` tokens per engine-rule token would count them
    (at least 1): what the probe fits prompts to when it has no tokenizer but has measured the server's count."""

    scale: float

    def __call__(self, text: str) -> int:
        return max(1, round(engine_tokens(text) * self.scale))


def _tag(index: int) -> list[str]:
    """The index written in base len(WORDS) with words as digits: unique per request, one token per word."""
    digits = [WORDS[index % len(WORDS)]]
    index //= len(WORDS)
    while index:
        digits.append(WORDS[index % len(WORDS)])
        index //= len(WORDS)
    return digits


def request_body(endpoint: str, model: str, planned: PlannedRequest, *, ignore_eos: bool = True) -> dict[str, Any]:
    """A streaming OpenAI request as `vllm bench serve` sends it (usage chunk requested, greedy)."""
    body: dict[str, Any] = {"model": model}
    if endpoint == "completions":
        if planned.prompt is None:
            raise ValueError("chat messages from a prompts file need --endpoint chat")
        body["prompt"] = planned.prompt
        body["max_tokens"] = planned.output_tokens
    elif endpoint == "chat":
        body["messages"] = planned.messages or [{"role": "user", "content": planned.prompt}]
        body["max_completion_tokens"] = planned.output_tokens
        body["max_tokens"] = planned.output_tokens  # older servers only read max_tokens
    else:
        raise ValueError(f"endpoint {endpoint!r}: expected completions or chat")
    body["temperature"] = 0.0
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM extension: generate exactly max_tokens
    return body


def encode_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def iter_requests(workload: Workload, count: int) -> Iterator[PlannedRequest]:
    for i in range(count):
        yield workload.request(i)
