"""Facts: the guarantees passes establish about a Program, named once.

A pass ``requires`` facts, ``provides`` facts and ``invalidates`` the facts
its rewrite makes stale (placing tiles again invalidates the KV map and the
stream built for the old placement), derived from what each fact was built
on (:data:`DEPENDS`). The pass manager (:mod:`primal_compiler.passmgr`)
checks a whole pipeline's contracts before any pass runs and drops the facts
a pass invalidates; ``--verify`` checks every fact a pass provides with its
verifier (:mod:`primal_compiler.verify`).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from primal_compiler.errors import InputError


class Fact(StrEnum):
    TILES = "tiles"  # weights lowered to macro tiles (lower-tiles)
    LORA_SPARSITY = "lora-sparsity"  # all-zero LoRA blocks found and flagged on the tiles
    BLOCKED = "blocked"  # tiles grouped into CTs and a layout (blocking)
    PLACED = "placed"  # every PE-owning tile has a PE
    SEARCHED = "searched"  # the placement came from the GA search
    BOUNDED = "bounded"  # the placement is exact, with its proven bound
    KV = "kv"  # the KV ring buffer is allocated (kv-ring)
    STREAM = "stream"  # the instruction stream is emitted for this placement and KV layout (codegen)
    POWER_SCHEDULE = "power-schedule"  # PG_ON / PG_OFF inserted into the stream (srpg)


CARRIED = frozenset({Fact.TILES, Fact.BLOCKED, Fact.PLACED, Fact.KV, Fact.STREAM, Fact.POWER_SCHEDULE})
"""Facts that stand for data the program keeps (tiles, layout, KV map, stream): one left invalidated at
the end would be written out stale. The others are claims (how the placement was found, that LoRA
sparsity was marked) that a later pass may simply make untrue."""


DEPENDS: dict[Fact, frozenset[Fact]] = {
    Fact.LORA_SPARSITY: frozenset({Fact.TILES}),  # flags on the tiles
    Fact.BLOCKED: frozenset({Fact.TILES}),
    Fact.PLACED: frozenset({Fact.BLOCKED}),
    Fact.SEARCHED: frozenset({Fact.PLACED}),  # how this placement was found
    Fact.BOUNDED: frozenset({Fact.PLACED}),
    Fact.KV: frozenset({Fact.PLACED}),  # units on each layer's CTs, "near" ones beside the roots' PEs
    Fact.STREAM: frozenset({Fact.TILES, Fact.LORA_SPARSITY, Fact.PLACED, Fact.KV}),
    Fact.POWER_SCHEDULE: frozenset({Fact.STREAM}),
}
"""What each fact was built on. A pass that (re)establishes a fact makes every fact built on it, directly or
through others, stale: its ``invalidates`` is :func:`invalidated_by` of its ``provides``, never written by hand."""


def invalidated_by(provided: frozenset[Fact]) -> frozenset[Fact]:
    """The facts built on any of ``provided`` (:data:`DEPENDS`, transitively), ``provided`` itself excepted."""
    stale: set[Fact] = set()
    grown = True
    while grown:
        grown = False
        for fact, basis in DEPENDS.items():
            if fact not in stale and basis & (provided | stale):
                stale.add(fact)
                grown = True
    return frozenset(stale - provided)


def facts(*names: Fact) -> frozenset[Fact]:
    """A frozen set of facts, for a pass's ``requires`` / ``provides`` / ``invalidates``."""
    return frozenset(names)


def check_contracts(passes: Sequence[Any], held: frozenset[Fact], earlier: tuple[str, ...] = ()) -> None:
    """Every pass's requirements hold when it would run, and the pipeline ends with no stale carried fact.

    ``passes``: objects with ``name``, ``requires``, ``provides`` and ``invalidates``; ``held``: what the
    program holds before the first of them; ``earlier``: the passes that made it. An InputError names the
    pass and, for a stale fact, the pass that provided it and the one that invalidated it.
    """
    have = {f: (-1, "an earlier compile") for f in held}  # fact -> (position, who provided it)
    stale: dict[Fact, tuple[int, str, str]] = {}  # fact -> (position, who provided it, the pass invalidating it)
    names = list(earlier)
    for i, p in enumerate(passes):
        missing = p.requires - have.keys()
        if missing & stale.keys():
            f = min(missing & stale.keys())
            _, provider, killer = stale[f]
            raise InputError(f"pass {p.name}", f"requires {f}, which pass {killer} invalidated after {provider} "
                                               f"provided it (run {_rerun(provider)} after {killer})")
        if missing:
            raise InputError(f"pass {p.name}", f"requires {', '.join(sorted(missing))}, which no earlier pass "
                                               f"provides (earlier passes: {', '.join(names) or 'none'})")
        for f in p.invalidates & have.keys():
            stale[f] = (*have.pop(f), p.name)
        for f in p.provides:
            have[f] = (i, f"pass {p.name}")
            stale.pop(f, None)
        names.append(p.name)
    left = {f: v for f, v in stale.items() if f in CARRIED}
    if left:  # name the one provided first: what the rest was built on
        f, (_, provider, killer) = min(left.items(), key=lambda item: (item[1][0], item[0]))
        raise InputError(f"pass {killer}", f"invalidates {f}, which {provider} provided, and no later pass "
                                           f"provides it again, so the program would end with a stale {f} "
                                           f"(run {_rerun(provider)} after {killer})")


def _rerun(provider: str) -> str:
    return provider.removeprefix("pass ") if provider.startswith("pass ") else "its pass"
