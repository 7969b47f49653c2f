"""Sizes and bounds as a user reads them (spice_core.units): decimal units chosen by size at three significant
figures, and bounds rounded up in plain decimal, so a value typed back from a message still meets it."""
from decimal import Decimal

import pytest

from spice_core.units import format_bytes, round_up


@pytest.mark.parametrize("n_bytes,said", [(0, "0 B"), (12, "12 B"), (999, "999 B"), (999.5, "1.00 kB"),
                                          (1536, "1.54 kB"), (9_995, "10.0 kB"), (99_949, "99.9 kB"),
                                          (999_499, "999 kB"), (999_999, "1.00 MB"), (17.3e6, "17.3 MB"),
                                          (268_435_456, "268 MB"), (2.7e9, "2.70 GB"), (112.3e9, "112 GB"),
                                          (-1536, "-1.54 kB")])
def test_a_size_reads_in_the_largest_unit_it_reaches_to_three_significant_figures(n_bytes, said):
    assert format_bytes(n_bytes) == said


@pytest.mark.parametrize("value,said", [(0.0036057692, "0.00361"), (1.23e-5, "0.0000123"), (0.125, "0.125"),
                                        (0.1, "0.1"), (2 / 3, "0.667"), (0.99999, "1"), (0, "0"),
                                        (123_456.7, "124000")])
def test_a_bound_is_rounded_up_in_plain_decimal(value, said):
    assert round_up(value) == said
    assert Decimal(said) >= Decimal(repr(value)) and float(said) >= value and "e" not in said.lower()
