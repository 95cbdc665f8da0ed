"""vt.buckets: the padded-length series every compiled shape uses."""
from vt.buckets import bucket


def test_series_and_bounds():
    assert [bucket(n, 16, half_octaves=True) for n in (0, 1, 16, 17, 24, 25, 33, 48, 49, 1000)] == \
        [16, 16, 16, 24, 24, 32, 48, 48, 64, 1024]
    assert [bucket(n, 2, half_octaves=True) for n in (1, 2, 3, 4, 5, 7)] == [2, 2, 3, 4, 6, 8]
    assert [bucket(n) for n in (0, 1, 3, 5, 64, 65)] == [1, 1, 4, 8, 64, 128]
    assert bucket(5, 64) == 64
    for lo, half in ((1, False), (16, True), (64, False)):
        for n in range(1, 3000):
            b = bucket(n, lo, half_octaves=half)
            # never too short; at most a third of the row padding with half octaves (half without)
            assert b >= max(n, lo) and (b <= lo or b < n * (1.5 if half else 2) + 1), (n, lo, b)
