"""Helpers the server tests share (imported by name: tests/server/conftest.py puts this folder on sys.path)."""
MODEL = "smollm2-135m-instruct"


def chat_stream_text(client, messages, **params) -> str:
    params.setdefault("temperature", 0)
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **params)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


class Relay:
    """A TCP relay on 127.0.0.1 in front of a server, which a test can cut at a chosen moment: the
    connection drops exactly then (a reset, as when a cable or a VPN goes), not when the server's own
    shutdown gets round to it. `url` is the relayed server's /v1 address."""

    def __init__(self, port: int):
        import socket
        import threading

        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list = []
        self._lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            try:
                inbound, _ = self._listener.accept()
            except OSError:                          # closed by sever()
                return
            outbound = socket.create_connection(("127.0.0.1", self._target))
            with self._lock:
                self._sockets += [inbound, outbound]
            for a, b in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def sever(self):
        """Reset every relayed connection now and accept no more."""
        import socket
        import struct

        self._listener.close()
        with self._lock:
            for s in self._sockets:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # RST, not FIN
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
