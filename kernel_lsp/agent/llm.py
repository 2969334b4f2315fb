"""The LLM proposer: any OpenAI-compatible chat completions endpoint, streamed.

Configured by model, base_url and api_key (or OPENAI_API_KEY / OPENAI_BASE_URL /
KERNEL_LSP_MODEL). The key lives only in the client object: never logged, never put
in a prompt, a note, an event or the store.

No model configured is an immediate `NoModelConfigured` (never a default model at a public
endpoint); an endpoint that does not answer is `EndpointUnreachable` from `check()` and a
fatal failed Proposal (no retry loop) from `propose()`. Both are `verdicts.CannotRun`: exit 2.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kernel_lsp.model import Candidate
from kernel_lsp.verdicts import EndpointUnreachable, NoModelConfigured

from .budget import Pricing
from .patches import ParseError, parse_answer
from .prompts import build_messages
from .proposer import Proposal, ProposalRequest

log = logging.getLogger(__name__)

@dataclass
class LLMConfig:
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)   # repr=False: keep it out of logs
    temperature: float | None = 0.7
    max_tokens: int | None = 8192
    request_timeout: float = 300.0
    client_max_retries: int = 2      # the openai client's own retries (honors Retry-After)
    attempts: int = 3                # our loop around it, for 429/5xx/timeouts that persist
    backoff: float = 1.0             # first wait, doubled per attempt, jittered
    max_backoff: float = 30.0
    max_retry_after: float = 60.0
    stream: bool = True
    pricing: Pricing = field(default_factory=Pricing)

    @classmethod
    def from_env(cls, model: str | None = None, base_url: str | None = None,
                 api_key: str | None = None, env: dict[str, str] | None = None, **kw: Any) -> "LLMConfig":
        env = dict(os.environ) if env is None else env
        return cls(
            model=model or env.get("KERNEL_LSP_MODEL") or None,
            base_url=base_url or env.get("OPENAI_BASE_URL") or None,
            api_key=api_key or env.get("OPENAI_API_KEY") or None,
            **kw,
        )

    def describe(self) -> dict[str, Any]:
        """What may be stored and shown: never the key."""
        return {"model": self.model, "base_url": self.base_url,
                "api_key": "set" if self.api_key else "unset"}


    def problem(self) -> str | None:
        """Why this configuration cannot work, before any request; None when it may."""
        if not self.model:
            return NoModelConfigured().reason
        if not self.base_url and not self.api_key:
            return (f"model {self.model!r} is set but no endpoint is: set --base-url / OPENAI_BASE_URL "
                    "(agent.baseUrl in the editor) for a local or private server, or OPENAI_API_KEY "
                    "for api.openai.com")
        return None


class LLMError(Exception):
    def __init__(self, reason: str, fatal: bool = False, kind: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal
        self.kind = kind      # "unreachable" | "auth" | "refused" | ""


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    attempts: int
    seconds: float


class LLMProposer:
    """Proposes children of a node by asking a chat model; repairs by patch."""

    name = "llm"
    can_repair = True
    uses_profile = True

    def __init__(self, config: LLMConfig | None = None, *,
                 sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.config = config or LLMConfig.from_env()
        problem = self.config.problem()
        if problem is not None:
            raise NoModelConfigured(problem)
        import openai  # the agent's one hard dependency; imported here so the rest loads without it

        self.model: str = self.config.model or ""
        self._openai = openai
        self._sleep = sleep
        self._refused: set[str] = set()   # request parameters the endpoint rejected
        self._client = openai.AsyncOpenAI(
            # A local server needs no key; the client insists on one, so pass a placeholder.
            api_key=self.config.api_key or "not-set",
            base_url=self.config.base_url,
            timeout=self.config.request_timeout,
            max_retries=self.config.client_max_retries,
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def check(self, timeout: float = 10.0) -> None:
        """Raise EndpointUnreachable at once when the endpoint does not answer (any HTTP answer,
        404 included, means it is there; authentication is judged by the first real request)."""
        oa = self._openai
        try:
            await self._client.with_options(timeout=timeout, max_retries=0).models.list()
        except oa.APITimeoutError:
            raise EndpointUnreachable(f"endpoint unreachable: {self._where()} did not answer within "
                                      f"{timeout:.0f} s") from None
        except oa.APIConnectionError as e:
            raise EndpointUnreachable(f"endpoint unreachable: cannot reach {self._where()}: "
                                      f"{_short(e) or 'connection failed'}") from None
        except oa.APIError:
            pass  # it answered (401, 404, ...): there is an endpoint; the real request judges the rest

    def _where(self) -> str:
        return str(self._client.base_url).rstrip("/")

    async def propose(self, request: ProposalRequest) -> list[Proposal]:
        calls = [self._one(request, i) for i in range(max(1, request.count))]
        return list(await asyncio.gather(*calls))

    async def _one(self, request: ProposalRequest, index: int) -> Proposal:
        t0 = time.monotonic()
        messages = build_messages(request)
        try:
            done = await self.complete(messages)
        except LLMError as e:
            return Proposal.failed(e.reason, fatal=e.fatal, seconds=time.monotonic() - t0)
        cost = self.config.pricing.cost(self.model, done.prompt_tokens, done.completion_tokens)
        usage = dict(prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens,
                     cost=cost, seconds=time.monotonic() - t0)
        try:
            parsed = parse_answer(done.text, request.parent.source, kind=request.parent.kind)
        except ParseError as e:
            return Proposal.failed(f"unusable answer: {e}", **usage)
        origin = "repair" if request.mode == "repair" else "llm"
        note = parsed.note or ("patch" if parsed.form == "patch" else "rewrite")
        if parsed.form == "patch":
            note = f"{note} ({parsed.patches} patch{'es' if parsed.patches > 1 else ''})"
        cand = Candidate(source=parsed.source, kind=request.parent.kind, origin=origin,
                         parent=request.parent.id, note=note[:240])
        return Proposal(candidate=cand, form=parsed.form, **usage)

    async def complete(self, messages: list[dict[str, str]]) -> Completion:
        """One chat completion with bounded retries; raises LLMError with a clear reason."""
        oa = self._openai
        t0 = time.monotonic()
        last = "no attempt made"
        attempt = 0
        while attempt < self.config.attempts:
            attempt += 1
            try:
                text, pt, ct = await self._request(messages)
                return Completion(text, pt, ct, attempt, time.monotonic() - t0)
            except oa.AuthenticationError as e:
                raise LLMError(f"authentication failed (HTTP {e.status_code}): check the API key",
                               fatal=True, kind="auth") from None
            except (oa.PermissionDeniedError, oa.NotFoundError) as e:
                raise LLMError(f"endpoint refused the request (HTTP {e.status_code}): "
                               f"{_short(e)}; check the model name and base URL", fatal=True,
                               kind="refused") from None
            except oa.RateLimitError as e:
                last = f"rate limited (HTTP 429): {_short(e)}"
                wait = self._retry_after(e) or self._backoff(attempt)
            except oa.APIStatusError as e:
                if e.status_code == 400 and self._adapt(_short(e)):
                    attempt -= 1  # a parameter this endpoint refuses: dropped or renamed, ask again
                    continue
                if e.status_code < 500:
                    raise LLMError(f"request rejected (HTTP {e.status_code}): {_short(e)}") from None
                last = f"server error (HTTP {e.status_code}): {_short(e)}"
                wait = self._retry_after(e) or self._backoff(attempt)
            except oa.APITimeoutError:
                last = f"request timed out after {self.config.request_timeout:.0f}s"
                wait = self._backoff(attempt)
            except oa.APIConnectionError as e:
                # The client already retried the connection: an endpoint that is not there now
                # will not be there in a minute either. Say so at once.
                raise LLMError(f"endpoint unreachable: cannot reach the endpoint {self._where()}: "
                               f"{_short(e)}", fatal=True, kind="unreachable") from None
            except oa.APIError as e:  # e.g. an error event in the middle of a stream
                last = f"API error: {_short(e)}"
                wait = self._backoff(attempt)
            if attempt < self.config.attempts:
                log.info("LLM request failed (%s); retry %d in %.1fs", last, attempt, wait)
                await self._sleep(wait)
        raise LLMError(f"{last} (after {self.config.attempts} attempts)")

    def _adapt(self, message: str) -> bool:
        """Reasoning models refuse `max_tokens` (want `max_completion_tokens`) or a temperature;
        some local servers refuse `stream_options`. Adjust once per parameter."""
        low = message.lower()
        for param in ("max_tokens", "temperature", "stream_options"):
            if param in low and param not in self._refused:
                self._refused.add(param)
                return True
        return False

    async def _request(self, messages: list[dict[str, str]]) -> tuple[str, int, int]:
        kw: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.config.temperature is not None and "temperature" not in self._refused:
            kw["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            key = "max_completion_tokens" if "max_tokens" in self._refused else "max_tokens"
            kw[key] = self.config.max_tokens
        if not self.config.stream:
            resp = await self._client.chat.completions.create(**kw)
            text = (resp.choices[0].message.content or "") if resp.choices else ""
            usage = resp.usage
            pt = usage.prompt_tokens if usage else _estimate(messages)
            ct = usage.completion_tokens if usage else len(text) // 4
            return text, pt, ct
        if "stream_options" not in self._refused:
            kw["stream_options"] = {"include_usage": True}
        stream = await self._client.chat.completions.create(stream=True, **kw)
        chunks: list[str] = []
        pt = ct = None
        async with stream:
            async for chunk in stream:
                if chunk.usage is not None:
                    pt, ct = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                for choice in chunk.choices or ():
                    if choice.delta is not None and choice.delta.content:
                        chunks.append(choice.delta.content)
        text = "".join(chunks)
        # Servers without include_usage: estimate (about 4 characters a token).
        return text, (pt if pt is not None else _estimate(messages)), (ct if ct is not None else len(text) // 4)

    def _retry_after(self, e: Any) -> float | None:
        headers = getattr(getattr(e, "response", None), "headers", None) or {}
        for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            value = headers.get(name)
            if value is None:
                continue
            try:
                seconds = float(value) * scale
            except ValueError:
                continue
            if seconds >= 0:
                return min(seconds, self.config.max_retry_after)
        return None

    def _backoff(self, attempt: int) -> float:
        base = min(self.config.max_backoff, self.config.backoff * 2 ** (attempt - 1))
        return base * (0.75 + 0.5 * random.random())


def _estimate(messages: list[dict[str, str]]) -> int:
    return sum(len(m.get("content", "")) for m in messages) // 4


def _short(e: Exception) -> str:
    msg = getattr(e, "message", None) or str(e)
    return " ".join(str(msg).split())[:200]
