"""The cost report of a replayed program, as a table and as one JSON object."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from primal_compiler.baselines.family import render_family
from primal_compiler.errors import InputError
from primal_compiler.executor.critical import CLASS_KEYS, LABELS
from primal_compiler.report.text import human_bytes, human_time, table


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def render_critical_path(cp: dict) -> list[str]:
    """The "where the time goes" table of ``metrics["critical_path"]``: each class with time on either path."""
    t, i = cp["ttft"], cp["itl"]

    def cell(part: dict, key: str) -> str:
        v = part["by_class_s"][key]
        return f"{human_time(v)} {100 * v / part['total_s'] if part['total_s'] else 0:5.1f}%"

    rows = [(LABELS[key], cell(t, key), cell(i, key)) for key in CLASS_KEYS
            if t["by_class_s"][key] or i["by_class_s"][key]]
    rows += [("total", human_time(t["total_s"]), human_time(i["total_s"])),
             ("bound by", LABELS[t["bound_by"]], LABELS[i["bound_by"]])]
    lines = table(rows, ("where the time goes (critical path)", "TTFT", "ITL (per step)"))
    lines.append(f"({t['records']:,} records on the TTFT path, {i['records']:,} on the ITL path over "
                 f"{i['steps']} decode step{'s' if i['steps'] != 1 else ''}; docs/executor.md, Critical path)")
    return lines


def render_memory(mem: dict) -> list[str]:
    """The scratchpad line, and a warning naming the worst PE when buffers do not fit."""
    cap = mem["capacity_bytes"]
    line = (f"scratchpad: peak {human_bytes(mem['peak_bytes'])} per PE of {human_bytes(cap)} (prefill "
            f"{human_bytes(mem['peak_prefill_bytes'])}, decode {human_bytes(mem['peak_decode_bytes'])}, KV up to "
            f"{human_bytes(mem['kv_bytes_max'])}; the compiler allocates up to {human_bytes(mem['allocated_bytes'])})")
    if mem["fits"]:
        return [line + "; every buffer fits"]
    w = mem["worst"]
    largest = ", ".join(f"{b['buffer']} {human_bytes(b['bytes'])} ({b['op']} record {b['record']})" for b in w["largest"])
    return [line + f"; {mem['pes_over_capacity']:,} PEs over capacity",
            f"  WARNING: these figures assume scratchpads that hold these buffers; worst CT {w['ct']} PE {w['pe']} "
            f"{human_bytes(w['bytes'])}: {largest} (--memory strict refuses; docs/executor.md, Memory)"]


def render_run(report: dict) -> str:
    """Human-readable table of :func:`primal_compiler.api.run_program`'s report."""
    m, g = report["metrics"], report.get("h100")
    gpu_note = g.get("error") if g else "no model description in the program"
    g = None if not g or "error" in g else g
    lines = [f"PRIMAL run: {report['model']} on {report['target']} ({m['num_cts']} CTs), batch {m['batch']}, "
             f"context {m['context']}, {m['records']['total']:,} records "
             f"(adapter {m['records']['adapter']:,}, prefill {m['records']['prefill']:,}, decode {m['records']['decode']:,})"]
    if m.get("memory"):  # first: whether the machine holds the program decides what every figure below is worth
        lines += render_memory(m["memory"])
    lines.append("")
    rows = [
        ("TTFT", human_time(m["ttft_s"]), g and human_time(g["ttft_s"]), g and _ratio(g["ttft_s"], m["ttft_s"])),
        ("ITL", human_time(m["itl_s"]), g and human_time(g["itl_s"]), g and _ratio(g["itl_s"], m["itl_s"])),
        ("throughput (tokens/s)", f"{m['tokens_per_s']:.1f}", g and f"{g['tokens_per_s']:.1f}",
         g and _ratio(m["tokens_per_s"], g["tokens_per_s"])),
        ("energy per token", f"{m['energy_per_token_j'] * 1e3:.3f} mJ", g and f"{g['energy_per_token_j'] * 1e3:.1f} mJ",
         g and _ratio(g["energy_per_token_j"], m["energy_per_token_j"])),
        ("tokens/J", f"{m['tokens_per_j']:.2f}", g and f"{g['tokens_per_j']:.3f}",
         g and _ratio(m["tokens_per_j"], g["tokens_per_j"])),
        ("power (decode)", f"{m['power_w']:.2f} W", g and f"{g['power_w']:.0f} W", g and ""),
    ]
    lines += table([row if g else row[:2] for row in rows], ("metric", "PRIMAL", "H100", "advantage") if g
                   else ("metric", "PRIMAL"))
    if g:
        lines.append("(advantage: how many times better PRIMAL is; below 1 the H100 is better. H100: the seed's "
                     "comparison point, an FP16 roofline at MBU 0.6 (baselines/h100.py); the family below prices engines and precisions)")
    else:
        lines.append(f"(no H100 baseline: {gpu_note})")
    family = render_family(report.get("baselines"), m, report.get("h100"))
    if family:
        lines += [""] + family
    h, x, p = m["hops"], m["hops"]["inter_ct"], m["hops"]["mapped"]
    lines += ["", f"hops, decode step (on-CT legs): max {h['max_hops']}, mean {h['mean_hops']:.2f}, "
                  f"traffic-weighted {h['weighted_hops']:.2f} over {h['transfers']:,} legs",
              f"  of which mapped (matrix, LoRA, residual): max {p['max_hops']}, mean {p['mean_hops']:.2f}, "
              f"traffic-weighted {p['weighted_hops']:.2f} over {p['transfers']:,} legs; the rest follow kv-ring",
              f"hops, die-to-die legs (package mesh): max {x['max_hops']}, mean {x['mean_hops']:.2f}, "
              f"traffic-weighted {x['weighted_hops']:.2f} over {x['transfers']:,} legs"]
    if "validation" in report:
        v = report["validation"]
        lines.append(f"hop validation: {v['mapped_legs']:,} mapped legs, {v['d2d_legs']:,} die-to-die legs and "
                     f"{v['kv_legs']:,} KV/attention legs match the mapping and the kv-ring layout")
    total = m["power_w"]
    lines.append("")
    lines.append("power by component: " + ", ".join(
        f"{k} {v:.3f} W ({100 * v / total:.1f}%)" for k, v in m["power_breakdown_w"].items()))
    lines.append("power by state:     " + ", ".join(f"{k} {v:.3f} W" for k, v in m["power_by_state_w"].items()))
    lk = m["leakage"]
    at = (f"at the dies' steady temperature, {lk['die_c']['mean']:.1f} degC mean, {lk['die_c']['max']:.1f} max: "
          f"x{lk['scale']['mean']:.2f} the stated leakage" if lk["temperature"] == "die"
          else f"as stated, at {lk['die_c']['max']:.2f} degC (thermal.leakage_temperature = reference)")
    lines.append(f"leakage {at}")
    bound = "instruction issue" if m["decode_issue_s"] >= 0.9 * m["itl_s"] else "the mesh and the macros"
    g = m["generation"]
    repeats = (f" ({g['replayed_steps']} replayed, {g['repeated_steps']} repeating the periodic last one)"
               if g["repeated_steps"] else "")
    if g["unsettled"]:
        repeats = (f" of {g['planned']} planned: the decode has not settled in them ({g['unsettled']}), so the "
                   f"figures cover these; replay more with --replay-steps")
    lines.append(f"decode: {m['decode_steps']} step(s){repeats}, {m['passes']} pass(es) per step ({m['control']} control); ITL per "
                 f"sequence p50 {human_time(m['itl_p50_s'])}, p99 {human_time(m['itl_p99_s'])}, first step "
                 f"{human_time(m['itl_first_step_s'])}; {human_time(m['decode_issue_s'])} on the busiest sequencer "
                 f"to issue a step: bound by {bound}; program load {human_time(m['program_load_s'])} (once)")
    lines.append(f"prefill energy {m['prefill_energy_j']:.3f} J; exposed LoRA reconfiguration {human_time(m['reconfig_exposed_s'])}; "
                 f"KV storage-bandwidth utilisation {100 * m['kv_storage_utilisation']:.1f}%")
    a = m["area_mm2"]
    lines.append("area: " + ", ".join(f"{k} {v:,.0f} mm2" for k, v in a.items() if k != "total")
                 + f"; total {a['total']:,.0f} mm2")
    if "critical_path" in m:
        lines += [""] + render_critical_path(m["critical_path"]) + [""]
    if "replay_s" in m:  # wall time of this replay: absent where the text must be reproducible (viz's page)
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in m["replay_s"].items())
        lines.append(f"replay: {sum(m['replay_s'].values()):.1f} s ({stages})")
    return "\n".join(lines)


