"""Graph IR of a decoder-only transformer with optional LoRA adapters.

A :class:`Model` is a tuple of :class:`DecoderLayer` plus embeddings, final
norm and LM head. Every value is a small frozen dataclass, so models are
hashable, comparable and safe to share between passes. Shapes follow the
``y = x @ W`` convention: a :class:`Linear` maps ``in_features`` to
``out_features`` whatever layout the exporter used for W.

Parameter counts follow the Hugging Face convention (embeddings, norms and
biases included; a tied LM head is counted once), so they can be compared
with published model sizes.

Size limits (:data:`SIZE_LIMITS`) are checked when a :class:`Model` is built,
so every front end (ONNX files, built-in architectures, ``--lora``) passes
through them before any pass allocates anything; a model over a limit is an
:class:`~primal_compiler.errors.InputError` that names the limit. Each limit
is several times the largest published dense decoder (Llama-3.1-405B: hidden
16,384, FFN 53,248, 128 heads, 126 layers, 4.06e11 parameters; Gemma 3:
vocabulary 262,144), and the parameter limit keeps ``primal inspect`` within
about 15 s and 1.2 GB (Llama-2-70B: 1.8 s, 0.26 GB). ``docs/frontend.md``
lists them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

from primal_compiler.errors import InputError
from primal_compiler.ir.precision import Precision
from primal_compiler.ir.quant import WeightQuant

#: The largest value each size may take.
SIZE_LIMITS: dict[str, int] = {
    "decoder layers": 1024,
    "hidden size": 1 << 16,  # 65,536
    "projection width": 1 << 18,  # 262,144: in or out features of any projection (FFN width, fused qkv), a head size
    "attention heads": 1024,  # query or key/value heads
    "vocabulary": 1 << 21,  # 2,097,152
    "positions": 1 << 24,  # 16,777,216: max_position_embeddings, rows of a learned position table
    "parameters": 1 << 39,  # 5.5e11, base and LoRA together
}


def check_size(where: str, what: str, value: int) -> None:
    """Raise ``InputError(where, ...)`` naming the limit when ``value`` is over ``SIZE_LIMITS[what]``."""
    limit = SIZE_LIMITS[what]
    if value > limit:
        raise InputError(where, f"{what} {value:,} is over the limit of {limit:,} (docs/frontend.md)")


class Role(StrEnum):
    """What a weight matrix does in a decoder layer (or around it)."""

    Q = "q"
    K = "k"
    V = "v"
    QKV = "qkv"  # fused query/key/value projection (GPT-2 Conv1D)
    O = "o"
    GATE = "gate"
    UP = "up"
    DOWN = "down"
    FC1 = "fc1"
    FC2 = "fc2"
    EMBED = "embed"
    POS_EMBED = "pos_embed"
    LM_HEAD = "lm_head"


ATTENTION_ROLES = (Role.Q, Role.K, Role.V, Role.QKV, Role.O)
MLP_ROLES = (Role.GATE, Role.UP, Role.DOWN, Role.FC1, Role.FC2)


class NormKind(StrEnum):
    RMS = "rmsnorm"  # weight only
    LAYER = "layernorm"  # weight and bias


NORM_STATISTICS = {NormKind.RMS: 1, NormKind.LAYER: 2}
"""Sums a norm needs over its vector's elements: an RMSNorm the sum of squares, a LayerNorm the sum too (so a
norm cut into shards gathers that many values per vector)."""


class Activation(StrEnum):
    """The MLP activation; with GATE and UP it gates: ``act(x @ W_gate) * (x @ W_up)`` (SwiGLU, GeGLU)."""

    SILU = "silu"
    GELU = "gelu"  # erf form
    GELU_NEW = "gelu_new"  # tanh approximation (gelu_pytorch_tanh)
    RELU = "relu"
    RELU_SQUARED = "relu_squared"  # relu(x)^2 (Nemotron, Primer)


class Positional(StrEnum):
    ROPE = "rope"
    LEARNED = "learned"
    ALIBI = "alibi"  # a per-head linear bias slope_h * (key position) added to the attention scores (Bloom)


@dataclass(frozen=True)
class LoRA:
    """A low-rank adapter ``delta W = (alpha / rank) * A @ B`` on one projection.

    A is ``in_features x rank`` and B is ``rank x out_features``. ``dora``: weight-decomposed LoRA (DoRA),
    whose output ``x (W + delta W)`` is then scaled per output column by ``m / ||W + delta W||`` (the learned
    magnitude over the column's norm), before any bias.
    """

    rank: int
    alpha: float
    dora: bool = False

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def params(self, in_features: int, out_features: int) -> int:
        return self.rank * (in_features + out_features) + (out_features if self.dora else 0)


@dataclass(frozen=True)
class Linear:
    """One projection ``y = x @ W (+ b)`` with an optional unmerged LoRA adapter."""

    role: Role
    in_features: int
    out_features: int
    bias: bool = False
    lora: LoRA | None = None

    def __post_init__(self) -> None:
        if self.in_features < 1 or self.out_features < 1:
            raise ValueError(f"{self.role}: shape must be positive, got {self.in_features}x{self.out_features}")

    @property
    def base_params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)

    @property
    def lora_params(self) -> int:
        return 0 if self.lora is None else self.lora.params(self.in_features, self.out_features)


@dataclass(frozen=True)
class Attention:
    """Attention geometry; ``num_kv_heads < num_heads`` is grouped-query attention."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if min(self.num_heads, self.num_kv_heads, self.head_dim) < 1:
            raise ValueError("attention heads and head_dim must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class DecoderLayer:
    """One transformer block: attention projections, MLP projections, two norms.

    ``parallel``: attention and MLP both read the layer input, ``x + attn(n1(x)) + mlp(n2(x))`` (GPT-J,
    GPT-NeoX, Falcon, Phi-2), with ``num_norms`` 1 when they share the attention's norm; otherwise the
    MLP reads ``n2(x + attn(n1(x)))``. ``rope`` False: a positionless (NoPE) layer of a RoPE model, whose
    queries and keys enter attention unrotated. ``post_norms``: sandwich norms (Gemma 2, 3), the attention's
    and the MLP's outputs normed again before their residual adds, ``h + n3(attn(n1(h)))`` (``num_norms`` 4).
    ``window``: sliding-window attention, each query sees only the last ``window`` keys, its own included
    (Mistral v0.1, Gemma 2); 0 every earlier key. ``qk_norm``: every query and key head RMS-normalised, with
    one ``head_dim`` weight for q and one for k, before RoPE (Qwen3, Gemma 3).
    """

    index: int
    attention: Attention
    linears: tuple[Linear, ...]
    norm: NormKind
    activation: Activation
    num_norms: int = 2
    parallel: bool = False
    rope: bool = True
    post_norms: bool = False
    window: int = 0
    qk_norm: bool = False

    def __post_init__(self) -> None:
        if self.window < 0:
            raise ValueError(f"layer {self.index}: window must be >= 0, got {self.window}")
        if self.post_norms and (self.parallel or self.num_norms != 4):
            raise ValueError(f"layer {self.index}: sandwich norms need a sequential block of 4 norms")

    def linear(self, role: Role) -> Linear | None:
        for lin in self.linears:
            if lin.role == role:
                return lin
        return None

    def base_params(self, hidden_size: int) -> int:
        return (sum(lin.base_params for lin in self.linears) + self.num_norms * _norm_params(self.norm, hidden_size)
                + 2 * self.attention.head_dim * self.qk_norm)

    @property
    def lora_params(self) -> int:
        return sum(lin.lora_params for lin in self.linears)


def _norm_params(kind: NormKind, hidden_size: int) -> int:
    return hidden_size * (2 if kind == NormKind.LAYER else 1)


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer: the unit every pass and the executor consume."""

    name: str
    hidden_size: int
    vocab_size: int
    layers: tuple[DecoderLayer, ...]
    positional: Positional
    norm: NormKind
    tie_word_embeddings: bool
    max_position_embeddings: int = 0
    num_pos_embeddings: int = 0  # rows of a learned position table (OPT adds an offset of 2)
    lm_head_bias: bool = False
    precision: Precision = field(default_factory=Precision)
    source: str = "builtin"
    norm_eps: float = 1e-5  # epsilon of every norm (Hugging Face configs use one value per model)
    rope_theta: float = 10000.0  # RoPE base: frequency i of a head is rope_theta ** (-2i / head_dim)
    # RoPE frequencies as the file holds them (head_dim / 2 values, any scaling scheme); when set they are
    # the frequencies and rope_theta is only informative
    rope_inv_freq: tuple[float, ...] = ()
    embed_scale: float = 1.0  # token embeddings are multiplied by it before the first layer (Gemma: sqrt(hidden))
    weight_quant: tuple[WeightQuant, ...] = ()  # the file's own weight quantization, one entry per format
    rope_dim: int = 0  # dimensions of each head that RoPE rotates (the first ones); 0 = the whole head
    # "per-head": a fused qkv weight's columns run head by head, [q_h | k_h | v_h] (GPT-NeoX); "per-group":
    # kv group by group, [its query heads | k_j | v_j] (Falcon's new decoder architecture); the IR's
    # QKV is q | k | v, and the functional replay puts the file's columns in that order. "": q | k | v already
    qkv_layout: str = ""
    # RoPE rotates adjacent pairs (2i, 2i + 1) of each head (GPT-J's rotate_every_two); False: dimension i
    # with i + rot / 2 (rotate_half). The crossbars store pairs adjacent either way (``ir.columns``)
    rope_interleaved: bool = False
    rope_attention_scale: float = 1.0  # both RoPE tables are multiplied by it (YaRN's attention factor)
    alibi_slopes: tuple[float, ...] = ()  # ALiBi: one slope per query head, as the file computes them
    embed_norm: bool = False  # the token embeddings pass a norm of the model's kind before the first layer (Bloom)
    norm_bias: bool = True  # LayerNorms add a bias (False: scale only, MPT); RMSNorm never has one
    # False: the norms learn nothing, their scale one constant of ones the graph shares (OLMo's non-parametric
    # LayerNorm), so they count no parameters
    norm_weights: bool = True
    # The logits are multiplied by logit_scale (Cohere, Granite), then soft-capped, cap * tanh(x / cap), when
    # logit_softcap > 0 (Gemma 2): the controller's ACT LOGIT_CAP before its ARGMAX
    logit_scale: float = 1.0
    logit_softcap: float = 0.0
    attention_scale: float = 0.0  # attention scores' scale (Gemma's query_pre_attn_scalar ** -0.5); 0: 1/sqrt(head_dim)
    attn_softcap: float = 0.0  # scaled scores soft-capped, cap * tanh(s / cap), before the softmax (Gemma 2); 0: none
    residual_multiplier: float = 1.0  # every attention and MLP output times it before its residual add (Granite)
    qkv_clip: float = 0.0  # queries, keys and values clamped to [-clip, clip] after their projection (OLMo); 0: none
    # activation tensors the file rounds to int8 at calibrated scales (static QDQ); the replay keeps them in float
    static_activations: int = 0

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(f"model {self.name!r} has no decoder layers")
        if self.hidden_size < 1 or self.vocab_size < 1:
            raise ValueError(f"model {self.name!r}: hidden_size and vocab_size must be positive")
        if not (self.norm_eps > 0 and self.rope_theta > 1):
            raise ValueError(f"model {self.name!r}: norm_eps must be > 0 and rope_theta > 1")
        object.__setattr__(self, "rope_inv_freq", tuple(float(f) for f in self.rope_inv_freq))  # JSON gives a list
        if self.qkv_layout not in ("", "per-head", "per-group"):
            raise ValueError(f"model {self.name!r}: qkv_layout must be '', 'per-head' or 'per-group', "
                             f"got {self.qkv_layout!r}")
        head_dim = self.layers[0].attention.head_dim
        if self.rope_dim and (self.rope_dim % 2 or not 0 < self.rope_dim <= head_dim):
            raise ValueError(f"model {self.name!r}: rope_dim must be even and in 2..head_dim {head_dim}, "
                             f"got {self.rope_dim}")
        half = (self.rope_dim or head_dim) // 2
        if self.rope_inv_freq and (len(self.rope_inv_freq) != half
                                   or not all(math.isfinite(f) and f >= 0 for f in self.rope_inv_freq)):
            raise ValueError(f"model {self.name!r}: rope_inv_freq must hold {half} finite frequencies >= 0")
        object.__setattr__(self, "alibi_slopes", tuple(float(f) for f in self.alibi_slopes))
        heads = self.layers[0].attention.num_heads
        if (self.positional == Positional.ALIBI) != bool(self.alibi_slopes) or self.alibi_slopes and (
                len(self.alibi_slopes) != heads or not all(math.isfinite(f) for f in self.alibi_slopes)):
            raise ValueError(f"model {self.name!r}: ALiBi positions need {heads} finite alibi_slopes, and only they")
        for key, least in (("rope_attention_scale", 0.0), ("embed_scale", 0.0), ("logit_scale", 0.0),
                           ("logit_softcap", -1.0), ("attention_scale", -1.0), ("attn_softcap", -1.0),
                           ("residual_multiplier", 0.0), ("qkv_clip", -1.0)):
            value = float(getattr(self, key))  # scales positive, caps (and the attention scale, 0: the default) >= 0
            object.__setattr__(self, key, value)  # a plain float, as a program file's meta stores it (not numpy's)
            if not (math.isfinite(value) and value > least and value >= 0):
                raise ValueError(f"model {self.name!r}: {key} must be finite and {'>' if least == 0 else '>='} 0, "
                                 f"got {value}")
        self._check_sizes()

    def _check_sizes(self) -> None:
        """Every size against :data:`SIZE_LIMITS` (an ``InputError`` where the model's name is ``where``)."""
        where = f"model {self.name}"
        check_size(where, "decoder layers", len(self.layers))
        check_size(where, "hidden size", self.hidden_size)
        check_size(where, "vocabulary", self.vocab_size)
        check_size(where, "positions", max(self.max_position_embeddings, self.num_pos_embeddings))
        for layer in self.layers:
            att = layer.attention
            check_size(where, "attention heads", max(att.num_heads, att.num_kv_heads))
            check_size(where, "projection width", att.head_dim)
            for lin in layer.linears:
                check_size(where, "projection width", max(lin.in_features, lin.out_features))
        check_size(where, "parameters", self.base_params + self.lora_params)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def attention(self) -> Attention:
        return self.layers[0].attention

    @property
    def intermediate_size(self) -> int:
        for role in (Role.UP, Role.FC1):
            lin = self.layers[0].linear(role)
            if lin is not None:
                return lin.out_features
        raise ValueError(f"model {self.name!r} has no MLP up-projection")

    @property
    def embed_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def pos_embed_params(self) -> int:
        return self.num_pos_embeddings * self.hidden_size if self.positional == Positional.LEARNED else 0

    @property
    def lm_head_params(self) -> int:
        weight = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return weight + (self.vocab_size if self.lm_head_bias else 0)

    @property
    def base_params(self) -> int:
        return (
            self.embed_params
            + self.pos_embed_params
            + sum(layer.base_params(self.hidden_size) for layer in self.layers)
            + _norm_params(self.norm, self.hidden_size) * (2 if self.embed_norm else 1)
            - self._unbiased_norms * self.hidden_size
            + self.lm_head_params
            - (0 if self.norm_weights else self._norm_params_total)
        )

    @property
    def _norm_params_total(self) -> int:
        """Parameters of every norm of the hidden size (the layers', the final and an embedding norm)."""
        h = self.hidden_size
        return (sum(x.num_norms * _norm_params(x.norm, h) for x in self.layers)
                + _norm_params(self.norm, h) * (2 if self.embed_norm else 1) - self._unbiased_norms * h)

    @property
    def _unbiased_norms(self) -> int:
        """LayerNorms counted with a bias by ``_norm_params`` that have none (``norm_bias`` False)."""
        if self.norm_bias:
            return 0
        return sum(x.num_norms for x in self.layers if x.norm == NormKind.LAYER) + (
            (1 + self.embed_norm) if self.norm == NormKind.LAYER else 0)

    @property
    def lora_params(self) -> int:
        return sum(layer.lora_params for layer in self.layers)

    @property
    def score_scale(self) -> float:
        """What attention scores are multiplied by: ``attention_scale``, or 1/sqrt(head_dim) when it is 0."""
        return self.attention_scale or 1.0 / math.sqrt(self.layers[0].attention.head_dim)

    @property
    def lora_targets(self) -> tuple[Role, ...]:
        seen: dict[Role, None] = {}
        for layer in self.layers:
            for lin in layer.linears:
                if lin.lora is not None:
                    seen[lin.role] = None
        return tuple(seen)

    def with_precision(self, precision: Precision) -> Model:
        return replace(self, precision=precision)
