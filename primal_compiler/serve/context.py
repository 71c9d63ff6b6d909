"""Context save: which conversations' KV caches stay in the scratchpads, and what a returning turn prefills.

The KV space holds ``slots`` sequences of the full context (the most
``kv-ring`` fits in the placed program's scratchpads). A running batch
takes a slot for every lane of the program it runs (a padded lane writes
its slot too); with context save, a named conversation's
slot keeps its keys and values after its turn (the server cannot know
whether a turn is the last), and the least recently used saved
conversation not in the running batch gives its slot up when a batch needs
one. A turn whose conversation is still saved *resumes*: its KV cache holds
every earlier token but the last generated one (a decode step appends the
token it embeds; the token the last ARGMAX picks is never embedded), so it
prefills that token and its own prompt from there. Any other turn, and
every turn without context save, prefills its whole history and prompt.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from primal_compiler.serve.trace import Trace


class SavedContexts:
    """The conversations whose KV caches are held, least recently used first, in at most ``slots`` slots."""

    def __init__(self, slots: int, enabled: bool) -> None:
        self.slots, self.enabled = slots, enabled
        self.held: OrderedDict[int, int] = OrderedDict()  # conversation -> tokens its KV cache holds
        self.evictions = 0

    def saved(self, trace: Trace, k: int) -> int:
        """Tokens of request ``k``'s conversation its KV cache holds now (0: it prefills everything)."""
        held = self.held.get(int(trace.conversation[k]), 0) if trace.conversation[k] >= 0 else 0
        return held if held == trace.history[k] - 1 else 0

    def admit(self, trace: Trace, members: list[int], lanes: int) -> None:
        """Slots for a batch of ``members`` run as a program of ``lanes`` sequences (a padded lane's slot is
        written too): a saved conversation of the members keeps its own, the least recently used others' are
        given up until every lane has one."""
        own = {int(trace.conversation[k]) for k in members} & set(self.held)
        need = lanes - len(own)
        for c in [c for c in self.held if c not in own][: max(0, len(self.held) + need - self.slots)]:
            del self.held[c]
            self.evictions += 1

    def keep(self, trace: Trace, members: list[int]) -> None:
        """After the batch: each named conversation's cache holds its tokens but the last generated one."""
        for k in members:
            c = int(trace.conversation[k])
            if self.enabled and c >= 0:
                self.held[c] = int(trace.history[k] + trace.prompt[k] + trace.generate[k] - 1)
                self.held.move_to_end(c)
            elif c >= 0:
                self.held.pop(c, None)


def prefill_tokens(trace: Trace, members: list[int], saved: list[int]) -> np.ndarray:
    """Tokens each member prefills: its prompt, and the tokens of its history its cache does not hold."""
    return trace.history[members] + trace.prompt[members] - np.asarray(saved, np.int64)
