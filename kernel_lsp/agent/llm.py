"""The LLM proposer: any OpenAI-compatible chat completions endpoint, streamed.

Configured by model, base_url and api_key (or OPENAI_API_KEY / OPENAI_BASE_URL /
KERNEL_LSP_MODEL). The key lives only in the client object: never logged, never put
in a prompt, a note, an event or the store.

A proposal is one turn of its lineage's conversation (conversation.py). With an endpoint that
supports OpenAI tool calling (`tools="auto"`, the default, detected: an endpoint that rejects
`tools` gets the text protocol from then on) the model may compile, test, time and profile
through tools (tools.py) before it submits, within the Search's evaluation budget; otherwise
it answers with SEARCH/REPLACE patches or a whole file. An answer that cannot be used (a patch
that does not apply, no code) goes back to the model whole, with why, up to `parse_retries`
times: the lineage continues.

No model configured is an immediate `NoModelConfigured` (never a default model at a public
endpoint); an endpoint that does not answer is `EndpointUnreachable` from `check()` and a
fatal failed Proposal (no retry loop) from `propose()`. Both are `verdicts.CannotRun`: exit 2.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from .conversation import build_messages, size, unusable
from .prompts import SYSTEM, SYSTEM_TOOLS
from .proposer import Proposal, ProposalRequest

log = logging.getLogger(__name__)

@dataclass
class LLMConfig:
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)   # repr=False: keep it out of logs
    temperature: float | None = 0.7
    # Answer tokens. A reasoning model's hidden reasoning counts against max_completion_tokens
    # too: once the endpoint asks for that parameter (a reasoning model) it gets
    # `reasoning_max_tokens`, so a long think does not cut the code off.
    max_tokens: int | None = 16384
    reasoning_max_tokens: int = 65536
    tools: str = "auto"              # "auto": offer tools, fall back when refused; "off": text protocol
    max_tool_turns: int = 16         # model requests per proposal while it calls tools
    parse_retries: int = 2           # unusable answers sent back to the model per proposal
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
        if "tools" not in kw and env.get("KERNEL_LSP_AGENT_TOOLS"):  # "auto" | "off"
            kw["tools"] = env["KERNEL_LSP_AGENT_TOOLS"].strip().lower()
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
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


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
        self.uses_tools = self.config.tools != "off"  # the Search lends a Toolbox when True
        self._token_cap: int | None = None  # answer tokens, halved while the endpoint's context is exceeded
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

    def _tools_on(self, request: ProposalRequest) -> bool:
        return request.tools is not None and self.config.tools != "off" and "tools" not in self._refused

    async def _one(self, request: ProposalRequest, index: int) -> Proposal:
        t0 = time.monotonic()
        ideas = [request.direction] + list(request.siblings) if request.direction else []
        if ideas:  # each sibling its own direction; the others are named so it takes a different one
            mine = ideas[index % len(ideas)]
            request = dataclasses.replace(request, direction=mine, siblings=[d for d in ideas if d != mine])
        tools = self._tools_on(request)
        messages = build_messages(request, tools=tools)
        session = request.tools.session(request.parent) if tools else None
        pt = ct = turns = 0
        sent_back: list[str] = []
        retries = self.config.parse_retries
        origin = "repair" if request.mode == "repair" else "llm"

        def usage() -> dict[str, Any]:
            return dict(prompt_tokens=pt, completion_tokens=ct, seconds=time.monotonic() - t0, turns=turns,
                        cost=self.config.pricing.cost(self.model, pt, ct), sent_back=list(sent_back))

        while True:
            turns += 1
            try:
                done = await self.complete(messages, tools=request.tools.specs if tools else None)
            except LLMError as e:
                return Proposal.failed(e.reason, fatal=e.fatal, messages=messages[1:], **usage())
            pt, ct = pt + done.prompt_tokens, ct + done.completion_tokens
            if tools and "tools" in self._refused:  # the endpoint rejected tools: the text protocol
                tools, session = False, None
                messages[0] = {"role": "system", "content": SYSTEM}
            if done.tool_calls and session is not None:
                messages.append({"role": "assistant", "content": done.text or None, "tool_calls": done.tool_calls})
                for call in done.tool_calls:
                    fn = call["function"]
                    result = await session.call(fn["name"], fn.get("arguments"))
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
                if session.submitted is not None:
                    cand = session.submitted
                    cand.origin = origin
                    return Proposal(candidate=cand, form="tools", messages=messages[1:], **usage())
                b = request.tools.budget
                out_of_tokens = b.tokens is not None and b.used_tokens + pt + ct >= b.tokens
                if turns >= self.config.max_tool_turns or out_of_tokens:
                    if session.passed is not None and session.passed != request.parent.source:
                        cand = Candidate(source=session.passed, kind=request.parent.kind, origin=origin,
                                         parent=request.parent.id, note="last version that passed `test` "
                                         + ("(the token budget ran out)" if out_of_tokens
                                            else f"(no submit within {turns} turns)"))
                        return Proposal(candidate=cand, form="tools", messages=messages[1:], **usage())
                    why = "the token budget ran out" if out_of_tokens else f"no submit within {turns} tool turns"
                    return Proposal.failed(f"{why} (and no version passed `test`)", messages=messages[1:], **usage())
                continue
            messages.append({"role": "assistant", "content": done.text})
            current = session.working if session is not None else request.parent.source
            try:
                parsed = parse_answer(done.text, current, kind=request.parent.kind)
            except ParseError as e:
                if retries > 0:
                    retries -= 1
                    sent_back.append(str(e))
                    messages.append({"role": "user", "content": unusable(str(e), e.patch)})
                    continue
                return Proposal.failed(f"unusable answer: {e}", messages=messages[1:], **usage())
            note = parsed.note or ("patch" if parsed.form == "patch" else "rewrite")
            if parsed.form == "patch":
                note = f"{note} ({parsed.patches} patch{'es' if parsed.patches > 1 else ''})"
            cand = Candidate(source=parsed.source, kind=request.parent.kind, origin=origin,
                             parent=request.parent.id, note=note[:240])
            return Proposal(candidate=cand, form=parsed.form, messages=messages[1:], **usage())

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion:
        """One chat completion with bounded retries; raises LLMError with a clear reason."""
        oa = self._openai
        t0 = time.monotonic()
        last = "no attempt made"
        attempt = 0
        while attempt < self.config.attempts:
            attempt += 1
            try:
                if tools and "tools" in self._refused and messages and messages[0].get("content") == SYSTEM_TOOLS:
                    messages[0] = {"role": "system", "content": SYSTEM}  # refused: the text protocol's rules
                text, pt, ct, calls = await self._request(messages, None if "tools" in self._refused else tools)
                return Completion(text, pt, ct, attempt, time.monotonic() - t0, calls)
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
        if "context length" in low or "context window" in low:
            # A local server with a small context: ask for fewer answer tokens (halved, not below 2048).
            current = self._token_cap or self.config.max_tokens or 0
            if current > 2048:
                self._token_cap = max(2048, current // 2)
                return True
            return False
        for param in ("max_tokens", "temperature", "stream_options"):
            if param in low and param not in self._refused:
                self._refused.add(param)
                return True
        if ("tool" in low or "function" in low) and "tools" not in self._refused:
            self._refused.add("tools")  # no tool calling here: the text protocol from now on
            log.info("the endpoint rejected tools; using the text protocol")
            return True
        return False

    async def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
                       ) -> tuple[str, int, int, list[dict[str, Any]]]:
        kw: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            kw["tools"] = tools
        if self.config.temperature is not None and "temperature" not in self._refused:
            kw["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            if "max_tokens" in self._refused:  # a reasoning model: its hidden reasoning counts too
                want = max(self.config.max_tokens, self.config.reasoning_max_tokens)
                kw["max_completion_tokens"] = min(want, self._token_cap) if self._token_cap else want
            else:
                kw["max_tokens"] = min(self.config.max_tokens, self._token_cap or self.config.max_tokens)
        if not self.config.stream:
            resp = await self._client.chat.completions.create(**kw)
            msg = resp.choices[0].message if resp.choices else None
            text = (msg.content or "") if msg is not None else ""
            calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                   "arguments": c.function.arguments or ""}}
                     for c in (msg.tool_calls or [])] if msg is not None else []
            usage = resp.usage
            pt = usage.prompt_tokens if usage else _estimate(messages)
            ct = usage.completion_tokens if usage else len(text) // 4
            return text, pt, ct, calls
        if "stream_options" not in self._refused:
            kw["stream_options"] = {"include_usage": True}
        stream = await self._client.chat.completions.create(stream=True, **kw)
        chunks: list[str] = []
        pieces: dict[int, dict[str, Any]] = {}   # streamed tool calls, by index
        pt = ct = None
        async with stream:
            async for chunk in stream:
                if chunk.usage is not None:
                    pt, ct = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                for choice in chunk.choices or ():
                    if choice.delta is not None and choice.delta.content:
                        chunks.append(choice.delta.content)
                    for tc in (choice.delta.tool_calls or []) if choice.delta is not None else []:
                        got = pieces.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                        got["id"] = tc.id or got["id"]
                        if tc.function is not None:
                            got["name"] = tc.function.name or got["name"]
                            got["arguments"] += tc.function.arguments or ""
        text = "".join(chunks)
        calls = [{"id": c["id"] or f"call_{i}", "type": "function",
                  "function": {"name": c["name"], "arguments": c["arguments"]}} for i, c in sorted(pieces.items())]
        # Servers without include_usage: estimate (about 4 characters a token).
        return (text, (pt if pt is not None else _estimate(messages)),
                (ct if ct is not None else (len(text) + sum(len(c["function"]["arguments"]) for c in calls)) // 4), calls)

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


def _estimate(messages: list[dict[str, Any]]) -> int:
    return size(messages) // 4  # about 4 characters a token


def _short(e: Exception) -> str:
    msg = getattr(e, "message", None) or str(e)
    return " ".join(str(msg).split())[:200]
