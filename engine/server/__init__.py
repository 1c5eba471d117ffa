"""Hearth's OpenAI-compatible server (`hearth serve`, the app's Server panel). See docs/SERVER.md.

    from engine.server import Server, ServerConfig
    server = Server(engine, ServerConfig(port=0, api_key="secret")).start()   # listens in a thread
    print(server.url)                                                        # http://127.0.0.1:PORT/v1
    server.stop()

The web stack (starlette, uvicorn) is imported only when the server is used.
"""
from .defaults import DEFAULT_HOST, DEFAULT_PORT

_LAZY = {"Server": "server", "ServerUnavailable": "server", "ServerConfig": "app", "create_app": "app",
         "EngineHost": "host", "RequestRecord": "host"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)
