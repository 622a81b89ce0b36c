"""The suite registers slowed presets by name (``harness.slowed_preset``, at collection time
too); they are taken out again after each module, so tests elsewhere that walk every preset
never see them."""

import pytest

from baton.perf import presets
from tests.conformance.harness import _Slowed


@pytest.fixture(autouse=True, scope="module")
def _slowed_presets_removed():
    yield
    for name in [n for n, p in presets.PRESETS.items() if isinstance(p, _Slowed)]:
        del presets.PRESETS[name]
