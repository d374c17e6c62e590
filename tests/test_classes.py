"""Every input class a strategy lists is drawn under the ci profile.

Each strategy of the quant, moe, transpose and mhc families tags its cases with their input classes
(its ``classify``, `strategies.quant.tagging`; the suite tags each judged case with
``hypothesis.event("class: <name>")``) and lists the classes it reaches (its ``classes``).  Here each op's strategy runs under the ci profile's settings on the CPU; a listed
class with no example fails, and so does a listed class the family's spec docstring does not name.
"""

from __future__ import annotations

import collections
import importlib

import pytest
from hypothesis import given, settings

from tkverify import coverage, profiles, registry

FAMILIES = ("quant", "moe", "transpose", "mhc")


def tagged_specs() -> list[registry.OpSpec]:
    """The ops of these families whose strategy tags its classes."""
    return [s for s in registry.all_specs()
            if s.name.split(".")[0] in FAMILIES and getattr(s.strategy, "classes", None)]


def ci_class_counts(spec: registry.OpSpec) -> collections.Counter:
    """Examples per tagged input class of `spec`'s strategy under the ci profile's settings."""
    profiles.register_profiles()
    profiles.pin_constant_pool()  # draws that do not depend on what this process imported before
    counts: collections.Counter = collections.Counter()

    @settings(settings.get_profile("ci"))
    @given(case=spec.strategy())
    def draw(case):
        counts.update(set(coverage.drawn_classes()) | set(spec.strategy.classify(case)))

    draw()
    return counts


def test_every_family_tags():
    tagged = {s.name.split(".")[0] for s in tagged_specs()}
    assert tagged == set(FAMILIES)


@pytest.mark.parametrize("spec", tagged_specs(), ids=lambda s: s.name)
def test_listed_classes_are_drawn(spec):
    counts = ci_class_counts(spec)
    missing = [c for c in spec.strategy.classes if not counts[c]]
    assert not missing, f"{spec.name}: no example of {missing} under the ci profile (drawn: {dict(counts)})"


@pytest.mark.parametrize("spec", tagged_specs(), ids=lambda s: s.name)
def test_spec_docstring_lists_the_classes(spec):
    doc = importlib.import_module(f"tkverify.specs.{spec.name.split('.')[0]}").__doc__
    unlisted = [c for c in spec.strategy.classes if f"``{c}``" not in doc]
    assert not unlisted, f"tkverify/specs/{spec.name.split('.')[0]}.py's docstring lacks {unlisted}"


def test_tags_are_true_of_the_case():
    """A tag is computed from the drawn tensors: -0.0 beside +0.0 in a row is a signed-zero tie."""
    import torch
    from strategies.quant import case_classes
    from tkverify.case import Case

    tie = Case({}, {"x": torch.tensor([[-0.0, 0.0, 1.0], [2.0, 3.0, 4.0]])})
    plain = Case({}, {"x": torch.tensor([[1.0, 0.0, 1.0], [2.0, 3.0, 4.0]])})
    assert {"signed_zero_tie:x", "neg_zero:x", "non_pow2"} <= case_classes(tie, "x")
    assert not {"signed_zero_tie:x", "neg_zero:x"} & case_classes(plain, "x")
    sub = Case({}, {"x": torch.tensor([[1e-40, float("nan")]])})
    assert {"subnormal:x", "nan:x", "single_row"} <= case_classes(sub, "x")
    payload = torch.tensor([[float("nan")]]).view(torch.int32)
    payload += 1
    assert "nan_payload:x" in case_classes(Case({}, {"x": payload.view(torch.float32)}), "x")
