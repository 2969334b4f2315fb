"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat completions API with
scripted answers, for tests that drive the real `openai` client.

    server = start(["first answer", {"status": 429, "headers": {"Retry-After": "0"}}, "next"])
    client = AsyncOpenAI(base_url=server.base_url, api_key="k")
    ...
    server.requests   # every request: {"path", "headers" (lower-case names), "body", "answered"}
    server.close()

Each request takes the next scripted item; when the script runs out, `default` answers.
An item is either a string (the assistant's text) or a dict:
    {"text": str, "usage": bool}                   an answer (usage in the stream if asked)
    {"status": int, "body": dict|str, "headers": {}}  an HTTP error (429, 401, 500, ...)
    {"sleep": float, "text": str}                  answer after a delay (timeouts, cancel)
    {"stream_error": str}                          a stream that breaks with an error event
    a callable(body) -> item                       the answer made at request time (from files the
                                                   server under test wrote meanwhile, or from what the
                                                   model was sent: a tool's result)
    {"tool_calls": [{"name": str, "arguments": dict|str}], "text": str}
                                                   the assistant calls tools (OpenAI tool calling)
Streaming (`"stream": true`) answers are Server-Sent Events in small chunks, `[DONE]` last.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Item = str | dict[str, Any]


class ScriptedServer:
    def __init__(self, answers: list[Item], default: Item = "No more ideas.") -> None:
        self.answers = list(answers)
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self.gets: list[dict[str, Any]] = []  # GET requests (a model list): {"path", "headers"}
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"scripted": self})
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def next_item(self) -> Item:
        with self._lock:
            return self.answers.pop(0) if self.answers else self.default

    def add(self, *items: Item) -> None:
        with self._lock:
            self.answers.extend(items)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "ScriptedServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout, cancel) leaves a broken pipe: expected, not news.
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def start(answers: list[Item], default: Item = "No more ideas.") -> ScriptedServer:
    """Start a server in a background thread; `.base_url` ends in /v1 like OpenAI's."""
    return ScriptedServer(answers, default)


class _Handler(BaseHTTPRequestHandler):
    scripted: ScriptedServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:  # /v1/models, for clients that list models
        with self.scripted._lock:
            self.scripted.gets.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
        self._json(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        item = self.scripted.next_item()
        if callable(item):
            item = item(body)
        record = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body,
                  "answered": item, "time": time.time()}
        with self.scripted._lock:
            self.scripted.requests.append(record)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        if isinstance(item, str):
            item = {"text": item}
        if "sleep" in item:
            time.sleep(float(item["sleep"]))
        if "status" in item:
            payload = item.get("body") or {"error": {"message": f"scripted HTTP {item['status']}",
                                                     "type": "scripted", "code": item["status"]}}
            self._json(int(item["status"]), payload, item.get("headers", {}))
            return
        prompt_tokens = sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4
        calls = _tool_calls(item, len(self.scripted.requests))
        if body.get("stream"):
            self._stream(body, item, prompt_tokens, calls)
        else:
            text = item.get("text", "")
            message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
            if calls:
                message["tool_calls"] = calls
            self._json(200, {
                "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop",
                             "message": message}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text) // 4,
                          "total_tokens": prompt_tokens + len(text) // 4},
            })

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode() if not isinstance(payload, str) else payload.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, body: dict[str, Any], item: dict[str, Any], prompt_tokens: int,
                calls: list[dict[str, Any]] | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        model = body.get("model", "scripted")
        base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model}

        def send(obj: Any, event: str | None = None) -> None:
            prefix = f"event: {event}\n" if event else ""
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"{prefix}data: {data}\n\n".encode())
            self.wfile.flush()

        send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                   "finish_reason": None}]})
        if "stream_error" in item:
            send({"error": {"message": item["stream_error"], "type": "server_error"}}, event="error")
            self.close_connection = True
            return
        text = item.get("text", "")
        size = max(64, len(text) // 100)  # small chunks, but not thousands for a huge answer
        for i in range(0, len(text), size):
            send({**base, "choices": [{"index": 0, "delta": {"content": text[i:i + size]},
                                       "finish_reason": None}]})
        for i, call in enumerate(calls or []):
            args = call["function"]["arguments"]
            half = len(args) // 2  # arguments arrive in pieces, as real servers send them
            send({**base, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                {"index": i, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": args[:half]}}]}}]})
            send({**base, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": args[half:]}}]}}]})
        send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}]})
        wants_usage = (body.get("stream_options") or {}).get("include_usage")
        if wants_usage and item.get("usage", True):
            ct = len(text) // 4
            send({**base, "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                   "completion_tokens": ct,
                                                   "total_tokens": prompt_tokens + ct}})
        send("[DONE]")
        self.close_connection = True


def _tool_calls(item: dict[str, Any], n: int) -> list[dict[str, Any]]:
    out = []
    for i, call in enumerate(item.get("tool_calls") or []):
        args = call.get("arguments", {})
        out.append({"id": call.get("id", f"call_{n}_{i}"), "type": "function",
                    "function": {"name": call["name"],
                                 "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out
