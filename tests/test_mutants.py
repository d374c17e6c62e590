"""Mutation testing: the ci profile catches every mutant of the eager implementations (and
every model mutant, the ones the GPU runs, applied to the eager implementations); the
runner counts, reports and exits as documented.  The torch mutants run on the CPU, also on a machine
with a GPU, and are held to the CPU's claims (claims/torch.toml); the GPU's catalogue run is
`tkverify mutants --impl tilelang`."""

import io
import json

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

from tkverify import cli, mutants, registry
from tkverify.case import Case
from tkverify.mutants import CAUGHT, CLAIMS, MISSED, NOT_APPLICABLE, Mutant
from tkverify.policies import ulp


def _run(mutant_list, impl="torch", **kwargs):
    out = io.StringIO()
    code = mutants.run_command(mutant_list, impl, "ci", stream=out, **kwargs)
    return code, out.getvalue()


@pytest.mark.parametrize("models", [False, True], ids=["eager", "models"])
def test_ci_profile_catches_every_torch_mutant(models):
    catalogue = mutants.catalogue()
    profile = settings.get_current_profile_name()
    outcomes = mutants.run_all(catalogue, "torch", profile="ci", models=models, device="cpu")
    assert settings.get_current_profile_name() == profile  # restored
    assert not [n for spec in registry.all_specs() for n in spec.impls if n.startswith("mutant:")]

    counted = [o for o in outcomes if o.counted]
    missed = [f"{o.mutant.name}: {o.status} {o.detail}" for o in counted if o.status != CAUGHT]
    assert not missed, "\n".join(missed)
    # Caught by a verdict on the outputs, never because the mutant raised (a defect of the mutant).
    raised = [f"{o.mutant.name}: {o.detail}" for o in counted if "raised" in o.detail]
    assert not raised, "\n".join(raised)
    # Not applicable only while the op is not registered (mhc is declared before it lands), or,
    # for the models, where a mutant has no model; once an op is registered, every one of its
    # mutants must run on the eager implementation (write the missing factory).
    for o in outcomes:
        if not o.counted:
            allowed = o.detail.endswith("not registered") or (models and o.detail.startswith("no factory"))
            assert allowed, f"{o.mutant.name} did not run: {o.detail}"
    assert mutants.summary_line(outcomes) == f"{len(counted)} of {len(counted)} mutants caught"


def test_catalogue_covers_the_issue():
    names = {m.name for m in mutants.catalogue()}
    assert {"topk_ties_to_higher_index", "truncation_e4m3", "truncation_e2m1", "truncation_e5m6",
            "no_saturation_e4m3", "sf_rounded_down", "clamp_min_ignored", "transpose_tail_tile_skipped",
            "swiglu_clamp_one_sided", "swiglu_counter_32bit", "expand_padding_rows_garbage",
            "reduce_accumulates_masked_slots", "engram_eps_outside_sqrt", "engram_grad_x_missing_term",
            "engram_gate_grad_below_clamp", "sinkhorn_one_iteration_fewer", "sinkhorn_rows_columns_swapped",
            "sinkhorn_backward_missing_step", "post_comb_transposed", "pre_split_scale1_on_comb",
            # padding rows left unwritten on every path whose contract writes padding (caught through
            # tkverify.poison), and a tie class across the NaN / +inf boundary
            "expand_padding_rows_unwritten", "expand_sf_padding_rows_unwritten",
            "fused_mapping_padding_rows_unwritten", "swiglu_padding_rows_unwritten", "topk_nan_tied_with_inf",
            # claim regressions: inside the contract, beyond the torch claims
            "sf_by_reciprocal", "engram_rms_reciprocal_of_sqrt"} <= names
    assert any(n.startswith("ties_away_") for n in names)


# -- claim regressions: inside the contract, caught only by the implementation's claims ---------------------


CLAIM_REGRESSIONS = [m for m in mutants.catalogue() if m.claim_regression]


def test_claim_regressions_span_families():
    assert len({m.op.split(".")[0] for m in CLAIM_REGRESSIONS}) >= 2, [m.name for m in CLAIM_REGRESSIONS]


@pytest.mark.parametrize("mutant", CLAIM_REGRESSIONS, ids=lambda m: m.name)
def test_a_claim_regression_passes_its_contract_and_fails_its_claims(mutant):
    """A change that keeps an implementation inside its contract but rounds worse than its claim: the
    contract alone misses it on every ci example, the torch claims (claims/torch.toml) catch it."""
    (alone,) = mutants.run_all([mutant], "torch", profile="ci", claims_dir=None, device="cpu")
    assert alone.status == MISSED, f"{alone.status}: {alone.detail}"
    assert alone.examples >= settings.get_profile("ci").max_examples
    (held,) = mutants.run_all([mutant], "torch", profile="ci", device="cpu")
    assert (held.status, held.by) == (CAUGHT, CLAIMS), f"{held.status}: {held.detail}"
    assert held.detail.startswith("beyond the claims of torch.toml: "), held.detail


