"""Blocking of tiles into CTs and the per-CT placement problems built from it.

Within a layer, each output column of a matrix (all its block rows and bit
slices: one reduction group) is a strip; strips are packed in layer order
(Q, K, V, O, MLP) into CTs of ``rows x cols`` PEs, a new CT starting when a
strip does not fit, so reductions never cross a CT and W_Q sits next to W_K.
Every layer owns whole CTs (so SRPG can gate a layer's CTs together); the LM
head follows the last layer. CTs sit on a package mesh in snake order, so
consecutive CTs are neighbours. Identical layers share one set of CT
templates: each distinct CT is one :class:`Instance`, solved once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.ir.model import Model
from primal_compiler.ir.tiles import ROLE_CODES, Macro, TileTable
from primal_compiler.mapping.instance import Instance
from primal_compiler.mapping.traffic import layer_flows


@dataclass(frozen=True, eq=False)
class CtTemplate:
    """One distinct CT: its placement problem and (once placed) its tile and hub PEs."""

    layer: int  # first layer using this template (num_layers for the LM head)
    local_ct: int  # position of the CT within its layer
    instance: Instance
    rel_rows: np.ndarray  # tile rows relative to the layer's first row, in seq order
    slots: np.ndarray  # PE of each tile (T,)
    hubs: np.ndarray  # PE of each hub (H,), where the placing pass's hub policy put them


@dataclass(frozen=True, eq=False)
class Layout:
    rows: int
    cols: int
    ct_layer: np.ndarray  # layer of each CT
    ct_template: np.ndarray  # template index of each CT
    templates: tuple[CtTemplate, ...]
    inter_src: np.ndarray  # die-to-die transfers of one decode step (global CT ids; -1 = controller)
    inter_dst: np.ndarray
    inter_bytes: np.ndarray
    package_cols: int

    @property
    def num_cts(self) -> int:
        return len(self.ct_layer)

    def ct_xy(self, ct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Package-mesh coordinates of CTs in snake order."""
        row = ct // self.package_cols
        col = np.where(row % 2 == 0, ct % self.package_cols, self.package_cols - 1 - ct % self.package_cols)
        return col, row

    def replace_template(self, index: int, **changes) -> Layout:
        templates = list(self.templates)
        templates[index] = replace(templates[index], **changes)
        return replace(self, templates=tuple(templates))


