"""Attention geometry of a recognised layer: head count, kv heads and head size, from shapes and splits.

:class:`HeadGeometry` (the base of ``onnx_decoder.Decoder``) reads them from
the attention op's attributes, a ``Reshape`` of the query into heads, or a
fused qkv projection's ``Split``/``Slice`` widths. A fused qkv reshaped to
``[..., heads, 3 * head_dim]`` and split in three along that last axis
(GPT-NeoX's ``query_key_value``), or to ``[..., heads, 3, head_dim]`` with
q, k and v taken by a ``Gather`` of index 0, 1 and 2 (Bloom's), runs its
columns head by head: the layer's ``qkv_layout`` is ``"per-head"``. A
fused qkv reshaped to ``[..., q_heads + 2 kv_heads, head_dim]`` and cut
along that heads axis (Falcon's multi-query ``query_key_value``: the query
``[..., :-2, :]``, the key and value heads picked by index) is q | k | v
already; one grouped per kv head (``[..., kv_heads, group + 2, head_dim]``,
Falcon's new decoder architecture) is ``"per-group"``. The heads each part
selects are checked; ``ir.columns`` puts the weights in q | k | v order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from primal_compiler.frontend.onnx_graph import GraphIndex, PatternError, attr, slice_bounds
from primal_compiler.frontend.onnx_project import Projection
from primal_compiler.ir.model import Role

if TYPE_CHECKING:
    from primal_compiler.frontend.onnx_decoder import Layer


@dataclass
class Core:
    anchor: int  # Softmax or fused attention node
    q_in: str
    k_in: str
    v_in: str
    out: str
    heads: int | None = None
    kv_heads: int | None = None


class HeadGeometry(ABC):
    """Head-geometry queries over the subclass's graph ``g``, its ``barriers`` and ``hits_fwd``."""

    g: GraphIndex
    barriers: frozenset[int]  # nodes of the projections, where a backward walk stops

    @abstractmethod
    def hits_fwd(self, p: Projection) -> tuple[set[int], set[int]]:
        """Nodes reached forward from projection ``p``'s output, and the nodes of the projections it hits."""

    def geometry(self, layer: Layer) -> None:
        """num_heads, num_kv_heads, head_dim of ``layer`` (PatternError when not found)."""
        core = layer.core
        first = layer.attn[0]
        per_head = self._per_head_split(first, core) if first.role == Role.QKV else None
        if per_head is None and first.role == Role.QKV:
            per_head = self._per_head_select(first, core)
        if per_head is not None:
            layer.qkv_layout, layer.head_dim = "per-head", per_head
            layer.num_heads = layer.num_kv_heads = first.out_features // (3 * per_head)
            return
        axis_split = self._heads_axis_split(first, core) if first.role == Role.QKV else None
        if axis_split is not None:
            q_size, kv_size, layer.qkv_layout = axis_split
        elif first.role == Role.QKV:
            q_size, kv_size = self._fused_split(first, core)
        else:
            q_size, kv_size = first.out_features, layer.attn[1].out_features
        head_dim = None
        if core.heads:
            head_dim = q_size // core.heads
        else:
            head_dim = self._head_dim(first, core.q_in, q_size)
        if not head_dim or q_size % head_dim or kv_size % head_dim:
            raise PatternError("cannot determine the attention head size (no Reshape of the query into heads)")
        layer.head_dim = head_dim
        layer.num_heads = q_size // head_dim
        layer.num_kv_heads = kv_size // head_dim

    def _path(self, p: Projection, target: str) -> list[int]:
        reached_f, _ = self.hits_fwd(p)
        reached_b, _ = self.g.backward([target], self.barriers)
        return sorted(reached_f & reached_b)

    def _head_dim(self, p: Projection, q_in: str, q_size: int) -> int | None:
        g = self.g
        for i in self._path(p, q_in):
            node = g.nodes[i]
            if node.op_type != "Reshape":
                continue
            second, last = g.tail_ints(node.input[1], 2)
            if last is not None and 0 < last < q_size and q_size % last == 0:
                return last
            if second is not None and 0 < second < q_size and q_size % second == 0 and (last or 0) <= 0:
                return q_size // second
        return None

    def _per_head_split(self, p: Projection, core: Core) -> int | None:
        """The head size of a fused qkv reshaped to ``[..., heads, 3 * head_dim]`` and split in three along
        that last axis, q first, k second (GPT-NeoX's ``query_key_value``); None for any other layout."""
        g = self.g
        path_q, path_k = set(self._path(p, core.q_in)), set(self._path(p, core.k_in))
        for i in sorted(path_q):
            node = g.nodes[i]
            if node.op_type == "Slice" and slice_bounds(g, node, (-1, 3)) is not None:
                return self._per_head_slices(p, node, path_k, set(self._path(p, core.v_in)))
            if node.op_type != "Split" or len(node.output) != 3 or attr(node, "axis", 0) not in (-1, 3):
                continue
            last = self._per_head_width(p, node.input[0])
            if last is None:
                return None
            sizes = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else attr(node, "split")
            if sizes is not None and [int(s) for s in list(sizes)] != [last // 3] * 3:
                return None
            q, k = self._output_for(node, path_q, core.q_in), self._output_for(node, path_k, core.k_in)
            if (q, k) != (0, 1):
                raise PatternError(f"unsupported fused qkv at node {node.name or i}: its per-head split gives the "
                                   f"query part {q} and the key part {k}, not 0 and 1")
            return last // 3
        return None

    def _per_head_width(self, p: Projection, tensor: str) -> int | None:
        """``3 * head_dim`` when ``tensor`` is ``p``'s output reshaped to ``[..., heads, 3 * head_dim]`` (maybe
        transposed), else None."""
        g = self.g
        src = g.node_of(tensor)
        src = g.node_of(src.input[0]) if src is not None and src.op_type == "Transpose" else src
        last = g.tail_ints(src.input[1], 1)[0] if src is not None and src.op_type == "Reshape" else None
        return None if not last or last % 3 or p.out_features % last else last

    def _per_head_slices(self, p: Projection, q_slice, path_k: set[int], path_v: set[int]) -> int | None:
        """The head size of NeoX's per-head qkv cut by three ``Slice`` nodes along the last axis (the TorchScript
        exporter's form of its split; ``q_slice`` is the query's): q, k and v must take ``[0, d)``, ``[d, 2d)``
        and ``[2d, 3d)`` (an end past ``3d`` is the same); None for another layout."""
        g = self.g
        last = self._per_head_width(p, q_slice.input[0])
        if last is None:
            return None
        d = last // 3

        def cuts(path: set[int]) -> list:
            return [slice_bounds(g, g.nodes[j], (-1, 3)) for j in g.consumers.get(q_slice.input[0], ())
                    if j in path and g.nodes[j].op_type == "Slice"]

        q, ks, vs = slice_bounds(g, q_slice, (-1, 3)), cuts(path_k), cuts(path_v)
        v_ok = len(vs) == 1 and vs[0] is not None and vs[0][0] == 2 * d and vs[0][1] >= 3 * d and vs[0][2] == 1
        if q != (0, d, 1) or ks != [(d, 2 * d, 1)] or not v_ok:
            raise PatternError(f"unsupported fused qkv at node {q_slice.name}: its per-head slices give the query "
                               f"{q}, the key {ks} and the value {vs}, not [0, {d}), [{d}, {2 * d}) and "
                               f"[{2 * d}, {3 * d})")
        return d

    def _heads_axis_split(self, p: Projection, core: Core) -> tuple[int, int, str] | None:
        """(q size, kv size, ``qkv_layout``) of a fused qkv reshaped to ``[..., heads, head_dim]`` and cut along the heads
        axis (Falcon's multi-query layout), checking the heads each of q, k and v selects; None for another
        layout."""
        g = self.g
        paths = [set(self._path(p, t)) for t in (core.q_in, core.k_in, core.v_in)]
        for i in sorted(paths[0]):
            node = g.nodes[i]
            if node.op_type != "Reshape":
                continue
            groups, inner, size = g.tail_ints(node.input[1], 3)
            if inner and size and 0 < inner * size < p.out_features and p.out_features % (inner * size) == 0 \
                    and groups in (-1, p.out_features // (inner * size)):
                return self._grouped(node, i, paths, p.out_features // (inner * size), inner, size)
            n, hd = g.tail_ints(node.input[1], 2)
            if not n or not hd or n * hd != p.out_features:
                continue
            picked = [self._heads_picked(node.output[0], path, n) for path in paths]
            if picked[0] is None:
                return None
            q = picked[0]
            kv = (n - len(q)) // 2
            want = [list(range(len(q))), list(range(len(q), len(q) + kv)), list(range(len(q) + kv, n))]
            if picked != want:
                raise PatternError(f"unsupported fused qkv at node {node.name or i}: its {n} heads of {hd} are cut "
                                   f"into q {picked[0]}, k {picked[1]}, v {picked[2]}, not q first, then k, then v")
            return len(q) * hd, kv * hd, ""
        return None

    def _grouped(self, node, i: int, paths: list[set[int]], groups: int, inner: int, hd: int) -> tuple[int, int, str]:
        """A qkv reshaped to ``[..., groups, inner, head_dim]`` (Falcon's new decoder architecture): each group
        holds ``inner - 2`` query heads, then its key and its value head, picked along the ``inner`` axis."""
        picked = [self._heads_picked(node.output[0], path, inner, axis=3) for path in paths]
        want = [list(range(inner - 2)), [inner - 2], [inner - 1]]
        if inner < 3 or picked != want:
            raise PatternError(f"unsupported fused qkv at node {node.name or i}: its columns are grouped as "
                               f"[..., {groups}, {inner}, {hd}] and cut into q {picked[0]}, k {picked[1]}, "
                               f"v {picked[2]} of each group, not the group's query heads, then a key, then a value")
        return groups * (inner - 2) * hd, groups * hd, "per-group"

    def _heads_picked(self, tensor: str, path: set[int], n: int, axis: int = 2) -> list[int] | None:
        """The heads (indices on the second-to-last axis of ``tensor``, ``axis`` of a 4-D or 5-D shape, ``n``
        of them) that the node of ``path`` consuming it selects: a Slice on that axis, or a GatherND of
        constant indices after a Transpose that brings the axis first; None when no such node is found."""
        g = self.g
        for i in g.consumers.get(tensor, ()):
            node = g.nodes[i]
            if i not in path:
                continue
            if node.op_type == "Slice":
                found = slice_bounds(g, node, (-2, axis))
                return list(range(n))[slice(*found[:2])] if found is not None and found[2] == 1 else None
            if node.op_type == "Gather" and attr(node, "axis", 0) in (-2, axis):  # the TorchScript form of x[..., [i], :]
                index = g.const(node.input[1])
                if index is None or index.ndim > 1 or not ((-n <= index) & (index < n)).all():
                    return None  # an index past the heads is an error in onnx, never read as wrapped
                return [int(x) % n for x in index.reshape(-1)]
            if node.op_type == "Transpose" and (attr(node, "perm") or [None])[0] == axis:
                for j in g.consumers.get(node.output[0], ()):
                    gather = g.nodes[j]
                    index = g.const(gather.input[1]) if gather.op_type == "GatherND" and j in path else None
                    if index is not None and index.ndim == 2 and index.shape[1] == 1:
                        return [int(x) % n for x in index.reshape(-1)]
        return None

    def _per_head_select(self, p: Projection, core: Core) -> int | None:
        """The head size of a fused qkv reshaped to ``[..., heads, 3, head_dim]`` whose q, k and v are
        elements 0, 1 and 2 of the second-to-last axis (Bloom's ``query_key_value``, head by head as NeoX's);
        None for any other layout."""
        g = self.g
        paths = [set(self._path(p, t)) for t in (core.q_in, core.k_in, core.v_in)]
        for i in sorted(paths[0]):
            node = g.nodes[i]
            heads, three, hd = g.tail_ints(node.input[1], 3) if node.op_type == "Reshape" else (None, None, None)
            if three != 3 or not heads or not hd or heads * 3 * hd != p.out_features:
                continue
            picked = []
            for path in paths:
                uses = [g.nodes[j] for j in g.consumers.get(node.output[0], ()) if j in path]
                index = g.const(uses[0].input[1]) if len(uses) == 1 and uses[0].op_type == "Gather" else None
                axis_ok = len(uses) == 1 and attr(uses[0], "axis", 0) in (-2, 3)
                picked.append(int(index.reshape(-1)[0]) if index is not None and index.size == 1 and axis_ok else None)
            if picked != [0, 1, 2]:
                raise PatternError(f"unsupported fused qkv at node {node.name or i}: reshaped to [..., {heads}, 3, "
                                   f"{hd}], its query, key and value take {picked} of the 3, not 0, 1, 2")
            return hd
        return None

    def _fused_split(self, p: Projection, core: Core) -> tuple[int, int]:
        """(q size, k size) of a fused qkv projection, from its Split (or Slices)."""
        g = self.g
        path_q, path_k = set(self._path(p, core.q_in)), set(self._path(p, core.k_in))
        for i in sorted(path_q):
            node = g.nodes[i]
            if node.op_type != "Split" or len(node.output) != 3:
                continue
            qi, ki = self._output_for(node, path_q, core.q_in), self._output_for(node, path_k, core.k_in)
            sizes = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else attr(node, "split")
            if sizes is not None and len(sizes) == 3 and qi is not None and ki is not None:
                sizes = [int(s) for s in list(sizes)]
                return sizes[qi], sizes[ki]
            break
        q_len, k_len = (self._slice_len(path, p.out_features) for path in (path_q, path_k))
        if q_len and k_len:
            return q_len, k_len
        if p.out_features % 3:
            raise PatternError(f"fused qkv projection of {p.out_features} outputs does not split evenly in three")
        return p.out_features // 3, p.out_features // 3

    def _output_for(self, node, path: set[int], target: str) -> int | None:
        """Which output of ``node`` is ``target`` or feeds a node of ``path``."""
        for j, out in enumerate(node.output):
            if out == target or any(c in path for c in self.g.consumers.get(out, ())):
                return j
        return None

    def _slice_len(self, path: set[int], size: int) -> int | None:
        for i in sorted(path):
            node = self.g.nodes[i]
            if node.op_type == "Slice" and len(node.input) >= 3:
                start, end = self.g.const(node.input[1]), self.g.const(node.input[2])
                if start is not None and end is not None and start.size == 1 and end.size == 1:
                    lo, hi = int(start.reshape(-1)[0]), min(int(end.reshape(-1)[0]), size)
                    if 0 <= lo < hi:
                        return hi - lo
        return None
