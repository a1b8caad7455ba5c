"""Where a kernel's warps wait: ncu's source page read back (verify_attn.stalls).

tests/data/ncu_source_tc_attn_tma.csv is a real page, cut down: ten instructions of
tc_attn_tma at Chain heads 64, q_len 9, prefix 65,536 on the H200 (ncu 2025.3, `--section
SourceCounters --warp-sampling-interval 1`, exported with `--page source --print-source
cuda,sass --csv`), every file section and source line above them as ncu wrote it.
"""

from pathlib import Path

import pytest

from verify_attn import stalls

PAGE = (Path(__file__).parent / "data" / "ncu_source_tc_attn_tma.csv").read_text()


def test_each_instruction_counts_once_under_every_frame():
    function, ins = stalls.parse(PAGE)
    assert function.startswith("verify_attn::<unnamed>::tc_attn_tma(")
    assert len(ins) == 10 and [i.address for i in ins] == sorted(i.address for i in ins)
    bssy = next(i for i in ins if i.sass.startswith("BSSY"))
    assert {(f, n) for f, n, _ in bssy.lines} == {("tc_wgmma_ws.h", 254), ("tc_wgmma_ws.h", 271),
                                                   ("tc_wgmma_ws.h", 512)}  # inlined: three frames
    s = stalls.summarise(ins, top=4)
    assert s["samples"] == sum(i.samples for i in ins) == 41310  # once, not once a frame
    assert s["warp_instructions"] == sum(i.executed for i in ins)
    lines = {l["where"]: l["samples"] for l in s["lines"]}
    assert min(lines["tc_wgmma_ws.h:512"], lines["tc_wgmma_ws.h:271"], lines["tc_wgmma_ws.h:254"]) >= 22800  # each frame


def test_kinds_come_from_the_machine_code():
    _, ins = stalls.parse(PAGE)
    kinds = {i.sass.split()[0] if not i.sass.startswith("@") else "BRA": stalls.kind(ins, n) for n, i in enumerate(ins)}
    assert kinds["SYNCS.PHASECHK.TRANS64.TRYWAIT"] == kinds["BRA"] == "mbarrier wait"  # the try_wait loop
    assert kinds["BSSY"] == "named barrier wait"  # the instruction behind bar.sync, barrier stalls
    assert kinds["WARPGROUP.DEPBAR.LE"] == "wgmma wait"
    assert kinds["HGMMA.64x256x16.F32.BF16"] == "wgmma issue"
    assert kinds["FMNMX.NAN"] == kinds["LOP3.LUT"] == "other"
    s = stalls.summarise(ins)
    assert s["kinds"] == {"mbarrier wait": 755, "named barrier wait": 22800, "wgmma wait": 13224,
                          "wgmma issue": 4250, "other": 281}
    assert sum(s["other_reasons"].values()) == 281  # the reasons of "other" account for its samples


def test_table_gives_shares():
    _, ins = stalls.parse(PAGE)
    text = stalls.table("tc_attn_tma", stalls.summarise(ins, top=2))
    assert text.splitlines()[0] == "tc_attn_tma: 41310 warp samples, 0.18 M warp instructions"
    assert "named barrier wait 55.2%, wgmma wait 32.0%" in text and "BSSY B2" in text


def test_a_page_without_samples_is_refused():
    with pytest.raises(stalls.SourcePageError, match="no source page with warp samples"):
        stalls.parse('"ID","Kernel Name"\n"0","k"\n')
