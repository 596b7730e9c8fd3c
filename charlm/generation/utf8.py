"""`Utf8Mask`: a byte model draws only bytes that keep its text valid UTF-8 (RFC 3629).

A small automaton reads UTF-8: `NEXT[state, byte]` is the state after the byte, -1 where it
cannot come next (state 0: a lead byte or ASCII). A mask restricts it to a vocabulary's bytes and
is applied to a batch of logits by one gather."""

from __future__ import annotations

import numpy as np
import torch

from charlm.core.errors import CharlmError
from charlm.data.vocab import Vocab

STATES = 8


def _transitions() -> np.ndarray:
    nxt = np.full((STATES, 256), -1, dtype=np.int64)
    cont = slice(0x80, 0xC0)
    nxt[0, 0x00:0x80] = 0  # ASCII: a whole character
    nxt[0, 0xC2:0xE0] = 1  # two-byte lead: one continuation to come (C0, C1 are overlong)
    nxt[0, 0xE1:0xF0] = 2  # three-byte lead: two to come
    nxt[0, 0xED] = 5  # ... but ED's next is 80..9F (not a surrogate)
    nxt[0, 0xE0] = 4  # ... and E0's next is A0..BF (not overlong)
    nxt[0, 0xF1:0xF4] = 3  # four-byte lead: three to come
    nxt[0, 0xF0] = 6  # ... F0's next is 90..BF (not overlong)
    nxt[0, 0xF4] = 7  # ... F4's next is 80..8F (not past U+10FFFF); F5..FF never occur
    nxt[1, cont] = 0
    nxt[2, cont] = 1
    nxt[3, cont] = 2
    nxt[4, 0xA0:0xC0] = 1
    nxt[5, 0x80:0xA0] = 1
    nxt[6, 0x90:0xC0] = 2
    nxt[7, 0x80:0x90] = 2
    return nxt


NEXT = _transitions()


def vocab_transitions(vocab: Vocab) -> np.ndarray:
    """NEXT over the vocabulary's ids (STATES, V), less bytes of characters it cannot finish."""
    nxt = NEXT[:, [ord(c) for c in vocab.chars]]
    for _ in range(STATES):  # prune until nothing changes: each pass settles one more byte
        live = (nxt >= 0).any(axis=1)
        live[0] = True  # a finished character: the text may end here
        pruned = np.where((nxt >= 0) & live[np.maximum(nxt, 0)], nxt, -1)
        if (pruned == nxt).all():
            break
        nxt = pruned
    if not (nxt[0] >= 0).any():
        raise CharlmError("the model's byte vocabulary holds no byte that begins a UTF-8 "
                          "character, so it cannot generate text; train it on UTF-8 text")
    return nxt


class Utf8Mask:
    """The UTF-8 state of `rows` sequences, each starting after a whole character: `apply`
    masks logits (B, V), `advance` takes the drawn ids (B,), `select` keeps rows."""

    def __init__(self, vocab: Vocab, rows: int, device: torch.device | str = "cpu"):
        nxt = torch.from_numpy(vocab_transitions(vocab)).to(device)
        self.allowed = nxt >= 0  # (STATES, V)
        self.next = nxt.clamp(min=0)
        self.state = torch.zeros(rows, dtype=torch.long, device=device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.masked_fill(~self.allowed[self.state], float("-inf"))

    def advance(self, ids: torch.Tensor) -> None:
        self.state = self.next[self.state, ids]

    def select(self, index: torch.Tensor) -> None:
        self.state = self.state[index]


def utf8_mask(vocab: Vocab, rows: int, device: torch.device | str) -> Utf8Mask | None:
    return Utf8Mask(vocab, rows, device) if vocab.units == "byte" else None
