"""The ASGI app (Starlette): OpenAI-compatible routes over an EngineHost.

    GET  /v1/models
    POST /v1/chat/completions     (stream by server-sent events, ending with `data: [DONE]`)
    POST /v1/completions

Every request passes, in order: the Host header check (DNS rebinding: a web page on a foreign name
must not reach a server on 127.0.0.1), the API key when one is set, and the body size bound.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine import Finished, TextDelta
from ..errors import HearthError
from .errors import APIError, bad_param, from_engine_error
from .host import EngineHost, RequestRecord
from .schemas import ParsedRequest, parse_chat, parse_completion, require_object
from . import tools as tool_calls

from .defaults import DEFAULT_HOST, DEFAULT_PORT

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: Optional[str] = None
    models: Optional[list] = None              # ids served; None = the whole library
    cors_origins: list = field(default_factory=list)   # empty: no CORS headers at all
    allowed_hosts: list = field(default_factory=list)  # extra names the Host header may carry
    max_body_bytes: int = 4 << 20
    max_tokens: int = 4096                     # the most tokens one reply may ask for


def _finish_reason(stop_reason: str) -> str:
    return {"max-tokens": "length", "context-full": "length"}.get(stop_reason, "stop")


def _host_allowed(header: str, config: ServerConfig) -> bool:
    host = header.strip().lower()
    if host.startswith("["):                     # [::1]:8765
        name = host[1:host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    allowed = {n.lower() for n in (*LOOPBACK_NAMES, config.host, *config.allowed_hosts)}
    if name in allowed:
        return True
    if config.host in ("0.0.0.0", "::"):
        try:                                     # bound to every interface: any address literal is fine,
            ipaddress.ip_address(name)           # rebinding needs a DNS name
            return True
        except ValueError:
            return False
    return False


class Guard:
    """ASGI middleware: Host check, API key, body size bound, before any route runs."""

    def __init__(self, app, config: ServerConfig):
        self.app, self.config = app, config

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        error = None
        if not _host_allowed(headers.get("host", ""), self.config):
            error = APIError(403, f"The Host header {headers.get('host', '')!r} is not one this server answers to "
                             "(a guard against DNS rebinding); add it with --allow-host.", code="host_not_allowed")
        elif self.config.api_key and scope["method"] != "OPTIONS":
            auth = headers.get("authorization", "")
            given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if not given or not hmac.compare_digest(given.encode(), self.config.api_key.encode()):
                error = APIError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'.",
                                 code="invalid_api_key")
        if error is None:
            length = headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self.config.max_body_bytes:
                error = APIError(413, f"The request body is {int(length):,} bytes; this server takes at most "
                                 f"{self.config.max_body_bytes:,}.", code="request_too_large")
        if error is not None:
            response = JSONResponse(error.body(), status_code=error.status)
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def _json_body(request: Request, limit: int) -> dict:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"The request body is over {limit:,} bytes.", code="request_too_large")
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    return require_object(parsed)


def create_app(host: EngineHost, config: ServerConfig) -> Starlette:
    engine = host.engine

    async def load(model: str) -> str:
        try:
            return await asyncio.to_thread(host.ensure_loaded, model)
        except HearthError as exc:
            raise from_engine_error(exc) from None

    def check_context(model_id: str, tokens: list, param: str) -> None:
        limit = engine.context_limit(model_id)
        if len(tokens) >= limit:
            raise APIError(400, f"The prompt is {len(tokens):,} tokens, and this model was loaded with a context "
                           f"of {limit:,} tokens.", param=param, code="context_length_exceeded")

    def constraint_for(model_id: str, parsed: ParsedRequest):
        if not parsed.response_format or parsed.response_format.get("type") == "text":
            return None
        from ..constraints import constraint_for_response_format
        try:
            return constraint_for_response_format(engine.tokenizer(model_id), parsed.response_format)
        except HearthError as exc:
            raise bad_param("response_format", exc.message) from None

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": host.served_models()})

    async def run(request: Request, kind: str):
        started = time.perf_counter()
        record = {"method": request.method, "path": request.url.path, "model": ""}
        try:
            body = await _json_body(request, config.max_body_bytes)
            parsed = (parse_chat if kind == "chat" else parse_completion)(body, config.max_tokens)
            record["model"] = parsed.model
            model_id = await load(parsed.model)
            try:
                if kind == "chat":
                    plan = tool_calls.plan(engine, model_id, parsed)
                    tokens = plan.tokens
                    constraint = plan.constraint or constraint_for(model_id, parsed)
                else:
                    plan = None
                    prompt = parsed.prompt
                    if isinstance(prompt, str):
                        tokens = engine.tokenizer(model_id).encode(prompt)
                        tok = engine.tokenizer(model_id)
                        bos = tok.inner.token_to_id(tok.bos_token) if tok.bos_token else None
                        if tok.add_bos and bos is not None:
                            tokens = [bos] + tokens
                    else:
                        vocab = engine.tokenizer(model_id).vocab_size
                        if any(t < 0 or t >= vocab for t in prompt):
                            raise bad_param("prompt", f"Token ids must be in [0, {vocab}).")
                        tokens = list(prompt)
                    constraint = constraint_for(model_id, parsed)
            except HearthError as exc:
                raise from_engine_error(exc) from None
            check_context(model_id, tokens, "messages" if kind == "chat" else "prompt")
        except APIError as error:
            host.record(RequestRecord(time.time(), record["method"], record["path"], record["model"], error.status,
                                      duration_s=time.perf_counter() - started))
            return _error_response(error)
        reply = Reply(kind, model_id, parsed, len(tokens), plan)
        if parsed.stream:
            return StreamingResponse(reply.sse(host.stream(model_id, tokens, parsed.params, constraint),
                                               host, started, record),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            finished = await host.complete(model_id, tokens, parsed.params, constraint)
        except HearthError as exc:
            error = from_engine_error(exc)
            host.record(RequestRecord(time.time(), record["method"], record["path"], model_id, error.status,
                                      duration_s=time.perf_counter() - started))
            return _error_response(error)
        s = finished.stats
        host.record(RequestRecord(time.time(), record["method"], record["path"], model_id, 200, s.prompt_tokens,
                                  s.generated_tokens, s.ttft_s, time.perf_counter() - started, s.stop_reason))
        return JSONResponse(reply.whole(finished))

    async def chat_completions(request: Request):
        return await run(request, "chat")

    async def completions(request: Request):
        return await run(request, "completion")

    async def not_found(request: Request, exc):
        return _error_response(APIError(404, f"There is no route {request.method} {request.url.path}; see GET "
                                        "/v1/models, POST /v1/chat/completions, POST /v1/completions.",
                                        code="not_found"))

    async def method_not_allowed(request: Request, exc):
        return _error_response(APIError(405, f"{request.method} is not allowed on {request.url.path}.",
                                        code="method_not_allowed"))

    async def internal(request: Request, exc):
        return _error_response(APIError(500, f"Internal server error: {exc}", type="server_error"))

    routes = [Route("/v1/models", models, methods=["GET"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: method_not_allowed, 500: internal})
    app.state.host = host
    if config.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(Guard, config=config)
    return app


class Reply:
    """One response in OpenAI's shapes, whole or as chunks."""

    def __init__(self, kind: str, model_id: str, parsed: ParsedRequest, prompt_tokens: int, plan):
        self.kind, self.model_id, self.parsed, self.plan = kind, model_id, parsed, plan
        self.prompt_tokens = prompt_tokens
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.object = "chat.completion" if kind == "chat" else "text_completion"

    def usage(self, completion_tokens: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}

    def _head(self, chunk: bool) -> dict:
        obj = self.object + (".chunk" if chunk and self.kind == "chat" else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_id,
                "system_fingerprint": "hearth"}

    def whole(self, finished: Finished) -> dict:
        s = finished.stats
        reason = _finish_reason(s.stop_reason)
        if self.kind == "chat":
            message = {"role": "assistant", "content": finished.text, "refusal": None}
            if self.plan is not None and self.plan.tools:
                content, calls = tool_calls.parse(finished.text, self.plan)
                if calls:
                    message = {"role": "assistant", "content": content or None, "tool_calls": calls, "refusal": None}
                    reason = "tool_calls"
            choice = {"index": 0, "message": message, "finish_reason": reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": finished.text, "finish_reason": reason, "logprobs": None}
        return {**self._head(False), "choices": [choice], "usage": self.usage(s.generated_tokens)}

    def _chunk(self, delta: Optional[dict] = None, text: Optional[str] = None, finish: Optional[str] = None) -> str:
        if self.kind == "chat":
            choice = {"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        body = {**self._head(True), "choices": [choice]}
        if self.parsed.include_usage:
            body["usage"] = None
        return f"data: {json.dumps(body)}\n\n"

    async def sse(self, events, host: EngineHost, started: float, record: dict):
        status, finished = 200, None
        buffer_tools = self.plan is not None and bool(self.plan.tools)
        try:
            if self.kind == "chat":
                yield self._chunk(delta={"role": "assistant", "content": ""})
            async for event in events:
                if isinstance(event, TextDelta):
                    if buffer_tools or not event.text:
                        continue
                    yield (self._chunk(delta={"content": event.text}) if self.kind == "chat"
                           else self._chunk(text=event.text))
                elif isinstance(event, Finished):
                    finished = event
            reason = _finish_reason(finished.stats.stop_reason)
            if buffer_tools:
                content, calls = tool_calls.parse(finished.text, self.plan)
                delta = {"content": content} if content else {}
                if calls:
                    delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
                    reason = "tool_calls"
                yield self._chunk(delta=delta)
            yield self._chunk(finish=reason)
            if self.parsed.include_usage:
                body = {**self._head(True), "choices": [], "usage": self.usage(finished.stats.generated_tokens)}
                yield f"data: {json.dumps(body)}\n\n"
            yield "data: [DONE]\n\n"
        except HearthError as exc:                  # after the headers went out: an error event, then DONE
            error = from_engine_error(exc)
            status = error.status
            yield f"data: {json.dumps(error.body())}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            s = finished.stats if finished is not None else None
            host.record(RequestRecord(time.time(), record["method"], record["path"], self.model_id,
                                      status if s is not None or status != 200 else 499,
                                      s.prompt_tokens if s else self.prompt_tokens, s.generated_tokens if s else 0,
                                      s.ttft_s if s else 0.0, time.perf_counter() - started,
                                      s.stop_reason if s else "disconnected"))
