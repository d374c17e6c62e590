"""Hypothesis profiles: `ci` (derandomised, the default when CI is set), `dev`, `fuzz` and `worst`.

`fuzz` and `worst` search for the worst case: the differential suite reports each output's error to
`hypothesis.target` there (`targets`), so that hypothesis steers towards larger errors; `ci` and `dev`
report nothing and draw what they drew before targeting existed.

Under `ci` with ``TKVERIFY_CI_SEED=commit`` the seed comes from the commit (`commit_seed`): successive
commits draw different examples, and each commit's run is reproducible.  Without it (the default) ci
draws the same derandomised examples at every commit.  ``--hypothesis-seed N`` overrides both.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("ci", "dev", "fuzz", "worst")

# The profiles under which the differential suite targets each output's error (`tkverify.suite.verify`).
TARGETED = ("fuzz", "worst")

# Cases hold tensors built from a few drawn numbers, so the usual health checks
# about slow or large data generation only measure the kernels; they stay off.
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
          HealthCheck.function_scoped_fixture]
# No "explain" phase: its coverage notes point into tkverify, not into the kernel.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]


def register_profiles() -> None:
    settings.register_profile(
        "ci", max_examples=int(os.environ.get("TKVERIFY_CI_EXAMPLES", 30)), derandomize=True, deadline=None,
        print_blob=True, database=None, suppress_health_check=_QUIET, phases=_PHASES,
    )
    settings.register_profile("dev", max_examples=100, deadline=None, print_blob=True, suppress_health_check=_QUIET, phases=_PHASES)
    # The searching profiles start from hypothesis' own defaults (random, with its example database), not
    # from the profile loaded when they are registered: hypothesis loads its derandomised "ci" profile
    # where the CI variable is set, and a search that replays one fixed sequence finds nothing new.
    searching = settings.get_profile("default")
    settings.register_profile(
        "fuzz", parent=searching, max_examples=int(os.environ.get("TKVERIFY_FUZZ_EXAMPLES", 2000)), deadline=None,
        print_blob=True, suppress_health_check=_QUIET, phases=_PHASES,
    )
    settings.register_profile(
        "worst", parent=searching, max_examples=int(os.environ.get("TKVERIFY_WORST_EXAMPLES", 10_000)),
        deadline=None, print_blob=True, suppress_health_check=_QUIET, phases=_PHASES,
    )


def pin_constant_pool() -> bool:
    """Keep hypothesis from drawing constants out of the code this process has imported.

    Hypothesis (6.131 on) draws about one choice in twenty from the literals it finds in every "local"
    module (outside site-packages and the standard library) imported so far, a pool that grows as the
    process imports more.  A derandomised profile's cases then depend on what ran before them: on the H200
    a strategy test that passes alone failed inside the suite, in the one xdist worker whose earlier tests
    had imported our kernels and tilelang, unpacked outside site-packages there
    (reports/evidence/framework.md#constant-pool).  tkverify's
    strategies aim at the formats' edges themselves, so the pool is pinned empty: a case depends on the
    seed, the strategy and hypothesis' version only.  Returns False where this hypothesis has no pool.
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:
        return False
    if not hasattr(providers, "_get_local_constants"):
        return False
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    cache = getattr(providers, "CONSTANTS_CACHE", None)  # (choice kind, constraints) -> the pools drawn from
    if cache is not None:
        cache.cache.clear()
    return True


def targets(profile: str) -> bool:
    """Whether the differential suite reports each output's error to `hypothesis.target` under `profile`
    (a name `load` returned: a seeded variant targets as its profile does)."""
    return profile.removesuffix("-seeded") in TARGETED


# TKVERIFY_CI_SEED=commit: the ci profile's seed is derived from the commit (`commit_seed`).
CI_SEED_ENV = "TKVERIFY_CI_SEED"


def checkout_commit() -> str | None:
    """The commit the examples are drawn for: TKVERIFY_COMMIT, else git's HEAD here, else None."""
    named = os.environ.get("TKVERIFY_COMMIT")
    if named:
        return named
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def seed_of_commit(commit: str | None) -> int:
    """A 32-bit seed of a commit's name (its SHA-256, so that neighbouring names give unrelated seeds); 0
    where there is no commit."""
    if not commit:
        return 0
    return int.from_bytes(hashlib.sha256(commit.encode()).digest()[:4], "big")


def commit_seed(profile: str | None) -> int | None:
    """The seed of `profile` (None: the default profile) derived from the commit, where TKVERIFY_CI_SEED=commit
    asks for it and the profile is ci; None otherwise (the profile draws as it always does)."""
    wanted = os.environ.get(CI_SEED_ENV, "").strip().lower()
    if wanted not in ("", "commit", "fixed"):
        raise ValueError(f"{CI_SEED_ENV}={wanted!r}: use commit (a seed from the commit) or fixed (the default)")
    if wanted != "commit" or (profile or default_profile()) != "ci":
        return None
    return seed_of_commit(checkout_commit())


def force_seed(seed: int) -> None:
    """Make every hypothesis test of this process draw from `seed`, as pytest's --hypothesis-seed does."""
    from hypothesis import core

    core.global_force_seed = seed


def default_profile() -> str:
    return "ci" if os.environ.get("CI") else "dev"


def load(name: str | None, seeded: bool = False) -> str:
    """Load a profile; `seeded` (pytest's --hypothesis-seed was given) keeps its
    example counts but lets the seed choose the examples, which a derandomised
    profile would otherwise ignore (derandomize wins over the global seed)."""
    register_profiles()
    pin_constant_pool()
    name = name or default_profile()
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}")
    if seeded and settings.get_profile(name).derandomize:
        settings.register_profile(f"{name}-seeded", parent=settings.get_profile(name), derandomize=False)
        name = f"{name}-seeded"
    settings.load_profile(name)
    return name
