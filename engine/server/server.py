"""The server process: uvicorn in a thread of its own, over the app of app.py.

    server = Server(engine, ServerConfig(port=0, api_key="secret"))
    server.start()            # uvicorn in a thread of its own; returns once it listens
    print(server.url)         # http://127.0.0.1:PORT/v1
    server.stop()
"""
from __future__ import annotations

import asyncio
import threading
from typing import Optional

from ..errors import HearthError
from .app import ServerConfig, create_app
from .defaults import DEFAULT_HOST, DEFAULT_PORT
from .host import EngineHost, RequestRecord

__all__ = ["Server", "ServerConfig", "EngineHost", "RequestRecord", "DEFAULT_HOST", "DEFAULT_PORT",
           "ServerUnavailable"]


class ServerUnavailable(HearthError):
    kind = "server-unavailable"


def _uvicorn():
    try:
        import uvicorn
    except ImportError:
        raise ServerUnavailable("The server needs uvicorn and starlette: pip install 'hearth[serve]'.") from None
    return uvicorn


class Server:
    def __init__(self, engine, config: Optional[ServerConfig] = None):
        self.config = config or ServerConfig()
        self.host = EngineHost(engine, self.config.models)
        self.app = create_app(self.host, self.config)
        self._server = None
        self._thread: Optional[threading.Thread] = None
        self.port: Optional[int] = None
        self._error: Optional[BaseException] = None

    @property
    def url(self) -> str:
        name = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{name}:{self.port}/v1"

    def _uvicorn_server(self):
        uvicorn = _uvicorn()
        config = uvicorn.Config(self.app, host=self.config.host, port=self.config.port, log_level="warning",
                                access_log=False, lifespan="off", timeout_graceful_shutdown=2)
        return uvicorn.Server(config)

    def start(self, timeout: float = 30.0) -> "Server":
        """Listen in a background thread; raises ServerUnavailable if the port cannot be bound."""
        self._server = self._uvicorn_server()
        self._server.install_signal_handlers = lambda: None   # not the main thread

        def run():
            try:
                asyncio.run(self._server.serve())
            except BaseException as exc:     # noqa: BLE001 - reported by start()
                self._error = exc

        self._thread = threading.Thread(target=run, name="hearth-serve", daemon=True)
        self._thread.start()
        for _ in range(int(timeout / 0.02)):
            if self._server.started or not self._thread.is_alive():
                break
            self._thread.join(0.02)
        if not self._server.started:
            self.stop()
            why = self._error or "it did not start in time"
            if isinstance(why, SystemExit):
                why = "the address is in use or cannot be bound"
            raise ServerUnavailable(f"The server could not listen on {self.config.host}:{self.config.port}: {why}.")
        sockets = [s for srv in self._server.servers for s in srv.sockets]
        self.port = sockets[0].getsockname()[1] if sockets else self.config.port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def serve_forever(self) -> None:
        """Run in the calling thread until Ctrl-C (the CLI)."""
        server = self._uvicorn_server()
        self._server = server
        asyncio.run(server.serve())
