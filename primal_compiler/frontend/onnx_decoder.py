"""Recognise decoder layers in an ONNX graph from data flow and shapes alone.

The steps (initializer and node names are never looked at):

1. projections: weight matmuls with their biases and LoRA pairs (``onnx_project``);
2. attention cores: a Softmax between a score MatMul (``q @ k^T``) and a
   value MatMul (``p @ v``), or a fused attention op (ONNX ``Attention``,
   com.microsoft ``MultiHeadAttention``/``GroupQueryAttention``); the
   projections that feed the score's left and right inputs and the value
   input are q, k, v (one projection feeding all three is a fused qkv), the
   projection the core's output feeds is o;
3. MLP: a projection that depends on a layer's o (through the residual and
   the norm) is an MLP input (fc1, or gate/up when two share the input: gate
   is the one passing alone through the activation); the projection that
   depends only on those is the MLP output (fc2/down);
4. geometry: head_dim is the last entry of the Reshape that splits q into
   heads; num_heads = q size / head_dim, kv heads = k size / head_dim;
5. norms from the ops between the residual stream and the projections,
   activation from the ops between the MLP input and output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from primal_compiler.frontend.onnx_graph import SHAPE_OPS, TRANSPARENT, GraphIndex, PatternError, attr
from primal_compiler.frontend.onnx_heads import Core, HeadGeometry
from primal_compiler.frontend.onnx_project import Projection
from primal_compiler.ir.model import Activation, NormKind, Role

FUSED_ATTENTION = {("", "Attention"), ("com.microsoft", "MultiHeadAttention"), ("com.microsoft", "GroupQueryAttention")}
UNSUPPORTED_ATTENTION = {
    ("com.microsoft", op)
    for op in (
        "Attention",
        "QAttention",
        "PackedAttention",
        "PackedMultiHeadAttention",
        "LongformerAttention",
        "DecoderAttention",
        "PagedAttention",
    )
}
ACTIVATION_OPS = {
    "Sigmoid",
    "Tanh",
    "Erf",
    "Relu",
    "Gelu",
    "FastGelu",
    "BiasGelu",
    "QuickGelu",
    "HardSigmoid",
    "Softplus",
    "Elu",
    "LeakyRelu",
    "HardSwish",
    "Mish",
}


@dataclass
class Layer:
    core: Core
    attn: list[Projection]  # q,k,v or qkv
    o: Projection
    mlp_in: list[Projection]
    mlp_out: Projection | None = None
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    norm: NormKind | None = None
    num_norms: int = 0
    activation: Activation | None = None
    parallel: bool = False  # the MLP reads the layer input, as the attention does
    post_norms: bool = False  # sandwich norms: each branch normed again before its residual add (Gemma 2)
    qk_norm: bool = False  # every query and key head RMS-normalised before RoPE (Qwen3)
    # a fused qkv's column order (``Model.qkv_layout``): "per-head" [q_h | k_h | v_h] (GPT-NeoX, Bloom),
    # "per-group" [q heads of group j | k_j | v_j] (Falcon's new decoder architecture), "" q | k | v
    qkv_layout: str = ""

    @property
    def projections(self) -> list[Projection]:
        return [*self.attn, self.o, *self.mlp_in, *([self.mlp_out] if self.mlp_out is not None else [])]

    def recognised(self) -> tuple[Projection, NormKind, Activation]:
        """Its MLP output projection, norm and activation; PatternError naming the first recognition left
        unset."""
        if self.mlp_out is None or self.norm is None or self.activation is None:
            what = "MLP output projection" if self.mlp_out is None else "norm" if self.norm is None else "activation"
            raise PatternError(f"unsupported decoder layer: no {what} found")
        return self.mlp_out, self.norm, self.activation


class Decoder(HeadGeometry):
    """Data-flow queries shared by the recognition steps."""

    def __init__(self, g: GraphIndex, projections: list[Projection]) -> None:
        self.g = g
        self.projections = projections
        self.owner: dict[int, Projection] = {}
        for p in projections:
            for n in p.nodes:
                self.owner[n] = p
        self.barriers = frozenset(self.owner)
        self._act_matmuls: set[int] | None = None

    def hits_back(self, tensor: str) -> set[int]:
        _, hit = self.g.backward([tensor], self.barriers)
        return {self.owner[n].node for n in hit}

    def hits_fwd(self, p: Projection) -> tuple[set[int], set[int]]:
        reached, hit = self.g.forward(self.g.nodes[p.node].output, self.barriers)
        return reached, {self.owner[n].node for n in hit}

    def by_node(self, node: int) -> Projection:
        return self.owner[node]

    # ---------------------------------------------------------------- attention

    def cores(self) -> list[Core]:
        g = self.g
        for node in g.nodes:
            if (node.domain or "", node.op_type) in UNSUPPORTED_ATTENTION:
                raise PatternError(
                    f"unsupported attention variant {node.domain}.{node.op_type} (weights fused into the op)"
                )
        cores: list[Core] = []
        for i, node in enumerate(g.nodes):
            key = (node.domain or "", node.op_type)
            if key in FUSED_ATTENTION:
                inputs = list(node.input) + ["", ""]
                q, k, v = inputs[0], inputs[1] or inputs[0], inputs[2] or inputs[0]
                heads = attr(node, "q_num_heads") or attr(node, "num_heads")
                kv = attr(node, "kv_num_heads") or heads
                cores.append(Core(i, q, k, v, node.output[0], heads, kv))
            elif node.op_type == "Softmax":
                core = self._softmax_core(i)
                if core is not None:
                    cores.append(core)
        return cores

    def _is_act_matmul(self, i: int) -> bool:
        node = self.g.nodes[i]
        return (
            node.op_type == "MatMul"
            and i not in self.owner
            and all(self.g.weight(x) is None and self.g.const(x) is None for x in node.input)
        )

    def _softmax_core(self, i: int) -> Core | None:
        g = self.g
        if self._act_matmuls is None:
            self._act_matmuls = {j for j in range(len(g.nodes)) if self._is_act_matmul(j)}
        act = self._act_matmuls
        reached, _ = g.backward([g.nodes[i].input[0]], self.barriers, stop=act)
        scores = sorted(reached & act)
        _, hit = g.forward(g.nodes[i].output, self.barriers | act)
        values = sorted(hit & act)
        if not scores or not values:
            return None
        s, pv = g.nodes[scores[-1]], g.nodes[values[0]]
        return Core(i, s.input[0], s.input[1], pv.input[1], pv.output[0])

    def attention_projections(self, core: Core) -> tuple[list[Projection], Projection]:
        q, k, v = (self.hits_back(t) for t in (core.q_in, core.k_in, core.v_in))
        if any(len(s) != 1 for s in (q, k, v)):
            raise PatternError(
                "unsupported attention variant: query, key and value do not each come from one projection"
            )
        qn, kn, vn = q.pop(), k.pop(), v.pop()
        _, o_hits = self.g.forward([core.out], self.barriers)
        outs = {self.owner[n].node for n in o_hits}
        if len(outs) != 1:
            raise PatternError("unsupported attention variant: the attention output does not feed one projection")
        o = self.by_node(outs.pop())
        o.role = Role.O
        if qn == kn == vn:
            qkv = self.by_node(qn)
            qkv.role = Role.QKV
            return [qkv], o
        if len({qn, kn, vn}) != 3:
            raise PatternError("unsupported attention variant: two of query, key, value share a projection")
        projs = [self.by_node(n) for n in (qn, kn, vn)]
        for p, role in zip(projs, (Role.Q, Role.K, Role.V)):
            p.role = role
        return projs, o

    # ---------------------------------------------------------------- norms and activations

    def norm_region(self, tensor: str, stops: set[int]) -> set[int]:
        """Nodes ``tensor`` depends on back to the residual stream (``stops``), projections excluded."""
        reached, _ = self.g.backward([tensor], self.barriers, stop=stops)
        return reached - stops

    def norm_before(self, tensor: str, stops: set[int]) -> NormKind | None:
        ops = {self.g.nodes[i].op_type for i in self.norm_region(tensor, stops)}
        if ops & {"LayerNormalization", "SkipLayerNormalization"}:
            return NormKind.LAYER
        if ops & {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization"}:
            return NormKind.RMS
        if "ReduceMean" in ops:
            return NormKind.LAYER if "Sub" in ops else NormKind.RMS
        return None

    def activation(self, mlp_in: list[Projection], mlp_out: Projection) -> tuple[Activation, list[Projection]]:
        """The activation and the MLP inputs ordered (gate, up) or (fc1,); roles are set.

        One input projection twice as wide as the output projection's input is a fused gate/up
        (Phi-3's ``gate_up_proj``): its output must be cut in two halves by a ``Split`` or two ``Slice``
        nodes, and it becomes two projections on column ranges of the one weight.
        """
        if len(mlp_in) == 1 and mlp_in[0].out_features == 2 * mlp_out.in_features:
            return self._fused_gate_up(mlp_in[0], mlp_out.in_features)
        if len(mlp_in) == 1:
            if mlp_in[0].out_features != mlp_out.in_features:
                raise PatternError(f"unsupported MLP: an input projection of {mlp_in[0].out_features} outputs "
                                   f"feeds an output projection of {mlp_out.in_features} inputs")
            reached, _ = self.hits_fwd(mlp_in[0])
            mlp_in[0].role = Role.FC1
            return self._activation_kind(reached), mlp_in
        if len(mlp_in) != 2:
            raise PatternError(f"unsupported MLP: {len(mlp_in)} projections share the MLP input")
        (ra, _), (rb, _) = self.hits_fwd(mlp_in[0]), self.hits_fwd(mlp_in[1])
        only_a = {i for i in ra - rb if self.g.nodes[i].op_type in ACTIVATION_OPS}
        only_b = {i for i in rb - ra if self.g.nodes[i].op_type in ACTIVATION_OPS}
        if bool(only_a) == bool(only_b):
            raise PatternError("unsupported MLP: cannot tell the gate projection from the up projection")
        gate, up, act_nodes = (mlp_in[0], mlp_in[1], ra - rb) if only_a else (mlp_in[1], mlp_in[0], rb - ra)
        gate.role, up.role = Role.GATE, Role.UP
        return self._activation_kind(act_nodes), [gate, up]

    def _fused_gate_up(self, p: Projection, width: int) -> tuple[Activation, list[Projection]]:
        g, label = self.g, g_name(self.g, p.node)
        if p.lora is not None:
            raise PatternError(f"unsupported MLP: LoRA on the fused gate/up projection at node {label}")
        halves = self.halves(p, width)
        if halves is None:
            raise PatternError(f"unsupported MLP: the {p.out_features}-wide fused gate/up projection at node "
                               f"{label} is not cut in two halves of {width} by a Split or two Slices")
        reach = [g.forward([t], self.barriers)[0] for _, t in halves]
        acts = [{i for i in reach[k] - reach[1 - k] if g.nodes[i].op_type in ACTIVATION_OPS} for k in (0, 1)]
        if bool(acts[0]) == bool(acts[1]):
            raise PatternError(f"unsupported MLP: cannot tell the gate half of node {label} from the up half")
        k = 0 if acts[0] else 1
        parts = []
        for role, (lo, _) in ((Role.GATE, halves[k]), (Role.UP, halves[1 - k])):
            parts.append(replace(p, out_features=width, role=role, split=(lo, lo + width, p.out_features)))
        return self._activation_kind(reach[k] - reach[1 - k]), parts

    def halves(self, p: Projection, width: int) -> list[tuple[int, str]] | None:
        """[(first column, tensor)] of the two halves a Split or two Slices cut ``p``'s output into."""
        g = self.g
        tensor, ops = g.nodes[p.node].output[0], []
        for _ in range(8):  # through layout ops and the bias Add
            users = [i for i in g.consumers.get(tensor, ()) if g.nodes[i].op_type not in SHAPE_OPS]
            ops = [g.nodes[i] for i in users]
            if len(ops) == 1 and (ops[0].op_type in TRANSPARENT or (ops[0].op_type == "Add" and p.bias)):
                tensor = ops[0].output[0]
                continue
            break
        if len(ops) == 1 and ops[0].op_type == "Split" and len(ops[0].output) == 2:
            node = ops[0]
            sizes = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else attr(node, "split")
            sizes = [width, width] if sizes is None else [int(x) for x in list(sizes)]
            if sizes == [width, width] and attr(node, "axis", 0) in (-1, 2):
                return [(0, node.output[0]), (width, node.output[1])]
            return None
        if len(ops) == 2 and all(n.op_type == "Slice" for n in ops):
            found = sorted(self._slice_range(n, 2 * width) or (-1, -1, "") for n in ops)
            if [r[:2] for r in found] == [(0, width), (width, 2 * width)]:
                return [(lo, t) for lo, _, t in found]
        return None

    def _slice_range(self, node, size: int) -> tuple[int, int, str] | None:
        """(start, end, output) of a unit-step Slice of the last axis with constant bounds."""
        inputs = list(node.input) + ["", "", ""]
        start, end = self.g.const(inputs[1]), self.g.const(inputs[2])
        axes, steps = self.g.const(inputs[3]) if inputs[3] else None, self.g.const(inputs[4]) if inputs[4] else None
        if start is None or end is None or start.size != 1 or end.size != 1:
            return None
        if axes is not None and int(axes.reshape(-1)[0]) not in (-1, 2):
            return None
        if steps is not None and int(steps.reshape(-1)[0]) != 1:
            return None
        lo, hi = int(start.reshape(-1)[0]), int(end.reshape(-1)[0])
        return lo, min(hi, size), node.output[0]

    def _activation_kind(self, nodes: set[int]) -> Activation:
        found = [self.g.nodes[i] for i in nodes]
        ops = {n.op_type for n in found}
        if "Sigmoid" in ops or "Swish" in ops:
            return Activation.SILU
        if "Relu" in ops:  # squared when the Relu's output is multiplied or raised (verify_activation checks it)
            return Activation.RELU_SQUARED if ops & {"Mul", "Pow"} else Activation.RELU
        for n in found:
            if n.op_type == "Gelu":
                return Activation.GELU_NEW if attr(n, "approximate", b"none") in (b"tanh", "tanh") else Activation.GELU
        if "FastGelu" in ops or "Tanh" in ops:
            return Activation.GELU_NEW
        if ops & {"Erf", "BiasGelu"}:
            return Activation.GELU
        raise PatternError(f"unsupported MLP activation (ops {', '.join(sorted(ops)) or 'none'})")


def g_name(g: GraphIndex, node: int) -> str:
    """A node's name for messages (its index when it has none)."""
    return g.nodes[node].name or f"#{node}"
