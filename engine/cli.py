"""`hearth`: the command line.

    hearth [app] [--model ID]      open the desktop app
    hearth inspect PATH [--json] [--plan [--context N] [--sessions N] [--precision fast|exact]
                                        [--gpus N] [--gpu-free GiB,GiB,...]]
    hearth models list [--json] | import PATH [--nvfp4] | remove ID | default
    hearth generate MODEL --prompt TEXT [--chat] [--context N] [--max-tokens N] [--temperature T] [--seed S] [--json]
    hearth chat MODEL [--context N] [--system TEXT]   (saved as a chat the app shows)
    hearth quantize MODEL --format nvfp4 [--layout modelopt|compressed-tensors] [--id ID]
    hearth serve [--host H] [--port P] [--api-key KEY] [--model ID ...]   the OpenAI-compatible server
    hearth bench ...               (see `python -m engine.bench --help`)
    hearth bench --ui [--runs N]   event-loop stalls of the app while loading and streaming (app/bench_ui.py)
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from .errors import HearthError
from .progress import ProgressEvent


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class ProgressBar:
    """A one-line progress bar on stderr, redrawn as bytes arrive."""

    def __init__(self, stream=sys.stderr, width: int = 30):
        self.stream, self.width, self.last = stream, width, None

    def __call__(self, event: ProgressEvent) -> None:
        if not self.stream.isatty() and event.stage == self.last and event.fraction < 1.0:
            return
        self.last = event.stage
        filled = int(self.width * event.fraction)
        bar = "#" * filled + "-" * (self.width - filled)
        amount = f"{_size(event.current_bytes)}/{_size(event.total_bytes)}" if event.total_bytes else ""
        end = "\r" if self.stream.isatty() else "\n"
        self.stream.write(f"{event.stage:<17} [{bar}] {amount:>22}{end}")
        self.stream.flush()

    def done(self) -> None:
        if self.stream.isatty():
            self.stream.write("\n")


def _engine(args):
    from .engine import Engine

    from .plan import DEFAULT_RESIDENT_SESSIONS

    return Engine(backend=getattr(args, "backend", "auto") or "auto",
                  precision=getattr(args, "precision", None) or "fast",
                  resident_sessions=getattr(args, "sessions", None) or DEFAULT_RESIDENT_SESSIONS)


def _print_plan(args) -> None:
    """The memory plan of a load, part by part, against the memory free now."""
    eng = _engine(args)
    plan = eng.memory_plan(args.path, context_length=args.context)
    free, total, where = eng.free_memory()
    print(f"  memory plan      {eng.backend}, {plan.precision} precision, {plan.context_length:,}-token "
          f"context, {plan.sessions} session{'s' if plan.sessions != 1 else ''} resident")
    for name, n in plan.breakdown():
        print(f"    {name:<44} {_size(n):>10}")
    print(f"    {'total':<44} {_size(plan.total_bytes):>10}")
    if plan.reserve_bytes:
        print(f"    {'kept free for other programs':<44} {_size(plan.reserve_bytes):>10}")
    print(f"  fit              {plan.fits(free, where).message}")
    if getattr(args, "gpus", None) or getattr(args, "gpu_free", None):
        _print_split(args, eng, plan)


def _visible_gpus_free() -> Optional[list]:
    """Free bytes on each visible GPU, or None when torch sees none."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]