def column_major(rows: int, cols: int, n: int) -> np.ndarray:
    """PE index of the first ``n`` positions filled column by column."""
    k = np.arange(n)
    return ((k % rows) * cols + k // rows).astype(np.int32)


def _pack_strips(t: TileTable, rows: np.ndarray, capacity: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Local CT and sequence index of each PE-owning row (in canonical order).

    A strip is a run of rows of one role, part and ``bcol``: an RRAM output column, or a self-hosted
    SRAM tile with the SRAM tiles of its matrix and rank block that follow it.
    """
    ct = np.empty(len(rows), dtype=np.int32)
    seq = np.empty(len(rows), dtype=np.int32)
    key = (t.role[rows].astype(np.int64) * 4 + t.part[rows]) * 1_000_000 + t.bcol[rows]
    bounds = np.flatnonzero(np.diff(key)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(rows)]])
    cur, fill = 0, 0
    for s, e in zip(starts, ends):
        size = e - s
        if size > capacity:
            raise InputError(where, f"a {ROLE_CODES[t.role[rows[s]]]} column needs {size} PEs; a CT has {capacity}")
        if fill + size > capacity:
            cur, fill = cur + 1, 0
        ct[s:e] = cur
        seq[s:e] = fill + np.arange(size)
        fill += size
    return ct, seq


def pe_owners(t: TileTable, rows: np.ndarray) -> np.ndarray:
    """Those of ``rows`` that own a PE: RRAM tiles and SRAM tiles that are their own host."""
    return rows[(t.macro[rows] == Macro.RRAM) | (t.host[rows] == rows)]


def _template_instances(model: Model, t: TileTable, start: int, stop: int, geo, mesh, context: int, layer: int):
    """Per-CT instances of one layer's table slice, plus its die-to-die transfers."""
    rows_all = np.arange(start, stop)
    rram = rows_all[t.macro[rows_all] == Macro.RRAM]
    owners = pe_owners(t, rows_all)
    ct_of = np.full(len(t), -1, dtype=np.int64)
    ct_local, seq = _pack_strips(t, owners, mesh[0] * mesh[1], model.name)
    ct_of[owners] = ct_local
    sram = rows_all[t.macro[rows_all] == Macro.SRAM]
    ct_of[sram] = ct_of[t.host[sram]]
    seq_of = np.full(len(t), -1, dtype=np.int64)
    seq_of[owners] = seq
    flows = layer_flows(model, layer, t, rows_all, geo, context)
    hub_ct = _locate_hubs(t, rram, ct_of, flows, geo.rram_rows, geo.rram_cols)
    n_ct = int(ct_local.max()) + 1

    def where(e):
        return int(ct_of[e]) if isinstance(e, (int, np.integer)) else hub_ct[e]

    local = defaultdict(list)  # ct -> [(src, dst, bytes, cls)]
    inter: dict[tuple, float] = {}
    for f in flows:
        a, b = where(f.src), where(f.dst)
        if a == b:
            local[a].append((f.src, f.dst, f.bytes, f.cls))
            continue
        proxy = f"proxy:{f.payload}"
        inter[(a, b, proxy)] = max(inter.get((a, b, proxy), 0.0), f.bytes)
        local[b].append((proxy, f.dst, f.bytes, f.cls))
    instances = []
    for c in range(n_ct):
        tiles = owners[ct_local == c]
        tiles = tiles[np.argsort(seq_of[tiles])]
        tile_id = {int(r): k for k, r in enumerate(tiles)}
        hubs: dict[str, int] = {}

        def endpoint(e):
            if isinstance(e, (int, np.integer)):
                r = int(e) if t.macro[e] == Macro.RRAM else int(t.host[e])
                return tile_id[r]
            return len(tiles) + hubs.setdefault(e, len(hubs))

        src, dst, w, cls = [], [], [], []
        for s, d, nbytes, k in local[c]:
            src.append(endpoint(s))
            dst.append(endpoint(d))
            w.append(nbytes)
            cls.append(k)
        inst = Instance(
            rows=mesh[0], cols=mesh[1], num_tiles=len(tiles), num_hubs=len(hubs),
            src=np.asarray(src, np.int32), dst=np.asarray(dst, np.int32),
            weight=np.asarray(w, np.float64), flow_class=np.asarray(cls, np.int8),
            hub_names=tuple(hubs),
        )
        instances.append((inst, tiles - start))
    inter_list = [(a, b, nbytes) for (a, b, _), nbytes in sorted(inter.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))]
    return instances, inter_list, ct_of, seq_of, hub_ct


def _locate_hubs(t: TileTable, rram: np.ndarray, ct_of: np.ndarray, flows, rows: int, cols: int) -> dict[str, int]:
    """CT of every hub: roots with their column, LoRA hubs with their A tiles, shards of ``mid`` and ``out``
    with the O and down (fc2) root of their first element, a norm hub with its hub's first shard, the rest
    (shards of ``in``) in the layer's first CT."""
    hub_ct: dict[str, int] = {}
    first = int(ct_of[rram].min())
    for f in flows:
        if isinstance(f.src, (int, np.integer)) and isinstance(f.dst, str) and f.dst not in hub_ct:
            if f.dst.startswith(("root:", "lora:")):
                hub_ct[f.dst] = int(ct_of[f.src])
    for f in flows:
        for e in (f.src, f.dst):
            if isinstance(e, str) and e not in hub_ct:
                hub_ct[e] = first
    for name in [n for n in hub_ct if n.startswith(("mid:", "out:"))]:  # a shard with the root of its first element
        roles = ("root:o:",) if name.startswith("mid:") else ("root:down:", "root:fc2:")
        block = int(name.rsplit(":", 1)[1]) * rows // cols
        root = next((n for n in hub_ct if n.startswith(roles) and int(n.rsplit(":", 1)[1]) == block), None)
        hub_ct[name] = hub_ct[root] if root else first
    for name in [n for n in hub_ct if n.startswith("norm:")]:  # a norm hub with its hub's first shard
        hub_ct[name] = hub_ct.get(f"{name[5:]}:0", first)
    return hub_ct
