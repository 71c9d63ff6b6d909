"""The machinery of hardware target tables: fields with units and rules, the table base, introspection.

A target file's TOML tables map to nested frozen dataclasses built from
:func:`spec_field` (unit, one-line meaning and value rules as metadata) and
:class:`Table` (cross-field rules in ``_problems``, plain-data export); the
loader (:mod:`primal_compiler.target.loader`) checks every rule generically.
The PRIMAL tables are in :mod:`.spec`, the GPU ones in :mod:`.gpu`; the
limits below bound what any target may declare.
"""

from __future__ import annotations

import hashlib
import json
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cached_property
from typing import Any

SCHEMA_VERSION = 1

#: Metadata keys that constrain a value (checked by the loader in this order).
RULE_KEYS = ("choices", "ge", "gt", "le", "lt", "multiple_of")

# Upper bounds (``le`` rules) of what a target may declare: every count that sizes an array or fills a
# fixed-width field of the instruction stream is bounded, so an absurd target is refused when it is
# loaded instead of overflowing a field or exhausting memory later. Each admits the bundled targets
# with a wide margin.
#: CTs of a package: the stream's 16-bit CT field reserves 0xFFFE (the controller) and 0xFFFF (none).
MAX_CTS = 0xFFFE
#: PE rows or columns of a CT: the 16-bit PE field reserves 0xFFFF (all PEs); 255 x 255 = 65,025 fit below it.
MAX_MESH_SIDE = 255
#: PEs of a package (CTs x PEs per CT): 16.8 M, 15x the 1.1 M Llama-2-70B takes on primal-7nm; the executor
#: keeps several counters per PE, so this also bounds its memory (checked for num_cts here, for a derived
#: CT count by the blocking pass).
MAX_PES = 1 << 24
#: Rows, columns and banks of a macro, widths of flits, links and banks: 16x the bundled 256 x 256 crossbar.
MAX_MACRO_SIDE = 4096
#: Cycles of one operation: 1 ms at 1 GHz, far beyond any macro, router or link.
MAX_CYCLES = 10**6
#: Clock, ADC and kernel rates: 1 THz.
MAX_RATE_HZ = 10**12
#: Link and memory bandwidth: 1 PB/s, 300x an H100's HBM.
MAX_BYTES_PER_S = 10**15
#: Tensor-core peaks: 10^18 op/s, 500x an H100's dense FP8 peak.
MAX_OPS_PER_S = 10**18
#: A router scratchpad: 16 MiB, 1024x the bundled 16 KiB.
MAX_SCRATCHPAD_BYTES = 1 << 24

# Units that need no suffix in the key name.
UNITLESS = frozenset({"count", "fraction", "bool", "text", "enum"})


def spec_field(unit: str, doc: str, **rules: Any) -> Any:
    """A dataclass field with its unit, meaning and value rules as metadata."""
    unknown = set(rules) - set(RULE_KEYS)
    if unknown:  # pragma: no cover - programming error
        raise TypeError(f"unknown field rules {sorted(unknown)}")
    return field(metadata={"unit": unit, "doc": doc, **rules})


def internal_field(doc: str) -> Any:
    """A field that is not part of the TOML schema (not loaded, not hashed)."""
    return field(default="", compare=False, repr=False, metadata={"internal": True, "doc": doc})


def ranges_field() -> Any:
    """The stated ranges of a target's numbers (dotted key -> (low, high)): loaded, not hashed (a range
    changes no result)."""
    return field(default_factory=dict, compare=False, repr=False,
                 metadata={"internal": True, "doc": "stated ranges (<key>_range = [low, high]), not part of the hash"})


Problem = tuple[str, str]  # (field name relative to the table, what is wrong)


class Table:
    """Base of every table dataclass: cross-field rules and plain-data export."""

    def _problems(self) -> Iterator[Problem]:
        """Cross-field consistency problems as (field, message); none by default."""
        return iter(())

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict of the schema fields (TOML/JSON-compatible values)."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            if f.metadata.get("internal"):
                continue
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Table) else value
        return out


class TargetBase(Table):
    """Root of a target: identity, canonical hash."""

    source: str

    @cached_property
    def content_hash(self) -> str:
        """sha256 hex of the canonical JSON of every value (stable across runs and hosts)."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()



# --------------------------------------------------------------------------- introspection


@dataclass(frozen=True)
class FieldInfo:
    """One key of the schema, for docs and tooling."""

    key: str  # dotted, e.g. "rram.adc_bits"
    type: type
    unit: str
    doc: str
    rules: dict[str, Any]


def is_table(typ: Any) -> bool:
    """Whether a field's type is a nested table (a dataclass) rather than a leaf value."""
    return isinstance(typ, type) and is_dataclass(typ)


def type_hints(cls: type) -> dict[str, Any]:
    """Resolved field annotations of a spec dataclass (cached per class)."""
    cached = _HINTS.get(cls)
    if cached is None:
        cached = _HINTS[cls] = typing.get_type_hints(cls)
    return cached


_HINTS: dict[type, dict[str, Any]] = {}


def schema(cls: type, prefix: str = "") -> list[FieldInfo]:
    """Every leaf key of a target class, depth-first in declaration order."""
    out: list[FieldInfo] = []
    hints = type_hints(cls)
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        typ = hints[f.name]
        if is_table(typ):
            out.extend(schema(typ, f"{prefix}{f.name}."))
        else:
            rules = {k: f.metadata[k] for k in RULE_KEYS if k in f.metadata}
            out.append(FieldInfo(prefix + f.name, typ, f.metadata["unit"], f.metadata["doc"], rules))
    return out

