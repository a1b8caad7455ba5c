"""A small model of the synchronization of the warp-specialized kernels (kernels/tc_wgmma_ws.h,
tc_wgmma_tma.cu), shared by tests/test_dealing.py, test_refill.py and test_tma_refill.py:
mbarriers with phases and transaction bytes, named barriers, a random scheduler over threads
written as generators (each `yield` is a point where any other thread may run next), shared
memory with its copies in flight, and the consumer warpgroups' pair schedule."""


class Mbar:
    """An mbarrier. A phase completes once `count` arrivals happened and its transaction count
    (raised by an arrival's expect_tx, lowered by complete_tx) is back at zero; `phase` counts the
    completed phases. try_wait.parity(P) passes once the phase of parity P completed, i.e. while
    the current phase's parity differs from P (passed). `use`, where given, is the phase an
    arrival or a transaction is meant for: it must be the current one."""

    def __init__(self, count, name="mbarrier"):
        self.count, self.name = count, name
        self.pending, self.tx, self.phase = 0, 0, 0

    def _meant_for(self, use):
        assert use is None or use == self.phase, f"{self.name}: an arrival for use {use} in phase {self.phase}"

    def _settle(self):
        if self.pending == self.count and self.tx == 0:
            self.pending, self.phase = 0, self.phase + 1

    def arrive(self, use=None, expect_tx=0):
        self._meant_for(use)
        self.tx += expect_tx
        self.pending += 1
        self._settle()

    def complete_tx(self, n, use=None):
        self._meant_for(use)
        self.tx -= n
        self._settle()

    def passed(self, parity):
        return (self.phase & 1) != parity


def wait(cond):
    """Spin (yield) until cond() holds."""
    while not cond():
        yield


def wait_phase(bar, use):
    """A parity wait for the completion of phase `use` of bar, checked: the barrier never runs
    two phases ahead of it (the parity would then pass a phase too late, or never)."""
    while True:
        assert bar.phase <= use + 1, f"{bar.name}: phase {bar.phase} completed while a wait for phase {use} is pending"
        if bar.passed(use & 1):
            return
        yield


class NamedBarriers:
    """Named barriers (bar.arrive does not block, bar.sync waits): an instance completes when
    each of its parties arrived at it. A party arriving at a barrier twice before the others
    arrived once would join the wrong instance: asserted against."""

    def __init__(self):
        self.inst = {}  # name -> arrivals of each party

    def bar(self, name, who, block, parties=2):
        inst = self.inst.setdefault(name, [0] * parties)
        inst[who] += 1
        mine = inst[who]
        assert mine - min(inst) <= 1, f"named barrier {name} arrived at twice (party {who} ran two ahead)"
        if block:
            yield from wait(lambda: min(inst) >= mine)


def run(threads, rng, background=(), steps=200000):
    """Steps a random one of the threads (generators) at a time until each of `threads` has
    finished; `background` ones (which never finish) are stepped among them. AssertionError when
    they do not finish within `steps` (a deadlock)."""
    live, bg = list(threads), list(background)
    for _ in range(steps):
        if not live:
            return
        t = rng.choice(live + bg)
        try:
            next(t)
        except StopIteration:
            live.remove(t)
    raise AssertionError("deadlock (or far too slow)")


