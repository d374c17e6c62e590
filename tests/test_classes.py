"""Every input class a strategy lists is drawn under the ci profile.

Each strategy of the quant, moe, transpose and mhc families tags its cases with their input classes
(its ``classify``, `strategies.classes.tagging`; the suite tags each judged case with
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
    module, doc = _listing_docstring(spec.name)
    unlisted = [c for c in spec.strategy.classes if f"``{c}``" not in doc]
    assert not unlisted, f"tkverify/specs/{module}.py's docstring lacks {unlisted}"


def _listing_docstring(op: str) -> tuple[str, str]:
    """(module, the op's bullet) of the tkverify.specs module whose docstring has a bullet ``* <ops>: ...``
    naming the op among its comma-separated ops; the family's module (an empty bullet) where none has."""
    import pkgutil

    import tkverify.specs

    for info in pkgutil.iter_modules(tkverify.specs.__path__):
        doc = importlib.import_module(f"tkverify.specs.{info.name}").__doc__ or ""
        for bullet in doc.split("\n* ")[1:]:
            if op in [name.strip() for name in bullet.split(":", 1)[0].split(",")]:
                return info.name, bullet
    return op.split(".")[0], ""
