"""What a 4-bit format costs a model: perplexity on a real text and the mean KL divergence of the
next-token distribution against the unquantized model, on the torch backend (fp32, CPU).

    python -m engine.tools.quant_quality --model ID_OR_FOLDER [--text FILE] [--tokens N]

Compares the model as stored (the reference) with its NVFP4 copy (`hearth quantize`, both layouts
hold the same numbers, so one is measured) and, as a peer, with llama.cpp's Q4_0 applied to the same
projections (the `gguf` package's quantizer; embedding and lm_head stay 16-bit in both). Copies are
written to a temporary folder and removed afterwards.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "pride_and_prejudice_ch1.txt"
PROJECTION_ROLES = ("q", "k", "v", "o", "gate", "up", "down")


def token_ids(folder, text: str, limit: int) -> list:
    from ..checkpoint import inspect
    from ..tokenizer import Tokenizer

    info = inspect(folder)
    ids = Tokenizer.from_folder(info.path, info.config).encode(text)
    return ids[:limit]


def teacher_forced_logits(folder, ids: list) -> np.ndarray:
    """float32 [len, vocab] logits of the torch backend in fp32."""
    from ..backends.base import RunnerOptions
    from ..backends.torch_ref import TorchRunner
    from ..checkpoint import inspect

    info = inspect(folder)
    if info.plan is None:
        raise SystemExit(f"{folder}: {info.plan_error}")
    runner = TorchRunner(info, info.plan, RunnerOptions(context_length=len(ids) + 1))
    try:
        return runner.score(ids)
    finally:
        runner.close()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def perplexity(logits: np.ndarray, ids: list) -> float:
    """exp of the mean negative log-likelihood of ids[1:] given the logits of ids[:-1]."""
    logp = _log_softmax(logits[:-1])
    nll = -logp[np.arange(len(ids) - 1), np.asarray(ids[1:])]
    return float(np.exp(nll.mean()))


def mean_kl(reference: np.ndarray, other: np.ndarray) -> float:
    """Mean over positions of KL(reference || other), in nats."""
    p, q = _log_softmax(reference), _log_softmax(other)
    return float((np.exp(p) * (p - q)).sum(axis=-1).mean())


def write_q4_0_copy(folder, out) -> Path:
    """A copy of a bf16/fp16/fp32 checkpoint whose projections went through llama.cpp's Q4_0 and back."""
    import torch
    from gguf import GGMLQuantizationType, quants
    from safetensors.torch import load_file, save_file

    from ..checkpoint import inspect

    info = inspect(folder)
    names = {t.name for layer in info.catalog.layers for r, t in layer.roles.items() if r in PROJECTION_ROLES}
    out = Path(out)
    shutil.copytree(info.path, out)
    tensors = load_file(str(out / "model.safetensors"))
    for name in names:
        w = tensors[name].float().numpy()
        q = quants.dequantize(quants.quantize(w, GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0)
        tensors[name] = torch.from_numpy(q.reshape(w.shape)).to(tensors[name].dtype)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def measure(folder, text: str, limit: int = 512, peers: bool = True) -> dict:
    """{"reference": {...}, "nvfp4": {...}, "q4_0": {...}} with perplexity, mean KL and weight bytes."""
    from ..checkpoint import inspect
    from ..quantize import write_nvfp4

    folder = Path(folder)
    ids = token_ids(folder, text, limit)
    results = {}
    reference = teacher_forced_logits(folder, ids)
    results["reference"] = {"perplexity": perplexity(reference, ids), "mean_kl": 0.0,
                            "weight_bytes": inspect(folder).weight_bytes, "tokens": len(ids)}
    with tempfile.TemporaryDirectory(prefix="hearth-quality-") as tmp:
        copies = {"nvfp4": lambda out: write_nvfp4(folder, out)}
        if peers:
            copies["q4_0"] = lambda out: write_q4_0_copy(folder, out)
        for label, make in copies.items():
            path = make(Path(tmp) / label)
            logits = teacher_forced_logits(path, ids)
            results[label] = {"perplexity": perplexity(logits, ids), "mean_kl": mean_kl(reference, logits),
                              "weight_bytes": inspect(path).weight_bytes, "tokens": len(ids)}
            shutil.rmtree(path, ignore_errors=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a library model id or a checkpoint folder")
    parser.add_argument("--text", default=str(DEFAULT_TEXT))
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--no-peers", action="store_true", help="measure NVFP4 only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from ..library import ModelLibrary

    folder = ModelLibrary().resolve(args.model)
    results = measure(folder, Path(args.text).read_text(encoding="utf-8"), args.tokens, not args.no_peers)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    base = results["reference"]["perplexity"]
    print(f"{'weights':<10} {'perplexity':>10} {'vs ref':>8} {'mean KL (nats)':>15} {'weight bytes':>14}")
    for label, r in results.items():
        print(f"{label:<10} {r['perplexity']:>10.3f} {100 * (r['perplexity'] / base - 1):>+7.2f}% "
              f"{r['mean_kl']:>15.5f} {r['weight_bytes']:>14,}")
    print(f"({results['reference']['tokens']} tokens of {Path(args.text).name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