class Smem:
    """Shared memory as keys (a plane of a stage, a mask, a plane of Q), each split in `slices`
    (one a modelled thread: what its cp.async writes), with who reads each and the writes in
    flight, and the copies in flight in issue order (`ops`: cp.async and TMA boxes, and
    cp.async.mbarrier.arrive.noinc arrivals, landed by `engine` in any order that the hardware
    allows). Asserted: nothing is written while read, nothing is read while a write to it is in
    flight, every read sees the value it was meant for. `early` counts TMA boxes issued into a
    stage while a consumer still read other planes of it."""

    def __init__(self, slices, rng):
        self.T, self.rng = slices, rng
        self.content, self.readers, self.inflight = {}, {}, {}
        self.ops, self.seq, self.early = [], 0, 0

    def key(self, k):
        self.content.setdefault(k, [None] * self.T)
        self.readers.setdefault(k, [])
        self.inflight.setdefault(k, 0)
        return k

    def read_begin(self, who, k, want):
        self.key(k)
        assert self.inflight[k] == 0, f"{who} reads {k} while a write to it is in flight"
        assert all(v == want for v in self.content[k]), f"{who} reads {k}: {self.content[k]}, meant {want}"
        self.readers[k].append(who)

    def read_end(self, who, k, want):
        assert all(v == want for v in self.content[k]), f"{k} changed under {who}: {self.content[k]}, meant {want}"
        self.readers[k].remove(who)

    def reads(self, who, ks, want):
        """A read of several keys by one instruction stream, from issue to wait."""
        for k in ks:
            self.read_begin(who, k, want)
        yield
        for k in ks:
            self.read_end(who, k, want)

    def write_issue(self, who, k):
        self.key(k)
        assert not self.readers[k], f"{who} writes {k} while {self.readers[k]} read it"
        self.inflight[k] += 1

    def write_land(self, k, slices, value):
        assert not self.readers[k], f"a write lands in {k} while {self.readers[k]} read it"
        self.inflight[k] -= 1
        for i in slices:
            self.content[k][i] = value

    def generic_write(self, who, k, slices, value):
        """st.shared by a thread or a warpgroup."""
        self.write_issue(who, k)
        yield
        self.write_land(k, slices, value)

    def _op(self, **kw):
        self.seq += 1
        self.ops.append(dict(kw, seq=self.seq))

    def cp_async(self, who, t, k, value):
        """Thread t's 16-byte copies of its slice of k."""
        self.write_issue(who, k)
        self._op(kind="copy", cp=t, key=k, slices=[t], value=value)

    def tma(self, who, k, value, bar, use):
        """A box: the whole of k, counted on bar's transaction bytes for its phase `use`."""
        self.write_issue(who, k)
        self.early += any(self.readers.get((k[0], p)) for p in range(9))
        self._op(kind="copy", cp=None, key=k, slices=range(self.T), value=value, bar=bar, use=use)

    def arrive_cp_async(self, t, bar, use):
        """cp.async.mbarrier.arrive.noinc: lands once thread t's earlier copies did."""
        self._op(kind="arrive", pt=t, bar=bar, use=use)

    def cp_pending(self, t, before=None):
        return any(o["kind"] == "copy" and o["cp"] == t and (before is None or o["seq"] < before) for o in self.ops)

    def engine(self):
        """Lands one ready copy or arrival at a time, in any order (a background thread of run)."""
        while True:
            ready = [o for o in self.ops if o["kind"] == "copy" or not self.cp_pending(o["pt"], o["seq"])]
            if ready:
                o = self.rng.choice(ready)
                self.ops.remove(o)
                if o["kind"] == "copy":
                    self.write_land(o["key"], o["slices"], o["value"])
                    if o.get("bar"):
                        o["bar"].complete_tx(1, o["use"])
                else:
                    o["bar"].arrive(o["use"])
            yield


