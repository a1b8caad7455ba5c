"""One NaN contract for every implementation.

A non-finite value (NaN or +-inf) in ``q`` or in a cache row that a query attends to makes
exactly the dependent outputs non-finite: that query's ``out`` row for that head (all 512
elements) and its ``lse``. Values in rows a query does NOT attend to -- masked tree rows (a
sibling's row), rows past ``prefix_len + q_len`` of its batch element, unused slots of
``kv_indices`` and the pool rows they point to -- never affect it, whatever they hold. Every
other output stays finite and equal to the output of the same implementation on the same
inputs without the non-finite value.

How the kernels meet it: a non-finite score of an attended key is a NaN (so an inf that
would give a score of -inf, a weight of 0 and a finite lse still poisons the query); the
running max, the sums and the split merge propagate NaN; masked keys and rows past the
element's rows are skipped by the mask, never multiplied by a zero weight; an empty split
(no visible key) has weight 0.

Runs on the CPU, and on CUDA where torch sees a GPU; every registered implementation is
covered (``registry.names()``). Known failures of the torch composite are strict xfails.
"""

import pytest
import torch

from conftest import require
from verify_attn import cases, ops, registry

# Small shapes so that the CPU runs are quick; element 1 leaves rows of kv unused. The
# "long" variant (prefix test only) crosses the CPU flash split length (1024 keys), so the
# splits are merged and element 1's second split is empty; on CUDA flash splits it in two.
# "single" is element 0 alone, contiguous: on the H200 tc runs it one block a key range,
# with the prefix tiles by TMA (a batch goes to the dealt kernel, every tile by cp.async).
LAYOUTS = {"contiguous": False, "paged": True, "single": False}
PREFIXES = {False: (300, 150), True: (1100, 150)}


def case_of(layout, long=False):
    prefixes = PREFIXES[long][:1] if layout == "single" else PREFIXES[long]
    return cases.Case(f"nan_{layout}", len(prefixes), 8, 9, prefixes, paged=LAYOUTS[layout])


def target(i):
    """The element the tests poison: the last one (element 1, or 0 alone)."""
    return i.q.shape[0] - 1


# Query i depends on tree row j when j is i or an ancestor: row 1 feeds 1, 3, 4, 6, 7 only.
PARENT = [-1, 0, 0, 1, 1, 2, 3, 3, 5]
SEED = 1

# (impl, test id, device) that fail today and are expected to; strict, so a fix must remove
# its entry. Empty: every implementation meets the contract.
KNOWN_FAILURES: dict = {}


def expect(request, impl, case_id):
    reason = KNOWN_FAILURES.get((impl, case_id, request.getfixturevalue("device")))
    if reason:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def make(layout, device, long=False):
    i = cases.make_inputs(case_of(layout, long), device, SEED)
    i.parent = torch.tensor([PARENT] * i.q.shape[0], dtype=torch.int32, device=i.parent.device)
    return i


def run(impl, i):
    return ops.verify_attention(i.q, i.kv, i.parent, i.prefix_lens, i.scale, kv_indices=i.kv_indices, impl=impl)


_clean = {}


def clean(impl, layout, device, long=False):
    key = (impl, layout, device, long)
    if key not in _clean:
        out, lse = run(impl, make(layout, device, long))
        assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "clean inputs gave a non-finite output"
        _clean[key] = out, lse
    return _clean[key]


def pool_row(i, b, t):
    """Where position t of batch element b lives: (index into kv's first dims)."""
    return (int(i.kv_indices[b, t]),) if i.kv_indices is not None else (b, t)


def check(out, lse, ref_out, ref_lse, bad):
    """bad: [batch, q_len, heads] bool, the (query, head) pairs that must be non-finite."""
    bad = bad.to(out.device)
    bad_lse = bad.permute(0, 2, 1)  # lse is [batch, heads, q_len]
    finite_out = torch.isfinite(out.float()).any(-1)  # [batch, q_len, heads]: any element finite
    leaked = (finite_out & bad).nonzero().tolist()
    assert not leaked, f"(b, i, h) rows with finite elements that must be all non-finite: {leaked[:8]}"
    leaked = (torch.isfinite(lse) & bad_lse).nonzero().tolist()
    assert not leaked, f"finite lse at (b, h, i) that must be non-finite: {leaked[:8]}"
    changed = (~(out == ref_out).all(-1) & ~bad).nonzero().tolist()
    assert not changed, f"out rows (b, i, h) changed by a value they do not depend on: {changed[:8]}"
    changed = (~(lse == ref_lse) & ~bad_lse).nonzero().tolist()
    assert not changed, f"lse (b, h, i) changed by a value it does not depend on: {changed[:8]}"


