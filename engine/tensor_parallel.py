"""Tensor parallel: one dense decoder split over N ranks (GPUs of one host), and its CPU oracle.

The split (Megatron-style, exactly as the native engine will do it; docs/TENSOR_PARALLEL.md):
  * q / k / v and gate / up by output rows (whole heads): rank r holds query heads
    [r*H/N, (r+1)*H/N) and KV heads [r*KV/N, (r+1)*KV/N). Grouped-query attention keeps query head j
    on KV head j // (H/KV), so a rank's query heads are exactly those that use its KV heads and
    attention needs no communication. The KV cache is sharded the same way, by KV head.
  * o and down by input columns: each rank's product is a partial sum of the whole; an all-reduce
    (sum) after each makes the residual stream whole again on every rank.
  * embedding and lm_head by vocabulary, in ceil(V/N)-row slices (the last padded with zero rows so
    every rank's slice has one shape): each rank looks up the ids in its range (zeros elsewhere),
    then an all-reduce; each rank computes its slice of the logits, then an all-gather.
  * norms (and Qwen3's per-head q / k norms) are replicated; sampling happens on rank 0, which then
    broadcasts the tokens so every rank embeds the same next step.

`ShardLayout` is the arithmetic (no torch), shared with the memory plan (engine/plan.py).
`TensorParallelGroup` is the oracle: one process per rank (torch.multiprocessing spawn) over
torch.distributed's gloo backend on the CPU, each rank running the torch backend's own forward
(engine/backends/torch_ref.py: its `_embed`, `_reduce` and `_head` hooks are the only difference).
The group drives its ranks as the engine's single scheduler would: one command at a time, broadcast
to every rank, rank 0's answer returned.
"""
from __future__ import annotations

import queue
import socket
import traceback
from dataclasses import dataclass
from typing import Sequence

from .checkpoint import DecoderConfig
from .errors import HearthError, UnsupportedArchitecture


class TensorParallelUnsupported(UnsupportedArchitecture):
    """The model cannot be split N ways (heads or the feed-forward width do not divide, or MoE)."""
    kind = "tensor-parallel-unsupported"


class TensorParallelFailed(HearthError):
    """A rank died, raised, or a collective did not complete in time."""
    kind = "tensor-parallel-failed"


def _divides(decoder: DecoderConfig, ways: int) -> list[str]:
    """The sizes that `ways` does not divide, in words (empty when the split works)."""
    problems = []
    for what, n in (("KV heads", decoder.num_kv_heads), ("query heads", decoder.num_heads),
                    ("feed-forward width", decoder.intermediate_size)):
        if n % ways:
            problems.append(f"{n} {what}")
    return problems


def workable_ways(decoder: DecoderConfig, limit: int = 8) -> list[int]:
    """Every N in 1..limit that splits this decoder evenly."""
    return [n for n in range(1, limit + 1) if not _divides(decoder, n)]


def check_shardable(decoder: DecoderConfig, ways: int) -> None:
    """Raise TensorParallelUnsupported with the reason (and the N that would work) if the split fails."""
    if ways < 1:
        raise TensorParallelUnsupported(f"Tensor parallel needs at least one GPU, not {ways}.")
    if decoder.is_moe:
        raise TensorParallelUnsupported(
            "Tensor parallel splits dense decoders only; this is a mixture-of-experts model "
            "(its experts would be split by expert, which Hearth does not do yet).")
    if decoder.qk_norm_whole_projection:
        raise TensorParallelUnsupported(
            "This model normalises q and k over all heads together, which a split by heads cannot do "
            "without an extra all-reduce per layer; Hearth does not split it.")
    problems = _divides(decoder, ways)
    if problems:
        good = [str(n) for n in workable_ways(decoder) if n > 1]
        hint = (f"; {' or '.join(good)} GPUs would work" if good else
                "; no split over 2 to 8 GPUs works for this model")
        raise TensorParallelUnsupported(
            f"This model cannot be split over {ways} GPUs: {ways} does not divide its "
            f"{' or its '.join(problems)} (each GPU takes whole heads and an equal share){hint}.")