def consumers(n, full, bars, m, masked, release, start=None, after_s_b=None, uses=(0, 0), tag=None, q="Q",
              p1_wait=True, halves=None):
    """tc_attn_ws's two consumer warpgroups over a range of n tiles (kernels/tc_wgmma_ws.h, the
    pair schedule; consume_tiles), as generators WG0, WG1 reading through m (Smem, m.T slices a
    key): full[s] the stages' barriers, bars the named barriers, masked(j) whether tile j's
    softmax reads its stage's mask. release(w, s, j) (a generator) runs where warpgroup w is done
    with stage s holding tile j; start(w) (a generator) first; after_s_b(j) (a generator, a
    mutant's hook) where WG1's S of tile j + 1 is done. uses: the stages' uses before the range
    (its pair k is use uses[s] + k of stage s); tag(j): what tile j's planes hold (j); q: what
    Q's planes hold. Each warpgroup also posts its tile's row maxima and factors (s_m, s_sc:
    ("m", w) here) with its P and the peer reads them after the same named barrier
    (issue_peer_pv); the next tile's post overwrites them after the peer's read (ordered by the
    named barriers and by the stage's full barrier, which waits for the peer's release).
    p1_wait=False: a mutant, WG0 goes on past P1 without waiting for WG1's post. halves
    (tc_attn_tma, consume_tiles<true>): halves[s][w] is the barrier of planes_of(w, s) of stage s
    (full is then unused); WG0 issues S of each tile a in two parts, planes 0-3 behind the
    previous pair's PV_b, planes 4-8 at its pair's start, and each warpgroup waits only for the
    halves it reads."""
    Q = [("q", p) for p in range(9)]
    tag = tag or (lambda j: j)

    def stage(s, planes):
        return [(s, p) for p in planes]

    def softmax(who, s, j):
        if masked(j):
            yield from m.reads(who, [(s, "mask")], tag(j))

    def wg0_halves():
        H = halves
        if start:
            yield from start(0)
        s_a = []  # (key, meant) of the S in flight

        def s_part(planes, j):
            for kk, want in ([(x, q) for x in Q] if planes[0] == 0 else []) + [((0, p), tag(j)) for p in planes]:
                m.read_begin("WG0 S_a", kk, want)
                s_a.append((kk, want))

        if n:
            yield from wait_phase(H[0][0], uses[0])
            s_part(range(4), 0)
        for k in range((n + 1) // 2):
            a, b = 2 * k, 2 * k + 1
            has_b = b < n
            yield from wait_phase(H[0][1], uses[0] + k)
            s_part(range(4, 9), a)
            yield
            while s_a:
                m.read_end("WG0 S_a", *s_a.pop())
            if has_b:
                yield from bars.bar("S0", 0, False)
            yield from softmax("WG0 softmax_a", 0, a)
            yield from m.generic_write("WG0 P_a", (0, 8), range(m.T), ("P", tag(a)))
            yield from m.generic_write("WG0 m_a", ("m", 0), range(m.T), ("m", tag(a)))
            yield from bars.bar("P0", 0, False)
            yield from m.reads("WG0 PV_a", stage(0, range(4)), tag(a))
            yield from release(0, 0, a)
            if not has_b:
                break
            yield from bars.bar("P1", 0, p1_wait)
            yield from m.reads("WG0 m_b", [("m", 1)], ("m", tag(b)))
            yield from wait_phase(H[1][0], uses[1] + k)
            m.read_begin("WG0 PV_b", (1, 8), ("P", tag(b)))
            for kk in stage(1, range(4)):
                m.read_begin("WG0 PV_b", kk, tag(b))
            if b + 1 < n:  # the next tile a's planes 0-3, behind PV_b
                yield from wait_phase(H[0][0], uses[0] + k + 1)
                s_part(range(4), a + 2)
            yield
            m.read_end("WG0 PV_b", (1, 8), ("P", tag(b)))
            for kk in stage(1, range(4)):
                m.read_end("WG0 PV_b", kk, tag(b))
            yield from release(0, 1, b)
        yield from bars.bar("End", 0, True)

    def wg0():
        if halves:
            yield from wg0_halves()
            return
        if start:
            yield from start(0)
        for k in range((n + 1) // 2):
            a, b = 2 * k, 2 * k + 1
            has_b = b < n
            yield from wait_phase(full[0], uses[0] + k)
            yield from m.reads("WG0 S_a", Q, q)
            yield from m.reads("WG0 S_a", stage(0, range(9)), tag(a))
            if has_b:
                yield from bars.bar("S0", 0, False)
            yield from softmax("WG0 softmax_a", 0, a)
            yield from m.generic_write("WG0 P_a", (0, 8), range(m.T), ("P", tag(a)))
            yield from m.generic_write("WG0 m_a", ("m", 0), range(m.T), ("m", tag(a)))
            yield from bars.bar("P0", 0, False)
            yield from m.reads("WG0 PV_a", stage(0, range(4)), tag(a))
            yield from release(0, 0, a)
            if has_b:
                yield from bars.bar("P1", 0, p1_wait)
                yield from m.reads("WG0 m_b", [("m", 1)], ("m", tag(b)))
                yield from wait_phase(full[1], uses[1] + k)
                m.read_begin("WG0 PV_b", (1, 8), ("P", tag(b)))
                yield from m.reads("WG0 PV_b", stage(1, range(4)), tag(b))
                m.read_end("WG0 PV_b", (1, 8), ("P", tag(b)))
                yield from release(0, 1, b)
        yield from bars.bar("End", 0, True)

    def wg1():
        if start:
            yield from start(1)
        for k in range((n + 1) // 2):
            a, b = 2 * k, 2 * k + 1
            if b < n:
                yield from bars.bar("S0", 1, True)
                for bar in (halves[1] if halves else [full[1]]):
                    yield from wait_phase(bar, uses[1] + k)
                s_b = Q + stage(1, range(9))
                for kk in s_b[:9]:
                    m.read_begin("WG1 S_b", kk, q)
                for kk in s_b[9:]:
                    m.read_begin("WG1 S_b", kk, tag(b))
                yield from bars.bar("P0", 1, True)
                yield from m.reads("WG1 m_a", [("m", 0)], ("m", tag(a)))
                yield from wait_phase(halves[0][1] if halves else full[0], uses[0] + k)
                pv_a = stage(0, range(4, 8))
                for kk in pv_a:
                    m.read_begin("WG1 PV_a", kk, tag(a))
                m.read_begin("WG1 PV_a", (0, 8), ("P", tag(a)))
                yield
                for kk in s_b[:9]:  # S_b done (wait_one), PV_a in flight
                    m.read_end("WG1 S_b", kk, q)
                for kk in s_b[9:]:
                    m.read_end("WG1 S_b", kk, tag(b))
                if after_s_b:
                    yield from after_s_b(a)
                yield from softmax("WG1 softmax_b", 1, b)
                yield from m.generic_write("WG1 P_b", (1, 8), range(m.T), ("P", tag(b)))
                yield from m.generic_write("WG1 m_b", ("m", 1), range(m.T), ("m", tag(b)))
                yield from bars.bar("P1", 1, False)
                yield
                for kk in pv_a:
                    m.read_end("WG1 PV_a", kk, tag(a))
                m.read_end("WG1 PV_a", (0, 8), ("P", tag(a)))
                yield from release(1, 0, a)
                yield from m.reads("WG1 PV_b", stage(1, range(4, 8)), tag(b))
                yield from release(1, 1, b)
            else:
                yield from bars.bar("P0", 1, True)
                yield from m.reads("WG1 m_a", [("m", 0)], ("m", tag(a)))
                yield from wait_phase(halves[0][1] if halves else full[0], uses[0] + k)
                m.read_begin("WG1 PV_a", (0, 8), ("P", tag(a)))
                yield from m.reads("WG1 PV_a", stage(0, range(4, 8)), tag(a))
                m.read_end("WG1 PV_a", (0, 8), ("P", tag(a)))
                yield from release(1, 0, a)
        yield from bars.bar("End", 1, True)

    return wg0(), wg1()
