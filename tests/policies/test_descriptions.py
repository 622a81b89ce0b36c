"""Every named policy has its one line for ``baton list policies``, and no line names a
policy that is gone."""

from baton.policies.catalog import POLICIES
from baton.policies.descriptions import DESCRIPTIONS


def test_every_policy_has_one_line_and_only_policies_have_one():
    assert set(DESCRIPTIONS) == set(POLICIES)
    for name, text in DESCRIPTIONS.items():
        assert text.strip() and "\n" not in text and len(text) <= 100, name
