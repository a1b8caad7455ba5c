"""Where a kernel's warps wait: ncu's source page read back (verify_attn.stalls).

tests/data/ncu_source_tc_attn_tma.csv is a real page, cut down: ten instructions of
tc_attn_tma at Chain heads 64, q_len 9, prefix 65,536 on the H200 (ncu 2025.3, `--section
SourceCounters --warp-sampling-interval 1`, exported with `--page source --print-source
cuda,sass --csv`), every file section and source line above them as ncu wrote it.
"""

import csv
import io
import json
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


def edited(page: str, sass: str, samples: float, reason: str) -> str:
    """The page with every row of the instruction `sass` holding `samples` warp samples, all of
    them of stall reason `reason` (as a rebuilt kernel's page would read)."""
    rows, header = list(csv.reader(io.StringIO(page))), None
    for row in rows:
        if row and row[0] == "Line No":
            header = row
        elif header and len(row) > 3 and row[3].strip() == sass:
            for n, name in enumerate(header):
                if name.startswith("stall_") and n < len(row):
                    row[n] = "0"
            row[header.index(stalls.SAMPLES)] = f"{samples:.0f}"
            row[header.index(f"stall_{reason}")] = f"{samples:.0f}"
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return out.getvalue()


def test_stalls_verb_shows_where_samples_moved(tmp_path):
    """A head whose row maximum lost 50 samples and whose wgmma wait gained 70: the verb ranks
    the lines by their change and puts the samples in their kinds."""
    from verify_attn_tools import cli

    base, head, out = tmp_path / "base.csv", tmp_path / "head.csv", tmp_path / "c.json"
    base.write_text(PAGE)
    page = edited(PAGE, "FMNMX.NAN R185, R18, R153, !PT", 11, "wait")  # 61 -> 11
    head.write_text(edited(page, "WARPGROUP.DEPBAR.LE gsb0, 0x0", 13294, "barrier"))  # 13224 -> 13294
    assert cli.main(["stalls", str(base), str(head), "--top", "3", "--json", str(out)]) == 0
    c = json.loads(out.read_text())
    assert c["samples"] == {"base": 41310, "head": 41330, "change": 20}
    assert c["kinds"]["wgmma wait"]["change"] == 70 and c["kinds"]["other"]["change"] == -50
    # the instruction's 41 dispatch and 20 selected samples became 11 wait samples
    assert {r: v["change"] for r, v in c["other_reasons"].items() if v["change"]} == {"dispatch": -41, "selected": -20,
                                                                                     "wait": 11}
    # the wait is inlined under two frames, each counted; the maximum's line third, not dropped as smaller
    assert [(l["where"], l["change"]) for l in c["lines"]] == [("tc_wgmma.h:57", 70), ("tc_wgmma_ws.h:538", 70),
                                                               ("device.h:25", -50)]
    assert c["base"]["function"] == c["head"]["function"]


def test_stalls_verb_refuses_what_is_not_a_page(tmp_path, capsys):
    from verify_attn_tools import cli

    page = tmp_path / "p.csv"
    page.write_text(PAGE)
    (tmp_path / "k.csv").write_text('"ID","Kernel Name"\n"0","k"\n')
    assert cli.main(["stalls", str(page), str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err
    assert cli.main(["stalls", str(tmp_path / "k.csv"), str(page)]) == 2
    assert "k.csv: no source page with warp samples" in capsys.readouterr().err


def test_stalls_verb_says_when_the_kernels_differ(tmp_path, capsys):
    from verify_attn_tools import cli

    base, head = tmp_path / "base.csv", tmp_path / "head.csv"
    base.write_text(PAGE)
    head.write_text(PAGE.replace("::tc_attn_tma(", "::tc_attn_ws("))  # every file section names it
    assert cli.main(["stalls", str(base), str(head)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tc_attn_tma (base.csv) -> tc_attn_ws (head.csv)")
    assert "different kernels: compare the shares" in out


def test_stalls_verb_names_a_templated_kernel_by_its_own_name(tmp_path, capsys):
    """A page's function of a template (tc_attn<Config<...>>) reads as the kernel, not its argument."""
    from verify_attn_tools import cli

    page = tmp_path / "p.csv"
    page.write_text(PAGE.replace("verify_attn::<unnamed>::tc_attn_tma(",
                                 "void verify_attn::<unnamed>::tc_attn<verify_attn::<unnamed>::Config<2, 4, 2, 2, 2, true>>("))
    assert cli.main(["stalls", str(page), str(page)]) == 0
    assert capsys.readouterr().out.startswith("tc_attn (p.csv) -> tc_attn (p.csv)")


def test_stalls_verb_follows_a_line_an_edit_moved(tmp_path, capsys):
    """An edit above a line moves its number: the verb pairs the line with its own text, not
    with whatever the old number holds now; a line whose text changed keeps its number's pair."""
    from verify_attn_tools import cli

    rows = list(csv.reader(io.StringIO(PAGE)))
    for row in rows:
        if row and row[0] == "511":
            row[0] = "509"
        elif row and row[0] == "538":
            row[1] = "} else if (peer) {"
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    base, head, result = tmp_path / "base.csv", tmp_path / "head.csv", tmp_path / "c.json"
    base.write_text(PAGE)
    head.write_text(out.getvalue())
    assert cli.main(["stalls", str(base), str(head), "--top", "50", "--json", str(result)]) == 0
    lines = {l["where"]: l for l in json.loads(result.read_text())["lines"]}
    moved = lines["tc_wgmma_ws.h:511->509"]
    assert moved["change"] == 0 and moved["base"] > 0 and moved["base_source"] == moved["head_source"]
    assert not {"tc_wgmma_ws.h:511", "tc_wgmma_ws.h:509"} & set(lines)
    edited_line = lines["tc_wgmma_ws.h:538"]
    assert edited_line["change"] == 0 and edited_line["head_source"] == "} else if (peer) {" != edited_line["base_source"]
    assert all(l["change"] == 0 for l in lines.values())
    text = capsys.readouterr().out
    assert "tc_wgmma_ws.h:511->509" in text and "(text differs)" in text and "only)" not in text


def test_a_repeated_line_an_edit_moved_pairs_in_order():
    """Two lines of the same text both moved down by an edit above them: each pairs with its
    own, in order, not left as base only and head only."""
    from verify_attn_tools.stalls import match

    def line(where, source, samples):
        return {"where": where, "source": source, "samples": samples}

    base = [line("k.cu:10", "named_barrier(1 + wr, 64);", 5), line("k.cu:20", "named_barrier(1 + wr, 64);", 7),
            line("k.cu:30", "x = y;", 1)]
    head = [line("k.cu:12", "named_barrier(1 + wr, 64);", 5), line("k.cu:22", "named_barrier(1 + wr, 64);", 9),
            line("k.cu:30", "x = z;", 1)]
    pairs = {(a and a["where"], b and b["where"]) for a, b in match(base, head)}
    assert pairs == {("k.cu:10", "k.cu:12"), ("k.cu:20", "k.cu:22"), ("k.cu:30", "k.cu:30")}
