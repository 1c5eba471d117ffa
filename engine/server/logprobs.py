"""Log probabilities of the tokens a reply drew (`logprobs`, `top_logprobs`), in OpenAI's two shapes.

The recorder is a sampler observer: it runs in the model loop right after each draw, on the raw logits
(the model's own distribution, before temperature or any filter), and stores ids and floats only;
token strings are made in the server's thread when a chunk is written.
"""
from __future__ import annotations

from collections import deque


class LogprobRecorder:
    def __init__(self, top: int, eos_ids: frozenset):
        self.top = int(top)
        self.eos_ids = eos_ids
        self.entries: deque = deque()      # (token, logprob, [(id, logprob)]); appended by the loop thread

    def __call__(self, logits, token: int) -> None:
        if token in self.eos_ids:          # the end of the reply is not one of its tokens
            return
        import torch

        lp = torch.log_softmax(logits.double(), dim=-1)
        top = []
        if self.top:
            values, ids = torch.topk(lp, self.top)
            top = list(zip(ids.tolist(), values.tolist()))
        self.entries.append((int(token), float(lp[token]), top))

    def take(self) -> list:
        out = []
        while self.entries:
            out.append(self.entries.popleft())
        return out


class LogprobFormatter:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.offset = 0                    # completions' text_offset runs over the whole reply

    def text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def chat(self, entries: list) -> dict:
        def item(token, logprob):
            s = self.text(token)
            return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}

        return {"content": [{**item(t, lp), "top_logprobs": [item(i, v) for i, v in top]} for t, lp, top in entries],
                "refusal": None}

    def completion(self, entries: list, top_wanted: bool) -> dict:
        tokens, offsets = [], []
        for t, _, _ in entries:
            s = self.text(t)
            tokens.append(s)
            offsets.append(self.offset)
            self.offset += len(s)
        top = [{self.text(i): v for i, v in top} for _, _, top in entries] if top_wanted else None
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries], "top_logprobs": top,
                "text_offset": offsets}