@dataclass(frozen=True)
class ShardLayout:
    """Which rows and columns rank `rank` of `ways` holds. Ranges are [start, stop) in elements of
    the dimension the tensor is split along (output rows for q/k/v/gate/up, input columns for
    o/down, vocabulary rows for the embedding and lm_head)."""
    decoder: DecoderConfig
    ways: int
    rank: int

    def __post_init__(self):
        check_shardable(self.decoder, self.ways)
        if not 0 <= self.rank < self.ways:
            raise ValueError(f"rank {self.rank} outside 0..{self.ways - 1}")

    @property
    def query_heads(self) -> range:
        per = self.decoder.num_heads // self.ways
        return range(self.rank * per, (self.rank + 1) * per)

    @property
    def kv_heads(self) -> range:
        per = self.decoder.num_kv_heads // self.ways
        return range(self.rank * per, (self.rank + 1) * per)

    @property
    def q_rows(self) -> slice:
        hd = self.decoder.head_dim
        return slice(self.query_heads.start * hd, self.query_heads.stop * hd)

    @property
    def kv_rows(self) -> slice:
        hd = self.decoder.head_dim
        return slice(self.kv_heads.start * hd, self.kv_heads.stop * hd)

    @property
    def ffn_rows(self) -> slice:
        per = self.decoder.intermediate_size // self.ways
        return slice(self.rank * per, (self.rank + 1) * per)

    @property
    def vocab_rows_per_rank(self) -> int:
        """ceil(V / N): every rank's slice has this many rows (the last one zero-padded)."""
        return -(-self.decoder.vocab_size // self.ways)

    @property
    def vocab(self) -> slice:
        """The real vocabulary rows this rank holds (possibly fewer than vocab_rows_per_rank)."""
        per = self.vocab_rows_per_rank
        start = min(self.rank * per, self.decoder.vocab_size)
        return slice(start, min(start + per, self.decoder.vocab_size))

    def elements(self, tied_embeddings: bool) -> dict[str, int]:
        """The weight elements this rank keeps, by part (replicated norms included; vocabulary
        slices at their padded size, as the native engine allocates them)."""
        d, n = self.decoder, self.ways
        H, hd = d.hidden_size, d.head_dim
        q, kv, inter = d.num_heads * hd // n, d.num_kv_heads * hd // n, d.intermediate_size // n
        per_layer_sharded = (q + 2 * kv) * H + H * q + 2 * inter * H + inter * H
        if d.attention_bias:
            per_layer_sharded += q + 2 * kv
        per_layer_replicated = 2 * H + (2 * hd if d.qk_norm else 0)
        vocab = self.vocab_rows_per_rank * H * (1 if tied_embeddings else 2)
        return {"layers (sharded)": d.num_layers * per_layer_sharded,
                "norms (replicated)": d.num_layers * per_layer_replicated + H,
                "embedding and lm_head (vocabulary slice)": vocab}


# ----------------------------------------------------------------------------- the CPU oracle
# Everything below imports torch; the layout above does not (the memory plan uses it).

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_runner_class():
    """The torch backend's runner with its three tensor-parallel hooks filled in (defined lazily so
    that importing this module for the layout does not import torch)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from .backends.torch_ref import TorchRunner

    class ShardedTorchRunner(TorchRunner):
        def __init__(self, info, plan, options, layout: ShardLayout, group):
            self.layout, self.group = layout, group
            super().__init__(info, plan, options)

        def _load(self, info, progress) -> None:
            super()._load(info, progress)           # the whole model, then keep this rank's share
            lay, d = self.layout, self.decoder
            q, kv, ffn, vocab = lay.q_rows, lay.kv_rows, lay.ffn_rows, lay.vocab
            self.kv_heads = len(lay.kv_heads)
            for w in self.layers:
                w.q, w.k, w.v = w.q[q].clone(), w.k[kv].clone(), w.v[kv].clone()
                if w.q_bias is not None:
                    w.q_bias, w.k_bias, w.v_bias = w.q_bias[q].clone(), w.k_bias[kv].clone(), w.v_bias[kv].clone()
                w.o = w.o[:, q].clone()
                w.gate, w.up, w.down = w.gate[ffn].clone(), w.up[ffn].clone(), w.down[:, ffn].clone()
            rows = lay.vocab_rows_per_rank

            def vocab_slice(table):
                part = torch.zeros(rows, d.hidden_size, dtype=table.dtype)
                part[: vocab.stop - vocab.start] = table[vocab]
                return part

            tied = self.lm_head is self.embed
            self.embed_slice = vocab_slice(self.embed)
            self.head_slice = self.embed_slice if tied else vocab_slice(self.lm_head)
            self.embed = self.lm_head = None
            self.weight_bytes = sum(t.numel() * t.element_size() for t in self._tensors())

        def _tensors(self):
            yield self.embed_slice
            if self.head_slice is not self.embed_slice:
                yield self.head_slice
            yield self.final_norm
            for w in self.layers:
                yield from (t for t in vars(w).values() if isinstance(t, torch.Tensor))

        def _embed(self, ids):
            start = self.layout.vocab.start
            local = ids - start
            mine = (local >= 0) & (local < self.layout.vocab.stop - start)
            x = self.embed_slice[local.clamp(0, self.embed_slice.shape[0] - 1)] * mine[:, None].to(self.dtype)
            dist.all_reduce(x, group=self.group)
            return x

        def _reduce(self, partial):
            dist.all_reduce(partial, group=self.group)
            return partial

        def _head(self, x):
            local = F.linear(x, self.head_slice).contiguous()            # [n, ceil(V/N)]
            parts = [torch.empty_like(local) for _ in range(self.layout.ways)]
            dist.all_gather(parts, local, group=self.group)
            return torch.cat(parts, dim=-1)[:, : self.decoder.vocab_size]

        def sample(self, states):
            """Rank 0 samples from the gathered logits; the tokens reach every rank by broadcast."""
            tokens = torch.tensor(super().sample(states) if self.layout.rank == 0 else [0] * len(states),
                                  dtype=torch.long)
            dist.broadcast(tokens, src=0, group=self.group)
            return tokens.tolist()

        def last_logits(self):
            return super().last_logits() if self.layout.rank == 0 else None

        def score(self, token_ids):
            full = super().score(token_ids)
            return full if self.layout.rank == 0 else None

    return ShardedTorchRunner


def _rank_main(rank: int, world: int, port: int, commands, results, timeout_s: float) -> None:
    """One rank: join the gloo group, then run the driver's commands until told to stop."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)            # ranks share the machine's cores; one thread each
    runner_class = _rank_runner_class()
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        # Every split size gets its own group of ranks 0..N-1, made once by all ranks together.
        groups = {n: dist.new_group(list(range(n))) for n in range(1, world + 1)}
        results.put((rank, True, "ready"))
    except Exception:
        results.put((rank, False, traceback.format_exc()))
        return
    runner = None
    while True:
        method, args = commands.get()
        try:
            if method == "stop":
                break
            if method == "load":
                path, options, ways = args
                from .checkpoint import inspect

                if runner is not None:
                    runner.close()
                    runner = None
                if rank < ways:
                    info = inspect(path)
                    runner = runner_class(info, info.plan, options, ShardLayout(info.decoder, ways, rank),
                                          groups[ways])
                result = runner.weight_bytes if runner is not None else None
            elif runner is None:
                result = None               # a rank outside the current split idles
            else:
                result = getattr(runner, method)(*args)
            results.put((rank, True, result))
        except Exception:
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class TensorParallelGroup:
    """`world` rank processes on this machine, kept for several loads (spawning costs seconds).

    `load(path, ways)` splits a model over ranks 0..ways-1 and returns a runner with the
    ModelRunner calls (prefill, decode, sample, last_logits, score, ...). Every call waits at most
    `timeout_s` for every rank: a hung collective or a dead rank raises TensorParallelFailed
    and stops the group rather than hanging."""

    def __init__(self, world: int, timeout_s: float = 120.0):
        import torch.multiprocessing as mp

        self.world, self.timeout_s = world, timeout_s
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._commands = [ctx.Queue() for _ in range(world)]
        port = _free_port()
        self._procs = [ctx.Process(target=_rank_main, args=(r, world, port, self._commands[r], self._results,
                                                            timeout_s), daemon=True) for r in range(world)]
        for p in self._procs:
            p.start()
        self._collect()             # each rank says "ready"

    def _collect(self) -> list:
        import time

        answers: dict[int, object] = {}
        deadline = time.monotonic() + self.timeout_s     # the watchdog: no call waits longer
        while len(answers) < self.world:
            try:
                rank, ok, value = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive() and r not in answers]
                if dead or time.monotonic() > deadline:
                    self.close()
                    raise TensorParallelFailed(
                        f"Tensor-parallel rank {', '.join(map(str, dead))} exited without answering." if dead else
                        f"Tensor-parallel ranks did not answer within {self.timeout_s:g} s.") from None
                continue
            if not ok:
                self.close()
                raise TensorParallelFailed(f"Rank {rank} failed:\n{value}")
            answers[rank] = value
        return [answers[r] for r in range(self.world)]

    def call(self, method: str, *args) -> list:
        """Run `method(*args)` on every rank; each rank's answer, rank 0 first."""
        if not self._procs:
            raise TensorParallelFailed("The tensor-parallel group is closed.")
        for q in self._commands:
            q.put((method, args))
        return self._collect()

    def load(self, path, ways: int, options=None) -> "TensorParallelRunner":
        from .backends.base import RunnerOptions
        from .checkpoint import inspect

        if ways > self.world:
            raise TensorParallelUnsupported(f"This group has {self.world} ranks; it cannot split over {ways}.")
        info = inspect(path)
        check_shardable(info.decoder, ways)     # refuse in the driver, before any rank loads
        options = options or RunnerOptions()
        shard_bytes = self.call("load", str(path), options, ways)[:ways]
        return TensorParallelRunner(self, info, ways, shard_bytes)

    def close(self) -> None:
        procs, self._procs = self._procs, []
        for q, p in zip(self._commands, procs):
            if p.is_alive():
                q.put(("stop", ()))
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TensorParallelRunner:
    """A model split over a group's first `ways` ranks, driven like one ModelRunner."""
    backend_name = "torch-tensor-parallel"

    def __init__(self, group: TensorParallelGroup, info, ways: int, shard_bytes: Sequence[int]):
        self.group, self.info, self.ways = group, info, ways
        self.shard_weight_bytes = list(shard_bytes)      # what each rank keeps

    def _rank0(self, method: str, *args):
        return self.group.call(method, *args)[0]

    def allocate_sequence(self) -> int:
        ids = set(self.group.call("allocate_sequence")[: self.ways])
        assert len(ids) == 1, ids                       # every rank numbers sequences alike
        return ids.pop()

    def release_sequence(self, seq: int) -> None:
        self.group.call("release_sequence", seq)

    def length(self, seq: int) -> int:
        return self._rank0("length", seq)

    def truncate(self, seq: int, length: int) -> None:
        self.group.call("truncate", seq, length)

    def prefill(self, seq: int, token_ids: Sequence[int]) -> None:
        self.group.call("prefill", seq, list(token_ids))

    def decode(self, seqs: Sequence[int], token_ids: Sequence[int]) -> None:
        self.group.call("decode", list(seqs), list(token_ids))

    def sample(self, states) -> list[int]:
        """Rank 0's tokens; every rank must have received the same by broadcast."""
        answers = self.group.call("sample", list(states))[: self.ways]
        if any(a != answers[0] for a in answers):
            raise TensorParallelFailed(f"Ranks disagree on the sampled tokens: {answers}")
        return answers[0]

    def last_logits(self):
        return self._rank0("last_logits")

    def score(self, token_ids: Sequence[int]):
        return self._rank0("score", list(token_ids))

    def memory(self) -> list[dict]:
        """Each rank's weights and KV cache (the KV shard is 1/N of the one-process cache)."""
        return self.group.call("memory")[: self.ways]


def generate_greedy(runner, prompts: Sequence[Sequence[int]], steps: int) -> list[list[int]]:
    """Greedy tokens for prompts decoded together: each prompt but its last token prefilled, then one
    decode call per step over all rows (the first step feeds the prompts' last tokens). Works on a
    TorchRunner and a TensorParallelRunner alike."""
    from .sampling import SamplerState, SamplingParams

    seqs, states = [], []
    for prompt in prompts:
        seq = runner.allocate_sequence()
        if len(prompt) > 1:
            runner.prefill(seq, list(prompt[:-1]))
        seqs.append(seq)
        states.append(SamplerState.start(SamplingParams(temperature=0.0), prompt))
    out: list[list[int]] = [[] for _ in prompts]
    feed = [p[-1] for p in prompts]
    for _ in range(steps):
        runner.decode(seqs, feed)
        feed = runner.sample(states)
        for o, state, t in zip(out, states, feed):
            state.advance(t)
            o.append(t)
    for seq in seqs:
        runner.release_sequence(seq)
    return out
