"""Every input class a strategy lists is reached by the differential suite's own draws under the ci profile.

Each strategy of the quant, moe, transpose and mhc families tags its cases with their input classes
(its ``classify``, `strategies.classes.tagging`; the suite tags each judged case with
``hypothesis.event("class: <name>")``) and lists the classes it reaches (its ``classes``).  Here the
differential suite's verify runs each op's torch implementation under the ci profile on the CPU
(`tkverify.suite.judged_classes`: the same test function, strategy and layouts, hence the same derandomised
examples as ``pytest tests/test_differential.py`` under ci); a listed class no judged example has fails, and so
does a listed class the family's spec docstring does not name.
"""

from __future__ import annotations

import collections
import importlib

import pytest
from hypothesis import settings

from tkverify import mutants, registry, suite

FAMILIES = ("quant", "moe", "transpose", "mhc")


def tagged_specs() -> list[registry.OpSpec]:
    """The ops of these families whose strategy tags its classes."""
    return [s for s in registry.all_specs()
            if s.name.split(".")[0] in FAMILIES and getattr(s.strategy, "classes", None)]


def ci_judged_classes(spec: registry.OpSpec) -> suite.JudgedClasses:
    """The input classes of the examples the differential suite judges of `spec`'s torch implementation
    under the ci profile (without its shrink phase: a disagreement is test_differential's to shrink)."""
    impl = spec.impls.get("torch")
    if impl is None or impl.unavailable_reason():
        pytest.skip(f"{spec.name} has no torch implementation here")
    with mutants.hypothesis_profile("ci"):
        return suite.judged_classes(spec, impl)


def test_every_family_tags():
    tagged = {s.name.split(".")[0] for s in tagged_specs()}
    assert tagged == set(FAMILIES)


@pytest.mark.parametrize("spec", tagged_specs(), ids=lambda s: s.name)
def test_listed_classes_are_drawn(spec):
    judged = ci_judged_classes(spec)
    missing = [c for c in spec.strategy.classes if not judged.counts[c]]
    stopped = f"; the run stopped at {judged.failure}" if judged.failure else ""
    assert not missing, (f"{spec.name}: no judged example of {missing} in the suite's {judged.drawn} ci draws "
                         f"(judged: {dict(judged.counts)}){stopped}")


def test_judged_classes_are_the_suites_draws():
    """judged_classes counts the examples test_differential judges: the classes `tkverify.suite.verify`
    hands its coverage recorder (what the report's "Input classes drawn" table counts), example for example.
    mhc.post is one of the ops whose draws a counting ``map`` of the strategy changes."""
    spec = registry.get("mhc.post")
    impl = spec.impls["torch"]
    recorded: list[str] = []
    with mutants.hypothesis_profile("ci"):
        suite.verify(spec, impl, record_coverage=lambda op, impl_name, classes, paths: recorded.extend(classes))
    judged = ci_judged_classes(spec)
    assert judged.counts == collections.Counter(recorded)
    assert judged.drawn == settings.get_profile("ci").max_examples


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
