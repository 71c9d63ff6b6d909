"""Hardware targets: spec dataclasses and the strict TOML loader.

>>> from primal_compiler.target import load_target
>>> t = load_target("primal-7nm")
>>> t.rram.rows, t.ct.pes
(256, 1024)
"""

from primal_compiler.target.loader import (
    bundled_targets,
    load_gpu_target,
    load_primal_target,
    load_target,
    parse_override,
    require_primal,
    validate_all,
    with_overrides,
)
from primal_compiler.target.gpu import GpuComputeSpec, GpuEfficiencySpec, GpuMemorySpec, GpuPowerSpec, GpuTarget
from primal_compiler.target.spec import (
    AreaSpec,
    CtSpec,
    D2dSpec,
    PowerGatingSpec,
    PrimalTarget,
    RouterSpec,
    RramSpec,
    SramSpec,
    SystemSpec,
    Target,
)
from primal_compiler.target.table import SCHEMA_VERSION, FieldInfo, schema

__all__ = [
    "SCHEMA_VERSION",
    "AreaSpec",
    "CtSpec",
    "D2dSpec",
    "FieldInfo",
    "GpuComputeSpec",
    "GpuEfficiencySpec",
    "GpuMemorySpec",
    "GpuPowerSpec",
    "GpuTarget",
    "PowerGatingSpec",
    "PrimalTarget",
    "RouterSpec",
    "RramSpec",
    "SramSpec",
    "SystemSpec",
    "Target",
    "bundled_targets",
    "load_gpu_target",
    "load_primal_target",
    "load_target",
    "parse_override",
    "require_primal",
    "schema",
    "validate_all",
    "with_overrides",
]
