"""Hostile input is refused before it costs anything (the quality bar: alias bombs, huge
numbers, deep nesting, adversarial strings "refused quickly and safely").

`refused_in_time` guards against a blow-up, not a speed target: unguarded, these inputs
take seconds to hours (a billion-laughs expansion, a quadratic pattern's 54 s, exact
arithmetic on "1e-9999999" for 8 s), and guarded a few milliseconds, so one generous
bound tells the two apart on a loaded 2-core machine. How fast budget is, `make bench`
measures and prints.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

BLOW_UP_S = 1.0


@contextmanager
def refused_in_time() -> Iterator[None]:
    """Assert the block (an exception it raises and a ``pytest.raises`` inside catches
    included) ran within `BLOW_UP_S`."""
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    assert seconds < BLOW_UP_S, f"{seconds:.3f} s: a blow-up, not a slow machine"
