import pytest

from chaoskit.units import format_size, parse_duration, parse_percent, parse_size


@pytest.mark.parametrize("text,seconds", [("15ms", 0.015), ("2s", 2.0), ("5m", 300.0), ("1h", 3600.0),
                                          ("250us", 0.00025), (3, 3.0), ("1.5s", 1.5), ("7", 7.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["-1s", -2, "15x", "", "ms", True, None, [1]])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_sizes():
    assert parse_size("512MiB") == 512 * 1024**2
    assert parse_size("1G") == 10**9
    assert parse_size("40%", total=1000) == 400
    assert parse_size(4096) == 4096
    for bad in ("-1MiB", "12 parsecs", "150%"):
        with pytest.raises(ValueError):
            parse_size(bad, total=100)
    assert format_size(3 * 1024**3) == "3.0GiB"


def test_percent():
    assert parse_percent("0.2%") == pytest.approx(0.002)
    assert parse_percent(50) == 0.5
    for bad in ("150%", "-1%", "abc", 101):
        with pytest.raises(ValueError):
            parse_percent(bad)
