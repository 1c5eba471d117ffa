"""Reading tensor bytes out of checkpoint files by memory map, and checking shapes against config.

Both backends load through here: `TensorReader.raw(tensor)` is a zero-copy view of the bytes on disk;
the torch backend wraps it in a tensor, the CUDA backend copies it through pinned staging buffers.
"""
from __future__ import annotations

import mmap
from pathlib import Path

from .catalog import TensorCatalog
from .checkpoint import CheckpointInfo, DecoderConfig, TensorInfo
from .errors import CorruptCheckpoint


class TensorReader:
    """Memory maps of a checkpoint's files, opened once and closed together."""

    def __init__(self, info: CheckpointInfo):
        self.folder = Path(info.path)
        self._maps: dict[str, mmap.mmap] = {}
        self._files = []

    def raw(self, tensor: TensorInfo) -> memoryview:
        mm = self._maps.get(tensor.file)
        if mm is None:
            f = open(self.folder / tensor.file, "rb")
            self._files.append(f)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[tensor.file] = mm
        if tensor.offset + tensor.bytes > len(mm):
            raise CorruptCheckpoint(f"{tensor.file} is truncated: tensor {tensor.name} runs past the end of the file.")
        return memoryview(mm)[tensor.offset:tensor.offset + tensor.bytes]

    def close(self) -> None:
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:  # a view is still alive; the map closes when it goes
                pass
        for f in self._files:
            f.close()
        self._maps.clear()
        self._files.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def expected_shapes(decoder: DecoderConfig) -> dict:
    """role -> the shape config.json implies for it (per layer roles and globals)."""
    h, hd = decoder.hidden_size, decoder.head_dim
    q, kv, inter = decoder.q_size, decoder.kv_size, decoder.intermediate_size
    return {
        "embed": (decoder.vocab_size, h), "lm_head": (decoder.vocab_size, h), "final_norm": (h,),
        "attn_norm": (h,), "mlp_norm": (h,), "q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q),
        "q_bias": (q,), "k_bias": (kv,), "v_bias": (kv,), "q_norm": (hd,), "k_norm": (hd,),
        "gate": (inter, h), "up": (inter, h), "down": (h, inter),
    }


def check_shapes(decoder: DecoderConfig, catalog: TensorCatalog) -> None:
    """Refuse a checkpoint whose tensors disagree with its config.json."""
    want = expected_shapes(decoder)
    entries = list(catalog.globals.items())
    for layer in catalog.layers:
        entries += list(layer.roles.items())
    for role, t in entries:
        shape = want.get(role)
        if shape is not None and tuple(t.shape) != shape:
            raise CorruptCheckpoint(
                f"Tensor {t.name} has shape {list(t.shape)}, but config.json implies {list(shape)}. "
                "The weights and the configuration belong to different models.")