@pytest.mark.parametrize("op", sorted({m.op for m in CLAIM_REGRESSIONS}))
def test_the_unchanged_implementation_is_within_its_claims_in_the_runner(op):
    """No false alarm: the eager implementation itself, run as a mutant that changes nothing, draws the
    examples the claims were measured on and stays within them."""
    unchanged = Mutant("unchanged", op, "nothing", eager=lambda fn: fn)
    (outcome,) = mutants.run_all([unchanged], "torch", profile="ci", device="cpu")
    assert outcome.status == MISSED, f"{outcome.status}: {outcome.detail}"
    assert outcome.detail.endswith("none beyond the claims of torch.toml"), outcome.detail


def test_claims_hold_under_the_ci_profile_only():
    """Other profiles draw examples the claims never saw: a mutant there is judged by the contract alone."""
    (mutant,) = [m for m in CLAIM_REGRESSIONS if m.name == "sf_by_reciprocal"]
    (outcome,) = mutants.run_all([mutant], "torch", profile="dev")
    assert outcome.status == MISSED and outcome.by == ""
    assert "claims" not in outcome.detail


# -- the runner, on a fake op ----------------------------------------------------------------


@pytest.fixture
def fake_op():
    """fake.double: y = 2 x, judged to 0.5 ULP; x drawn in [-10, 10]."""
    spec = registry.register(registry.OpSpec(
        name="fake.double",
        oracle=lambda x: x.double() * 2,
        strategy=lambda: st.lists(st.floats(-10, 10, width=32), min_size=1, max_size=8).map(
            lambda v: Case(params={}, inputs={"x": torch.tensor(v, dtype=torch.float32)})),
        outputs={"y": ulp("fp32", 0.5)},
        impls={"torch": registry.Impl("torch", lambda x: x * 2, device="cpu")},
    ))
    yield spec
    registry._REGISTRY.pop("fake.double", None)


def _times_three(fn):
    return lambda x: fn(x) * 1.5


def _off_beyond_range(fn):
    return lambda x: torch.where(x.abs() > 1e30, fn(x) + 1, fn(x))  # the strategy never goes there


CAUGHT_ONE = Mutant("triples", "fake.double", "y = 3 x", model=_times_three)
MISSED_ONE = Mutant("off_far_away", "fake.double", "wrong beyond 1e30", model=_off_beyond_range)
ABSENT_OP = Mutant("not_here", "fake.absent", "an op nobody registered", model=_times_three)


def test_runner_reports_caught_and_missed(fake_op, tmp_path):
    code, out = _run([CAUGHT_ONE, MISSED_ONE, ABSENT_OP], out=tmp_path / "mutants.md")
    lines = out.strip().splitlines()
    assert code == 1, out
    assert lines[-1] == "1 of 2 mutants caught", out
    assert any(ln.startswith("triples") and "caught after" in ln for ln in lines), out
    assert any(ln.startswith("off_far_away") and "MISSED" in ln for ln in lines), out
    assert "1 not applicable here, not counted in M:" in lines, out
    assert "    op fake.absent not registered: not_here" in lines, out
    assert "fake.double" in registry._REGISTRY and list(fake_op.impls) == ["torch"]  # registry restored

    report = json.loads((tmp_path / "mutants.json").read_text())
    assert (report["caught"], report["total"]) == (1, 2)
    by_name = {m["name"]: m for m in report["mutants"]}
    assert by_name["triples"]["status"] == CAUGHT and by_name["triples"]["examples"] >= 1
    assert by_name["off_far_away"]["status"] == "missed"
    assert by_name["off_far_away"]["examples"] == settings.get_profile("ci").max_examples
    assert by_name["not_here"]["status"] == NOT_APPLICABLE
    assert by_name["triples"]["by"] == "contract" and report["claims"].endswith("claims")
    assert (tmp_path / "mutants.md").read_text().rstrip().endswith("1 of 2 mutants caught")


def test_runner_counts_examples_to_the_first_failure(fake_op):
    # Wrong only for the first element of the list above 5: the strategy takes a few draws to get there.
    def late(fn):
        return lambda x: torch.where(x > 5, fn(x) + 1, fn(x))

    (outcome,) = mutants.run_all([Mutant("late", "fake.double", "wrong above 5", model=late)], profile="ci")
    assert outcome.status == CAUGHT
    assert 1 <= outcome.examples <= settings.get_profile("ci").max_examples
    assert "y" in outcome.detail


def test_nothing_applicable_exits_2(fake_op):
    code, out = _run([ABSENT_OP])
    assert code == 2
    assert out.strip().splitlines()[-1] == "0 of 0 mutants caught"


def test_cli_subcommand(capsys):
    assert cli.main(["mutants", "--impl", "torch", "--profile", "ci", "--only", "topk_ties_to_higher_index"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "1 of 1 mutants caught"
    assert cli.main(["mutants", "--only", "no_such_mutant"]) == 2
