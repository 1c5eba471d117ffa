"""Reading tensor bytes out of checkpoint files, and checking shapes against config.

The torch backend loads through `TensorReader.read_into`; the CUDA backend reads the same offsets
natively, through pinned staging buffers (native/src/runtime/read_pool.cpp).
"""
from __future__ import annotations

import os
from pathlib import Path

from .catalog import TensorCatalog
from .checkpoint import CheckpointInfo, DecoderConfig, TensorInfo
from .errors import CorruptCheckpoint


class TensorReader:
    """A checkpoint's files, opened once and closed together."""

    _CHUNK = 16 * 1024 * 1024

    def __init__(self, info: CheckpointInfo):
        self.folder = Path(info.path)
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

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def expected_shapes(decoder: DecoderConfig) -> dict:
    """role -> the shape config.json implies for it (per layer roles and globals)."""
    h, hd = decoder.hidden_size, decoder.head_dim
    q, kv, inter = decoder.q_size, decoder.kv_size, decoder.intermediate_size
    shapes = {
        "embed": (decoder.vocab_size, h), "lm_head": (decoder.vocab_size, h), "final_norm": (h,),
        "attn_norm": (h,), "mlp_norm": (h,), "q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q),
        "q_bias": (q,), "k_bias": (kv,), "v_bias": (kv,), "q_norm": (hd,), "k_norm": (hd,),
        "gate": (inter, h), "up": (inter, h), "down": (h, inter),
    }
    if decoder.qk_norm_whole_projection:
        shapes.update(q_norm=(q,), k_norm=(kv,))
    moe = decoder.moe
    if moe is not None:
        e, s = moe.expert_intermediate_size, moe.shared_expert_intermediate_size
        shapes.update(router=(moe.num_experts, h), expert_gate=(e, h), expert_up=(e, h), expert_down=(h, e),
                      shared_gate=(s, h), shared_up=(s, h), shared_down=(h, s),
                      shared_expert_router=(1, h))
    return shapes


def check_shapes(decoder: DecoderConfig, catalog: TensorCatalog) -> None:
    """Refuse a checkpoint whose tensors disagree with its config.json."""
    want = expected_shapes(decoder)
    entries = list(catalog.globals.items())
    for layer in catalog.layers:
        entries += list(layer.roles.items())
        for expert in layer.experts.values():
            entries += [("expert_" + role, t) for role, t in expert.items()]
    for role, t in entries:
        if t.dtype == "U8":
            continue            # packed NVFP4: checked with its scales, logical shape, by nvfp4_checkpoint.pair
        shape = want.get(role)
        if shape is not None and tuple(t.shape) != shape:
            raise CorruptCheckpoint(
                f"Tensor {t.name} has shape {list(t.shape)}, but config.json implies {list(shape)}. "
                "The weights and the configuration belong to different models.")
