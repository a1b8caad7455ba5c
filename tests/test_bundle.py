"""Bundles replay a case through every implementation; loading never runs code."""


import pytest
import torch

from verify_attn import cases
from verify_attn_tools.check import main as check_main


def test_bundle_round_trip(tmp_path):
    inputs = cases.make_inputs(cases.CASES["paged_2x16x17"], seed=5)
    path = tmp_path / "case.pt"
    cases.save_bundle(inputs, path)
    back = cases.load_bundle(path)
    for name in ("q", "kv", "kv_indices", "parent", "prefix_lens"):
        assert torch.equal(getattr(back, name), getattr(inputs, name))
    assert back.scale == pytest.approx(inputs.scale)


def test_check_replays_bundles(tmp_path, capsys):
    path = tmp_path / "captured.pt"
    cases.save_bundle(cases.make_inputs(cases.CASES["ragged_3x16x9"]), path)
    assert check_main(["--device", "cpu", str(path), "--impl", "naive", "--impl", "flash"]) == 0
    assert capsys.readouterr().out.count("PASS") == 2


class Boom:
    def __reduce__(self):
        return (exec, ("open('/tmp/verify_attn_pwned', 'w').write('x')",))


@pytest.mark.parametrize("content, message", [
    (b"not a zip or pickle", "not a verify_attn bundle"),
    (None, "not a verify_attn bundle"),  # a pickle that would run code
])
def test_malformed_bundle_gets_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.pt"
    if content is None:
        torch.save({"format": cases.BUNDLE_FORMAT, "q": Boom()}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        cases.load_bundle(path)
    import os
    assert not os.path.exists("/tmp/verify_attn_pwned")


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("parent"), "lacks tensor 'parent'"),
    (lambda d: d.update(q=d["q"].float()), "q must be torch.bfloat16"),
    (lambda d: d.update(format="other"), "not a verify_attn bundle"),
    (lambda d: d.update(kv_indices=d["kv_indices"].long()), "kv_indices must be an int32"),
])
def test_bundle_contents_are_checked(tmp_path, edit, message):
    inputs = cases.make_inputs(cases.CASES["paged_2x16x17"])
    path = tmp_path / "b.pt"
    cases.save_bundle(inputs, path)
    data = torch.load(path, weights_only=True)
    edit(data)
    torch.save(data, path)
    with pytest.raises(ValueError, match=message):
        cases.load_bundle(path)
