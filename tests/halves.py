"""The scrape layer's C halves or their Python twins, chosen explicitly through the one seam
(fsdpmon.scrape.fastpath), whatever FSDPMON_PURE_PYTHON says: for the tests that compare them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fsdpmon.scrape import fastpath

BUILT = fastpath.built()


def needs_c(*parts: str) -> pytest.MarkDecorator:
    """Skips a test where one of these C parts (fastpath.Halves' fields) is not built."""
    missing = [part for part in parts or fastpath.PARTS if getattr(BUILT, part) is None]
    return pytest.mark.skipif(bool(missing), reason=f"C half not built: {', '.join(missing)}")


@pytest.fixture(params=["c", "python"])
def half(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test with every C half built ("c"), then with none ("python")."""
    if request.param == "c" and not BUILT.any():
        pytest.skip("no C half is built")
    with fastpath.using(BUILT if request.param == "c" else fastpath.PYTHON):
        yield request.param
