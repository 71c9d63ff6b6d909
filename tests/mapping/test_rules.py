"""The seed's layout rules as checked properties of a placement."""

from __future__ import annotations

import numpy as np

from primal_compiler.ir.model import Role
from primal_compiler.ir.tiles import ROLE_INDEX
from primal_compiler.mapping.instance import Instance
from primal_compiler.mapping.layout import CtTemplate
from primal_compiler.mapping.rules import template_rules
from primal_compiler.mapping.traffic import FlowClass

# 4 Q tiles and 4 K tiles on a 4x4 mesh; hub 8 = root:q:0, hub 9 = root:k:0; one q -> K-root flow of 256 bytes.
ROLES = np.array([ROLE_INDEX[Role.Q]] * 4 + [ROLE_INDEX[Role.K]] * 4)
INST = Instance(4, 4, 8, 2, np.array([8], np.int32), np.array([9], np.int32), np.array([256.0]),
                np.array([FlowClass.ATTN], np.int8), hub_names=("root:q:0", "root:k:0"))


def _template(slots, hubs) -> CtTemplate:
    return CtTemplate(0, 0, INST, np.arange(8), np.array(slots, np.int32), np.array(hubs, np.int32))


def test_column_rectangles_side_by_side_hold_every_rule():
    # Q in column 0, K in column 1; the roots in one mesh row
    r = template_rules(_template([0, 4, 8, 12, 1, 5, 9, 13], [4, 5]), ROLES)
    assert r["column_band_q"] == {"holds": True, "tiles": 4, "first_col": 0, "last_col": 0, "foreign_tiles": 0}
    assert r["q_next_to_k"]["holds"] and r["q_next_to_k"]["min_hops"] == 1
    assert r["qk_horizontal"] == {"holds": True, "qk_byte_hops": 256.0, "vertical_bytes": 0.0}


def test_broken_rules_are_reported_with_their_cost():
    # Q scattered over two corners, K in column 3; the K root two rows below the Q root
    r = template_rules(_template([0, 4, 2, 6, 3, 7, 11, 15], [0, 11]), ROLES)
    band = r["column_band_q"]  # columns 0 and 2 but not 1: a gap
    assert not band["holds"] and (band["first_col"], band["last_col"], band["foreign_tiles"]) == (0, 2, 0)
    assert r["column_band_k"]["holds"]
    assert r["q_next_to_k"]["holds"]  # tile 2 (0,2) touches K tile (0,3)
    h = r["qk_horizontal"]
    assert not h["holds"] and h["vertical_bytes"] == 256.0 and h["qk_byte_hops"] == 256.0 * (3 + 2)


def test_a_band_with_another_matrix_in_its_inner_columns_is_broken():
    # Q in columns 0-2 (a partial first and last column may be shared), K tile (1,1) inside Q's inner column
    r = template_rules(_template([0, 4, 1, 2, 5, 3, 7, 11], [0, 3]), ROLES)
    assert r["column_band_q"] == {"holds": False, "tiles": 4, "first_col": 0, "last_col": 2, "foreign_tiles": 1}
    assert not r["column_band_k"]["holds"]  # K spans columns 1-3 and Q's tile (0,2) sits inside
    ok = template_rules(_template([0, 4, 8, 1, 5, 9, 13, 2], [0, 5]), ROLES)  # Q: column 0 + (0,1); K after it
    assert ok["column_band_q"]["holds"] and ok["column_band_k"]["holds"]


def test_rules_absent_where_there_is_nothing_to_judge():
    mlp = np.array([ROLE_INDEX[Role.UP]] * 8)
    assert template_rules(_template(list(range(8)), [0, 1]), mlp) == {"qk_horizontal": {
        "holds": True, "qk_byte_hops": 256.0 * 1, "vertical_bytes": 0.0}}