def rows_mask(batch=2, q_len=9, heads=8):
    return torch.zeros((batch, q_len, heads), dtype=torch.bool)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("col", [100, 540], ids=["latent", "rope"])
@pytest.mark.parametrize("impl", registry.names())
def test_nan_in_query_row(impl, col, layout, device, request):
    i = make(layout, device)
    require(impl, device, i)
    expect(request, impl, f"query_col{col}")
    b = target(i)
    i.q[b, 4, 3, col] = float("nan")
    out, lse = run(impl, i)
    bad = rows_mask(i.q.shape[0])
    bad[b, 4, 3] = True
    check(out, lse, *clean(impl, layout, device), bad)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("value, col", [("nan", 7), ("inf", 7), ("inf", 520)],
                         ids=["nan_col7", "inf_col7", "inf_col520"])
@pytest.mark.parametrize("impl", registry.names())
def test_nonfinite_prefix_row(impl, value, col, layout, device, request):
    """A prefix row is attended by every query of its element: all of them, every head."""
    i = make(layout, device, long=True)
    require(impl, device, i)
    expect(request, impl, f"prefix_{value}_col{col}")
    i.kv[pool_row(i, 0, 1050) + (col,)] = float(value)  # in the second CPU flash split
    out, lse = run(impl, i)
    bad = rows_mask(i.q.shape[0])
    bad[0] = True
    check(out, lse, *clean(impl, layout, device, long=True), bad)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("j", [0, 1, 8])
@pytest.mark.parametrize("impl", registry.names())
def test_nan_in_tree_row(impl, j, layout, device, request):
    """Tree row j poisons exactly the queries that have j as ancestor-or-self."""
    i = make(layout, device)
    require(impl, device, i)
    expect(request, impl, f"tree_row_{j}")
    b = target(i)
    prefix = int(i.prefix_lens[b])
    i.kv[pool_row(i, b, prefix + j)] = float("nan")
    out, lse = run(impl, i)
    bad = rows_mask(i.q.shape[0])
    for q in range(len(PARENT)):
        k = q
        while k > j:
            k = PARENT[k]
        bad[b, q] = k == j
    assert 0 < int(bad[b, :, 0].sum()) < len(PARENT) or j == 0
    check(out, lse, *clean(impl, layout, device), bad)


@pytest.mark.parametrize("layout", ["contiguous", "single"])
@pytest.mark.parametrize("impl", registry.names())
def test_rows_past_kv_len_are_ignored(impl, layout, device, request):
    """Contiguous kv with more rows than any element uses: NaN there changes nothing."""
    i = make(layout, device)
    require(impl, device, i)
    expect(request, impl, "rows_past_kv_len")
    extra = torch.randn((i.kv.shape[0], 16, i.kv.shape[2]), device=i.kv.device).bfloat16()
    i.kv = torch.cat([i.kv, extra], dim=1)  # element 0 uses 309 of 325 rows, element 1 159
    ref = run(impl, i)
    used = (i.prefix_lens + len(PARENT)).tolist()
    for b, n in enumerate(used):
        i.kv[b, n:] = float("nan")
    out, lse = run(impl, i)
    check(out, lse, *ref, rows_mask())


@pytest.mark.parametrize("impl", registry.names())
def test_paged_unused_rows_and_slots_are_ignored(impl, device, request):
    """NaN in pool rows no used slot points at, and unused slots pointing at a NaN row."""
    i = make("paged", device)
    require(impl, device, i)
    expect(request, impl, "paged_unused")
    used = (i.prefix_lens + len(PARENT)).tolist()
    referenced = torch.zeros(i.kv.shape[0], dtype=torch.bool)
    for b, n in enumerate(used):
        referenced[i.kv_indices[b, :n].long().cpu()] = True
    unreferenced = (~referenced).nonzero().flatten()
    assert len(unreferenced) > 0
    i.kv[unreferenced.to(i.kv.device)] = float("nan")
    i.kv_indices[1, used[1]:] = int(unreferenced[0])  # element 1's unused slots
    out, lse = run(impl, i)
    check(out, lse, *clean(impl, "paged", device), rows_mask())
