"""Build the :class:`Layout` of a lowered model: CTs, templates, die-to-die transfers.

The initial placement of every CT is column-major in sequence order (each
matrix a column-shaped rectangle, W_Q beside W_K) with hubs at their
weighted medians; ordering and search passes replace it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.ir.model import Model
from primal_compiler.ir.tiles import TileTable
from primal_compiler.mapping.hops import mapped_legs
from primal_compiler.mapping.instance import hub_slots
from primal_compiler.mapping.layout import CtTemplate, Layout, _template_instances, column_major, pe_owners
from primal_compiler.mapping.lower import layer_templates
from primal_compiler.mapping.traffic import shards
from primal_compiler.target.table import MAX_CTS, MAX_PES

CONTROLLER = -1


def block_model(model: Model, tiles: TileTable, geo, mesh: tuple[int, int], context: int, max_cts: int = 0):
    """(tiles with ``ct``/``seq`` set, Layout). ``max_cts`` > 0 is the target's fixed CT count."""
    ids, firsts = layer_templates(model)
    starts = np.searchsorted(tiles.layer, np.arange(model.num_layers + 2))
    jobs = [(firsts[k], k) for k in range(len(firsts))] + [(model.num_layers, len(firsts))]
    per_template = {}
    for layer, key in jobs:
        per_template[key] = _template_instances(model, tiles, starts[layer], starts[layer + 1], geo, mesh, context, layer)
    layer_key = list(ids) + [len(firsts)]
    n_cts = [len(per_template[k][0]) for k in layer_key]
    needed = int(sum(n_cts))
    if max_cts and needed > max_cts:
        raise InputError(model.name, f"needs {needed} CTs but the target fixes num_cts = {max_cts}")
    if needed > MAX_CTS or needed * mesh[0] * mesh[1] > MAX_PES:
        raise InputError(model.name, f"needs {needed:,} CTs of {mesh[0]}x{mesh[1]} PEs, more than a package "
                                     f"holds ({MAX_CTS:,} CTs, {MAX_PES:,} PEs)")
    ct_base = np.concatenate([[0], np.cumsum(n_cts)[:-1]]).astype(np.int64)

    templates: list[CtTemplate] = []
    template_index: dict[tuple, int] = {}
    for key, (instances, _, _, _, _) in per_template.items():
        layer = jobs[key][0]
        for c, (inst, rel) in enumerate(instances):
            template_index[(key, c)] = len(templates)
            slots = column_major(inst.rows, inst.cols, inst.num_tiles)
            templates.append(CtTemplate(layer, c, inst, rel, slots, hub_slots(inst, slots)))
    ct_layer = np.repeat(np.arange(len(layer_key)), n_cts).astype(np.int32)
    ct_template = np.concatenate(
        [[template_index[(k, c)] for c in range(n)] for k, n in zip(layer_key, n_cts)]
    ).astype(np.int32)

    ct = np.full(len(tiles), -1, dtype=np.int64)
    seq = np.full(len(tiles), -1, dtype=np.int64)
    src, dst, nbytes = [], [], []
    for layer, key in enumerate(layer_key):
        _, inter, ct_of, seq_of, hub_ct = per_template[key]
        s0, s1, t0 = starts[layer], starts[layer + 1], starts[jobs[key][0]]
        ct[s0:s1] = ct_of[t0 : t0 + (s1 - s0)] + ct_base[layer]
        seq[s0:s1] = seq_of[t0 : t0 + (s1 - s0)]
        for a, b, nb in inter:
            src.append(a + ct_base[layer])
            dst.append(b + ct_base[layer])
            nbytes.append(nb)
        for i in range(shards(model.hidden_size, geo.rram_rows)):  # the hand-off, shard by shard
            prev = per_template[layer_key[layer - 1]][4] if layer else None
            src.append(CONTROLLER if prev is None else int(prev[f"out:{i}"] + ct_base[layer - 1]))
            dst.append(hub_ct[f"in:{i}"] + ct_base[layer])
            nbytes.append(min(geo.rram_rows, model.hidden_size - i * geo.rram_rows) * model.precision.activation_bits / 8)
    for name, c in per_template[layer_key[-1]][4].items():  # each LM-head root sends its logits to the controller
        if name.startswith("root:"):
            j = int(name.rsplit(":", 1)[1])
            src.append(int(c) + ct_base[-1])
            dst.append(CONTROLLER)
            nbytes.append(min(geo.rram_cols, model.vocab_size - j * geo.rram_cols) * model.precision.psum_bits / 8)

    layout = Layout(
        rows=mesh[0], cols=mesh[1], ct_layer=ct_layer, ct_template=ct_template, templates=tuple(templates),
        inter_src=np.asarray(src, np.int64), inter_dst=np.asarray(dst, np.int64),
        inter_bytes=np.asarray(nbytes, np.float64), package_cols=max(1, math.ceil(math.sqrt(needed))),
    )
    return tiles.with_columns(ct=ct, seq=seq), layout


