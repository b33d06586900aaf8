"""Units at the edges: GB = 1e9 and GiB = 2^30 kept apart (IEC 80000-13), times exact."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budget.plan.yaml_load import MAX_INT
from budget.units import (
    UnitError,
    format_bytes,
    format_duration,
    format_flops,
    format_rate,
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_flops,
)
from tests.guards import refused_in_time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80 GiB", 80 * 2**30),
        ("80GiB", 80 * 2**30),
        ("80 GB", 80 * 10**9),
        ("80GB", 80 * 10**9),
        (" 80 GiB ", 80 * 2**30),
        ("1.5 KiB", 1536),
        ("80 kB", 80_000),
        ("80 KiB", 81_920),
        ("3 MiB", 3 * 2**20),
        ("2 TB", 2 * 10**12),
        ("1 PiB", 2**50),
        ("4096", 4096),
        ("4096 B", 4096),
        (4096, 4096),
        (".5 KiB", 512),
        ("1e3 B", 1000),
        ("0", 0),
    ],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_parse_bytes_rounds_fractions_up() -> None:
    """Memory is allocated in whole bytes."""
    assert parse_bytes(1.5) == 2
    assert parse_bytes("0.1 B") == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("450 GB/s", 450e9),
        ("450GB/s", 450e9),
        ("25 GiB/s", 25 * 2**30),
        ("3.35 TB/s", 3.35e12),
        ("50 B/s", 50.0),
        ("0", 0.0),
        (0, 0.0),
    ],
)
def test_parse_bandwidth(text: str | float, expected: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3 us", 3e-6),
        ("3us", 3e-6),
        ("5 µs", 5e-6),  # MICRO SIGN
        ("5 μs", 5e-6),  # GREEK SMALL LETTER MU
        ("3 ns", 3e-9),
        ("1.5 ms", 1.5e-3),
        ("12s", 12.0),
        ("0", 0.0),
        (0.0, 0.0),
    ],
)
def test_parse_duration_is_exact(text: str | float, expected: float) -> None:
    """Exact, not approximately: '5 us' must be the float 5e-06 (the seed's 4 × 5 µs)."""
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("989 TFLOP/s", 989e12),
        ("312 TFLOPS", 312e12),
        ("989 TFLOPs/s", 989e12),
        ("1 PFLOP/s", 1e15),
        ("1000 GFLOP/s", 1e12),
        ("19.5 TFLOP/s", 19.5e12),
        ("0", 0.0),
    ],
)
def test_parse_flops(text: str, expected: float) -> None:
    assert parse_flops(text) == expected


@pytest.mark.parametrize(
    "text",
    ["80 gb", "80 G", "80 GiBs", "GiB", "", "nan", "inf B", "80 kiB", "80 B/s", "-1", "1e31", "x"],
)
def test_bad_sizes_are_unit_errors(text: str) -> None:
    with pytest.raises(UnitError):
        parse_bytes(text)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_bytes, "80 KB", "ambiguous prefix 'K' in '80 KB': write kB for 1000 bytes or KiB"),
        (parse_bytes, "80KB", "ambiguous prefix 'K' in '80KB': write kB for 1000 bytes or KiB"),
        (
            parse_bandwidth,
            "80 KB/s",
            "ambiguous prefix 'K' in '80 KB/s': write kB for 1000 bytes or KiB",
        ),
        (
            parse_bandwidth,
            "80 Kb/s",
            "ambiguous prefix 'K' in '80 Kb/s': write kb for 1000 bits or Kib",
        ),
    ],
)
def test_an_upper_case_kilo_is_refused_as_ambiguous(parse: object, text: str, message: str) -> None:
    """IEC 80000-13 writes kilo k (kB = 1000 B) and kibi Ki (KiB = 1024 B); JEDEC's "KB" is
    1024 B, and "80 KB" was read as 80,000 (an audit): the author says which. The lower
    and binary forms still read (test_parse_bytes); a compute rate has no such reading."""
    with pytest.raises(UnitError) as refused:
        parse(text)  # type: ignore[operator]
    assert str(refused.value).startswith(message)
    assert parse_bytes("80 kB") == 80_000 and parse_bytes("80 KiB") == 80 * 1024
    assert parse_bandwidth("80 kB/s") == 80e3 and parse_bandwidth("80 kb/s") == 10e3
    assert parse_flops("1 KFLOP/s") == 1e3  # no binary kilo of FLOP to confuse it with


