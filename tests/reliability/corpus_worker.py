"""Runs malformed-checkpoint cases through inspect, import and load; one JSON line per case.

    python tests/reliability/corpus_worker.py BASES_DIR WORK_DIR CASE [CASE ...]

The parent (reliability_harness.run_watched) reads "start NAME" before each case and
"result {json}" after it; a case that never reports is a hang (the parent kills this process after
its timeout), a process that dies is a crash. Outcomes per stage: "ok", "typed" (a HearthError, with
its class and message) or "untyped" (anything else, with the traceback).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import reliability_corpus as corpus  # noqa: E402


def _stage(fn) -> dict:
    from engine.errors import HearthError

    try:
        detail = fn()
        return {"outcome": "ok", **(detail or {})}
    except HearthError as exc:
        return {"outcome": "typed", "error": type(exc).__name__, "message": exc.message}
    except BaseException as exc:  # noqa: BLE001 - the point is to catch what should not happen
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"outcome": "untyped", "error": type(exc).__name__, "message": str(exc)[:300],
                "traceback": traceback.format_exc()[-3000:]}


def _library_leftovers(home: Path, keep: set) -> list:
    models = home / "models"
    if not models.is_dir():
        return []
    return sorted(p.name for p in models.iterdir() if p.name not in keep)


def run_case(case, bases: dict, work: Path) -> dict:
    from engine import Engine
    from engine.checkpoint import inspect
    from engine.library import ModelLibrary
    from engine.sampling import SamplingParams

    out = work / case.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    home = out / "home"
    cwd = os.getcwd()
    os.chdir(out)           # a sandbox escape would write its marker here
    try:
        path = case.build(bases[case.base], out)
        result = {"name": case.name, "must_fail": case.must_fail}
        result["inspect"] = _stage(lambda: (inspect(path), None)[1])
        library = ModelLibrary(home)
        imported = {}

        def do_import():
            manifest = library.import_path(path)
            imported["id"] = manifest.id
            return {"id": manifest.id}

        result["import"] = _stage(do_import)
        leftovers = _library_leftovers(home, {imported.get("id")})
        result["library_clean"] = not leftovers
        result["leftovers"] = leftovers

        def do_load():
            eng = Engine(backend="torch", home=home, context_length=64)
            handle = eng.load_model(imported.get("id") or path)
            try:
                text = ""
                if eng._model(handle.id).tokenizer is not None:
                    for event in eng.generate(handle.id, "hello", SamplingParams(temperature=0, max_tokens=2),
                                              chat=True):
                        text += getattr(event, "text", "")
                return {"text": text[:200]}
            finally:
                eng.unload(handle.id)

        result["load"] = _stage(do_load)
        if imported.get("id"):
            library.remove(imported["id"])
        result["library_clean"] = result["library_clean"] and not _library_leftovers(home, set())
        texts = json.dumps(result)
        result["leaked"] = (out / corpus.LEAK_MARK).exists() or corpus.LEAK_MARK in result["load"].get("text", "")
        del texts
        return result
    finally:
        os.chdir(cwd)
        shutil.rmtree(out, ignore_errors=True)


def main(argv) -> int:
    bases = {"st": Path(argv[0]) / "tiny-st", "gguf": Path(argv[0]) / "tiny.gguf"}
    work = Path(argv[1])
    table = corpus.by_name()
    import logging

    logging.disable(logging.WARNING)
    for name in argv[2:]:
        print(f"start {name}", flush=True)
        result = run_case(table[name], bases, work)
        print("result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
