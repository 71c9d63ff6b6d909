"""The cost metrics of a replay, each defined once (docs/executor.md, DESIGN.md section 5).

For request ``r`` (sections ``adapter:r`` if it loads an adapter, ``prefill:r``,
``decode:r``; every generated token ends with a controller ``ARGMAX``):

- **TTFT**: from the request's first record starting to the prefill's ARGMAX
  finishing (prefill plus the exposed part of the LoRA reconfiguration).
- **TTFT** ends when every sequence of the batch has its first token (the
  last prefill ARGMAX).
- **ITL** (per sequence): from one generated token to the next of the same
  sequence (the same pass: the batch, or one sequence when codegen
  pipelines), mean over every step of every pass; ``itl_p50_s`` /
  ``itl_p99_s`` over the same gaps; ``itl_first_step_s`` the first step only.
- **generation**: ``generate`` tokens per sequence (default: the replayed
  decode steps). Steps past the replayed ones repeat a middle replayed step
  once the last one is periodic (:mod:`.steady`): each adds one period to
  every pass's gaps, the window and step ``K - 1``'s energy; ``generation``
  says how many steps were replayed and how many repeat.
- **throughput** (of the machine): tokens generated (batch x steps) over the
  decode window, from the last prefill ARGMAX (every sequence has its first
  token) to the last decode ARGMAX.
- **energy per token / tokens/J / power**: over the decode window: dynamic
  energy of the decode records plus static energy of every CT in its power
  state, divided by the tokens generated in the window; power = that energy /
  window.
- **hops**: per leg of every router record of the decode step, XY hops on
  the PE mesh for legs within one CT (max, mean, bytes-weighted mean), the
  same over the legs the mapping placed (``mapped``: all but attention and
  KV legs, which follow the kv-ring layout), and package hops for legs
  between CTs (``inter_ct``); controller legs carry none.
- **decode issue time**: the busiest sequencer's time to dispatch its share
  of one decode step's records (``control``: distributed, one sequencer per
  CT; central, the NMC alone); when it is close to the ITL, decode is bound by
  instruction issue. ``program_load_s``: the NMC loading every CT's program,
  once, before the first request (not part of TTFT).
- **KV storage-bandwidth utilisation**: KV bytes the decode DMACs read over
  the bytes their scratchpad banks could deliver while those DMACs ran.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.executor import costs, memory, power
from primal_compiler.executor.replay import Replay
from primal_compiler.executor.steady import Steady, steady
from primal_compiler.executor.transfers import attention_legs
from primal_compiler.isa.opcodes import ARG_ENUM_MASK, CONTROLLER, ActFn, Opcode, step_ends

COMPONENT_KEYS = ("rram_adc", "base_dcim", "sram_dcim", "router_dmac", "links", "controller", "wakeup", "static")


def _argmax(rp: Replay, rec: np.ndarray) -> np.ndarray:
    """The pass ends (controller ARGMAXes) among records ``rec``, in their order: the ACT records' rows alone are
    copied out to test (a window of millions of records holds a few)."""
    act = rec[rp.stream.records["op"][rec] == Opcode.ACT]
    return act[step_ends(rp.stream.records[act])]


def _sections(rp: Replay, request: int) -> dict[str, np.ndarray]:
    out = {}
    for kind in ("adapter", "prefill", "decode"):
        try:
            out[kind] = rp.section(f"{kind}:{request}")
        except KeyError:
            out[kind] = np.zeros(0, dtype=np.int64)
    if not len(out["prefill"]) or not len(out["decode"]):
        names = [s.name for s in rp.stream.sections]
        raise KeyError(f"request {request} needs sections prefill:{request} and decode:{request} (stream has {names})")
    return out


def hop_stats(rp: Replay, rec: np.ndarray) -> dict:
    """Hop statistics of the legs of records ``rec`` (see module docstring)."""
    tr = rp.transfers
    leg = np.flatnonzero(np.isin(tr.rec, rec))
    nbytes = rp.stream.records["nbytes"][tr.rec[leg]].astype(np.float64)
    ctl = (tr.src_ct[leg] == CONTROLLER) | (tr.dst_ct[leg] == CONTROLLER)
    same = (tr.src_ct[leg] == tr.dst_ct[leg]) & ~ctl
    out = _summary(tr.routes.mesh_hops[leg][same], nbytes[same])
    mapped = same & ~attention_legs(rp.stream.records, tr.rec[leg])
    out["mapped"] = _summary(tr.routes.mesh_hops[leg][mapped], nbytes[mapped])
    inter = _summary(tr.routes.pkg_hops[leg][~same & ~ctl], nbytes[~same & ~ctl])
    inter["controller_transfers"] = int(ctl.sum())
    out["inter_ct"] = inter
    return out


def _summary(hops: np.ndarray, weight: np.ndarray) -> dict:
    total = float(weight.sum())
    return {"max_hops": int(hops.max()) if len(hops) else 0,
            "mean_hops": float(hops.mean()) if len(hops) else 0.0,
            "weighted_hops": float((hops * weight).sum() / total) if total else 0.0,
            "transfers": int(len(hops)), "bytes": total}


def _window_energy(rp: Replay, rec: np.ndarray, begin: int, end: int) -> tuple[dict, dict, dict]:
    """Joules per component, per power state and (static only) per domain: ``rec`` plus all CTs' static energy (leakage
    and the RRAM periphery's bias) in the window."""
    dyn = {k: float(v[rec].sum()) * 1e-12 for k, v in rp.energy_pj.items()}
    static = power.static_energy_j(rp.timeline, rp.target, rp.topo.pes, begin, end)
    static_by_state = np.sum(list(static.values()), axis=0)  # per state, over domains
    comp = {k: dyn.get(k, 0.0) for k in COMPONENT_KEYS if k != "static"}
    comp["static"] = float(static_by_state.sum())
    states = {s: float(static_by_state[i]) for i, s in enumerate(power.STATES)}
    states["active"] += sum(dyn[k] for k in ("rram_adc", "base_dcim", "sram_dcim", "router_dmac", "links"))
    states["waking"] += dyn["wakeup"]
    states["controller"] = dyn["controller"]
    return comp, states, {k: float(v.sum()) for k, v in static.items()}


