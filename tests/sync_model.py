"""A small model of the synchronization of the warp-specialized kernels (kernels/tc_wgmma_ws.h),
shared by tests/test_dealing.py and tests/test_refill.py: mbarriers with phases and transaction
bytes, named barriers, and a random scheduler over threads written as generators (each `yield`
is a point where any other thread may run next)."""


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
