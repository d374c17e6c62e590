"""The differential suite over the registry (tkverify/suite.py), collected as part of the project's tests."""

from tkverify.suite import test_differential  # noqa: F401
