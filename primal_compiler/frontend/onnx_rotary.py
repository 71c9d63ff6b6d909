"""Rotary forms beyond Llama's: partial rotary, adjacent pairs, and a precomputed sin/cos table (GPT-J).

Pairs. ``rotate_half`` (Llama, GPT-NeoX) negates ``x[..., rot/2:rot]`` and
puts it before ``x[..., :rot/2]``; GPT-J's ``rotate_every_two`` negates the
odd dimensions ``x[..., 1::2]`` and interleaves them back, ``(-x1, x0,
-x3, x2, ...)``. :func:`interleaved` tells them apart from the ``Slice``
each ``Neg`` reads (step 1 or 2) and checks the interleaving's
``Unsqueeze``/``Concat``; a graph that mixes them is refused.

Table. GPT-J gathers rows of a constant ``[positions, rot]`` table by the
position ids and splits each row in two, ``sin(p f) | cos(p f)``.
:func:`table_rope` reads the frequencies ``f`` back from the table (the
phase of its last row, unwrapped with its second) and requires every row
to be ``sin | cos`` of ``p f`` within 1e-5, and every multiplication by
the sine half to scale a negated (rotated) operand and by the cosine half a
plain one.

Partial rotary. A graph with partial rotary cuts every query and key head in two along its
last axis, ``x[..., :dim]`` and ``x[..., dim:]``, rotates the first part
with the cosine and sine tables and joins the parts back,
``Concat(rotated, x[..., dim:])``. :func:`check_partial` finds each such
join (a ``Concat`` on the last axis whose second input is a ``Slice``
``[dim:]`` of some tensor and whose first input depends on the ``Slice``
``[:dim]`` of the same tensor) and requires every multiplication by a
cosine or sine to feed the rotated side of one of them. Anything else
(the rotated dimensions elsewhere in the head, interleaved pairs, a table
applied to a whole head) is a :class:`PatternError` naming a node.

Positionless layers. :func:`rotated_layers` says, layer by layer, whether the queries and keys depend on a
rotation (a ``Neg``, a multiplication by a cosine or sine table, a ``RotaryEmbedding``): a RoPE model may
leave some layers unrotated (NoPE layers), which codegen then emits without ROPE; a layer rotating only
its queries or only its keys, or a RoPE model rotating nothing, is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from primal_compiler.errors import InputError
from primal_compiler.frontend.onnx_graph import FLOATS, HALF_EPS, GraphIndex, PatternError, attr, slice_bounds

if TYPE_CHECKING:  # onnx_decoder's layers are built before rotation is read; no import at run time
    from primal_compiler.frontend.onnx_decoder import Decoder, Layer
from primal_compiler.frontend.onnx_tensors import read_tensor

#: Axes that mean "the last one" of a [batch, heads, seq, head_dim] tensor.
LAST = (-1, 3)
#: An ``ends`` value this large means "to the end of the axis".
TO_END = 1 << 31


def _slice_last(g: GraphIndex, node) -> tuple[int, int, int] | None:
    """(start, end, step) of a ``Slice`` along the last axis, from its constant inputs; else None."""
    return slice_bounds(g, node, LAST)


def _bounds(g: GraphIndex, node) -> tuple[int, int] | None:
    """(start, end) of a unit-step ``Slice`` along the last axis; else None."""
    found = _slice_last(g, node)
    return found[:2] if found is not None and found[2] == 1 else None


def _joins(g: GraphIndex, dim: int, head_dim: int) -> list[set[int]]:
    """The nodes on the rotated side of every verified join."""
    found = []
    for node in g.nodes:
        if node.op_type != "Concat" or len(node.input) != 2 or attr(node, "axis", 0) not in LAST:
            continue
        tail = g.node_of(node.input[1])
        bounds = _bounds(g, tail) if tail is not None and tail.op_type == "Slice" else None
        if tail is None or bounds is None or bounds[0] != dim or min(bounds[1], TO_END) < head_dim:
            continue
        reached, _ = g.backward([node.input[0]], frozenset())
        heads = [i for i in reached if g.nodes[i].op_type == "Slice" and g.nodes[i].input[0] == tail.input[0]
                 and _bounds(g, g.nodes[i]) == (0, dim)]
        if heads:
            found.append(reached)
    return found


def check_partial(g: GraphIndex, dim: int, head_dim: int, tables: frozenset[str] = frozenset()) -> None:
    """Raise :class:`PatternError` unless the cos/sin tables (the outputs of ``Cos``/``Sin`` nodes, or the
    gathered rows ``tables`` of a precomputed table) rotate exactly the first ``dim`` of each head."""
    if dim % 2 or not 0 < dim < head_dim:
        raise PatternError(f"unsupported partial rotary: {dim} rotated dimensions of a {head_dim}-dimension head")
    joins = _joins(g, dim, head_dim)
    uses = _table_uses(g, tables)
    if not joins:
        name = g.nodes[uses[0]].name if uses else "RoPE"
        raise PatternError(f"unsupported partial rotary at node {name}: no query or key head is cut into its first "
                           f"{dim} dimensions (rotated) and the rest (passed through)")
    for i in uses:
        if not any(i in side for side in joins):
            node = g.nodes[i]
            raise PatternError(f"unsupported partial rotary at node {node.name or node.op_type} (Mul): it applies "
                               f"the rotary tables outside the first {dim} dimensions of a head")


#: Ops that only reshape or select a cosine or sine table on its way to the rotation.
TABLE_OPS = frozenset({"Unsqueeze", "Squeeze", "Cast", "CastLike", "Identity", "Slice", "Gather", "Reshape",
                       "Expand", "Transpose", "Split", "Tile", "Concat"})


def _table_uses(g: GraphIndex, seeds: frozenset[str] = frozenset()) -> list[int]:
    """The ``Mul`` nodes that multiply something by a cosine or sine table (``Cos``/``Sin`` outputs and
    ``seeds``)."""
    return sorted({i for t in _table_closure(g, seeds) for i in g.consumers.get(t, ()) if g.nodes[i].op_type == "Mul"})


def _table_closure(g: GraphIndex, seeds: frozenset[str]) -> set[str]:
    """The tensors that only reshape or select a ``Cos``/``Sin`` output or a ``seeds`` tensor."""
    tables = {o for n in g.nodes if n.op_type in ("Cos", "Sin") for o in n.output} | set(seeds)
    frontier = set(tables)
    while frontier:
        more = {o for t in frontier for i in g.consumers.get(t, ()) if g.nodes[i].op_type in TABLE_OPS
                and g.nodes[i].input[0] == t for o in g.nodes[i].output} - tables
        tables |= more
        frontier = more
    return tables


def _rotation_nodes(g: GraphIndex, seeds: frozenset[str] = frozenset()) -> set[int]:
    """The nodes that mark a rotation: a ``Neg``, a ``Mul`` by a cosine or sine table (or the gathered rows
    ``seeds``), a ``RotaryEmbedding`` op. A query or key that depends on none enters attention unrotated."""
    return set(_table_uses(g, seeds)) | {i for i, n in enumerate(g.nodes) if n.op_type in ("Neg", "RotaryEmbedding")}


def rotated_layers(g: GraphIndex, dec: Decoder, layers: list[Layer]) -> list[bool]:
    """Which layers rotate their queries and keys: False for a positionless (NoPE) layer of a RoPE model."""
    table = table_gather(g, layers[0].head_dim)
    marks = _rotation_nodes(g, frozenset(g.nodes[table[0]].output) if table is not None else frozenset())
    turned = []
    for i, layer in enumerate(layers):
        anchor = g.nodes[layer.core.anchor]
        if anchor.op_type == "GroupQueryAttention" and attr(anchor, "do_rotary", 0):
            turned.append(True)
            continue
        q, k = (bool(g.backward([t], dec.barriers)[0] & marks) for t in (layer.core.q_in, layer.core.k_in))
        if q != k:
            which = "queries" if q else "keys"
            raise PatternError(f"unsupported RoPE in layer {i}: it rotates its {which} alone")
        turned.append(q)
    if not any(turned):
        raise PatternError("unsupported position encoding: no layer rotates its queries and keys")
    return turned


def interleaved(g: GraphIndex) -> bool:
    """True when the rotations pair adjacent dimensions (``rotate_every_two``), False for halves or when no
    rotation is written out (a ``RotaryEmbedding`` op); a :class:`PatternError` names a node that is neither."""
    forms: dict[bool, str] = {}
    for i, node in enumerate(g.nodes):
        src = g.node_of(node.input[0]) if node.op_type == "Neg" else None
        found = _slice_last(g, src) if src is not None and src.op_type == "Slice" else None
        if found is None:
            continue
        if found[2] == 2:
            _check_every_two(g, i, src, found)
        forms.setdefault(found[2] == 2, node.name or f"#{i}")
    if len(forms) > 1:
        raise PatternError(f"unsupported RoPE: node {forms[False]} rotates halves of a head and node {forms[True]} "
                           "adjacent pairs")
    return True in forms


def _check_every_two(g: GraphIndex, neg: int, odd, odd_bounds: tuple[int, int, int]) -> None:
    """``Neg(x[..., 1::2])`` must be interleaved before ``x[..., 0::2]``: ``Concat(Unsqueeze(-x1), Unsqueeze(x0))``
    on a new last axis, so output ``2j`` is ``-x[2j + 1]`` and ``2j + 1`` is ``x[2j]``."""
    node = g.nodes[neg]
    name = node.name or f"#{neg}"
    wrong = PatternError(f"unsupported rotation at node {name} (Neg of x[..., 1::2]): not GPT-J's rotate_every_two "
                         "(-x1, x0, -x3, x2, ...)")
    if odd_bounds[0] != 1:
        raise wrong
    ups = [g.nodes[i] for i in g.consumers.get(node.output[0], ())]
    joins = [g.nodes[i] for u in ups if u.op_type == "Unsqueeze" for i in g.consumers.get(u.output[0], ())]
    if len(ups) != 1 or len(joins) != 1 or joins[0].op_type != "Concat" or len(joins[0].input) != 2:
        raise wrong
    join = joins[0]
    other = g.node_of(join.input[1])
    even = g.node_of(other.input[0]) if other is not None and other.op_type == "Unsqueeze" else None
    even_bounds = _slice_last(g, even) if even is not None and even.op_type == "Slice" else None
    if (join.input[0] != ups[0].output[0] or attr(join, "axis", 0) != -1 or even is None or even_bounds is None
            or even.input[0] != odd.input[0] or even_bounds[::2] != (0, 2)):
        raise wrong


@dataclass(frozen=True)
class TableRope:
    """RoPE read from a precomputed ``sin | cos`` table gathered by position (GPT-J's ``embed_positions``)."""

    inv_freq: tuple[float, ...]  # rot / 2 frequencies
    gathered: frozenset[str]  # the gathered rows, where the tables' uses start


def table_gather(g: GraphIndex, head_dim: int) -> tuple[int, object, list[int], object] | None:
    """(node, tensor, dims, split) of a constant ``[positions, rot]`` table gathered and split in two halves
    along its last axis (the form of GPT-J's ``embed_positions``), its values unread; None without one."""
    for i, node in enumerate(g.nodes):
        tensor = g.constant_tensor(_repeated(g, node.input[0])) if node.op_type in ("Gather", "GatherElements") else None
        dims = [int(d) for d in tensor.dims] if tensor is not None else []
        if len(dims) < 2 or any(d != 1 for d in dims[:-2]) or dims[-1] % 4 or not 4 <= dims[-1] <= head_dim:
            continue
        rows = node.output[0]
        cast = [g.nodes[j] for j in g.consumers.get(rows, ()) if g.nodes[j].op_type == "Cast"
                and attr(g.nodes[j], "to") in FLOATS]  # a float cast: the rows stay what they were
        rows = cast[0].output[0] if len(cast) == 1 and len(g.consumers.get(rows, ())) == 1 else rows
        halves = [g.nodes[j] for j in g.consumers.get(rows, ()) if g.nodes[j].op_type == "Split"]
        if len(halves) == 1 and len(halves[0].output) == 2 and attr(halves[0], "axis", 0) in (-1, len(dims) - 1):
            return i, tensor, dims, halves[0]
    return None


def _repeated(g: GraphIndex, tensor: str) -> str:
    """The table behind ``Expand``/``Tile`` nodes that only repeat it along leading axes (the TorchScript
    export's ``embed_positions.repeat(batch, 1, 1)``), else ``tensor`` itself."""
    for _ in range(4):
        node = g.node_of(tensor)
        shape = g.const(node.input[1]) if node is not None and node.op_type in ("Expand", "Tile") else None
        if node is None or shape is None or shape.ndim != 1 or len(shape) < 2 or (shape[-2:] != 1).any():
            return tensor
        tensor = node.input[0]
    return tensor


def table_rope(g: GraphIndex, head_dim: int) -> TableRope | None:
    """The table of the graph's rotary embedding, or None when it has none; a table whose rows are not
    ``sin | cos`` of ``p f``, or whose halves multiply the wrong operands, is a :class:`PatternError`. An
    unreadable table (absent external data) gives empty ``inv_freq``."""
    found = table_gather(g, head_dim)
    if found is None:
        return None
    i, tensor, dims, split = found
    node = g.nodes[i]
    inv = _frequencies(g, tensor, dims[-2], dims[-1] // 2, node.name or node.op_type)
    _check_halves(g, split)
    return TableRope(inv, frozenset(node.output))


def _frequencies(g: GraphIndex, tensor, rows: int, half: int, name: str) -> tuple[float, ...]:

    try:
        table = read_tensor(g, tensor, "rotary table", "").reshape(rows, 2 * half).astype(np.float64)
    except InputError:
        return ()
    if rows < 2 or not (table[0, :half] == 0).all() or not (table[0, half:] == 1).all():
        raise PatternError(f"unsupported position table at node {name}: its first row is not sin 0 | cos 0")
    first = np.arctan2(table[1, :half], table[1, half:])
    last = np.arctan2(table[-1, :half], table[-1, half:])
    turns = np.round(((rows - 1) * first - last) / (2 * np.pi))
    inv = ((last + 2 * np.pi * turns) / (rows - 1)).astype(np.float32)
    angle = np.arange(rows, dtype=np.float32)[:, None] * inv[None, :]
    want = np.concatenate([np.sin(angle), np.cos(angle)], axis=1)
    rounding = {onnx.TensorProto.FLOAT16: HALF_EPS["float16"],
                onnx.TensorProto.BFLOAT16: HALF_EPS["bfloat16"]}.get(tensor.data_type, 0.0)
    if not (inv > 0).all() or np.abs(table - want).max() > 1e-5 + rounding:  # |sin|, |cos| <= 1: eps is absolute
        raise PatternError(f"unsupported position table at node {name}: its rows are not sin(p f) | cos(p f)")
    return tuple(float(f) for f in inv)


def _check_halves(g: GraphIndex, split) -> None:
    """The sine half multiplies only negated (rotated) operands, the cosine half only plain ones."""
    for out, rotated in zip(split.output, (True, False)):
        mine = _table_closure(g, frozenset({out}))
        for i in _table_uses(g, frozenset({out})):
            node = g.nodes[i]
            other = next(x for x in node.input if x not in mine)
            if _negated(g, other) != rotated:
                part = "sine" if rotated else "cosine"
                raise PatternError(f"unsupported rotation at node {node.name or f'#{i}'}: the table's {part} half "
                                   f"multiplies {'a plain' if rotated else 'a rotated'} operand")


def _negated(g: GraphIndex, tensor: str) -> bool:
    """``tensor`` is a rotation's output: a ``Neg`` within a few reshapes, unsqueezes and concats."""
    frontier = [tensor]
    for _ in range(6):
        nodes = [g.node_of(t) for t in frontier]
        if any(n is not None and n.op_type == "Neg" for n in nodes):
            return True
        frontier = [x for n in nodes if n is not None and n.op_type in ("Reshape", "Concat", "Unsqueeze", "Identity",
                                                                         "Cast", "Transpose") for x in n.input]
    return False