def _print_split(args, eng, plan) -> None:
    """Tensor parallel (docs/TENSOR_PARALLEL.md): each GPU's share of the load (--gpus N), and the
    fewest GPUs it fits on, against --gpu-free or the GPUs visible now."""
    from .plan import GiB, smallest_split
    from .tensor_parallel import TensorParallelUnsupported

    info = eng.inspect(args.path)
    d, tied = info.decoder, info.catalog.tied
    free = ([int(float(x) * GiB) for x in args.gpu_free.split(",")] if args.gpu_free else _visible_gpus_free())
    if args.gpus and args.gpus > 1:
        try:
            split = plan.split(d, args.gpus, tied)
        except TensorParallelUnsupported as e:
            print(f"  split            {e.message}")
        else:
            print(f"  split over {args.gpus:<5} {'weights':>10} {'KV cache':>10} {'workspace':>10} "
                  f"{'runtime':>10} {'total':>10}   (runtime includes NCCL, estimated)")
            for r, p in enumerate(split.ranks):
                print(f"    GPU {r:<{11}} {_size(p.weight_bytes):>10} {_size(p.kv_bytes):>10} "
                      f"{_size(p.workspace_bytes):>10} {_size(p.runtime_bytes):>10} {_size(p.total_bytes):>10}"
                      + ("   samples" if r == 0 else ""))
            if free:
                print(f"  split fit        {split.fits(free).message}")
    if free:
        print(f"  GPUs needed      {smallest_split(plan, d, free, tied).message}")
    elif args.gpus:
        print("  GPUs needed      no GPU is visible; pass --gpu-free GiB,GiB,... to check a split")


def _dtypes(counts: dict) -> str:
    """{'bf16': 270, 'f32': 2} -> 'bf16 × 270, f32 × 2' (most tensors first)."""
    return ", ".join(f"{dtype} × {n}" for dtype, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _exclusions(names, shown: int = 6) -> str:
    """The scheme's exclusions, the first few: MoE checkpoints list every layer's router."""
    names = list(names)
    if not names:
        return "nothing"
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _stop_note(stats) -> str:
    """Why a reply ended, in words, when it did not end on its own."""
    return {"max-tokens": f"cut at --max-tokens {stats.generated_tokens}: raise it for a longer reply",
            "context-full": f"the context ({stats.context_limit:,} tokens) is full",
            "cancelled": "stopped"}.get(stats.stop_reason, "")


def cmd_inspect(args) -> int:
    from .checkpoint import inspect

    info = inspect(args.path)
    if args.json:
        print(json.dumps(info.to_dict(), indent=1))
        return 0
    m, d = info.metadata, info.decoder
    print(f"{info.path}  ({info.format}, {_size(info.total_bytes)} in {len(info.files)} files)")
    print(f"  architecture     {m.architecture} ({m.model_type})")
    print(f"  parameters       {m.parameter_count:,}")
    print(f"  quantization     {m.quantization}   dtypes {_dtypes(m.dtypes)}")
    print(f"  layers           {d.num_layers}   hidden {d.hidden_size}   heads {d.num_heads}   kv heads {d.num_kv_heads}"
          f"   head dim {d.head_dim}")
    print(f"  intermediate     {d.intermediate_size}   vocab {d.vocab_size}   context {m.context_length:,}")
    print(f"  rope             theta {d.rope_theta:g}   scaling {d.rope_scaling or 'none'}   norm eps {d.rms_norm_eps:g}")
    print(f"  tied embeddings  {m.tied_embeddings}   tokenizer {m.has_tokenizer}   chat template {m.has_chat_template}")
    print(f"  KV per token     {_size(d.kv_bytes_per_token(2))} (bf16)")
    if info.quant_scheme is not None:
        s = info.quant_scheme
        print(f"  nvfp4            {s.layout}, blocks of {s.group_size}, activations {s.activations}, "
              f"not quantized: {_exclusions(s.exclusions)}")
        if not s.unsupported:
            from .errors import HearthError
            from .nvfp4_checkpoint import coverage

            try:
                parts = coverage(info)
            except HearthError:
                parts = []          # the plan line says why
            if parts:
                print("  nvfp4 weights    " + ", ".join(f"{part} {n} of {total}" for part, n, total in parts))
    if info.plan is not None:
        p = info.plan
        print(f"  plan             {p.family}: {p.archetype}, {p.attention}, {p.projection_format} projections")
        print(f"  block            {p.block}")
        if p.active_parameters != p.parameters:
            print(f"  active per token {p.active_parameters:,} of {p.parameters:,} parameters")
    else:
        print(f"  plan             unsupported: {info.plan_error}")
    print(f"  tensors          {len(info.tensors)}")
    if args.plan and info.plan is not None:
        _print_plan(args)
    return 0


def cmd_models(args) -> int:
    eng = _engine(args)
    lib = eng.library
    if args.action == "list":
        models = lib.list()
        if args.json:
            print(json.dumps([m.to_dict() for m in models], indent=1))
        elif not models:
            print("No models yet. `hearth models default` installs SmolLM2-135M-Instruct.")
        for m in models if not args.json else []:
            print(f"{m.id:<32} {m.architecture:<20} {m.quantization:<8} {_size(m.bytes):>10}  {m.path}")
    elif args.action == "import":
        if not args.path:
            raise SystemExit("hearth models import PATH")
        if args.nvfp4 and not str(args.path).lower().endswith(".gguf"):
            raise SystemExit("hearth: --nvfp4 keeps a GGUF at 4 bits; for a folder, import it and then run "
                             "hearth quantize ID --format nvfp4")
        eng.check_importable(args.path)   # an architecture Hearth cannot run is refused up front
        bar = ProgressBar()
        if args.nvfp4:
            from .quantize import import_gguf_as_nvfp4

            manifest = import_gguf_as_nvfp4(args.path, library=lib, progress=bar)
        else:
            manifest = lib.import_path(args.path, progress=bar)
        bar.done()
        print(f"imported {manifest.id} -> {manifest.path}")
    elif args.action == "remove":
        lib.remove(args.path)
        print(f"removed {args.path}")
    elif args.action == "default":
        bar = ProgressBar()
        manifest = eng.install_default_model(progress=bar)
        bar.done()
        print(manifest.path)
    return 0


def _params(args):
    from .sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed, max_tokens=args.max_tokens)