def window_energy_j(rp: Replay, rec: np.ndarray, begin: int, end: int) -> float:
    """Joules of records ``rec`` (dynamic) plus every CT's static energy within ``[begin, end)`` cycles."""
    return sum(_window_energy(rp, rec, begin, end)[0].values())


def area_mm2(rp: Replay) -> dict:
    """Silicon area of all CTs by PE component, in mm2."""
    a = rp.target.area
    pes = rp.topo.pes * rp.topo.num_cts
    out = {k: getattr(a, f"{k}_um2") * pes * 1e-6 for k in ("rram", "sram", "router", "dmac", "scratchpad")}
    out["total"] = sum(out.values())
    return out


def step_gaps(rp: Replay, pre_tok: np.ndarray, dec_tok: np.ndarray) -> tuple[np.ndarray, int]:
    """(cycles between consecutive tokens of the same pass, pass by pass, steps per pass).

    A pass is the sequences one ARGMAX decides (its TOKEN buffer): the whole batch, or one sequence
    when codegen pipelines. Each pass's gaps run from its prefill ARGMAX through its decode ARGMAXes.
    """
    r = rp.stream.records
    out, steps = [], 0
    for q in pre_tok:
        mine = dec_tok[r["dst_buf"][dec_tok] == r["dst_buf"][q]]
        if not len(mine):
            raise KeyError(f"pass of record {int(q)} has no decode ARGMAX writing its TOKEN buffer")
        times = np.concatenate([[rp.finish[q]], np.sort(rp.finish[mine])])
        out.append(np.diff(times))
        steps = len(mine)
    return np.concatenate(out).astype(np.float64), steps


def decode_issue_cycles(rp: Replay, rec: np.ndarray) -> int:
    """Dispatch time of records ``rec`` on their busiest sequencer (records there x its issue interval)."""
    c = rp.control
    per = np.bincount(c.seq[rec], minlength=len(c.issue_cycles)) * c.issue_cycles
    return int(per.max()) if len(per) else 0


def prompt_tokens(rp: Replay, prefill: np.ndarray, batch: int) -> int | None:
    """Prompt length of a prefill: its controller EMBED covers prompt x batch x hidden elements."""
    hidden = rp.meta.get("model_ir", {}).get("hidden_size")
    r = rp.stream.records[prefill]
    embed = r[(r["op"] == Opcode.ACT) & ((r["arg"] & ARG_ENUM_MASK[Opcode.ACT]) == ActFn.EMBED) & (r["ct"] == CONTROLLER)]
    if not hidden or not len(embed):
        return None
    return int(embed["count"].astype(np.int64).sum()) // (hidden * batch)


