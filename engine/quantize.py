"""`hearth quantize`: write an NVFP4 copy of a 16- or 32-bit checkpoint, weight-only, on the CPU.

Every decoder-layer projection (q, k, v, o, gate, up, down) becomes NVFP4 (engine/nvfp4.py: amax per
block of 16, no calibration data); the embedding, lm_head, norms and biases are copied byte for byte.
The parts of a fused slot (q/k/v, gate/up) are quantized against one global scale, the largest
amax of the group, so the engine stacks them as they are, with no second rounding of block scales.

Two layouts, both readable by the tools that made them popular:
    modelopt            weight, weight_scale, weight_scale_2 + hf_quant_config.json (no input_scale:
                        the checkpoint is weight-only)
    compressed-tensors  weight_packed, weight_scale, weight_global_scale + quantization_config
                        (format nvfp4-pack-quantized, the NVFP4A16 scheme)
The new model is written into a hidden folder and then added to the library in one step, so a
failed or cancelled run leaves nothing behind.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Optional

import numpy as np

from . import nvfp4
from .checkpoint import CheckpointInfo, TensorInfo, inspect
from .errors import HearthError, ImportFailed, UnsupportedArchitecture, UnsupportedTensorType
from .nvfp4_checkpoint import COMPRESSED_TENSORS, FUSED_GROUPS, MODELOPT, NVFP4_FORMAT, PROJECTIONS
from .progress import ByteCounter, ProgressCallback
from .weights import TensorReader

QUANTIZING = "quantizing"
LAYOUTS = (MODELOPT, COMPRESSED_TENSORS)
_DENSE = {"BF16", "F16", "F32"}
# Files of a Hugging Face folder that describe the model, copied beside the new weights.
_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
               "chat_template.jinja", "tokenizer.model", "vocab.json", "merges.txt")


def read_float32(reader: TensorReader, t: TensorInfo) -> np.ndarray:
    """A bf16, fp16 or fp32 tensor as float32, in its shape."""
    raw = np.empty(t.bytes, dtype=np.uint8)
    reader.read_into(t, memoryview(raw))
    if t.dtype == "BF16":
        return (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(t.shape)
    if t.dtype == "F16":
        return raw.view("<f2").astype(np.float32).reshape(t.shape)
    return raw.view("<f4").reshape(t.shape).copy()


def _check_source(info: CheckpointInfo) -> None:
    if info.format != "safetensors":
        raise UnsupportedTensorType("Quantize a model from the library or a Hugging Face folder, not a GGUF file.")
    if info.quant_scheme is not None:
        raise UnsupportedTensorType(f"{Path(info.path).name} is already NVFP4.")
    if info.plan is None:
        raise UnsupportedArchitecture(f"Hearth cannot run this model, so it will not quantize it: {info.plan_error}")
    if info.decoder.is_moe:
        raise UnsupportedArchitecture("Quantizing mixture-of-experts models is not supported yet.")
    for t in info.tensors:
        if t.dtype not in _DENSE:
            raise UnsupportedTensorType(f"Tensor {t.name} is {t.dtype}; Hearth quantizes bf16, fp16 and fp32 weights.")


def _names(layout: str, module: str) -> tuple:
    """(packed weight, block scale, global scale) tensor names of one module in a layout."""
    if layout == MODELOPT:
        return f"{module}.weight", f"{module}.weight_scale", f"{module}.weight_scale_2"
    return f"{module}.weight_packed", f"{module}.weight_scale", f"{module}.weight_global_scale"


def _quantized_entries(layout: str, t: TensorInfo) -> list:
    """Header entries (name, dtype, shape) of one projection once quantized."""
    n, k = t.shape
    weight, block, glob = _names(layout, t.name.rsplit(".", 1)[0])
    return [(weight, "U8", [n, k // 2]), (block, "F8_E4M3", [n, k // nvfp4.BLOCK]),
            (glob, "F32", [] if layout == MODELOPT else [1])]


def _quantize_layer(reader: TensorReader, roles: dict) -> dict:
    """{role: NvFp4Tensor} for one layer's projections, fused groups sharing one global scale."""
    weights = {role: read_float32(reader, t) for role, t in roles.items()}
    scales = {}
    for group in FUSED_GROUPS + tuple((r,) for r in PROJECTIONS):
        present = [r for r in group if r in weights and r not in scales]
        if present and len(present) == len(group):
            amax = max(float(np.abs(weights[r]).max()) for r in present)
            for r in present:
                scales[r] = nvfp4.global_scale_for(amax)
    return {role: nvfp4.quantize(w, scales[role]) for role, w in weights.items()}


def _quantization_config(layout: str, exclusions: list) -> dict:
    if layout == MODELOPT:
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": nvfp4.BLOCK,
                "exclude_modules": exclusions, "kv_cache_quant_algo": None}
    weights = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": nvfp4.BLOCK,
               "symmetric": True, "dynamic": False, "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": NVFP4_FORMAT, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": NVFP4_FORMAT}},
            "ignore": exclusions, "kv_cache_scheme": None}