def without_wall_times(metrics: dict) -> dict:
    """``metrics`` less the replay's wall times (``replay_s``): what a reproducible output (a saved report, the
    HTML page) keeps."""
    return {k: v for k, v in metrics.items() if k != "replay_s"}


def saved_report(report: dict) -> tuple[str, str]:
    """(``report.json``, ``report.txt``) of a run as ``primal run -o OUT`` keeps them: the report without the
    replay's wall times (``metrics.replay_s``), so the same program and target write the same bytes."""
    kept = {**report, "metrics": without_wall_times(report["metrics"])}
    return json.dumps(kept, indent=2, sort_keys=True) + "\n", render_run(kept) + "\n"


def read_saved(program_file: Path) -> dict | None:
    """The run report saved beside ``program_file`` (``OUT/report.json``, written by ``primal run MODEL -o
    OUT``), or None when there is none. An InputError naming it when it is unreadable or was made from another
    program (its ``program_sha256`` is not the one ``program_file`` carries); one without ``program_sha256``
    (saved before reports named their program) is set aside, said in one line, since it cannot be checked."""
    from primal_compiler.inputs import TEXT_LIMIT_BYTES, read_text
    from primal_compiler.isa.container import plain_json, program_sha256

    path = program_file.parent / "report.json"
    if program_file.name != "program.primal" or not path.exists():
        return None
    try:
        saved = plain_json(read_text(path, TEXT_LIMIT_BYTES))
    except (ValueError, RecursionError) as exc:
        raise InputError(str(path), f"not a run report: {type(exc).__name__}: {exc}") from None
    if not isinstance(saved, dict) or saved.get("format") != "primal-run":
        raise InputError(str(path), "not a run report (no \"format\": \"primal-run\")")
    if "program_sha256" not in saved:
        print(f"{path}: names no program (saved by an older version), set aside", file=sys.stderr)
        return None
    mine = program_sha256(program_file)
    if saved["program_sha256"] != mine:
        raise InputError(str(path), f"made from another program (sha256 {str(saved['program_sha256'])[:16]}...), "
                                    f"not {program_file.name} ({mine[:16]}...); remove it or rerun `primal run`")
    return saved
