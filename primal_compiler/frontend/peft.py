"""PEFT LoRA adapter directories: ``adapter_config.json`` + ``adapter_model.safetensors``, read as LoRA factors.

:func:`load_peft_adapter` reads the factors with the ``safetensors`` numpy
API. Module names map to roles through ``lora_spec.ALIASES`` (GPT-2's
``mlp.c_proj`` is fc2, ``attn.c_proj`` o). PEFT stores ``lora_A.weight`` as
``r x in`` and ``lora_B.weight`` as ``out x r`` for Linear and GPT-2 Conv1D
layers alike; both are transposed here into the IR's ``in x r`` and ``r x out``.

Everything is checked before it is used, each problem a one-line
:class:`InputError` naming the file: both files must be regular files
(``inputs.regular_file``: a FIFO or a device is never opened), the config
UTF-8 JSON of at most 64 MiB and the weights at most
:data:`ADAPTER_LIMIT_BYTES`; ``r`` and every ``rank_pattern`` value a positive
integer, ``lora_alpha`` and every ``alpha_pattern`` value a positive finite
number, ``use_rslora`` and ``use_dora`` booleans, pattern keys module names (PEFT allows
regular expressions there; they are refused rather than run, since a
user's pattern could take exponential time), and nothing but LoRA or DoRA
(:mod:`~primal_compiler.frontend.peft_config`, which reads the config); every
LoRA tensor finite (a NaN or an infinity is refused naming the tensor), and no
tensor but LoRA factors and, for a DoRA adapter (``use_dora``), one
``lora_magnitude_vector`` per adapted module (a LoRA bias or a saved module is
refused naming it; a DoRA adapter missing a magnitude, or a magnitude without
``use_dora``, too).

:func:`read_adapter` is what ``--adapter`` compiles with: the LoRA spec per
role from the config (``target_modules``, ``r``, ``lora_alpha``, and
``rank_pattern``/``alpha_pattern`` keyed by a target module name), checked
against the model and the tensors' shapes from the safetensors header (no
tensor data is read); :func:`attach_adapter` puts it on the model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from primal_compiler.errors import InputError, one_line
from primal_compiler.frontend.lora_spec import (ALIASES, LAYER_ROLES, MAX_ALPHA, MAX_RANK, attach_lora, lora_of,
                                                lora_text, set_lora)
from primal_compiler.frontend.peft_config import read_config
from primal_compiler.frontend.weights import ModelWeights, ProjectionWeights, check_lora
from primal_compiler.inputs import regular_file
from primal_compiler.ir.model import LoRA, Model, Role

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: Largest adapter weights file: 64 GiB, above r=256 on every projection of a 405B-parameter model in fp16 (20 GB).
ADAPTER_LIMIT_BYTES = 64 << 30

# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (optionally lora_A.<adapter>.weight)
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?:(?P<part>[AB])(?:\.(?P<adapter>[^.]+))?\.weight"
                       r"|(?P<magnitude>magnitude_vector)(?:\.(?P<dora>[^.]+)\.weight)?)$")  # DoRA's: PEFT >= 0.12
_LAYER_PATH = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(?P<index>[0-9]{1,6})\.(?P<path>.+)$")
_DTYPES: dict[str, Any] = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bfloat16"}  # bfloat16: ml_dtypes


def load_peft_adapter(path: str | Path, *, shapes_only: bool = False) -> ModelWeights:
    """LoRA A (``in x r``) and B (``r x out``) per ``(layer, role)`` from a PEFT adapter directory.

    With ``shapes_only`` no tensor data is read: each factor is a read-only zero-stride view with the
    stored shape and dtype (``nbytes`` is the stored size), enough for :func:`check_lora`.
    """
    if not str(path):
        raise InputError("''", "empty path where a PEFT adapter directory was expected")
    directory = Path(path)
    if not _present(directory):
        raise InputError(str(directory), "no such adapter directory")
    if not directory.is_dir():
        expected = f"{ADAPTER_CONFIG} + {ADAPTER_WEIGHTS}"
        raise InputError(str(directory), f"not a directory; expected a PEFT adapter directory ({expected})")
    config_path, weights_path = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    if not _present(config_path):
        raise InputError(str(config_path), "missing: a PEFT adapter directory needs adapter_config.json")
    if not _present(weights_path):
        hint = " (only the pickled adapter_model.bin is there; re-save with safe_serialization=True)" if (
            directory / "adapter_model.bin").exists() else ""
        raise InputError(str(weights_path), f"missing: a PEFT adapter directory needs {ADAPTER_WEIGHTS}{hint}")
    config = read_config(config_path)
    tensors = _safetensors(weights_path, shapes_only)
    where = str(weights_path)

    factors: dict[tuple[int, Role], dict[str, Any]] = {}
    for key, value in tensors.items():
        if ".lora_embedding_" in key:
            raise InputError(where, f"adapter targets an embedding ({key}); only layer projections can have LoRA")
        m = _LORA_KEY.match(key)
        assert m is not None  # _safetensors refuses every other tensor
        module = m["module"]
        leaf = module.rsplit(".", 1)[-1]
        lm = _LAYER_PATH.search(module)
        role = _role_of(leaf, lm["path"] if lm else "")
        if lm is None or role is None:
            raise InputError(where, f"adapter targets {leaf} ({module}), which is not a decoder-layer projection")
        entry = factors.setdefault((int(lm["index"]), role), {"module": module})
        if entry["module"] != module:
            both = f"modules {entry['module']} and {module}"
            raise InputError(where, f"{both} both map to layer {lm['index']} {role.value}")
        if value.ndim != (1 if m["magnitude"] else 2):
            raise InputError(where, f"{key} has shape {list(value.shape)}, expected a "
                                    f"{'vector' if m['magnitude'] else 'matrix'}")
        entry[m["part"] or "M"] = value
    if not factors:
        raise InputError(where, "no LoRA weights (no *.lora_A.weight / *.lora_B.weight tensors)")

    out: dict[tuple[int, Role], ProjectionWeights] = {}
    for (layer, role), entry in factors.items():
        label = f"layer {layer} {role.value}"
        if "A" not in entry or "B" not in entry:
            missing = "lora_A" if "A" not in entry else "lora_B"
            raise InputError(where, f"{label} ({entry['module']}) has no {missing}")
        a, b = entry["A"].T, entry["B"].T  # PEFT: A is r x in, B is out x r
        if a.shape[1] != b.shape[0]:
            raise InputError(where, f"{label} lora_A has rank {a.shape[1]} but lora_B has rank {b.shape[0]}")
        rank = a.shape[1]
        if rank < 1:
            raise InputError(where, f"{label} lora_A has rank 0")
        if config["rank_default"] and rank != config["r"]:
            raise InputError(where, f"{label} lora_A has rank {rank}, adapter_config.json says r={config['r']}")
        alpha = _pattern(config["alpha_pattern"], entry["module"], config["lora_alpha"])
        scale = alpha / math.sqrt(rank) if config["use_rslora"] else alpha / rank
        magnitude = entry.get("M")
        if config["use_dora"] != (magnitude is not None):
            raise InputError(where, f"{label} ({entry['module']}) has no lora_magnitude_vector, which a DoRA adapter "
                                    "(use_dora) needs" if magnitude is None else
                                    f"{label} ({entry['module']}) has a DoRA lora_magnitude_vector, but "
                                    f"{ADAPTER_CONFIG} does not set use_dora")
        if magnitude is not None and magnitude.shape != (b.shape[1],):
            raise InputError(where, f"{label} lora_magnitude_vector has {magnitude.shape[0]} values, lora_B "
                                    f"{b.shape[1]} columns")
        out[(layer, role)] = ProjectionWeights(
            a=a if shapes_only else np.ascontiguousarray(a), b=b if shapes_only else np.ascontiguousarray(b),
            scale=float(scale), module=entry["module"], magnitude=magnitude
        )
    return ModelWeights(where, "adapter", out)


@dataclass(frozen=True, eq=False)
class Adapter:
    """A PEFT adapter directory checked against a model, its tensor data unread.

    ``loras`` (in role order) is what ``adapter_config.json`` gives each role; ``shapes`` holds the
    factors as zero-stride views (IR layout, stored dtype), already checked against the model with
    ``loras`` attached.
    """

    config: str
    loras: dict[Role, LoRA]
    shapes: ModelWeights

    @property
    def spec(self) -> str:
        """The ``--lora`` text that attaches the same ranks and alphas (``--lora`` has no DoRA: a DoRA adapter's
        column scales come with its directory only)."""
        return lora_text(self.loras)


def read_adapter(path: str | Path, model: Model) -> Adapter:
    """The adapter in directory ``path`` for ``model``, from its config and its tensors' headers alone.

    Every problem is a one-line :class:`InputError` naming the file: a config without ``r`` or
    ``target_modules``, a target module the model lacks, a pattern key that is not a target module
    name (ranks per layer or per path are not supported), tensors on other roles than the config's,
    or tensors shaped unlike the model's matrices at the config's ranks.
    """
    config_path = Path(path) / ADAPTER_CONFIG
    shapes = load_peft_adapter(path, shapes_only=True)  # checks the directory, its config and the headers
    config = read_config(config_path)
    where = str(config_path)
    present = {lin.role for layer in model.layers for lin in layer.linears}
    names = _target_modules(where, config["target_modules"], present)
    loras: dict[Role, LoRA] = {}
    for name in names:
        roles = _module_roles(where, name)
        found = [r for r in roles if r in present]
        if not found:
            have = ", ".join(sorted(r.value for r in present))
            raise InputError(where, f"target module {name} ({'/'.join(r.value for r in roles)}) is not in model "
                                    f"{model.name}, whose projections are {have}")
        rank = _named(where, "rank_pattern", config["rank_pattern"], names, name, config["r"])
        alpha = _named(where, "alpha_pattern", config["alpha_pattern"], names, name, config["lora_alpha"])
        if rank > MAX_RANK or alpha > MAX_ALPHA:
            raise InputError(where, f"{name}: rank {rank} or alpha {alpha:g} above {MAX_RANK} or {MAX_ALPHA:g}")
        loras.update({r: LoRA(rank, float(alpha), config["use_dora"]) for r in found})
    loras = {role: loras[role] for role in LAYER_ROLES if role in loras}
    if set(shapes.lora_roles) != set(loras):
        have = ",".join(r.value for r in shapes.lora_roles)
        want = ",".join(r.value for r in loras)
        raise InputError(shapes.source, f"has LoRA tensors on {have}, but {ADAPTER_CONFIG}'s target_modules give "
                                        f"{want}")
    check_lora(shapes, set_lora(model, loras))
    return Adapter(where, loras, shapes)


def attach_adapter(model: Model, adapters: Adapter | list[Adapter], lora: str | None = None) -> Model:
    """``model`` with exactly the adapters' LoRA (the model file's own LoRA is replaced): one adapter's, or
    for several every role any adapts at the largest rank any gives it (alpha of the first giving it).

    An explicit ``lora`` spec must attach the same ranks and alphas to the same roles; if it does not,
    the :class:`InputError` names both.
    """
    adapters = adapters if isinstance(adapters, list) else [adapters]
    dora = [a.config for a in adapters if any(x.dora for x in a.loras.values())]
    if dora and len(adapters) > 1:
        raise InputError(dora[0], f"is a DoRA adapter (use_dora), and DoRA adapters are compiled one at a time: "
                                  f"{len(adapters)} adapters cannot share a program with one")
    loras: dict[Role, LoRA] = {}
    for adapter in adapters:
        for role, x in adapter.loras.items():
            if role not in loras or x.rank > loras[role].rank:
                loras[role] = x
    loras = {role: loras[role] for role in LAYER_ROLES if role in loras}
    plain = {role: replace(x, dora=False) for role, x in loras.items()}  # --lora has no DoRA; the adapter says it
    if lora and lora_of(attach_lora(set_lora(model, {}), lora)) != plain:
        given = (f"{adapters[0].config}, which gives" if len(adapters) == 1
                 else f"the {len(adapters)} adapters, which together give")
        raise InputError("--lora", f"{lora!r} disagrees with {given} {lora_text(loras)!r}; "
                                   "drop --lora (--adapter sets it) or make them agree")
    return set_lora(model, loras)


def _target_modules(where: str, value: Any, present: set[Role]) -> tuple[str, ...]:
    """PEFT's ``target_modules``: a list of module names, or ``all-linear`` (every layer projection)."""
    if value is None:
        raise InputError(where, "has no target_modules (the modules the LoRA adapts)")
    if value == "all-linear":
        return tuple(r.value for r in LAYER_ROLES if r in present)
    if isinstance(value, str):
        raise InputError(where, f"target_modules {value!r} is a regular expression; list the module names instead")
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InputError(where, f"target_modules must be a non-empty list of module names, got {value!r}")
    return tuple(sorted(set(value)))


