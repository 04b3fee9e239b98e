"""The override vocabulary by name: OverrideTarget and OverrideVerb agree with OVERRIDE_VERBS."""

from __future__ import annotations

from placement_logic.ir.overrides import OVERRIDE_VERBS, OverrideTarget, OverrideVerb


def test_targets_agree_with_the_table_one_to_one():
    assert [t.value for t in OverrideTarget] == list(OVERRIDE_VERBS)
    assert all(t.name == t.value.upper() for t in OverrideTarget)


def test_verbs_are_every_verb_of_the_table_once():
    every = {verb for verbs in OVERRIDE_VERBS.values() for verb in verbs}
    assert sorted(v.value for v in OverrideVerb) == sorted(every)
    assert all(v.name == v.value.upper() for v in OverrideVerb)


def test_a_member_compares_and_prints_as_its_string():
    assert OverrideTarget.CLIP_NORM == "clip_norm" and "clip_norm" in (OverrideTarget.CLIP_NORM,)
    assert f"override {OverrideTarget.GRADS}: {OverrideVerb.REDUCE}" == "override grads: reduce"
    assert OVERRIDE_VERBS[OverrideTarget.GRADS][OverrideVerb.REDUCE] == (True, False)
