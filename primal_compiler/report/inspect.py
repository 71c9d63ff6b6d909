"""``primal inspect``: the recognised model, its parameters and what it needs of a target."""

from __future__ import annotations

from dataclasses import fields

from primal_compiler.ir.program import Program


def inspect_model(model, target, program: Program | None = None) -> dict:
    """JSON-ready description; lowers and blocks the model (fast) when no program is given."""
    if program is None or program.layout is None:
        from primal_compiler.api import compile_model

        program = compile_model(model, target, "lower-tiles,blocking")
    model = program.model
    attn = model.attention
    t = program.tiles
    p = model.precision
    return {
        "name": model.name, "source": model.source, "num_layers": model.num_layers,
        "hidden_size": model.hidden_size, "num_heads": attn.num_heads, "num_kv_heads": attn.num_kv_heads,
        "head_dim": attn.head_dim, "intermediate_size": model.intermediate_size, "vocab_size": model.vocab_size,
        "norm": model.norm.value, "activation": model.layers[0].activation.value,
        "positional": model.positional.value, "rope_theta": model.rope_theta,
        "rope_frequencies": "read from the graph" if model.rope_inv_freq else "geometric in rope_theta",
        "embed_scale": model.embed_scale, "tie_word_embeddings": model.tie_word_embeddings,
        "base_params": model.base_params, "lora_params": model.lora_params,
        "lora_targets": [r.value for r in model.lora_targets],
        "precision": {f.name: getattr(p, f.name) for f in fields(p)},
        "layers": [
            {"index": layer.index, "matrices": [
                {"role": lin.role.value, "shape": [lin.in_features, lin.out_features], "bias": lin.bias,
                 "lora_rank": lin.lora.rank if lin.lora else 0, "lora_alpha": lin.lora.alpha if lin.lora else 0.0}
                for lin in layer.linears]}
            for layer in model.layers
        ],
        "needs": {
            "target": target.name, "rram_macros": int((t.macro == 0).sum()), "sram_macros": int((t.macro == 1).sum()),
            "cts": program.layout.num_cts, "pes_per_ct": program.layout.rows * program.layout.cols,
            "cts_per_layer": int((program.layout.ct_layer == 0).sum()),
            "lm_head_cts": int((program.layout.ct_layer == model.num_layers).sum()),
            "pe_utilisation": float((t.seq >= 0).sum() / (program.layout.num_cts * program.layout.rows * program.layout.cols)),
            "weight_bytes": int(t.bytes.sum()),
        },
    }


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
        + (f" (theta {info['rope_theta']:g}, frequencies {info['rope_frequencies']})"
           if info["positional"] == "rope" else "")
        + (f", embeddings scaled by {info['embed_scale']:g}" if info["embed_scale"] != 1.0 else ""),
        f"  parameters: base {info['base_params']:,}  LoRA {info['lora_params']:,} "
        f"on {','.join(info['lora_targets']) or 'none'}",
        f"  precision: base {p['base_weight_bits']}b, LoRA {p['lora_weight_bits']}b, "
        f"embeddings {p['embed_bits']}b, LM head {p['lm_head_bits']}b, activations {p['activation_bits']}b",
        f"  on {n['target']}: {n['rram_macros']:,} RRAM macros, {n['sram_macros']:,} SRAM macros, "
        f"{n['cts']} CTs ({n['cts_per_layer']} per layer + {n['lm_head_cts']} for the LM head), "
        f"PE utilisation {100 * n['pe_utilisation']:.1f}%",
    ])


def render_passes() -> str:
    import primal_compiler.transforms  # noqa: F401
    from primal_compiler.passmgr import REGISTRY, option_lines

    lines = []
    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        lines.append(f"{name}: {cls.summary}")
        req = ", ".join(sorted(cls.requires)) or "-"
        prov = ", ".join(sorted(cls.provides)) or "-"
        lines.append(f"    requires: {req}; provides: {prov}")
        lines += [f"    {line}" for line in option_lines(cls)]
    return "\n".join(lines)