def _span(rp: Replay, request: int) -> tuple[dict[str, np.ndarray], int, int, np.ndarray, np.ndarray, int, int]:
    """(sections, batch, start of the request, prefill and decode ARGMAXes, first-token and last-token cycles)."""
    sec = _sections(rp, request)
    batch = int(rp.meta.get("kv", {}).get("batch", 1))
    t0 = int(rp.start[np.concatenate([sec["adapter"], sec["prefill"]])].min())
    pre_tok, dec_tok = _argmax(rp, sec["prefill"]), _argmax(rp, sec["decode"])
    if not len(pre_tok) or not len(dec_tok):
        raise KeyError(f"request {request}: prefill and decode must each end with a controller ARGMAX")
    return sec, batch, t0, pre_tok, dec_tok, int(rp.finish[pre_tok].max()), int(rp.finish[dec_tok].max())


def phase_window(rp: Replay, phase: str, request: int = 0) -> tuple[np.ndarray, int, int]:
    """(records, first cycle, end cycle) of request ``request``'s ``"decode"`` window (first token to last token,
    its decode records: the window of ``power_w``) or ``"prefill"`` window (its first record to its first
    token: adapter load and prefill records, the window of ``prefill_energy_j``)."""
    sec, _, t0, _, _, begin, end = _span(rp, request)
    if phase == "decode":
        return sec["decode"], begin, end
    if phase == "prefill":
        return np.concatenate([sec["adapter"], sec["prefill"]]), t0, begin
    raise ValueError(f"unknown phase {phase!r}")


def _generation(rp: Replay, span: tuple, steps: int, generate: int | None, where: str, required: bool = True) -> Steady:
    return steady(rp.stream.records, rp.start, rp.finish, span[0]["decode"], steps, generate or steps, where, required)


def decode_steady(rp: Replay, request: int = 0, generate: int | None = None) -> Steady:
    """How request ``request``'s decode covers ``generate`` tokens per sequence (a program's plan: the replayed
    steps alone when they have not settled), as :func:`metrics` covers them."""
    span = _span(rp, request)
    return _generation(rp, span, step_gaps(rp, span[3], span[4])[1], generate, "program", required=False)


def energy_metrics(rp: Replay, request: int = 0, generate: int | None = None) -> dict:
    """The energy and power figures of :func:`metrics` (over ``generate`` tokens per sequence) alone: all that a
    change of energy constants moves (``executor.replay.reprice``)."""
    span = _span(rp, request)
    return _energy(rp, span, _generation(rp, span, step_gaps(rp, span[3], span[4])[1], generate, "program"))


def _merged(parts: tuple[dict, dict, dict], more: tuple[dict, dict, dict], times: int) -> tuple[dict, dict, dict]:
    return tuple({k: v + times * extra.get(k, 0.0) for k, v in part.items()}  # type: ignore[return-value]
                 for part, extra in zip(parts, more))


def _energy(rp: Replay, span: tuple, st: Steady) -> dict:
    sec, batch, t0, _, _, begin, end = span
    comp, states, domains = _window_energy(rp, sec["decode"], begin, end)
    if st.repeated:  # each repeat: a middle step's records and every CT's leakage over its period
        comp, states, domains = _merged((comp, states, domains),
                                        _window_energy(rp, st.step_records, *st.repeat_window(end)), st.repeated)
    window = end - begin + st.repeated * st.period_cycles
    energy, window_s, tokens = sum(comp.values()), rp.seconds(window), batch * st.generated
    pre_comp, _, _ = _window_energy(rp, np.concatenate([sec["adapter"], sec["prefill"]]), t0, begin)
    return {
        "energy_per_token_j": energy / tokens, "tokens_per_j": tokens / energy, "power_w": energy / window_s,
        "energy_per_token_by_component_j": {k: v / tokens for k, v in comp.items()},
        "energy_per_token_by_state_j": {k: v / tokens for k, v in states.items()},
        "power_breakdown_w": {k: v / window_s for k, v in comp.items()},
        "power_by_state_w": {k: v / window_s for k, v in states.items()},
        "static_by_domain_w": {k: v / window_s for k, v in domains.items()},
        "sram_macros": {"powered": int(rp.timeline.sram_on.sum()), "total": rp.topo.num_cts * rp.topo.pes},
        "scratchpads": {"kept_when_gated": int(rp.timeline.scratch_kept.sum()), "total": rp.topo.num_cts * rp.topo.pes},
        "leakage": leakage_summary(rp),
        "prefill_energy_j": sum(pre_comp.values()),
    }


