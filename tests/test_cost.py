"""The cost model counts what the tree mask lets through."""

import pytest

from verify_attn.cost import cost


def test_chain_counts_a_triangle():
    # chain of 3 after a prefix of 10: queries see 11, 12, 13 rows
    c = cost(heads=2, parents=[[-1, 0, 1]], prefix_lens=[10])
    assert c.flops == 2 * 2 * (11 + 12 + 13) * (576 + 512)
    assert c.bytes == 13 * 576 * 2 + 2 * 3 * (576 * 2 + 512 * 2 + 4)


def test_star_sees_root_and_self():
    c = cost(heads=1, parents=[[-1, 0, 0, 0]], prefix_lens=[0])
    assert c.flops == 2 * (1 + 2 + 2 + 2) * 1088


def test_roofline_takes_the_larger_floor():
    c = cost(heads=64, parents=[[-1] + list(range(8))], prefix_lens=[65536])
    assert c.intensity == pytest.approx(c.flops / c.bytes)
    compute, memory = c.flops / 784e12, c.bytes / 4.17e12
    assert c.roofline_s(784e12, 4.17e12) == max(compute, memory)
    # docs/h200.md: H64 q9 prefix 65,536 is about 105 us on the H200's tensor cores
    assert c.roofline_s(784e12, 4.17e12) == pytest.approx(105e-6, rel=0.05)


def test_batch_elements_add_up():
    one = cost(4, [[-1, 0]], [100])
    two = cost(4, [[-1, 0], [-1, 0]], [100, 100])
    assert two.flops == 2 * one.flops and two.bytes == 2 * one.bytes
