"""``primal inspect``: the recognised model, its parameters and what it needs of a target."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import TYPE_CHECKING

from primal_compiler.errors import InputError
from primal_compiler.ir.program import Program

if TYPE_CHECKING:
    from primal_compiler.target.spec import PrimalTarget
    import numpy as np

    from primal_compiler.frontend.weights import ProjectionWeights


def inspect_model(model, target: PrimalTarget, program: Program | None = None) -> dict:
    """JSON-ready description; lowers and blocks the model (fast) when no program is given."""
    if program is None or program.layout is None:
        from primal_compiler.api import compile_model

        program = compile_model(model, target, "lower-tiles,blocking")
    model = program.model
    attn = model.attention
    t, layout = program.need_tiles(), program.need_layout()
    p = model.precision
    return {
        "name": model.name, "source": model.source, "num_layers": model.num_layers,
        "hidden_size": model.hidden_size, "num_heads": attn.num_heads, "num_kv_heads": attn.num_kv_heads,
        "head_dim": attn.head_dim, "intermediate_size": model.intermediate_size, "vocab_size": model.vocab_size,
        "norm": model.norm.value, "activation": model.layers[0].activation.value,
        "positional": model.positional.value, "rope_theta": model.rope_theta,
        "rope_frequencies": ("geometric in rope_theta" if not model.rope_inv_freq else "read from the graph"
                             if model.source != "builtin" else "scaled as its rope_scaling says"),
        "rope_dim": model.rope_dim or attn.head_dim,
        "rope_pairs": "adjacent (rotate_every_two)" if model.rope_interleaved else "halves (rotate_half)",
        "alibi_slopes": list(model.alibi_slopes), "embed_norm": model.embed_norm,
        "rope_attention_scale": model.rope_attention_scale,
        "nope_layers": [layer.index for layer in model.layers if not layer.rope],
        "sandwich_layers": [layer.index for layer in model.layers if layer.post_norms],
        "windows": {layer.index: layer.window for layer in model.layers if layer.window},
        "qk_norm_layers": [layer.index for layer in model.layers if layer.qk_norm],
        "static_activations": model.static_activations,
        "norm_weights": model.norm_weights,
        "embed_scale": model.embed_scale, "tie_word_embeddings": model.tie_word_embeddings,
        "logit_scale": model.logit_scale, "logit_softcap": model.logit_softcap,
        "attention_scale": model.attention_scale, "attn_softcap": model.attn_softcap,
        "residual_multiplier": model.residual_multiplier, "qkv_clip": model.qkv_clip,
        "base_params": model.base_params, "lora_params": model.lora_params,
        "lora_targets": [r.value for r in model.lora_targets],
        "dora": any(lin.lora.dora for layer in model.layers for lin in layer.linears if lin.lora),
        "precision": {f.name: getattr(p, f.name) for f in fields(p)},
        "weight_quant": [{**asdict(q), "dynamic_inputs": q.dynamic_inputs, "description": q.describe()}
                         for q in model.weight_quant],
        "layers": [
            {"index": layer.index, "matrices": [
                {"role": lin.role.value, "shape": [lin.in_features, lin.out_features], "bias": lin.bias,
                 "lora_rank": lin.lora.rank if lin.lora else 0, "lora_alpha": lin.lora.alpha if lin.lora else 0.0}
                for lin in layer.linears]}
            for layer in model.layers
        ],
        "needs": {
            "target": target.name, "rram_macros": int((t.macro == 0).sum()), "sram_macros": int((t.macro == 1).sum()),
            "cts": layout.num_cts, "pes_per_ct": layout.rows * layout.cols,
            "cts_per_layer": int((layout.ct_layer == 0).sum()),
            "lm_head_cts": int((layout.ct_layer == model.num_layers).sum()),
            "pe_utilisation": float((t.seq >= 0).sum() / (layout.num_cts * layout.rows * layout.cols)),
            "weight_bytes": int(t.bytes.sum()),
        },
    }


#: Side of the blocks :func:`adapter_info` counts; fixed, so the count does not depend on a target.
BLOCK = 32
BLOCKS_COUNTED = (f"{BLOCK}x{BLOCK} blocks of each factor in the layout the SRAM tiles hold (A as in x r, "
                  f"B transposed to out x r), from row and rank 0; edge blocks may be smaller")


def adapter_info(directory: str, model) -> dict:
    """JSON-ready description of the PEFT adapter in ``directory`` for ``model`` (which it must fit).

    Per target role: rank, alpha, layers and the stored tensor shapes (PEFT layout: lora_A ``r x in``,
    lora_B ``out x r``), dtype and bytes (DoRA's magnitudes included), whether DoRA; in total the stored bytes of the LoRA tensors and how many
    :data:`BLOCK`-square blocks (see :data:`BLOCKS_COUNTED`) are all zero, read from the weights.
    """
    from primal_compiler.frontend.peft import load_peft_adapter, read_adapter

    adapter = read_adapter(directory, model)
    weights = load_peft_adapter(directory)
    targets, zero, blocks = [], 0, 0
    for role, lora in adapter.loras.items():
        shaped = {k: p for k, p in adapter.shapes.lora.items() if k[1] == role}
        factors = [_factors(p) for p in shaped.values()]
        first_a, first_b = factors[0]
        targets.append({
            "role": role.value, "modules": sorted({p.module.rsplit(".", 1)[-1] for p in shaped.values()}),
            "rank": lora.rank, "alpha": lora.alpha, "layers": len(shaped),
            "lora_A": list(first_a.T.shape), "lora_B": list(first_b.T.shape), "dtype": str(first_a.dtype),
            "bytes": sum(int(a.nbytes + b.nbytes) for a, b in factors)
            + sum(int(p.magnitude.nbytes) for p in shaped.values() if p.magnitude is not None),  # DoRA's m
            "dora": lora.dora,
        })
    for a, b in map(_factors, weights.lora.values()):
        for factor in (a, b.T):
            z, n = _zero_blocks(factor)
            zero, blocks = zero + z, blocks + n
    return {
        "directory": str(directory), "config": adapter.config, "weights": adapter.shapes.source,
        "lora": adapter.spec, "targets": targets, "bytes": sum(t["bytes"] for t in targets),
        "blocks": blocks, "zero_blocks": zero, "blocks_counted": BLOCKS_COUNTED,
    }


def _factors(p: ProjectionWeights) -> tuple[np.ndarray, np.ndarray]:
    """The (A, B) factors of a projection of ``ModelWeights.lora`` (a PEFT adapter's pairs carry both)."""
    if p.a is None or p.b is None:
        raise InputError(p.module or "adapter", "a LoRA projection without both factors")
    return p.a, p.b


def _zero_blocks(factor) -> tuple[int, int]:
    """(all-zero blocks, blocks) of a ``features x r`` factor cut into :data:`BLOCK`-square blocks."""
    import numpy as np

    rows, cols = -(-factor.shape[0] // BLOCK), -(-factor.shape[1] // BLOCK)
    padded = np.zeros((rows * BLOCK, cols * BLOCK), bool)
    padded[: factor.shape[0], : factor.shape[1]] = factor != 0  # NaN counts as nonzero (the adapter has none)
    nonzero = padded.reshape(rows, BLOCK, cols, BLOCK).any(axis=(1, 3))
    return int((~nonzero).sum()), rows * cols


def render_adapter(info: dict) -> str:
    """The lines of :func:`adapter_info`'s description."""
    dora = " (DoRA: magnitudes included)" if any(t["dora"] for t in info["targets"]) else ""
    lines = [f"adapter {info['directory']}: --lora {info['lora']}, {info['bytes']:,} bytes of LoRA tensors{dora}"]
    lines += [f"  {t['role']} ({','.join(t['modules'])}): rank {t['rank']}, alpha {t['alpha']:g}, {t['layers']} "
              f"layers, lora_A {t['lora_A'][0]}x{t['lora_A'][1]}, lora_B {t['lora_B'][0]}x{t['lora_B'][1]} "
              f"{t['dtype']}, {t['bytes']:,} bytes" for t in info["targets"]]
    lines.append(f"  all-zero blocks: {info['zero_blocks']:,} of {info['blocks']:,} ({info['blocks_counted']})")
    return "\n".join(lines)


def render_inspect(info: dict) -> str:
    n = info["needs"]
    first = info["layers"][0]["matrices"]
    mats = ", ".join(
        f"{m['role']} {m['shape'][0]}x{m['shape'][1]}" + (f" +LoRA r{m['lora_rank']}" if m["lora_rank"] else "")
        for m in first
    )
    p = info["precision"]
    return "\n".join([
        f"model {info['name']} ({info['source']}): {info['num_layers']} layers, hidden {info['hidden_size']}, "
        f"heads {info['num_heads']} (kv {info['num_kv_heads']}, dim {info['head_dim']}), "
        f"ffn {info['intermediate_size']}, vocab {info['vocab_size']}",
        f"  layer matrices: {mats}",
        f"  {info['norm']} norm, {info['activation']} MLP, {info['positional']} positions"
        + (f" (theta {info['rope_theta']:g}, frequencies {info['rope_frequencies']}"
           + (f", the first {info['rope_dim']} of {info['head_dim']} dimensions" if info["rope_dim"] < info["head_dim"]
              else "") + (", adjacent pairs" if info["rope_pairs"].startswith("adjacent") else "")
           + (f", tables scaled by {info['rope_attention_scale']:g}" if info["rope_attention_scale"] != 1.0 else "")
           + (f"; layers {', '.join(map(str, info['nope_layers']))} positionless (NoPE)" if info["nope_layers"] else "")
           + ")"
           if info["positional"] == "rope" else "")
        + (f" (slopes {info['alibi_slopes'][0]:g} .. {info['alibi_slopes'][-1]:g})" if info["alibi_slopes"] else "")
        + (f", embeddings scaled by {info['embed_scale']:g}" if info["embed_scale"] != 1.0 else "")
        + (f", embeddings normed by a {info['norm']}" if info["embed_norm"] else "")
        + (", sandwich norms (branches normed before their residual adds)" if info["sandwich_layers"] else "")
        + (", query and key heads RMS-normalised" if info["qk_norm_layers"] else "")
        + ("" if info["norm_weights"] else ", norms without learned parameters (one shared constant of ones)")
        + (f", sliding-window attention ({len(info['windows'])} of {info['num_layers']} layers see the last "
           f"{max(info['windows'].values())} keys)" if info["windows"] else "")
        + (f", logits scaled by {info['logit_scale']:g}" if info["logit_scale"] != 1.0 else "")
        + (f", logits soft-capped at {info['logit_softcap']:g}" if info["logit_softcap"] else "")
        + (f", attention scores scaled by {info['attention_scale']:g}" if info["attention_scale"] else "")
        + (f", attention scores soft-capped at {info['attn_softcap']:g}" if info["attn_softcap"] else "")
        + (f", residual branches multiplied by {info['residual_multiplier']:g}"
           if info["residual_multiplier"] != 1.0 else "")
        + (f", q/k/v clamped to +-{info['qkv_clip']:g}" if info["qkv_clip"] else ""),
        f"  parameters: base {info['base_params']:,}  {'DoRA' if info['dora'] else 'LoRA'} {info['lora_params']:,} "
        f"on {','.join(info['lora_targets']) or 'none'}" + (" (magnitudes included)" if info["dora"] else ""),
        f"  precision: base {p['base_weight_bits']}b, LoRA {p['lora_weight_bits']}b, "
        f"embeddings {p['embed_bits']}b, LM head {p['lm_head_bits']}b, activations {p['activation_bits']}b",
    ] + [f"  file quantization: {q['description']}" for q in info["weight_quant"]] + ([
        f"  file quantization: {info['static_activations']} activation tensors rounded to int8 at calibrated scales "
        "(static QDQ), kept in float by the replay"] if info["static_activations"] else []) + [
        f"  on {n['target']}: {n['rram_macros']:,} RRAM macros, {n['sram_macros']:,} SRAM macros, "
        f"{n['cts']} CTs ({n['cts_per_layer']} per layer + {n['lm_head_cts']} for the LM head), "
        f"PE utilisation {100 * n['pe_utilisation']:.1f}%",
    ] + [render_adapter(a) for a in info.get("adapters", [info["adapter"]] if "adapter" in info else [])])


def render_passes() -> str:
    import primal_compiler.transforms  # noqa: F401
    from primal_compiler.passmgr import REGISTRY, option_lines

    lines = []
    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        lines.append(f"{name}: {cls.summary}")
        req = ", ".join(sorted(cls.requires)) or "-"
        prov = ", ".join(sorted(cls.provides)) or "-"
        inv = ", ".join(sorted(cls.invalidates)) or "-"
        lines.append(f"    requires: {req}; provides: {prov}; invalidates: {inv}")
        lines += [f"    {line}" for line in option_lines(cls)]
    return "\n".join(lines)
