"""Reading tensor bytes out of checkpoint files by memory map, and checking shapes against config.

Both backends load through here: `TensorReader.raw(tensor)` is a zero-copy view of the bytes on disk;
the torch backend wraps it in a tensor, the CUDA backend copies it through pinned staging buffers.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

from .catalog import TensorCatalog
from .checkpoint import CheckpointInfo, DecoderConfig, TensorInfo
from .errors import CorruptCheckpoint


class TensorReader:
    """A checkpoint's files, opened once and closed together: zero-copy memory maps (`raw`) and
    plain reads into a caller's buffer (`read_into`)."""

    _CHUNK = 16 * 1024 * 1024

    def __init__(self, info: CheckpointInfo):
        self.folder = Path(info.path)
        self._maps: dict[str, mmap.mmap] = {}
        self._files = []
        self._fds: dict[str, int] = {}

    def read_into(self, tensor: TensorInfo, out: memoryview) -> None:
        """Copy a tensor's bytes into `out` with pread.

        Unlike copying out of a memory map, a read releases the GIL while the kernel fetches pages
        from disk, so a load in a worker thread never freezes the thread that draws the window.
        """
        fd = self._fds.get(tensor.file)
        if fd is None:
            fd = self._fds[tensor.file] = os.open(self.folder / tensor.file, os.O_RDONLY)
        out = out.cast("B")
        if len(out) != tensor.bytes:
            raise ValueError(f"buffer of {len(out)} bytes for {tensor.name} of {tensor.bytes}")
        done = 0
        while done < tensor.bytes:
            n = os.preadv(fd, [out[done:done + self._CHUNK]], tensor.offset + done)
            if n <= 0:
                raise CorruptCheckpoint(f"{tensor.file} is truncated: tensor {tensor.name} runs past the end of the file.")
            done += n

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
        for fd in self._fds.values():
            os.close(fd)
        self._maps.clear()
        self._files.clear()
        self._fds.clear()

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