@pytest.mark.parametrize("value", [True, None, float("inf"), float("nan"), [1]])
def test_non_quantities_are_unit_errors(value: object) -> None:
    with pytest.raises(UnitError):
        parse_bytes(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_bandwidth, "450 Gib/s bytes"),
        (parse_bandwidth, "450 GB"),
        (parse_duration, "3 min"),
        (parse_duration, "-1 s"),
        (parse_flops, "1 EFLOP/s"),
        (parse_flops, "989 TiFLOP/s"),
        (parse_flops, "989 tflop/s"),
    ],
)
def test_bad_quantities_are_unit_errors(parse: object, text: str) -> None:
    with pytest.raises(UnitError):
        parse(text)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("parse", "value", "message"),
    [
        (
            parse_bandwidth,
            450,
            "450 has no unit; write a bandwidth with its unit, such as '450 GB/s' or '450 Gb/s'",
        ),
        (
            parse_bandwidth,
            "3350",
            "3350 has no unit; write a bandwidth with its unit, such as '3350 GB/s' or '3350 Gb/s'",
        ),
        (
            parse_bandwidth,
            4.5e11,
            "450000000000 has no unit; write a bandwidth with its unit, such as '450 GB/s'",
        ),
        (
            parse_duration,
            3,
            "3 has no unit; write a time with its unit, such as '3 us', '3 ms' or '3 s'",
        ),
        (
            parse_duration,
            " 12 ",
            "12 has no unit; write a time with its unit, such as '12 us', '12 ms' or '12 s'",
        ),
        (parse_duration, 5e-06, "5e-06 has no unit; write a time with its unit, such as '5 us'"),
        (
            parse_duration,
            0.00015,
            "0.00015 has no unit; write a time with its unit, such as '150 us'",
        ),
        (
            parse_duration,
            0.0015,
            "0.0015 has no unit; write a time with its unit, such as '1.5 ms'",
        ),
        (  # 0.5 is as likely 0.5 us as 0.5 s (a review): the plain suggestion
            parse_duration,
            0.5,
            "0.5 has no unit; write a time with its unit, such as '0.5 us', '0.5 ms' or '0.5 s'",
        ),
        (
            parse_duration,
            "2.5e-10",
            "2.5e-10 has no unit; write a time with its unit, such as"
            " '2.5e-10 us', '2.5e-10 ms' or '2.5e-10 s'",
        ),
        (
            parse_flops,
            989,
            "989 has no unit; write a compute rate with its unit, such as '989 TFLOP/s'",
        ),
        (
            parse_flops,
            "1e15",
            "1e15 has no unit; write a compute rate with its unit, such as '1 PFLOP/s'",
        ),
        (
            parse_flops,
            989000000000000,
            "989000000000000 has no unit; write a compute rate with"
            " its unit, such as '989 TFLOP/s'",
        ),
        (
            parse_bandwidth,
            2.5e16,
            "2.5e+16 has no unit; write a bandwidth with its unit, such as '25000 TB/s'",
        ),
    ],
)
def test_a_bare_rate_or_time_is_refused_not_read_in_the_base_unit(
    parse: object, value: object, message: str
) -> None:
    """'bandwidth: 450' was 450 B/s and 'latency: 3' three seconds, silently (user audit):
    the author meant a unit the number does not say. 0 is 0 in every unit, so it stays."""
    with pytest.raises(UnitError) as refused:
        parse(value)  # type: ignore[operator]
    assert str(refused.value).startswith(message)


