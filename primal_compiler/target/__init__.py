"""Hardware targets: spec dataclasses and the strict TOML loader.

>>> from primal_compiler.target import load_target
>>> t = load_target("primal-7nm")
>>> t.rram.rows, t.ct.pes
(256, 1024)
"""

from primal_compiler.target.loader import (
    bundled_targets,
    load_primal_target,
    load_target,
    parse_override,
    require_primal,
    validate_all,
    with_overrides,
)
from primal_compiler.target.spec import (
    SCHEMA_VERSION,
    AreaSpec,
    CtSpec,
    D2dSpec,
    FieldInfo,
    GpuComputeSpec,
    GpuEfficiencySpec,
    GpuMemorySpec,
    GpuPowerSpec,
    GpuTarget,
    PowerGatingSpec,
    PrimalTarget,
    RouterSpec,
    RramSpec,
    SramSpec,
    SystemSpec,
    Target,
    schema,
)

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
    "load_primal_target",
    "load_target",
    "parse_override",
    "require_primal",
    "schema",
    "validate_all",
    "with_overrides",
]
