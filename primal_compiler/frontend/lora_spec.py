"""Parse ``--lora`` specs and attach adapters to a model.

Grammar: ``TARGETS:RANK[:ALPHA]`` with TARGETS a comma list of roles
(``q,v``), PEFT module names (``q_proj``, ``c_attn``...) or groups
(``attn``, ``mlp``, ``all``). ALPHA defaults to RANK (scale 1.0).
Several specs may be joined with ``;`` to give targets different ranks.
RANK is an integer in ``1..MAX_RANK`` and ALPHA a finite number in
``(0, MAX_ALPHA]``; anything else is an :class:`InputError` naming ``--lora``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from primal_compiler.errors import InputError
from primal_compiler.ir.model import ATTENTION_ROLES, MLP_ROLES, LoRA, Model, Role

N = TypeVar("N", int, float)

ALIASES: dict[str, tuple[Role, ...]] = {
    "q_proj": (Role.Q,), "k_proj": (Role.K,), "v_proj": (Role.V,), "o_proj": (Role.O,),
    "out_proj": (Role.O,), "dense": (Role.O,), "c_attn": (Role.QKV,), "c_proj": (Role.O,),
    "gate_proj": (Role.GATE,), "up_proj": (Role.UP,), "down_proj": (Role.DOWN,),
    "c_fc": (Role.FC1,), "fc_in": (Role.FC1,), "fc_out": (Role.FC2,),
    "query_key_value": (Role.QKV,), "dense_h_to_4h": (Role.FC1,), "dense_4h_to_h": (Role.FC2,),
    "attn": ATTENTION_ROLES, "mlp": MLP_ROLES, "all": ATTENTION_ROLES + MLP_ROLES,
}
LAYER_ROLES = ATTENTION_ROLES + MLP_ROLES

#: LoRA's update B @ A has rank at most min(in, out) of its projection, so a rank above the widest hidden
#: size of current LLMs (16,384: Llama-3.1-405B) adds nothing a full update would not, and only
#: multiplies the SRAM tiles to lower.
MAX_RANK = 16_384
#: alpha only scales the update (by alpha / rank); published adapters use at most a few times the rank.
#: The bound keeps alpha / rank within FP16 (65,504 at most) for every rank.
MAX_ALPHA = 65_504.0


@dataclass(frozen=True)
class LoraRequest:
    """One named target of a spec: the roles it expands to and the adapter to attach."""

    name: str
    roles: tuple[Role, ...]
    lora: LoRA

    @property
    def is_group(self) -> bool:
        return len(self.roles) > 1


def parse_lora_spec(spec: str) -> tuple[LoraRequest, ...]:
    """The requests of a spec string; any malformed part is an :class:`InputError`."""
    requests: list[LoraRequest] = []
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            raise InputError("--lora", f"empty part in {_shown(spec)}")
        fields = part.split(":")
        if len(fields) not in (2, 3):
            raise InputError("--lora", f"{_shown(part)} is not TARGETS:RANK[:ALPHA] (e.g. q,v:8 or q,k,v,o:16:32)")
        rank = _number(fields[1], int, part, "rank")
        if not 1 <= rank <= MAX_RANK:
            shown = _shown(fields[1].strip())
            raise InputError("--lora", f"{_shown(part)}: rank must be >= 1 and <= {MAX_RANK}, got {shown}")
        alpha = _number(fields[2], float, part, "alpha") if len(fields) == 3 else float(rank)
        if not 0 < alpha <= MAX_ALPHA:  # also refuses NaN and infinities
            raise InputError("--lora", f"{_shown(part)}: need alpha > 0 and alpha <= {MAX_ALPHA:g}, got {alpha:g}")
        for name in (t.strip().lower() for t in fields[0].split(",")):
            requests.append(LoraRequest(name, _roles(name, part), LoRA(rank, alpha)))
    return tuple(requests)


def _number(text: str, kind: Callable[[str], N], part: str, what: str) -> N:
    try:
        return kind(text.strip())
    except ValueError:  # also a number of more digits than int() converts
        raise InputError("--lora", f"{_shown(part)}: {what} {_shown(text)} is not a number") from None


def _shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for a one-line message, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _roles(name: str, part: str) -> tuple[Role, ...]:
    if name in ALIASES:
        return ALIASES[name]
    try:
        role = Role(name)
    except ValueError:
        role = None
    if role is None or role not in LAYER_ROLES:
        known = ", ".join([r.value for r in LAYER_ROLES] + sorted(ALIASES))
        raise InputError("--lora", f"{_shown(part)}: unknown target {_shown(name)}; known: {known}")
    return (role,)


def attach_lora(model: Model, spec: str) -> Model:
    """Model with the adapters of ``spec`` on every layer's matching projections.

    A group (attn, mlp, all) attaches to whichever of its roles the model has;
    a single named role the model lacks is an :class:`InputError`.
    """
    present = {lin.role for layer in model.layers for lin in layer.linears}
    adapters: dict[Role, LoRA] = {}
    for req in parse_lora_spec(spec):
        found = [r for r in req.roles if r in present]
        if not found:
            have = ", ".join(sorted(r.value for r in present))
            raise InputError("--lora", f"model {model.name} has no {req.name} projection (it has {have})")
        adapters.update({r: req.lora for r in found})
    layers = tuple(
        replace(layer, linears=tuple(replace(lin, lora=adapters.get(lin.role, lin.lora)) for lin in layer.linears))
        for layer in model.layers
    )
    return replace(model, layers=layers)


def set_lora(model: Model, loras: dict[Role, LoRA]) -> Model:
    """Model whose projections carry exactly ``loras`` (by role, on every layer): any other LoRA is removed."""
    layers = tuple(
        replace(layer, linears=tuple(replace(lin, lora=loras.get(lin.role)) for lin in layer.linears))
        for layer in model.layers
    )
    return replace(model, layers=layers)


def lora_of(model: Model) -> dict[Role, LoRA]:
    """The LoRA per role of a model whose layers all carry the same adapters (as ``--lora`` attaches them)."""
    found = {lin.role: lin.lora for layer in model.layers for lin in layer.linears if lin.lora is not None}
    return {role: found[role] for role in LAYER_ROLES if role in found}


def lora_text(loras: dict[Role, LoRA]) -> str:
    """The ``--lora`` spec that attaches ``loras``: roles of equal rank and alpha share a part, in role order."""
    parts: dict[LoRA, list[str]] = {}
    for role in LAYER_ROLES:
        if role in loras:
            parts.setdefault(loras[role], []).append(role.value)
    return ";".join(f"{','.join(roles)}:{lora.rank}:{_alpha_text(lora.alpha)}" for lora, roles in parts.items())


def _alpha_text(alpha: float) -> str:
    """``alpha`` as the shortest text that parses back to the same float."""
    return str(int(alpha)) if float(alpha).is_integer() else repr(float(alpha))