def test_missing_unit_names_only_bare_numbers() -> None:
    from budget.units import missing_unit

    assert missing_unit(450, "bandwidth") is not None
    assert missing_unit("450", "bandwidth") is not None
    for value in (0, 0.0, "0", " 0.0 ", "450 GB/s", "fast", True, None, [450], float("nan")):
        assert missing_unit(value, "bandwidth") is None, value


@pytest.mark.parametrize(
    ("value", "quantity"), [(-450, "bandwidth"), ("-1", "time"), (-1.5, "compute rate")]
)
def test_a_negative_bare_number_is_not_given_a_unit_to_write(value: object, quantity: str) -> None:
    """-450 was told "such as '-450 GB/s'", which is refused as negative (an audit)."""
    from budget.units import missing_unit

    said = missing_unit(value, quantity)
    assert said == f"{value} has no unit and is negative; write a {quantity} above 0 with its unit"


def test_negative_message_says_negative() -> None:
    with pytest.raises(UnitError, match="negative"):
        parse_bytes("-3 GiB")


@pytest.mark.parametrize("text", ["1e-9999999 GB", "1e-" + "0" * 5000 + "1", "9" * 10_000])
def test_hostile_numbers_fail_fast(text: str) -> None:
    # unguarded, Fraction("1e-9999999") alone takes about 8 s; refused at once
    with refused_in_time(), pytest.raises(UnitError):
        parse_bytes(text)


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["Ki", "Mi", "Gi", "Ti"]))
def test_binary_prefixes_are_powers_of_1024(n: int, prefix: str) -> None:
    scale = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[prefix]
    _assert_bytes(f"{n} {prefix}B", n * scale)


@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["k", "M", "G", "T"]))
def test_decimal_prefixes_are_powers_of_1000(n: int, prefix: str) -> None:
    scale = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[prefix]
    _assert_bytes(f"{n} {prefix}B", n * scale)


def _assert_bytes(text: str, count: int) -> None:
    """`text` reads as `count` bytes, or, from 2**63 bytes on, is refused as too large."""
    if count < MAX_INT:
        assert parse_bytes(text) == count
    else:
        with pytest.raises(UnitError, match=r"is too large \(sizes must be below 2\*\*63 bytes\)"):
            parse_bytes(text)


@given(st.text(max_size=40))
def test_any_text_parses_or_raises_unit_error(text: str) -> None:
    for parse in (parse_bytes, parse_bandwidth, parse_duration, parse_flops):
        try:
            value = parse(text)
        except UnitError:
            continue
        assert value >= 0


def test_format_bytes_names_its_prefix() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1.5 * 2**30) == "1.50 GiB"
    assert format_bytes(1.5e9, binary=False) == "1.50 GB"


def test_format_rate_flops_and_duration() -> None:
    assert format_rate(450e9) == "450 GB/s"
    assert format_flops(989e12) == "989 TFLOP/s"
    assert format_duration(0) == "0 s"
    assert format_duration(2.02e-3) == "2.02 ms"
    assert format_duration(3e-6) == "3 µs"
    assert format_duration(12.3) == "12.3 s"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("200 Gb/s", 25e9), ("400 Gbit/s", 50e9), ("100Gb/s", 12.5e9), ("8 Kib/s", 1024.0)],
)
def test_network_rates_in_bits_are_read_as_bytes(text: str, expected: float) -> None:
    """Network links are quoted in bits per second (HDR InfiniBand: 200 Gb/s = 25 GB/s)."""
    assert parse_bandwidth(text) == expected


def test_a_bare_size_under_a_mebibyte_is_a_unit_left_out() -> None:
    from budget.units import unit_left_out

    assert unit_left_out(80) == 80 and unit_left_out("5") == 5.0
    assert unit_left_out(2**20) is None and unit_left_out(85_899_345_920) is None  # bytes meant
    assert unit_left_out(0) is None and unit_left_out("5%") is None and unit_left_out(True) is None


