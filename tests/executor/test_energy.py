"""Decode energy recomputed by hand, record by record, from the target's constants and the tile table.

An independent check of the replay's energy accounting (issue 14, item 5): a plain loop over request
0's decode records prices each one by the formulas of docs/executor.md, routes every router leg itself
(XY on the CT mesh to the CT's port, XY on the package grid of CTs in snake order, one controller link)
to count the distinct links a record's bits cross, and integrates every CT's leakage over the decode
window from the PG_ON / PG_OFF times. It reads the replay only for record times.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.executor import power
from primal_compiler.executor.heat import network
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.target import load_target, with_overrides
from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.opcodes import CONTROLLER, NONE32, ActFn, DmacOp, Flag, Opcode


def _walk(x0: int, y0: int, x1: int, y1: int, tag: tuple) -> list[tuple]:
    """Links of the dimension-order walk (x first) from (x0, y0) to (x1, y1), each named by where it leaves."""
    links = []
    while x0 != x1:
        d = 1 if x1 > x0 else -1
        links.append((*tag, x0, y0, "x", d))
        x0 += d
    while y0 != y1:
        d = 1 if y1 > y0 else -1
        links.append((*tag, x0, y0, "y", d))
        y0 += d
    return links


def _snake(ct: int, cols: int) -> tuple[int, int]:
    row = ct // cols
    return (ct % cols if row % 2 == 0 else cols - 1 - ct % cols), row


def _links(src: tuple[int, int], dst: tuple[int, int], mesh_cols: int, package_cols: int) -> list[tuple]:
    """Every link of one leg (CT, PE) -> (CT, PE); the controller is CONTROLLER."""
    (sc, sp), (dc, dp) = src, dst
    pe_xy = lambda pe: (pe % mesh_cols, pe // mesh_cols)  # noqa: E731
    if sc == dc and sc != CONTROLLER:
        return _walk(*pe_xy(sp), *pe_xy(dp), ("mesh", sc))
    out = []
    if sc != CONTROLLER:
        out += _walk(*pe_xy(sp), 0, 0, ("mesh", sc))  # to the CT's port at PE 0
    else:
        out.append(("ctl", "in"))
    a = _snake(0 if sc == CONTROLLER else sc, package_cols)
    b = _snake(0 if dc == CONTROLLER else dc, package_cols)
    out += _walk(*a, *b, ("d2d",))
    if dc != CONTROLLER:
        out += _walk(0, 0, *pe_xy(dp), ("mesh", dc))
    else:
        out.append(("ctl", "out"))
    return out


def _legs(stream, i: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    r = stream.records[i]
    me, to = (int(r["ct"]), int(r["pe"])), (int(r["dst_ct"]), int(r["dst_pe"]))
    if r["group"] == NONE32:
        return [(me, to)]
    g = int(r["group"])
    members = [(int(stream.group_ct[k]), int(stream.group_pe[k]))
               for k in range(stream.group_ptr[g], stream.group_ptr[g + 1])]
    return [(me, m) for m in members] if r["op"] == Opcode.BCAST else [(m, to) for m in members]


def _tile_shapes(arrays, macro: Macro) -> dict[tuple[int, int], tuple[int, int]]:
    out = {}
    for i in range(len(arrays["tile_macro"])):
        if arrays["tile_macro"][i] != macro or arrays["tile_pe"][i] < 0:
            continue
        host = i if macro == Macro.RRAM else int(arrays["tile_host"][i])
        out[(int(arrays["tile_ct"][host]), int(arrays["tile_pe"][i]))] = (int(arrays["tile_rows"][i]),
                                                                           int(arrays["tile_cols"][i]))
    return out


def _dynamic_pj(rp, rec: list[int]) -> dict[str, float]:
    t, stream, arrays = rp.target, rp.stream, rp.arrays
    rram, sram, router = t.rram, t.sram, t.router
    rram_tiles, sram_tiles = _tile_shapes(arrays, Macro.RRAM), _tile_shapes(arrays, Macro.SRAM)
    ops = {fn: getattr(t.act, f"{fn.name.lower()}_ops_per_element") for fn in ActFn}
    head_dim = int(rp.meta["kv"]["head_dim"])  # the model's attention head, as the KV map stores it
    e = dict.fromkeys(("rram_adc", "base_dcim", "sram_dcim", "router_dmac", "links", "controller", "wakeup"), 0.0)
    for i in rec:
        r = stream.records[i]
        op, count, nbytes = Opcode(int(r["op"])), int(r["count"]), int(r["nbytes"])
        here = (int(r["ct"]), int(r["pe"]))
        e["controller"] += t.system.nmc_issue_energy_pj  # every record passes the NMC's issue port
        if op == Opcode.SMAC_RRAM and t.system.base_weight_array == "sram-dcim":  # the tile's SRAM macros
            rows, cols = rram_tiles[here]
            e["base_dcim"] += count * rows * cols * sram.mac_energy_pj * rram.weight_bits / sram.weight_bits
        elif op == Opcode.SMAC_RRAM:
            rows, cols = rram_tiles[here]
            pulses = math.ceil(rram.input_bits / rram.dac_bits)
            conversions = pulses * math.ceil(rows / rram.rows_active_per_read) * cols
            e["rram_adc"] += count * (conversions * (rram.adc_energy_pj_per_conversion
                                                     + rram.shift_add_energy_pj_per_conversion)
                                      + pulses * rows * cols * rram.array_read_energy_pj
                                      + pulses * rows * rram.row_driver_energy_pj)
        elif op == Opcode.SMAC_SRAM and not r["flags"] & Flag.SKIPPED:
            rows, cols = sram_tiles[here]
            e["sram_dcim"] += count * rows * cols * sram.mac_energy_pj
        elif op == Opcode.DMAC:  # a PV record first takes the softmax of its scores (one per head_dim MACs)
            scores = count // head_dim if int(r["arg"]) & 0xFF == DmacOp.PV else 0
            e["router_dmac"] += (count + scores * t.act.softmax_ops_per_element) * router.dmac_energy_pj_per_op \
                + count * (router.dmac_bits // 8) * 8 * router.scratchpad_energy_pj_per_bit
        elif op == Opcode.ACT:
            key = "controller" if here[0] == CONTROLLER else "router_dmac"
            e[key] += count * ops[ActFn(int(r["arg"]) & 0xFF)] * router.dmac_energy_pj_per_op
        elif op == Opcode.REDUCE:
            members = len(_legs(stream, i))
            e["router_dmac"] += nbytes * 8 // router.dmac_bits * (members - 1) * router.dmac_energy_pj_per_op
        elif op == Opcode.KV_APPEND:
            e["router_dmac"] += nbytes * 8 * router.scratchpad_energy_pj_per_bit
        elif op == Opcode.CONFIG:
            e["sram_dcim"] += nbytes * 8 * sram.write_energy_pj_per_bit
        elif op == Opcode.PG_ON:
            e["wakeup"] += t.power_gating.wakeup_energy_pj
        if op in (Opcode.BCAST, Opcode.REDUCE, Opcode.UNICAST, Opcode.KV_APPEND, Opcode.CONFIG):
            crossed = {link for a, b in _legs(stream, i)
                       for link in _links(a, b, rp.topo.mesh_cols, rp.topo.package_cols)}
            mesh = sum(1 for link in crossed if link[0] == "mesh")
            e["links"] += nbytes * 8 * (mesh * router.energy_pj_per_bit_hop
                                        + (len(crossed) - mesh) * t.d2d.energy_pj_per_bit)
    return e


def _static_j(rp, begin: int, end: int, scale: np.ndarray | None = None) -> np.ndarray:
    """Static energy of every CT over [begin, end), its state following its PG_ON / PG_OFF records: its leakage
    times its ``scale`` at temperature (default: the replay's) plus its RRAM periphery's bias, unscaled, while
    the periphery is powered."""
    scale = rp.timeline.leak_scale if scale is None else scale
    t, r = rp.target, rp.stream.records
    pg = t.power_gating
    digital = t.system.base_weight_array == "sram-dcim"
    rram = 0.0 if digital else t.rram.leakage_uw  # an all-digital PE has no RRAM periphery ...
    base = math.ceil(t.rram.rows * t.rram.cols * t.rram.weight_bits / (t.sram.rows * t.sram.cols_bits)) \
        * t.sram.leakage_uw if digital else 0.0  # ... but SRAM macros holding its base weights, always kept
    active = (rram + base + t.router.leakage_uw + t.router.scratchpad_leakage_uw) * 1e-6
    gated = (rram * pg.gated_leakage_fraction + base * pg.retained_leakage_fraction
             + t.router.leakage_uw * pg.gated_leakage_fraction) * 1e-6
    bias = {"active": 0.0 if digital else t.rram.idle_bias_uw * 1e-6 * rp.topo.pes}  # one bias per macro ...
    bias["gated"] = 0.0 if pg.gate_rram_periphery else bias["active"]  # ... switched off with the periphery
    pad_kept, pad_off = (t.router.scratchpad_leakage_uw * f * 1e-6 for f in (pg.retained_leakage_fraction,
                                                                             pg.gated_leakage_fraction))
    gating = any(r["op"] == Opcode.PG_OFF)  # srpg gated this program, so it switched unused macros off too
    sram_on, sram_kept, sram_off = (t.sram.leakage_uw * f * 1e-6 for f in (1.0, pg.retained_leakage_fraction,
                                                                             pg.gated_leakage_fraction))
    held = {(int(rp.arrays["tile_ct"][rp.arrays["tile_host"][i]]), int(rp.arrays["tile_pe"][i]))
            for i in range(len(rp.arrays["tile_macro"])) if rp.arrays["tile_macro"][i] == Macro.SRAM}
    total = np.zeros(rp.topo.num_cts)
    for ct in range(rp.topo.num_cts):
        lora = sum(1 for c, _ in held if c == ct) if pg.gate_unused_sram and gating else rp.topo.pes
        unused = (rp.topo.pes - lora) * sram_off  # watts of the macros holding no LoRA weight, in every state
        events = [(0, -1, "active")]  # (cycle, record, state of the CT from then on)
        for i in range(len(r)):
            if r["ct"][i] == ct and r["op"][i] == Opcode.PG_OFF:
                events.append((int(rp.finish[i]), 2 * i, "gated"))
            elif r["ct"][i] == ct and r["op"][i] == Opcode.PG_ON:
                events += [(int(rp.start[i]), 2 * i, "active"), (int(rp.finish[i]), 2 * i + 1, "active")]
        events.sort()
        windows = [(at, nxt) for (at, _, s), (nxt, _, _) in zip(events, events[1:] + [(rp.end, 0, "")]) if s == "gated"]
        pads = _scratchpads_to_keep(rp, ct, windows) if pg.gate_unused_scratchpad else rp.topo.pes
        active_ct = active * rp.topo.pes + lora * sram_on + unused
        gated_ct = gated * rp.topo.pes + lora * sram_kept + unused + pads * pad_kept + (rp.topo.pes - pads) * pad_off
        events = [(at, i, (active_ct if s == "active" else gated_ct, bias[s])) for at, i, s in events]
        for (at, _, (watts, fixed)), (nxt, _, _) in zip(events, events[1:] + [(rp.end, 0, 0.0)]):
            span = max(0, min(nxt, end) - max(at, begin))
            total[ct] += (watts * scale[ct] + fixed) * span / t.system.clock_hz
    return total


def _scratchpads_to_keep(rp, ct: int, windows: list[tuple[int, int]]) -> int:
    """PEs of CT ``ct`` holding a KV chunk (the kv-ring's units) or a buffer live across one of its gated windows."""
    keep = {int(p) for c, p in zip(rp.arrays["kv_ct"], rp.arrays["kv_pe"]) if int(c) == ct}
    mem = rp.memory
    for loc, b, e in zip(mem.inst_loc, mem.inst_begin, mem.inst_end):
        if int(loc) >> 32 == ct and any(b < w_end and e > w_begin for w_begin, w_end in windows):
            keep.add((int(loc) >> 16) & 0xFFFF)
    return len(keep)


def test_decode_energy_recomputed_by_hand_matches_the_replay(replayed):
    _check_by_hand(replayed)
    m = metrics(replayed)
    assert m["energy_per_token_by_component_j"]["base_dcim"] == 0
    assert 0 < m["scratchpads"]["kept_when_gated"] < m["scratchpads"]["total"]  # some hold nothing to keep


def test_a_scratchpad_is_kept_for_its_kv_and_for_a_buffer_live_across_the_gated_window(target):
    """CT 1 gated over [100, 200): PE 3's buffer lives across it, PE 4's ends before, PE 5 holds KV; CT 0 never
    gates, so its buffer over the same cycles keeps nothing."""
    tl = power.timeline(np.zeros(0, dtype=[("op", "u1"), ("ct", "u2")]), np.zeros(0, np.int64),
                        np.zeros(0, np.int64), 2, 300, np.full(2, 8), 8, 26.85)
    tl = replace(tl, ct=np.array([0, 1, 1, 1]), state=np.array([0, 0, 2, 0], np.int8),
                 begin=np.array([0, 0, 100, 200]), end=np.array([300, 100, 200, 300]))
    kv = np.zeros(16, np.int64)
    kv[8 + 5] = 8192
    pe = np.array([8 + 3, 8 + 4, 0 + 3])
    kept = power.scratchpads_kept(tl, target, 8, kv, pe, np.array([50, 0, 50]), np.array([150, 90, 150]))
    assert kept.scratch_kept.tolist() == [0, 2]
    off = with_overrides(target, {"power_gating.gate_unused_scratchpad": False})
    assert power.scratchpads_kept(tl, off, 8, kv, pe, np.zeros(3, np.int64), np.zeros(3, np.int64)).scratch_kept.tolist() == [8, 8]


def test_the_all_digital_reference_recomputed_by_hand_matches_its_replay(compiled):
    """The same program on digital-7nm: base MVMs in 16 SRAM-DCIM macros per PE, no RRAM periphery."""
    program, meta, arrays = compiled
    digital = with_overrides(load_target("digital-7nm"), {"ct.mesh_rows": 8, "ct.mesh_cols": 8})
    rp = replay(meta, arrays, program.stream, digital)
    _check_by_hand(rp)
    m = metrics(rp)
    assert m["energy_per_token_by_component_j"]["rram_adc"] == 0 and m["static_by_domain_w"]["rram_adc"] == 0
    assert m["static_by_domain_w"]["base_dcim"] > 0


def _check_by_hand(rp) -> None:
    m = metrics(rp)
    sec = {s.name: range(s.start, s.stop) for s in rp.stream.sections}
    sink = lambda i: (rp.stream.records["op"][i] == Opcode.ACT and rp.stream.records["arg"][i] == ActFn.ARGMAX  # noqa: E731
                      and rp.stream.records["ct"][i] == CONTROLLER)
    begin = max(int(rp.finish[i]) for i in sec["prefill:0"] if sink(i))
    end = max(int(rp.finish[i]) for i in sec["decode:0"] if sink(i))
    tokens = m["batch"] * m["decode_steps"]
    by_hand = _dynamic_pj(rp, list(sec["decode:0"]))
    replayed_j = m["energy_per_token_by_component_j"]
    assert by_hand["links"] > 0 and by_hand["rram_adc"] + by_hand["base_dcim"] > 0 and by_hand["wakeup"] >= 0
    for k, pj in by_hand.items():
        assert replayed_j[k] * tokens == pytest.approx(pj * 1e-12, rel=1e-9, abs=1e-18), k
    assert replayed_j["static"] * tokens == pytest.approx(_static_j(rp, begin, end).sum(), rel=1e-9)


def test_the_leakage_is_at_the_dies_steady_temperature(replayed):
    """Each CT's leakage scale is 2^((T - 300 K) / 12.9 K) at its die temperature T, and T is the RC network's
    steady state under the CT's mean power over the replay: its records' energy by hand (an issuing CT pays,
    a transfer to another CT splits it, the controller's issue is off the dies) plus its leakage by hand at T."""
    _check_steady_temperature(replayed)


def test_the_periphery_bias_heats_the_dies_unscaled(compiled, small_target):
    """As above with a large RRAM periphery bias (13.2 uW a macro, its stated range's top): the hand computation
    counts it at no leakage scale, so a replay that scaled it would miss the dies' temperature."""
    program, meta, arrays = compiled
    target = with_overrides(small_target, {"rram.idle_bias_uw": 13.2})
    _check_steady_temperature(replay(meta, arrays, program.stream, target))


def _check_steady_temperature(rp) -> None:
    t, tl, n = rp.target, rp.timeline, rp.topo.num_cts
    assert t.thermal.leakage_temperature == "die"
    assert np.allclose(tl.leak_scale, 2.0 ** ((tl.die_c - 26.85) / 12.9), rtol=1e-12)
    assert (tl.die_c > t.thermal.ambient_c).all() and (tl.leak_scale > 2.5).all()  # 45 degC ambient: x2.65 at least
    r = rp.stream.records
    dyn = np.zeros(n)
    for name, pj in rp.energy_pj.items():
        if name == "controller":
            continue
        for i in np.flatnonzero(pj):
            src, dst, e = int(r["ct"][i]), int(r["dst_ct"][i]), float(pj[i]) * 1e-12
            ends = [c for c in (src, dst) if c < n] if dst != src else [src] * (src < n)
            for c in ends:
                dyn[c] += e / len(ends)
    seconds = rp.end / t.system.clock_hz
    watts = (dyn + _static_j(rp, 0, rp.end)) / seconds
    net = network(rp.topo, t)
    assert np.allclose(net.ambient_c + net.steady_rise(watts)[:n], tl.die_c, atol=1e-4)


def test_leakage_at_the_reference_temperature_takes_the_keys_as_stated(compiled):
    program, meta, arrays = compiled
    target = with_overrides(load_target("primal-7nm"), {"ct.mesh_rows": 8, "ct.mesh_cols": 8,
                                                         "thermal.leakage_temperature": "reference"})
    rp = replay(meta, arrays, program.stream, target)
    assert (rp.timeline.leak_scale == 1).all() and (rp.timeline.die_c == 26.85).all()
    _check_by_hand(rp)


def test_a_die_past_the_models_range_is_refused(compiled):
    """A heat sink 10^6 times weaker leaves the dies far above 125 degC: refused in one line."""
    program, meta, arrays = compiled
    target = with_overrides(load_target("primal-7nm"), {"ct.mesh_rows": 8, "ct.mesh_cols": 8,
                                                         "thermal.convection_k_mm2_per_w": 1e9})
    with pytest.raises(InputError, match=r"die would pass 125 degC \(thermal.model_max_c\)"):
        replay(meta, arrays, program.stream, target)


def test_the_energy_splits_sum_to_the_energy_per_token(replayed):
    m = metrics(replayed)
    total = m["energy_per_token_j"]
    assert sum(m["energy_per_token_by_component_j"].values()) == pytest.approx(total, rel=1e-3)
    assert sum(m["energy_per_token_by_state_j"].values()) == pytest.approx(total, rel=1e-3)
    assert m["energy_per_token_by_state_j"]["gated"] > 0  # the fixture gates idle CTs during decode


def test_the_hand_router_counts_what_the_mapping_calls_hops():
    # inside one CT: Manhattan distance; across CTs: to the port, over the package, from the port
    assert len(_links((0, 9), (0, 0), 8, 2)) == 2
    assert len(_links((0, 9), (3, 9), 8, 2)) == 2 + 1 + 2  # CT 3 sits at (0, 1) of a 2-wide snake
    assert len(_links((CONTROLLER, 0), (0, 1), 8, 2)) == 1 + 1


def test_the_rram_periphery_bias_is_on_while_powered_and_off_with_the_periphery():
    """rram.idle_bias_uw per PE: drawn active and waking, removed while gated only where the periphery is switched
    off, none on an all-digital PE; it moves a replay's static power and not its leakage scale's rule."""
    seven = load_target("primal-7nm")
    assert power.bias_w(seven) * 1e6 == pytest.approx([0.19, 0.19, 0.0])
    kept = with_overrides(seven, {"power_gating.gate_rram_periphery": False})
    assert power.bias_w(kept) * 1e6 == pytest.approx([0.19, 0.19, 0.19])
    assert (power.bias_w(load_target("digital-7nm")) == 0).all()
    assert power.domain_static_w(seven)["rram_adc"] * 1e6 == pytest.approx([0.24 + 0.19, 0.24 + 0.19, 0.24 * 0.05])


def test_the_bias_adds_its_watts_to_every_powered_ct(replayed):
    rp = replayed
    more = with_overrides(rp.target, {"rram.idle_bias_uw": 10.19})  # 10 uW more per macro
    tl = replace(rp.timeline, leak_scale=np.ones(len(rp.timeline.sram_on)))
    extra = power.interval_watts(tl, more, rp.topo.pes) - power.interval_watts(tl, rp.target, rp.topo.pes)
    powered = tl.state != power.GATED
    assert powered.any() and (~powered).any()  # the fixture gates some CTs
    assert extra[powered] == pytest.approx(10e-6 * rp.topo.pes)
    assert extra[~powered] == pytest.approx(0.0, abs=1e-18)


def test_the_per_ct_attribution_adds_as_numpy_does(replayed):
    """leakage.ct_dynamic_j's compiled additions give, to the bit, what np.add.at gives in the same order."""
    from primal_compiler.executor.leakage import ct_dynamic_j

    rp, n = replayed, replayed.topo.num_cts
    rec = np.arange(len(rp.stream.records))[::2]  # a subset, as a window is
    r = rp.stream.records[rec]
    src, dst = r["ct"].astype(np.int64), r["dst_ct"].astype(np.int64)
    on_src, on_dst = src < n, (dst < n) & (dst != src)
    want, off = np.zeros(n), 0.0
    for name, per_record in rp.energy_pj.items():
        e = per_record[rec] * 1e-12
        if name == "controller":
            off += float(e.sum())
            continue
        share = np.where(on_src & on_dst, 0.5, 1.0) * e
        np.add.at(want, src[on_src], share[on_src])
        np.add.at(want, dst[on_dst], np.where(on_src, share, e)[on_dst])
        off += float(e[~on_src & ~on_dst].sum())
    got, got_off = ct_dynamic_j(rp.stream.records, rp.energy_pj, rec, n)
    assert got.tobytes() == want.tobytes() and got_off == off and want.sum() > 0


def test_an_idle_machine_draws_its_periphery_bias_unscaled(replayed):
    """serve's idle power: with the RRAM periphery left powered while gated, more bias adds its watts once (a die's
    leakage scale, 2.65x or more at the 45 degC ambient, must not multiply it), plus the little its heat adds."""
    from primal_compiler.serve.costs import idle_watts

    base = with_overrides(replayed.target, {"power_gating.gate_rram_periphery": False})
    more = with_overrides(base, {"rram.idle_bias_uw": base.rram.idle_bias_uw + 10.0})
    added = idle_watts(replace(replayed, target=more)) - idle_watts(replace(replayed, target=base))
    bias = 10e-6 * replayed.topo.pes * replayed.topo.num_cts
    assert bias <= added < 1.05 * bias
