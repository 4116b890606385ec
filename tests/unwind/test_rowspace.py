"""The row array's free ranges (bpf/rowspace.py): first fit, merged when given back."""
from __future__ import annotations

from optrace.bpf.rowspace import RowSpace


def test_rows_are_handed_out_first_fit_and_merged_when_given_back():
    space = RowSpace(100)
    assert [space.allocate(n) for n in (40, 30, 20)] == [0, 40, 70] and space.used == 90
    assert space.allocate(20) is None and space.fits([10]) and not space.fits([10, 5])
    space.release(0, 40)
    assert space.allocate(50) is None and space.fits([30, 10]) and not space.fits([30, 15])
    space.release(40, 30)  # touches the range before it: one range of 70
    assert space.allocate(70) == 0 and space.used == 90
    space.release(70, 20)
    space.release(0, 70)
    assert space.used == 0 and space.allocate(100) == 0


def test_a_reset_frees_everything():
    space = RowSpace(10)
    space.allocate(10)
    space.reset()
    assert space.used == 0 and space.allocate(10) == 0