def write_nvfp4(source, out_dir, layout: str = MODELOPT, progress: Optional[ProgressCallback] = None) -> Path:
    """Write an NVFP4 copy of the checkpoint folder `source` at `out_dir` (which must not exist)."""
    if layout not in LAYOUTS:
        raise ImportFailed(f"Unknown NVFP4 layout {layout!r}; choose {' or '.join(LAYOUTS)}.")
    info = inspect(source)
    _check_source(info)
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise ImportFailed(f"Cannot quantize into {out_dir}: it already exists.")
    quantized = {t.name for layer in info.catalog.layers for role, t in layer.roles.items()
                 if role in PROJECTIONS and len(t.shape) == 2 and t.shape[1] % nvfp4.BLOCK == 0}
    # A projection whose inputs are not a multiple of 16 stays 16-bit and is listed as excluded.
    kept = sorted(t.name.rsplit(".", 1)[0] for layer in info.catalog.layers for role, t in layer.roles.items()
                  if role in PROJECTIONS and t.name not in quantized)
    # Output order: globals, then each layer's tensors together, so one layer is held at a time.
    layer_index = {t.name: i for i, layer in enumerate(info.catalog.layers) for t in layer.roles.values()}
    order = sorted(info.tensors, key=lambda t: (layer_index.get(t.name, -1), t.offset))
    entries = []
    for t in order:
        entries += _quantized_entries(layout, t) if t.name in quantized else [(t.name, t.dtype, list(t.shape))]

    tmp = out_dir.parent / f".{out_dir.name}.quantizing-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        config = dict(info.config)
        config["quantization_config"] = _quantization_config(layout, ["lm_head"] + kept)
        _write_json(tmp / "config.json", config)
        if layout == MODELOPT:
            _write_json(tmp / "hf_quant_config.json", {
                "producer": {"name": "hearth", "version": "0.1.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": nvfp4.BLOCK,
                                 "exclude_modules": ["lm_head"] + kept}})
        for name in _SIDE_FILES:
            if (Path(info.path) / name).is_file():
                shutil.copy2(Path(info.path) / name, tmp / name)
        counter = ByteCounter(progress, QUANTIZING, info.weight_bytes)
        counter.start(Path(info.path).name)
        _write_weights(tmp / "model.safetensors", info, layout, order, entries, quantized, counter)
        os.replace(tmp, out_dir)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, HearthError) or not isinstance(e, Exception):
            raise
        if isinstance(e, OSError):
            from .library import write_failure

            raise ImportFailed(f"Quantizing {Path(info.path).name} failed: "
                               f"{write_failure(e, out_dir.parent)}.") from e
        raise ImportFailed(f"Quantizing {Path(info.path).name} failed: {e}") from e
    return out_dir


def _write_weights(out: Path, info: CheckpointInfo, layout: str, order: list, entries: list, quantized: set,
                   counter: ByteCounter) -> None:
    from .checkpoint import SAFETENSORS_DTYPES

    header, offset = {}, 0
    for name, dtype, shape in entries:
        nbytes = int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_DTYPES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt", "producer": "hearth quantize --format nvfp4"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    layer_of = {t.name: layer for layer in info.catalog.layers for t in layer.roles.values()}
    done: dict = {}          # tensor name -> NvFp4Tensor, for the layer being written
    with TensorReader(info) as reader, open(out, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for t in order:
            if t.name in quantized:
                if t.name not in done:
                    roles = {r: x for r, x in layer_of[t.name].roles.items() if x.name in quantized}
                    done = {roles[r].name: q for r, q in _quantize_layer(reader, roles).items()}
                q = done[t.name]
                # ModelOpt stores the multiplier, compressed-tensors its inverse.
                scale = q.global_scale if layout == MODELOPT else np.float32(1.0) / np.float32(q.global_scale)
                f.write(q.packed.tobytes())
                f.write(q.block_scales.tobytes())
                f.write(np.array([scale], dtype="<f4").tobytes())
            else:
                raw = np.empty(t.bytes, dtype=np.uint8)
                reader.read_into(t, memoryview(raw))
                f.write(raw.tobytes())
            counter.advance(t.bytes, t.name)
        f.flush()
        os.fsync(f.fileno())


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def quantize_model(model, layout: str = MODELOPT, library=None, progress: Optional[ProgressCallback] = None,
                   model_id: Optional[str] = None):
    """Quantize a library model (or a checkpoint folder) to NVFP4 and add the result to the library."""
    from .library import ModelLibrary

    library = library if library is not None else ModelLibrary()
    source = library.resolve(model)
    name = library.get(str(model)).name if str(model) in library else Path(source).name
    library.models_dir.mkdir(parents=True, exist_ok=True)
    staging = library.models_dir / f".{uuid.uuid4().hex[:8]}.nvfp4-staging"
    try:
        write_nvfp4(source, staging, layout, progress)
        # import_path hard-links the files in and renames its own folder into place: one atomic step.
        return library.import_path(staging, model_id=model_id, name=f"{name} NVFP4",
                                   source=f"hearth quantize --format nvfp4 --layout {layout} ({source})")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def import_gguf_as_nvfp4(gguf_path, library=None, layout: str = MODELOPT,
                         progress: Optional[ProgressCallback] = None, model_id: Optional[str] = None,
                         name: Optional[str] = None):
    """Import a GGUF keeping it at 4 bits: dequantized as every import is (engine.gguf_import), then
    NVFP4 instead of bf16. The projections pass through two 4-bit grids (the GGUF's, then NVFP4's),
    so this costs quality against the bf16 import; README gives the default model's figures."""
    from .gguf_import import convert_gguf
    from .library import ModelLibrary

    library = library if library is not None else ModelLibrary()
    gguf_path = Path(gguf_path).expanduser()
    library.models_dir.mkdir(parents=True, exist_ok=True)
    stem = f".{uuid.uuid4().hex[:8]}"
    dense, packed = library.models_dir / f"{stem}.gguf-staging", library.models_dir / f"{stem}.nvfp4-staging"
    try:
        convert_gguf(gguf_path, dense, progress)
        write_nvfp4(dense, packed, layout, progress)
        return library.import_path(packed, model_id=model_id, name=name or f"{gguf_path.stem} NVFP4",
                                   source=f"{gguf_path.resolve()} (GGUF, kept at 4 bits as NVFP4, {layout})")
    finally:
        shutil.rmtree(dense, ignore_errors=True)
        shutil.rmtree(packed, ignore_errors=True)