def apply_placement(tiles: TileTable, layout: Layout) -> TileTable:
    """Tile table whose ``pe`` column follows the layout's template slots (SRAM tiles: their host's PE,
    their own slot when they are their own host)."""
    pe = np.full(len(tiles), -1, dtype=np.int64)
    has = tiles.seq >= 0
    tmpl = layout.ct_template[tiles.ct[has]]
    lookup_off = np.concatenate([[0], np.cumsum([len(t.slots) for t in layout.templates])])
    flat = np.concatenate([t.slots for t in layout.templates])
    pe[has] = flat[lookup_off[tmpl] + tiles.seq[has]]
    sram = tiles.host >= 0
    pe[sram] = pe[tiles.host[sram]]
    return tiles.with_columns(pe=pe)


def restore_layout(model: Model, tiles: TileTable, geo, mesh: tuple[int, int], context: int, max_cts: int,
                   legs: Mapping[str, np.ndarray], where: str) -> Layout:
    """The Layout a compile held, rebuilt from what its program file keeps: blocking ``model`` again gives
    the CTs, templates and their placement problems; the stored tile table (``ct``, ``seq``, ``pe``) gives
    each template's tile PEs, and the mapped legs (:func:`~primal_compiler.mapping.hops.mapped_legs`) its hub
    PEs. InputError(where, ...) when the file's tiles, CTs or legs are not what that blocking and those PEs
    give, so a restored layout is the compiled one or nothing."""
    blocked, layout = block_model(model, tiles, geo, mesh, context, max_cts)
    same = all(np.array_equal(getattr(blocked, c), getattr(tiles, c)) for c in ("ct", "seq"))
    same &= np.array_equal(layout.ct_template, legs["ct_template"]) and np.array_equal(layout.ct_layer, legs["ct_layer"])
    if not same:
        raise InputError(where, "tile_ct, tile_seq, ct_layer, ct_template: not the blocking of the program's model")
    ptr, owners = legs["map_tpl_ptr"], pe_owners(tiles, np.arange(len(tiles)))
    first_ct = np.unique(layout.ct_template, return_index=True)[1]  # every template is some CT's
    for k, tp in enumerate(layout.templates):
        mine = owners[tiles.ct[owners] == first_ct[k]]
        slots = np.empty(tp.instance.num_tiles, np.int32)
        slots[tiles.seq[mine]] = tiles.pe[mine]
        hubs = np.full(tp.instance.num_hubs, -1, np.int32)
        ends = np.concatenate([tp.instance.src, tp.instance.dst]) - tp.instance.num_tiles
        pes = np.concatenate([legs["map_src_pe"][ptr[k]:ptr[k + 1]], legs["map_dst_pe"][ptr[k]:ptr[k + 1]]])
        if len(pes) != len(ends):
            raise InputError(where, f"map_tpl_ptr: template {k} has {len(pes) // 2} mapped legs, its blocking "
                                    f"{len(tp.instance.src)}")
        hubs[ends[ends >= 0]] = pes[ends >= 0]
        layout = layout.replace_template(k, slots=slots, hubs=hubs)
    legs_now = mapped_legs(layout) | {"tile_pe": apply_placement(tiles, layout).pe}
    bad = [name for name, a in legs_now.items() if not np.array_equal(a, legs[name])]
    if bad:
        raise InputError(where, f"{', '.join(bad)}: not the legs of the stored placement")
    return layout
