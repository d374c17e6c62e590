"""The hypothesis settings of the GPU tests that fuzz a kernel against its oracle: derandomised (the same cases at
every run), no example database, no deadline (a first call compiles or loads a kernel), no health checks (cases
hold tensors built from a few drawn numbers)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def gpu_fuzz(max_examples: int) -> settings:
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
