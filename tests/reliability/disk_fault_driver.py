"""Import or quantize with the process's file-size limit (RLIMIT_FSIZE) set: a disk that fills up.

    python tests/reliability/disk_fault_driver.py HOME LIMIT_BYTES WHAT SOURCE

WHAT: gguf (import a GGUF), folder-copy (import a folder whose files cannot be hard-linked, so
they are copied) or quantize (import SOURCE with no limit, then `hearth quantize` it under the
limit). SIGXFSZ is ignored, so a write past the limit fails with EFBIG as on a full disk. Prints one
JSON line: the outcome ("ok", "typed" or "untyped"), the error and message, and what the library's
folder holds afterwards.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv) -> int:
    home, limit, what, source = Path(argv[0]), int(argv[1]), argv[2], Path(argv[3])
    from engine.errors import HearthError
    from engine.library import ModelLibrary

    library = ModelLibrary(home)
    keep = set()
    if what == "quantize":
        keep.add(library.import_path(source).id)
    if what == "folder-copy":
        os.link = _no_links             # as if the library were on another file system
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    result = {}
    try:
        if what == "quantize":
            from engine.quantize import quantize_model

            manifest = quantize_model(next(iter(keep)), library=library)
        else:
            manifest = library.import_path(source)
        result = {"outcome": "ok", "id": manifest.id}
        keep.add(manifest.id)
    except HearthError as exc:
        result = {"outcome": "typed", "error": type(exc).__name__, "message": exc.message}
    except Exception as exc:  # noqa: BLE001
        result = {"outcome": "untyped", "error": type(exc).__name__, "message": str(exc),
                  "traceback": traceback.format_exc()[-2000:]}
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    models = home / "models"
    result["left"] = sorted(p.name for p in models.iterdir() if p.name not in keep) if models.is_dir() else []
    result["listed"] = sorted(m.id for m in library.list())
    result["keep"] = sorted(keep)
    print(json.dumps(result), flush=True)
    return 0


def _no_links(*args, **kwargs):
    raise OSError(18, "Invalid cross-device link")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