def test_a_count_of_one_takes_the_singular() -> None:
    """'1 layers', '1 ranks', '1 sequences' and '1 nodes ... hold' read wrong (review)."""
    from budget.units import plural

    assert plural(1, "layer") == "1 layer"
    assert plural(80, "layer") == "80 layers"
    assert plural(0, "rank") == "0 ranks"
    assert plural(16_384, "GPU") == "16,384 GPUs"
    assert plural(2, "micro-batch", "micro-batches") == "2 micro-batches"


def test_a_size_that_rounds_up_to_the_next_prefix_takes_it() -> None:
    """Three significant digits of the value as printed: 1,073,520,640 B is 1,023.8 MiB,
    which read "1024 MiB" beside the report's "1.00 GiB" figures (review); 9.996 GiB read
    "10.00 GiB", four digits; so did 1,000 to 1,023 of a binary unit ("1002 MiB", an audit,
    m427): 1,002 / 1,024 = 0.9785 GiB."""
    assert format_bytes(1_073_520_640) == "1.00 GiB"
    assert format_bytes(1002 * 2**20) == "0.979 GiB"
    assert format_bytes(999 * 2**20) == "999 MiB"
    assert format_bytes(1023 * 2**20) == "0.999 GiB"
    assert format_bytes(-1000 * 2**10) == "-0.977 MiB"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(9.996 * 2**30) == "10.0 GiB"
    assert format_bytes(99.96 * 2**30) == "100 GiB"
    assert format_bytes(999_600, binary=False) == "1.00 MB"
    assert format_bytes(999_400, binary=False) == "999 kB"


def test_a_time_that_rounds_up_to_the_next_unit_takes_it() -> None:
    """0.9996 s read "1000 ms"; as with sizes, a figure that rounds to a thousand of its
    unit is written in the next one."""
    assert format_duration(0.9996) == "1.00 s" and format_duration(-0.9996) == "-1.00 s"
    assert format_duration(0.9994) == "999 ms"
    assert format_duration(999.7e-9) == "1.00 µs" and format_duration(0.0009996) == "1.00 ms"


@pytest.mark.parametrize(
    "size", ["1e30 B", "9223372036854775808 B", "9223372036854775808", 1e30, "8192 PiB"]
)
def test_a_size_of_2_to_the_63_bytes_or_more_is_refused_as_the_bare_integer_is(
    size: str | float,
) -> None:
    """1e30 B passed as a device of 10^30 bytes, where the plan's YAML loader refuses the
    bare integer 9223372036854775808 (audit): a count of bytes is below `MAX_INT` too."""
    assert MAX_INT == 2**63
    with pytest.raises(UnitError) as raised:
        parse_bytes(size)
    assert str(raised.value) == f"{size!r} is too large (sizes must be below 2**63 bytes)"
    assert parse_bytes("9223372036854775807 B") == MAX_INT - 1
    assert parse_bytes(MAX_INT - 1) == MAX_INT - 1


@pytest.mark.parametrize(
    ("share", "text"),
    [(0.554, "55.4%"), (0.0005, "0.1%"), (0.00049, "0.049%"), (0.00025, "0.025%"), (0, "0.0%")],
)
def test_a_small_share_keeps_figures_enough_to_read_as_more_than_nought(
    share: float, text: str
) -> None:
    """An audit: a tiny model's MFU of 0.049 % printed "0.0%"."""
    from budget.units import format_share

    assert format_share(share) == text


@pytest.mark.parametrize(
    ("x", "text"),
    [(410_956.8, "410,957"), (44.2, "44"), (0.396, "0.396"), (4.2, "4.20"), (0, "0")],
)
def test_a_small_rate_keeps_three_significant_figures(x: float, text: str) -> None:
    """An audit: 0.396 generated tokens/s printed "0"."""
    from budget.units import format_amount

    assert format_amount(x) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (70_553_706_496, "70.55 billion"),
        (999_999_999, "1.00 billion"),
        (494_032_768, "494.03 million"),
        (171_136, "171,136"),
    ],
)
def test_a_parameter_count_is_said_in_the_unit_it_reaches(n: int, text: str) -> None:
    """An audit: a 171,136-parameter model read "0.00 billion parameters"."""
    from budget.units import format_count

    assert format_count(n) == text