def _module_roles(where: str, name: str) -> tuple[Role, ...]:
    """The roles a PEFT target module name adapts: GPT-2's ``c_proj`` is both o and fc2 unless a path says which."""
    parts = name.split(".")
    if any(part.isdigit() for part in parts):
        raise InputError(where, f"target module {name!r} names one layer's module; every layer of a role gets "
                                "the same LoRA here")
    if name == "c_proj":
        return (Role.O, Role.FC2)
    role = _role_of(parts[-1], ".".join(parts[-2:]))
    if role is None:
        known = ", ".join(sorted(k for k, v in ALIASES.items() if len(v) == 1) + ["c_proj"])
        raise InputError(where, f"target module {name!r} is not a decoder-layer projection this compiler knows "
                                f"(known: {known}, or a role name)")
    return (role,)


def _named(where: str, what: str, patterns: dict[str, Any], names: tuple[str, ...], name: str, default: Any) -> Any:
    """``default``, or the ``patterns`` value for target ``name``; any other key is refused."""
    for key in patterns:
        if key not in names:
            raise InputError(where, f"{what} key {key!r} is not one of target_modules; only per-module-name "
                                    "values are supported (every layer of a role has one rank and alpha)")
    return patterns.get(name, default)


def _present(path: Path) -> bool:
    """Whether anything (a dangling symlink included) is at ``path``; a path the system refuses is an InputError."""
    try:
        return path.exists() or path.is_symlink()
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        raise InputError(str(path), f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None


def _pattern(patterns: dict[str, float], module: str, default: float) -> float:
    """PEFT's per-module override: the first key naming ``module`` or a dotted suffix of it (``^`` anchors)."""
    for key, value in patterns.items():
        if module == key.lstrip("^") or (not key.startswith("^") and module.endswith("." + key)):
            return value
    return default


def _safetensors(path: Path, shapes_only: bool = False) -> dict[str, np.ndarray]:
    """The LoRA tensors of a safetensors file as float32 (bfloat16 through ml_dtypes, which onnx installs).

    Other tensors (``modules_to_save`` copies of whole layers) are never decoded. A LoRA tensor holding
    a NaN or an infinity is an :class:`InputError` naming it. ``shapes_only`` reads the header alone and
    gives zero-stride views of the stored shape and dtype.
    """
    try:
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
    except ImportError:  # pragma: no cover - onnx depends on it
        pass
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - a declared dependency
        raise InputError(str(path), "reading adapters needs the safetensors package") from None
    regular_file(path, ADAPTER_LIMIT_BYTES, "adapter weights file")
    out, foreign = {}, []
    try:
        with safe_open(str(path), framework="np") as fh:
            for key in fh.keys():
                if not _LORA_KEY.match(key) and ".lora_embedding_" not in key:
                    foreign.append(key)
                elif shapes_only:
                    out[key] = _shape_view(path, key, fh.get_slice(key))
                else:
                    out[key] = np.asarray(fh.get_tensor(key)).astype(np.float32)
    except Exception as exc:  # noqa: BLE001 - SafetensorError, TypeError for unknown dtypes, OSError

        detail = f"{type(exc).__name__}: {one_line(exc, 200)}"
        raise InputError(str(path), f"not a readable safetensors file ({detail})") from None
    if foreign:
        raise InputError(str(path), f"holds {foreign[0][:120]}, which is not a LoRA factor (*.lora_A.weight, "
                                    "*.lora_B.weight, a DoRA *.lora_magnitude_vector): a LoRA bias or a saved module "
                                    "changes what the adapter computes, and only LoRA and DoRA adapters are read")
    for key, value in out.items():
        if not shapes_only and not np.isfinite(value).all():
            raise InputError(str(path), f"{key} holds NaN or infinite values")
    return out


def _shape_view(path: Path, key: str, tensor: Any) -> np.ndarray:
    """A read-only zero-stride array with ``tensor``'s shape and dtype, read from the header only."""
    dtype = _DTYPES.get(tensor.get_dtype())
    if dtype is None:
        raise InputError(str(path), f"{key} has dtype {tensor.get_dtype()}, not a float type LoRA factors use")
    return np.broadcast_to(np.zeros((), dtype), tuple(tensor.get_shape()))


def _role_of(leaf: str, path: str) -> Role | None:
    """The role of a PEFT module leaf name; ``path`` (e.g. ``mlp.c_proj``) disambiguates GPT-2's c_proj."""
    if leaf == "c_proj" and path.split(".")[0] == "mlp":
        return Role.FC2
    roles = ALIASES.get(leaf)
    if roles is not None:
        return roles[0] if len(roles) == 1 else None
    try:
        role = Role(leaf)
    except ValueError:
        return None
    return role if role in LAYER_ROLES else None