def _load(eng, model: str, quiet: bool = False, context: Optional[int] = None):
    bar = ProgressBar() if not quiet else None
    handle = eng.load_model(model, progress=bar, context_length=context)
    if bar:
        bar.done()
    if eng.backend_note and not quiet:
        print(eng.backend_note, file=sys.stderr)
    return handle


def cmd_generate(args) -> int:
    from .engine import Finished, TextDelta

    if not args.prompt.strip():   # refused before a model is loaded (that takes a while)
        raise SystemExit("hearth: the prompt is empty; give the text to continue with --prompt TEXT")
    eng = _engine(args)
    handle = _load(eng, args.model, quiet=args.json, context=args.context)
    text, stats = "", None
    for event in eng.generate(handle.id, args.prompt, _params(args), chat=args.chat):
        if isinstance(event, TextDelta):
            text += event.text
            if not args.json:
                print(event.text, end="", flush=True)
        elif isinstance(event, Finished):
            stats = event.stats
    if args.json:
        print(json.dumps({"model": handle.id, "backend": handle.backend, "text": text, "stats": stats.to_dict()}))
    else:
        note = _stop_note(stats)
        print(f"\n\n[{stats.generated_tokens} tokens, {stats.tokens_per_s:.1f} tok/s, first token "
              f"{stats.ttft_s * 1000:.0f} ms, {stats.stop_reason}]" + (f"\n[{note}]" if note else ""),
              file=sys.stderr)
    return 0


def _chat_store():
    """The app's chat database (Qt-free), so a terminal chat shows up in the app's chat list."""
    from app.store import ChatStore

    return ChatStore()


