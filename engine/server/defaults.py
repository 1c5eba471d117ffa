"""The server's defaults (no import of the web stack: the CLI reads them to build its parser)."""
DEFAULT_HOST = "127.0.0.1"   # this machine only
DEFAULT_PORT = 8765          # not 1234 / 11434 / 1337 / 4891, which LM Studio, Ollama, Jan, GPT4All use
