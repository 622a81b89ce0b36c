"""The suite registers slowed presets by name (``harness.slowed_preset``); they are taken
out again after each module, so tests elsewhere that walk every preset never see them."""

import pytest

from baton.perf import presets


@pytest.fixture(autouse=True, scope="module")
def _slowed_presets_removed():
    before = set(presets.PRESETS)
    yield
    for name in set(presets.PRESETS) - before:
        del presets.PRESETS[name]