def cmd_chat(args) -> int:
    from .engine import Finished, TextDelta

    eng = _engine(args)
    handle = _load(eng, args.model, context=args.context)
    sid = eng.create_session(handle.id, system_prompt=args.system)
    print(f"Chatting with {handle.id} on {handle.backend}. Type /quit or press Ctrl-D to end; Ctrl-C stops a reply.")
    params = _params(args)
    store, chat = _chat_store(), None
    try:
        while True:
            try:
                user = input("\nyou> ").strip()
            except (EOFError, KeyboardInterrupt):
                print()
                break
            if not user:      # an Enter typed while a reply streamed: ignore it, never end the session
                continue
            if user in ("/quit", "/exit"):
                break
            if chat is None:
                chat = store.create_chat(" ".join(user.split())[:48], handle.id, args.system or "",
                                         {"temperature": params.temperature, "max_tokens": params.max_tokens})
            store.add_message(chat.id, "user", user)
            print("assistant> ", end="", flush=True)
            events = eng.chat(sid, user, params)
            text, stats = "", None
            try:
                for event in events:
                    if isinstance(event, TextDelta):
                        text += event.text
                        print(event.text, end="", flush=True)
                    elif isinstance(event, Finished):
                        stats = event.stats
                        note = _stop_note(stats)
                        print(f"\n  [{stats.generated_tokens} tokens, {stats.tokens_per_s:.1f} tok/s, context "
                              f"{stats.context_used:,}/{stats.context_limit:,}" + (f"; {note}" if note else "") + "]")
            except KeyboardInterrupt:
                eng.cancel(sid)
                for event in events:
                    pass
                print("\n  [stopped]")
            store.add_message(chat.id, "assistant", text, state="complete" if stats else "stopped",
                              model_id=handle.id, params={"temperature": params.temperature, "seed": params.seed,
                                                          "max_tokens": params.max_tokens},
                              seed=getattr(stats, "seed", None), stats=stats.to_dict() if stats else None)
    finally:
        if chat is not None:
            print(f"Saved as the chat “{store.chat(chat.id).title}” (open it in the app).", file=sys.stderr)
        store.close()
    return 0


def cmd_quantize(args) -> int:
    from .library import ModelLibrary
    from .quantize import quantize_model

    bar = ProgressBar()
    manifest = quantize_model(args.model, layout=args.layout, library=ModelLibrary(), progress=bar,
                              model_id=args.id)
    bar.done()
    print(f"quantized {args.model} -> {manifest.id} ({manifest.quantization}, {_size(manifest.bytes)}) "
          f"{manifest.path}")
    return 0


