"""Remote OpenAI-compatible endpoints (vLLM, SGLang, another Hearth, ...) as a model source.

    endpoints = RemoteEndpoints()                       # remotes.json in the Hearth home: no keys in it
    endpoint = endpoints.add("cluster", "http://gpu-box:8000/v1", api_key="...")   # key to the keyring
    client = endpoint.client()
    client.models()                                     # ids from GET /v1/models
    for event in client.chat_stream("llama-70b", messages, SamplingParams(temperature=0)):
        ...                                             # TextDelta ... Finished, as Engine.chat yields

The key lives in the system keyring (`keyring`). Where there is none (a headless Linux without a
Secret Service), `add` raises KeyringUnavailable and the caller keeps the key in memory for the
session only; it is never written to plain settings. Time to first token and tokens per second are
measured here, client-side. A reply cut by a dropped connection ends as `Finished` with stop_reason
"connection-lost" and the text received so far, so the app keeps it as a stopped reply.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional

from .engine import Finished, GenerationStats, TextDelta
from .errors import HearthError, InvalidOption
from .sampling import SamplingParams

KEYRING_SERVICE = "hearth-remote-endpoints"
DEFAULT_TIMEOUT = 60.0


class RemoteError(HearthError):
    kind = "remote"


class RemoteUnreachable(RemoteError):
    kind = "remote-unreachable"


class RemoteTimeout(RemoteError):
    kind = "remote-timeout"


class RemoteAuthFailed(RemoteError):
    kind = "remote-auth"


class RemoteRefused(RemoteError):
    """The endpoint answered with an error (its own message is kept)."""
    kind = "remote-refused"

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class KeyringUnavailable(HearthError):
    kind = "keyring-unavailable"


def _httpx():
    try:
        import httpx
    except ImportError:
        raise RemoteError("Remote endpoints need the httpx package: pip install 'hearth[serve]'.") from None
    return httpx


def normalize_base_url(url: str) -> str:
    url = (url or "").strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise InvalidOption(f"{url!r} is not an http(s) address; an OpenAI-compatible endpoint looks like "
                            "http://host:8000/v1.")
    return url if url.endswith("/v1") else url + "/v1"


class RemoteClient:
    last_error: Optional[RemoteError] = None     # why the last stream ended as "connection-lost"

    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = 10.0):
        self.base_url = normalize_base_url(base_url)
        self.api_key = api_key
        self.timeout = timeout
        self.connect_timeout = connect_timeout

    # ----------------------------------------------------------------------------- plumbing
    def _headers(self) -> dict:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _timeouts(self):
        return _httpx().Timeout(self.timeout, connect=self.connect_timeout)

    def _translate(self, exc) -> RemoteError:
        httpx = _httpx()
        where = self.base_url
        if isinstance(exc, httpx.TimeoutException):
            return RemoteTimeout(f"{where} did not answer within {self.timeout:g} s. The endpoint may be busy or "
                                 "down; try again, or raise the timeout.")
        if isinstance(exc, (httpx.ConnectError, httpx.NetworkError)):
            return RemoteUnreachable(f"Cannot reach {where}: {exc or type(exc).__name__}. Check the address, the "
                                     "network, and that the server is running.")
        return RemoteError(f"Talking to {where} failed: {exc}")

    def _refusal(self, status: int, body: bytes) -> RemoteError:
        try:
            error = json.loads(body)["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
        except (ValueError, KeyError, TypeError):
            message = body.decode("utf-8", "replace")[:300] or f"HTTP {status}"
        if status in (401, 403):
            return RemoteAuthFailed(f"{self.base_url} refused the API key (HTTP {status}): {message}")
        return RemoteRefused(f"{self.base_url} answered HTTP {status}: {message}", status)

    # ----------------------------------------------------------------------------- API
    def models(self) -> list[str]:
        """The model ids the endpoint serves (GET /v1/models)."""
        httpx = _httpx()
        try:
            r = httpx.get(f"{self.base_url}/models", headers=self._headers(), timeout=self._timeouts())
        except httpx.HTTPError as exc:
            raise self._translate(exc) from None
        if r.status_code != 200:
            raise self._refusal(r.status_code, r.content)
        try:
            return [m["id"] for m in r.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise RemoteRefused(f"{self.base_url}/models did not answer with an OpenAI model list.") from None

    def chat_stream(self, model: str, messages: list, params: SamplingParams = SamplingParams(),
                    cancel=None, extra: Optional[dict] = None) -> Iterator:
        """Stream one reply as TextDelta events and a closing Finished (client-side metrics).
        `cancel` (a threading.Event or a callable) is checked at every event: the reply stops there."""
        httpx = _httpx()
        body = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
                "temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens}
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        body.update(extra or {})
        started = time.perf_counter()
        first_at, text, deltas, usage, reason = None, "", 0, None, "cancelled"
        try:
            with httpx.stream("POST", f"{self.base_url}/chat/completions", json=body, headers=self._headers(),
                              timeout=self._timeouts()) as r:
                if r.status_code != 200:
                    raise self._refusal(r.status_code, r.read())
                try:
                    stopped = getattr(cancel, "is_set", cancel)      # an Event or a callable
                    for line in r.iter_lines():
                        if stopped is not None and stopped():
                            reason = "cancelled"
                            break
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        chunk = json.loads(data)
                        if "error" in chunk:
                            raise self._refusal(500, data.encode())
                        usage = chunk.get("usage") or usage
                        for choice in chunk.get("choices") or []:
                            piece = (choice.get("delta") or {}).get("content") or ""
                            if piece:
                                first_at = first_at or time.perf_counter()
                                text += piece
                                deltas += 1
                                yield TextDelta(piece, -1)
                            if choice.get("finish_reason"):
                                reason = {"length": "max-tokens"}.get(choice["finish_reason"], "stop")
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ReadTimeout) as exc:
                    if first_at is None:             # nothing arrived: a plain network error or timeout
                        raise self._translate(exc) from None
                    reason = "connection-lost"       # keep what arrived; the app shows it as stopped
                    self.last_error = self._translate(exc)
        except RemoteError:
            raise
        except httpx.HTTPError as exc:
            if first_at is None:
                raise self._translate(exc) from None
            reason = "connection-lost"
        ended = time.perf_counter()
        generated = int((usage or {}).get("completion_tokens") or deltas)
        first_at = first_at or ended
        stats = GenerationStats(
            prompt_tokens=int((usage or {}).get("prompt_tokens") or 0), prefilled_tokens=0, generated_tokens=generated,
            ttft_s=first_at - started,
            tokens_per_s=(generated - 1) / (ended - first_at) if generated > 1 and ended > first_at else 0.0,
            stop_reason=reason, context_used=0, context_limit=0, seed=params.seed or 0)
        yield Finished(stats, text)


# --------------------------------------------------------------------------------- stored endpoints
@dataclass(frozen=True)
class RemoteEndpoint:
    name: str
    base_url: str
    has_key: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


class RemoteEndpoints:
    """The endpoints the user added: remotes.json in the Hearth home (no keys), keys in the keyring.

    `session_keys` holds keys for this run only where no keyring exists."""

    def __init__(self, home=None):
        from .library import default_home

        self.home = Path(home) if home else default_home()
        self.path = self.home / "remotes.json"
        self.session_keys: dict = {}

    def list(self) -> list[RemoteEndpoint]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        return [RemoteEndpoint(d["name"], d["base_url"], bool(d.get("has_key"))) for d in data
                if isinstance(d, dict) and "name" in d and "base_url" in d]

    def _write(self, endpoints: list) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([e.to_dict() for e in endpoints], indent=1), encoding="utf-8")
        tmp.replace(self.path)

    def get(self, name: str) -> RemoteEndpoint:
        for e in self.list():
            if e.name == name:
                return e
        raise InvalidOption(f"There is no remote endpoint named {name!r}.")

    def add(self, name: str, base_url: str, api_key: Optional[str] = None) -> RemoteEndpoint:
        """Add or replace an endpoint. The key goes to the keyring; without one, KeyringUnavailable
        is raised after the endpoint is saved and the key kept for this session only."""
        if not name or not name.strip() or "/" in name:
            raise InvalidOption("A remote endpoint needs a name without '/'.")
        endpoint = RemoteEndpoint(name.strip(), normalize_base_url(base_url), bool(api_key))
        self._write([e for e in self.list() if e.name != endpoint.name] + [endpoint])
        if api_key:
            try:
                store_key(endpoint.name, api_key)
            except KeyringUnavailable:
                self.session_keys[endpoint.name] = api_key
                raise
        return endpoint

    def remove(self, name: str) -> None:
        self._write([e for e in self.list() if e.name != name])
        self.session_keys.pop(name, None)
        try:
            delete_key(name)
        except KeyringUnavailable:
            pass

    def key(self, name: str) -> Optional[str]:
        if name in self.session_keys:
            return self.session_keys[name]
        try:
            return load_key(name)
        except KeyringUnavailable:
            return None

    def client(self, name: str, timeout: float = DEFAULT_TIMEOUT) -> RemoteClient:
        endpoint = self.get(name)
        return RemoteClient(endpoint.base_url, self.key(name), timeout=timeout)

    def chat_stream(self, ref: str, messages: list, params: SamplingParams = SamplingParams(), cancel=None):
        """Stream a reply from a remote model named by its reference ("remote:ENDPOINT/MODEL")."""
        name, model = split_ref(ref)
        return self.client(name).chat_stream(model, messages, params, cancel=cancel)


REMOTE_PREFIX = "remote:"


def model_ref(endpoint: str, model: str) -> str:
    """How a remote model is named among local ones: "remote:ENDPOINT/MODEL"."""
    return f"{REMOTE_PREFIX}{endpoint}/{model}"


def is_remote(model_id) -> bool:
    return str(model_id).startswith(REMOTE_PREFIX)


def split_ref(ref: str) -> tuple[str, str]:
    if not is_remote(ref) or "/" not in ref:
        raise InvalidOption(f"{ref!r} does not name a remote model (remote:ENDPOINT/MODEL).")
    name, model = ref[len(REMOTE_PREFIX):].split("/", 1)
    return name, model


def _keyring():
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        raise KeyringUnavailable("The keyring package is not installed, so the API key cannot be stored; it is "
                                 "kept for this session only.") from None
    backend = keyring.get_keyring()
    if isinstance(backend, fail.Keyring) or "fail" in type(backend).__module__ or "null" in type(backend).__module__:
        raise KeyringUnavailable("This system has no keyring (such as GNOME Keyring or KWallet), so the API key "
                                 "cannot be stored; it is kept for this session only.")
    return keyring


def store_key(name: str, key: str) -> None:
    kr = _keyring()
    try:
        kr.set_password(KEYRING_SERVICE, name, key)
    except Exception as exc:  # noqa: BLE001 - keyring backends raise their own types
        raise KeyringUnavailable(f"The system keyring refused the key: {exc}") from None


def load_key(name: str) -> Optional[str]:
    kr = _keyring()
    try:
        return kr.get_password(KEYRING_SERVICE, name)
    except Exception as exc:  # noqa: BLE001
        raise KeyringUnavailable(f"The system keyring could not be read: {exc}") from None


def delete_key(name: str) -> None:
    kr = _keyring()
    try:
        kr.delete_password(KEYRING_SERVICE, name)
    except Exception:  # noqa: BLE001 - nothing stored is fine
        pass
