"""A deliberately simple, cycle-stepped, flit-level model of one CT's PE mesh, for the tests only.

It shares no code with ``primal_compiler.executor``: routes are found hop by
hop and time advances one cycle at a time, so it is a second opinion on the
fast executor's hop counts, zero-load latency and latency under contention.
See ``docs/refsim.md``.

The model:

* ``rows x cols`` routers, router ``y * cols + x``; one link per neighbour pair and
  direction. A packet of ``nbytes`` is ``F = ceil(nbytes * 8 / link_bits)`` flits
  (at least one). Packet ``i`` (stream order) is injected at its source at cycle
  ``i * issue_cycles`` with all its flits there. ``injection_ports``: at most that
  many packets leave one source at once (a packet holds a port from its head's
  grant until its tail has left; None: no limit); ``ejection_ports``: at most
  that many packets eject at one router at once (a packet holds a port from its
  head's grant there until its tail is ejected; None: no limit). A port is
  granted with the packet's output links there, all or nothing.
  ``run(traffic, inject)`` takes the injection cycles instead (non-decreasing).
* XY routing, hop by hop: move along x until the column matches, then along y.
  A multicast packet follows the union of the XY routes to its members: at a
  router it needs the next hops towards the members reached through it
  (replicating at branch points) and ejects there if the router is a member.
* A link carries at most one flit per cycle; a flit that leaves a router at cycle
  ``c`` is in the next router's input buffer at ``c + hop_cycles`` (router
  pipeline plus wire) and may leave it in that same cycle.
* Wormhole switching with credits: each link ends in an input buffer of
  ``buffer_flits`` flits, FIFO; a router sends a flit on a link only while the
  flits in flight on it plus those in its buffer (counted at the start of the
  cycle) are fewer than ``buffer_flits``. The head flit at the front of a buffer
  (or at its source) requests all its output links at that router; they are
  granted together when all are free (all-or-nothing, so replication is
  synchronous). Body flits follow over the granted links, one per cycle, moving
  only when every branch has credit; the tail releases the links once it has
  crossed them. ``cut_through=True``: a head is granted only when every next
  buffer has room for its whole packet (virtual cut-through).
* Arbitration, ``order="age"``: contenders present at a router are served
  oldest packet (stream order) first and a free link goes to whoever asks
  (work-conserving); multicast trees can then deadlock under wormhole (raises
  :class:`Deadlock`) but not with ``cut_through``. ``order="stream"``: the
  packets crossing a link get it strictly in stream order, each waiting until
  every earlier one has released it (the fast executor's rule, at flit level).
* A packet is delivered at a destination at the end of the cycle its tail is
  ejected there: the zero-load latency of ``H`` hops is ``H * hop_cycles + F``.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

DIRS = ((1, 0), (-1, 0), (0, 1), (0, -1))  # +x, -x, +y, -y


@dataclass
class Packet:
    src: int
    dsts: tuple[int, ...]
    flits: int
    inject: int  # cycle the packet is available at its source
    hops: dict[int, int] = field(default_factory=dict)  # destination -> links crossed
    arrive: dict[int, int] = field(default_factory=dict)  # destination -> cycle after its tail is ejected

    @property
    def done(self) -> int:
        return max(self.arrive.values())

    @property
    def latency(self) -> int:
        return self.done - self.inject


class Deadlock(RuntimeError):
    pass


@dataclass
class Mesh:
    rows: int
    cols: int
    hop_cycles: int = 2
    link_bits: int = 128
    issue_cycles: int = 1
    buffer_flits: int = 4
    order: str = "age"  # or "stream"
    cut_through: bool = False  # a head waits for room for its whole packet in every next buffer
    injection_ports: int | None = None  # packets leaving one source at once (None: no limit)
    ejection_ports: int | None = None  # packets ejecting at one router at once (None: no limit)

    def space(self, link, inflight, buf) -> int:
        """Credits of ``link``: free slots of the buffer at its far end, flits in flight counted."""
        return self.buffer_flits - len(inflight[link]) - len(buf[link])

    def xy_dir(self, node: int, dst: int) -> int | None:
        """Output direction at ``node`` towards ``dst`` (None: arrived)."""
        dx = dst % self.cols - node % self.cols
        dy = dst // self.cols - node // self.cols
        if dx:
            return 0 if dx > 0 else 1
        if dy:
            return 2 if dy > 0 else 3
        return None

    def neighbour(self, node: int, d: int) -> int:
        x, y = node % self.cols + DIRS[d][0], node // self.cols + DIRS[d][1]
        assert 0 <= x < self.cols and 0 <= y < self.rows, "route leaves the mesh"
        return y * self.cols + x

    def tree(self, src: int, dsts) -> tuple[dict[int, set[int]], dict[int, int]]:
        """({router: output directions} of the multicast tree, {destination: hops})."""
        out: dict[int, set[int]] = {src: set()}
        hops = {}
        for dst in dsts:
            node, h = src, 0
            while (d := self.xy_dir(node, dst)) is not None:
                out[node].add(d)
                node, h = self.neighbour(node, d), h + 1
                out.setdefault(node, set())
            hops[dst] = h
        return out, hops

    def flits(self, nbytes: int) -> int:
        return max(1, -(-nbytes * 8 // self.link_bits))

    def run(self, traffic, inject=None) -> list[Packet]:
        """Simulate ``traffic``: (source, destinations, nbytes) per packet in stream order, packet ``i``
        injected at ``inject[i]`` (default ``i * issue_cycles``)."""
        assert self.buffer_flits > self.hop_cycles, "buffers too small for one flit per cycle"
        inject = [i * self.issue_cycles for i in range(len(traffic))] if inject is None else [int(c) for c in inject]
        assert len(inject) == len(traffic) and all(a <= b for a, b in zip(inject, inject[1:]))
        pk, trees = [], []
        for i, (src, dsts, nbytes) in enumerate(traffic):
            dsts = tuple(int(d) for d in dsts)
            assert dsts and src not in dsts and len(set(dsts)) == len(dsts)
            out, hops = self.tree(int(src), dsts)
            pk.append(Packet(int(src), dsts, self.flits(int(nbytes)), inject[i], hops))
            trees.append({u: sorted(ds) for u, ds in out.items()})
        assert self.order in ("age", "stream")
        assert not self.cut_through or self.buffer_flits >= max((p.flits for p in pk), default=1)
        queue = defaultdict(list)  # link -> packets still to cross it, in stream order
        for i, out in enumerate(trees):
            for u, ds in out.items():
                for d in ds:
                    queue[(u, d)].append(i)
        holder: dict[tuple[int, int], int] = {}  # link (router, direction) -> packet holding it
        inflight = defaultdict(deque)  # link -> (arrival cycle, packet, flit) in send order
        buf = defaultdict(deque)  # link -> (packet, flit) in the input buffer at its far end
        sent = [0] * len(pk)  # flits that left their source
        granted = set()  # (packet, router) holding its output links there
        ports: dict[tuple[int, int], tuple[bool, bool]] = {}  # (packet, router) -> (injection, ejection) port held
        taken = defaultdict(lambda: [0, 0])  # router -> [injection, ejection] ports held
        left = sum(p.flits * len(p.dsts) for p in pk)  # flit ejections still to come
        sources = []  # packets injected with flits still at their source, oldest first
        nxt = 0  # next packet to inject
        c = 0
        while left:
            while nxt < len(pk) and pk[nxt].inject <= c:
                sources.append(nxt)
                nxt += 1
            for link, q in inflight.items():
                while q and q[0][0] == c:
                    _, i, j = q.popleft()
                    buf[link].append((i, j))
            # fronts: (packet, flit, router, its input buffer or None at the source, output links)
            fronts = [(q[0][0], q[0][1], self.neighbour(*link), q) for link, q in buf.items() if q]
            fronts += [(i, sent[i], pk[i].src, None) for i in sources]
            fronts = sorted((i, j, u, q, [(u, d) for d in trees[i][u]]) for i, j, u, q in fronts)  # oldest first
            for i, j, u, q, links in fronts:  # allocation: a head takes all its output links (and ports) or none
                free = all(lk not in holder for lk in links)
                turn = self.order == "age" or all(queue[lk][0] == i for lk in links)
                room = not self.cut_through or all(self.space(lk, inflight, buf) >= pk[i].flits for lk in links)
                inj = q is None and self.injection_ports is not None
                ej = u in pk[i].dsts and self.ejection_ports is not None
                port = (not inj or taken[u][0] < self.injection_ports) and (not ej or taken[u][1] < self.ejection_ports)
                if j == 0 and (i, u) not in granted and free and turn and room and port:
                    holder.update(dict.fromkeys(links, i))
                    granted.add((i, u))
                    ports[(i, u)] = (inj, ej)
                    taken[u][0] += inj
                    taken[u][1] += ej
            space = {lk: self.space(lk, inflight, buf) for lk in holder}
            moved = False
            for i, j, u, q, links in fronts:  # traversal: one flit per granted packet, if every branch has credit
                if (i, u) not in granted or any(space[lk] <= 0 for lk in links):
                    continue
                moved = True
                if q is None:
                    sent[i] += 1
                    if sent[i] == pk[i].flits:
                        sources.remove(i)
                else:
                    q.popleft()
                for lk in links:
                    inflight[lk].append((c + self.hop_cycles, i, j))
                if u in pk[i].dsts:
                    left -= 1
                    if j == pk[i].flits - 1:
                        pk[i].arrive[u] = c + 1
                if j == pk[i].flits - 1:
                    for lk in links:
                        del holder[lk]
                        queue[lk].remove(i)
                    granted.discard((i, u))
                    inj, ej = ports.pop((i, u))
                    taken[u][0] -= inj
                    taken[u][1] -= ej
            busy = any(inflight.values())
            if not moved and not busy and nxt == len(pk):
                raise Deadlock(f"no flit can move at cycle {c}; links held: {holder}")
            if not moved and not busy and not any(buf.values()) and nxt < len(pk):  # idle: skip to the next injection
                c = max(c + 1, pk[nxt].inject)
            else:
                c += 1
        return pk