def cmd_serve(args) -> int:
    import os

    from .engine import Engine
    from .server import Server, ServerConfig

    eng = Engine(backend=args.backend, max_batch=args.max_batch, context_length=args.context)
    if not args.model and not eng.library.list():
        bar = ProgressBar()
        eng.install_default_model(progress=bar)
        bar.done()
    key = args.api_key or os.environ.get("HEARTH_API_KEY") or None
    config = ServerConfig(host=args.host, port=args.port, api_key=key, models=args.model or None,
                          cors_origins=args.cors_origin or [], allowed_hosts=args.allow_host or [],
                          max_tokens=args.max_tokens)
    server = Server(eng, config)
    served = ", ".join(m["id"] for m in server.host.served_models()) or "none"
    server.start()                       # port 0 picks a free one: the line below names it
    print(f"Hearth serves {served} on {server.url} ({eng.backend}"
          f"{', API key required' if key else ''}). Ctrl-C stops.", file=sys.stderr, flush=True)
    if eng.backend_note:
        print(eng.backend_note, file=sys.stderr)
    import time

    try:
        while server.running:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hearth", description="Run language models on your own GPU.")
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("inspect", help="describe a checkpoint without loading it")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plan", action="store_true", help="the memory plan of a load, part by part")
    p.add_argument("--context", type=int, default=None, help="context length for --plan")
    p.add_argument("--sessions", type=int, default=None, help="full-length sessions kept resident (--plan)")
    p.add_argument("--precision", default=None, choices=["fast", "exact"])
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "cuda-native"])
    p.add_argument("--gpus", type=int, default=None, help="--plan split over this many GPUs (tensor parallel)")
    p.add_argument("--gpu-free", default=None, metavar="GiB,GiB,...",
                   help="free memory of each GPU for --plan's split advice (default: the GPUs visible now)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("models", help="the model library")
    p.add_argument("action", choices=["list", "import", "remove", "default"])
    p.add_argument("path", nargs="?", help="a folder or .gguf to import, or the id to remove")
    p.add_argument("--json", action="store_true")
    p.add_argument("--nvfp4", action="store_true",
                   help="import a 4-bit GGUF as NVFP4 (4.5 bits per weight) instead of bf16; costs some quality")
    p.set_defaults(func=cmd_models)

    for name, func, helptext in (("generate", cmd_generate, "generate text once"),
                                 ("chat", cmd_chat, "chat in the terminal")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("model", help="a model id from the library, or a checkpoint folder")
        p.add_argument("--backend", default="auto", choices=["auto", "torch", "cuda-native"])
        p.add_argument("--precision", default=None, choices=["fast", "exact"],
                       help="cuda-native: fast (16-bit products, the default) or exact (fp32-accurate)")
        p.add_argument("--context", type=int, default=None, help="context length to load the model with")
        p.add_argument("--max-tokens", type=int, default=256)
        p.add_argument("--temperature", type=float, default=0.7)
        p.add_argument("--top-k", type=int, default=0)
        p.add_argument("--top-p", type=float, default=1.0)
        p.add_argument("--min-p", type=float, default=0.0)
        p.add_argument("--repetition-penalty", type=float, default=1.0)
        p.add_argument("--seed", type=int, default=None)
        p.set_defaults(func=func)
        if name == "generate":
            p.add_argument("--prompt", required=True)
            p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
            p.add_argument("--json", action="store_true")
        else:
            p.add_argument("--system", default=None, help="a system prompt")

    p = sub.add_parser("quantize", help="write a 4-bit NVFP4 copy of a model into the library (weight-only, CPU)")
    p.add_argument("model", help="a model id from the library, or a checkpoint folder")
    p.add_argument("--format", default="nvfp4", choices=["nvfp4"])
    p.add_argument("--layout", default="modelopt", choices=["modelopt", "compressed-tensors"],
                   help="tensor names and scale convention of the new checkpoint (default modelopt)")
    p.add_argument("--id", default=None, help="the new model's id (default: from its name)")
    p.set_defaults(func=cmd_quantize)

    from .server.defaults import DEFAULT_HOST, DEFAULT_PORT

    p = sub.add_parser("serve", help="serve models over the OpenAI API on this machine")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or set HEARTH_API_KEY)")
    p.add_argument("--model", action="append", default=None, metavar="ID",
                   help="serve this library model (repeatable; default: the whole library), loaded on first use")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "cuda-native"])
    p.add_argument("--max-batch", type=int, default=8, help="most requests decoded together")
    p.add_argument("--context", type=int, default=None, help="context length models load with")
    p.add_argument("--max-tokens", type=int, default=4096, help="the most tokens one reply may ask for")
    p.add_argument("--cors-origin", action="append", default=None, metavar="ORIGIN",
                   help="allow browser pages from this origin (default: no CORS)")
    p.add_argument("--allow-host", action="append", default=None, metavar="NAME",
                   help="another name the Host header may carry (default: loopback names and --host)")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("app", help="open the desktop app (the same as `hearth` alone; see `hearth app --help`)",
                       add_help=False)
    p.set_defaults(func=None)

    p = sub.add_parser("bench", help="measure decode and prefill speed", add_help=False)
    p.set_defaults(func=None)
    return parser


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] == "app":
        from app.main import main as app_main  # the desktop app; engine/ itself never imports Qt

        return app_main(argv[1:])
    if argv[0] == "bench" and "--ui" in argv[1:]:
        from app.bench_ui import run as bench_ui  # the Qt event-loop benchmark; engine/ never imports Qt

        return bench_ui([a for a in argv[1:] if a != "--ui"])
    if argv[0] == "bench" and "--serve" in argv:   # HTTP against in-process batching (engine/server/bench.py)
        from .server.bench import main as serve_bench_main

        return serve_bench_main(argv[1:])
    if argv[0] == "bench":
        from .bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 2
    try:
        return args.func(args)
    except HearthError as exc:
        print(f"hearth: {exc.message}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `hearth inspect --json | head`: the reader left; say nothing more (and not at exit either)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
