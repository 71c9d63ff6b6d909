"""State of the replayed accelerator: scratchpad buffers, KV slots, SRAM slots, crossbars, controller.

Buffers are float32 arrays of token vectors (``V x E``) keyed by
``(ct, pe, buffer tag)``; the controller is ``(CONTROLLER, 0)``. They are
transient: every buffer is dropped when a prefill or decode step ends (its
ARGMAX), so reading a buffer no earlier record of the step wrote is an
error, and elements of a buffer no write reached are NaN. Persistent state
is what the hardware keeps between steps: KV chunks in the scratchpads
(values and the position each token slot holds), SRAM slots written by
CONFIG, mask registers, power states, the crossbars (the tiles placed on
each PE, prepared once in the chosen precision) and the controller's
position counter (the NMC's ring pointer) and last token.

Built with ``producers=True``, the machine also keeps a
:class:`~primal_compiler.functional.provenance.Provenance` (``log``): which
record last wrote every element of that state, and the (consumer, producer)
pairs of what every record consumed: the elements a handler names when it
reads a buffer (:meth:`Machine.read`), and the KV rows and persistent state
it reports with :meth:`Machine.used_kv` and :meth:`Machine.used_state`.
Without it the replay keeps none of this.

Every problem is an :class:`InputError` naming the record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.functional import ops
from primal_compiler.functional.params import Params
from primal_compiler.functional.precision import Crossbar, Numerics, SramTile
from primal_compiler.functional.provenance import Provenance
from primal_compiler.ir.model import Role
from primal_compiler.ir.tiles import ROLE_CODES, Macro, Part
from primal_compiler.isa.opcodes import CONTROLLER, NONE16, BufKind, Opcode, buf_name
from primal_compiler.mapping.lower import geometry

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget

CTL = (CONTROLLER, 0)
ALL = slice(None)
OP, FLAGS, CT, PE, DST_CT, DST_PE, LAYER, SRC_BUF, DST_BUF, GROUP, COUNT, NBYTES, ARG = range(13)


class Machine:
    """One replay: the program, its parameters in one precision, and the evolving state."""

    def __init__(self, program: Program, target: PrimalTarget, params: Params, numerics: Numerics, where: str,
                 producers: bool = False) -> None:
        self.program, self.model, self.kv, self.params, self.num = program, program.model, program.need_kv(), params, numerics
        self.where = where
        self.geo = geometry(program.model, target)
        stream = program.need_stream()
        self.group_ptr = stream.group_ptr.tolist()
        self.group_ct = stream.group_ct.tolist()
        self.group_pe = stream.group_pe.tolist()
        t = program.need_tiles()
        rram = np.flatnonzero(t.macro == Macro.RRAM)
        sram = np.flatnonzero(t.macro == Macro.SRAM)
        self.rram_at = dict(zip(zip(t.ct[rram].tolist(), t.pe[rram].tolist()), rram.tolist()))
        self.sram_at = dict(zip(zip(t.ct[t.host[sram]].tolist(), t.pe[sram].tolist()), sram.tolist()))
        self.unit_at = self._units()
        self.crossbars: dict[int, Crossbar] = {}
        self.buffers: dict[tuple[int, int, int], np.ndarray] = {}
        self.kv_slots: dict[tuple[int, int, int], list] = {}  # (ct, pe, slot) -> [values, positions, chunk]
        self.sram: dict[tuple[int, int, int], SramTile] = {}
        self.mask: dict[tuple[int, int], int] = {}
        self.gated: set[int] = set()
        self.record: tuple = ()
        self.index = -1
        self.log = Provenance(len(stream.records)) if producers else None
        # controller (NMC)
        self.prompt: list[int] = []
        self.token: dict[int, int] = {}  # per sequence of the batch, the token its last ARGMAX picked
        self.next_position: dict[int, int] = {}  # per sequence, the position of its next token
        self.position = 0  # position of the first token of the current step
        self.tokens = 0  # tokens of the current step
        self.prefilled = 0  # prompt tokens the current prefill's chunks embedded so far
        self.steps = 0  # steps finished (ARGMAX records executed)
        self.request_step: dict[int, int] = {}  # per sequence, steps finished in its current request
        self.forced: list[int] = []  # force[k] replaces the token step k generated (teacher forcing)
        self.logits: list[np.ndarray] = []  # every ARGMAX's logits, in order
        self.logit_seq: list[int] = []  # the sequence each of them belongs to
        self.embed = numerics.table(params.embed)
        self.pos_embed = None if params.pos_embed is None else numerics.table(params.pos_embed)
        if self.model.rope_inv_freq:  # the file's own frequencies (any scaling scheme)
            self.inv_freq = np.array(self.model.rope_inv_freq, np.float32)
        else:
            self.inv_freq = ops.inverse_frequencies(self.model.rope_theta, self.model.attention.head_dim)

    def _units(self) -> dict[tuple[int, int, int], tuple[int, int, int]]:
        """(ct, pe, slot) -> (layer, chunk, kind) of every KV unit."""
        kv = self.kv
        per_chunk = kv.batch * kv.kv_heads * 2
        layer, unit = kv.unit_layers()
        keys = zip(kv.ct.tolist(), kv.pe.tolist(), kv.slot.tolist())
        return dict(zip(keys, zip(layer.tolist(), (unit // per_chunk).tolist(), (unit % 2).tolist())))

    # --- errors --------------------------------------------------------------------------------
    def fail(self, problem: str) -> InputError:
        r = self.record
        ct = "ctl" if r[CT] == CONTROLLER else r[CT]
        return InputError(self.where, f"record {self.index} ({Opcode(r[OP]).name} ct={ct} pe={r[PE]}): {problem}")

    # --- buffers -------------------------------------------------------------------------------
    def read(self, pos: tuple[int, int], tag: int, rows: slice | np.ndarray = ALL, cols: slice = ALL) -> np.ndarray:
        """The whole buffer ``tag`` at ``pos``, of which the record consumes ``[rows, cols]`` (the log's pairs)."""
        key = (pos[0], pos[1], tag)
        value = self.buffers.get(key)
        if value is None:
            where = "the controller" if pos[0] == CONTROLLER else f"ct={pos[0]} pe={pos[1]}"
            raise self.fail(f"reads {buf_name(tag)} at {where}, which no earlier record of this step wrote")
        if self.log is not None:
            self.log.consumed(self.index, self.log.buffers[key][rows, cols])
        return value

    def write(self, pos: tuple[int, int], tag: int, data: np.ndarray, offset: int = 0) -> None:
        """Write ``data`` (V x E) at element ``offset``; a buffer holding another number of vectors is replaced."""
        key = (pos[0], pos[1], tag)
        old = self.buffers.get(key)
        width = offset + data.shape[1]
        kept = old is not None and old.shape[0] == data.shape[0]
        if old is None or not kept:
            new = np.full((data.shape[0], width), np.nan, np.float32)
        elif old.shape[1] < width:
            new = np.full((data.shape[0], width), np.nan, np.float32)
            new[:, : old.shape[1]] = old
        else:
            new = old.copy()
        new[:, offset:width] = data
        self.buffers[key] = new
        if self.log is not None:
            self.log.wrote(key, new.shape, kept, offset, width, self.index)

    def used_state(self, *keys: tuple[int | str, ...]) -> None:
        """The record consumes persistent state held under ``keys`` (see :mod:`.provenance`)."""
        if self.log is not None:
            self.log.consumed(self.index, self.log.latest(*keys))

    def wrote_state(self, *keys: tuple[int | str, ...]) -> None:
        """The record writes the persistent state held under ``keys``."""
        if self.log is not None:
            for k in keys:
                self.log.state[k] = self.index

    def end_step(self) -> None:
        self.buffers.clear()
        if self.log is not None:
            self.log.buffers.clear()

    def members(self, group: int) -> list[tuple[int, int]]:
        lo, hi = self.group_ptr[group], self.group_ptr[group + 1]
        return [(c, p if c != CONTROLLER else 0) for c, p in zip(self.group_ct[lo:hi], self.group_pe[lo:hi])]

    def check_awake(self) -> None:
        """No record may use a gated CT (issuer, destination or group member)."""
        r = self.record
        if r[OP] == Opcode.PG_ON:
            return
        cts = [r[CT], r[DST_CT]]
        if r[OP] in (Opcode.BCAST, Opcode.REDUCE):
            cts += [m[0] for m in self.members(r[GROUP])]
        for ct in cts:
            if ct in self.gated and ct not in (CONTROLLER, NONE16):
                raise self.fail(f"uses CT {ct} while it is power-gated")

    # --- macros --------------------------------------------------------------------------------
    def crossbar(self, pos: tuple[int, int]) -> tuple[int, Crossbar]:
        """(tile row, crossbar) of the RRAM tile placed at ``pos``."""
        row = self.rram_at.get(pos)
        if row is None:
            raise self.fail("no RRAM tile is placed on this PE")
        xbar = self.crossbars.get(row)
        if xbar is None:
            t, (R, C) = self.program.need_tiles(), (self.geo.rram_rows, self.geo.rram_cols)
            layer, role = int(t.layer[row]), ROLE_CODES[t.role[row]]
            i, j = int(t.brow[row]), int(t.bcol[row])
            rows, cols = slice(i * R, i * R + t.rows[row]), slice(j * C, j * C + t.cols[row])
            block = self.params.w[(layer, role)][rows, cols]
            stored = self.params.stored.get((layer, role))
            stored = None if stored is None else (stored[0][rows, cols], stored[1][rows, cols])
            bits = self.geo.lm_head_bits if role == Role.LM_HEAD else self.geo.base_bits
            xbar = self.crossbars[row] = self.num.crossbar(block, bits, int(t.slice[row]), stored, pos[0])
        return row, xbar

    def sram_block(self, pos: tuple[int, int], adapter: int = 0) -> tuple[int, SramTile]:
        """(tile row, SRAM contents) of ``adapter``'s LoRA tile hosted at ``pos``, as a CONFIG writes it."""
        row = self.sram_at.get(pos)
        if row is None:
            raise self.fail("no LoRA tile is hosted on this PE")
        if adapter >= len(self.params.lora):
            given = len(self.params.lora)
            raise self.fail(f"loads adapter {adapter}, but the replay was given {given} adapter"
                            f"{'s' if given != 1 else ''} (one --adapter directory per adapter id, in order)")
        a, b = self.params.lora[adapter]
        t, SR, W = self.program.need_tiles(), self.geo.sram_rows, self.geo.lora_width
        key = (int(t.layer[row]), ROLE_CODES[t.role[row]])
        i, k = int(t.brow[row]), int(t.bcol[row])
        matrix = a[key] if t.part[row] == Part.LORA_A else b[key].T  # B stored out x r
        block = matrix[i * SR : i * SR + t.rows[row], k * W : k * W + t.cols[row]]
        return row, self.num.sram_tile(block if t.part[row] == Part.LORA_A else block.T, self.geo.lora_bits)

    def tile_slice(self, pos: tuple[int, int]) -> int:
        row = self.rram_at.get(pos)
        if row is None:
            raise self.fail(f"group member ct={pos[0]} pe={pos[1]} holds no RRAM tile")
        return int(self.program.need_tiles().slice[row])

    # --- KV scratchpad -------------------------------------------------------------------------
    def kv_slot(self, pos: tuple[int, int], slot: int, kind: int, layer: int) -> list:
        key = (pos[0], pos[1], slot)
        unit = self.unit_at.get(key)
        name = "K" if kind == 0 else "V"
        if unit is None:
            raise self.fail(f"KV slot {slot} at ct={pos[0]} pe={pos[1]} belongs to no KV unit")
        if unit[0] != layer or unit[2] != kind:
            held = f"a {'KV'[unit[2]]} chunk of layer {unit[0]}"
            raise self.fail(f"KV slot {slot} holds {held}, not {name} of layer {layer}")
        entry = self.kv_slots.get(key)
        if entry is None:
            hd = self.kv.head_dim
            entry = self.kv_slots[key] = [np.zeros((self.kv.chunk_tokens, hd), np.float32),
                                          np.full(self.kv.chunk_tokens, -1, np.int64), unit[1]]
        return entry

    def used_kv(self, pos: tuple[int, int], slot: int, rows: np.ndarray) -> None:
        """The record consumes token rows ``rows`` (indices or a mask) of the KV chunk in ``slot``."""
        if self.log is not None:
            self.log.consumed(self.index, self.log.kv_rows((pos[0], pos[1], slot), self.kv.chunk_tokens)[rows])

    def wrote_kv(self, pos: tuple[int, int], slot: int, rows: slice) -> None:
        """The record writes token rows ``rows`` of the KV chunk in ``slot``."""
        if self.log is not None:
            self.log.kv_rows((pos[0], pos[1], slot), self.kv.chunk_tokens)[rows] = self.index

    def step_positions(self) -> np.ndarray:
        return self.position + np.arange(self.tokens)


def root_block(machine: Machine, tag: int) -> tuple[Role, int]:
    """(role, first output element) of the column block a ROOT buffer holds."""
    if tag >> 12 != BufKind.ROOT:
        raise machine.fail(f"{buf_name(tag)} is not a root buffer")
    return ROLE_CODES[(tag & 0xFFF) >> 8], (tag & 0xFF) * machine.geo.rram_cols