def leakage_summary(rp: Replay) -> dict:
    """At which temperature the leakage counts (``thermal.leakage_temperature``), the dies' steady temperatures
    over the replay (degC) and the leakage's scale over its stated value there (executor/leakage.py)."""
    tl = rp.timeline
    return {"temperature": rp.target.thermal.leakage_temperature,
            "die_c": {"max": float(tl.die_c.max()), "mean": float(tl.die_c.mean())},
            "scale": {"max": float(tl.leak_scale.max()), "mean": float(tl.leak_scale.mean())}}


def metrics(rp: Replay, request: int = 0, generate: int | None = None, where: str = "program",
            required: bool = True) -> dict:
    """Every metric of request ``request`` as one JSON-ready dict (seconds, joules, watts), over a generation of
    ``generate`` tokens per sequence (default: the replayed decode steps; more repeat the last replayed
    step once it is periodic, :mod:`.steady`; InputError naming ``where`` if it is not, unless the generation
    is a program's plan and not ``required``: the replayed steps alone, ``generation`` saying why)."""
    span = _span(rp, request)
    sec, batch, t0, pre_tok, dec_tok, first_token, end = span
    kv = rp.meta.get("kv", {})
    gaps, steps = step_gaps(rp, pre_tok, dec_tok)
    st = _generation(rp, span, steps, generate, where, required)
    first_gaps = gaps[:: max(1, steps)]
    if st.repeated:  # every pass's gaps go on with one period per repeated step
        gaps = np.hstack([gaps.reshape(-1, steps), np.full((len(pre_tok), st.repeated), float(st.period_cycles))]).ravel()
    itl_cycles = float(gaps.mean())
    window_s = rp.seconds(end - first_token + st.repeated * st.period_cycles)
    tokens = batch * st.generated
    stored, capacity = costs.kv_storage(rp.ctx, sec["decode"])
    hops = hop_stats(rp, sec["decode"])
    prefill_begin = int(rp.start[sec["prefill"]].min())
    return {
        "request": request, "batch": batch, "context": int(kv.get("context", 0)), "decode_steps": st.generated,
        "generation": {"tokens": st.generated, "replayed_steps": st.replayed, "repeated_steps": st.repeated,
                       "period_s": rp.seconds(st.period_cycles), "planned": st.planned or st.generated,
                       "unsettled": st.unsettled or None},
        "prompt_tokens": prompt_tokens(rp, sec["prefill"], batch),
        "ttft_s": rp.seconds(first_token - t0), "itl_s": rp.seconds(itl_cycles),
        "itl_p50_s": rp.seconds(float(np.percentile(gaps, 50))), "itl_p99_s": rp.seconds(float(np.percentile(gaps, 99))),
        "itl_first_step_s": rp.seconds(float(first_gaps.mean())), "passes": int(len(pre_tok)),
        "tokens_per_s": tokens / window_s, **_energy(rp, span, st),
        "reconfig_exposed_s": rp.seconds(max(0, prefill_begin - t0)),
        "decode_issue_s": rp.seconds(decode_issue_cycles(rp, sec["decode"]) / steps),
        "control": rp.control.mode, "program_load_s": rp.seconds(rp.control.load_cycles),
        "max_hops": hops["max_hops"], "mean_hops": hops["mean_hops"], "weighted_hops": hops["weighted_hops"],
        "hops": hops,
        "kv_storage_utilisation": stored / capacity if capacity else 0.0,
        "memory": memory.summary(rp.memory, rp.stream.records) if rp.memory is not None else None,
        "area_mm2": area_mm2(rp), "num_cts": rp.topo.num_cts,
        "records": {"total": len(rp.stream.records), "decode": int(len(sec["decode"])),
                    "prefill": int(len(sec["prefill"])), "adapter": int(len(sec["adapter"]))},
        "replay_s": {name: round(sec_, 3) for name, sec_ in rp.stages},
    }
