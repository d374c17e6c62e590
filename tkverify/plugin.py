"""The pytest plugin (registered through the `pytest11` entry point).

Options: ``--tk-impl`` which implementations to judge, ``--tk-profile`` the
hypothesis profile, ``--tk-report DIR`` where the merged report goes (with
each result row's worst example and its failing case as case files under
``DIR/worst/`` and ``DIR/cases/``),
``--tk-load MODULE`` extra registrations (your own kernels), ``--tk-cases DIR``
where failing cases are saved, ``--tk-precompile`` TileLang kernels compiled in
the background while the workers start (a cold kernel cache).

Under pytest-xdist each worker writes a shard and the controller merges them; on
a machine with several GPUs each worker is pinned to one GPU.  An `Unsupported`
raised in a test (an implementation refusing the case it is called on) is
reported as a skip with its reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tkverify import claims, profiles, registry
from tkverify.case import versions
from tkverify.report import Collector, ResultRow, device_info, meta, report_from_shards
from tkverify.report.shards import CASES_DIR, WORST_DIR

IMPL_CHOICES = ("auto", "all", *registry.BUILTIN_IMPLS)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tkverify", "tkverify differential testing")
    group.addoption("--tk-impl", default="auto",
                    help="implementations to judge: auto (what can run here), all, or a comma list of "
                         "torch, tilelang, tile_kernels and any registered name")
    group.addoption("--tk-profile", default=None, choices=profiles.PROFILES,
                    help="hypothesis profile: ci, dev, fuzz (targets each output's error) or worst (the same "
                         "with 10,000 examples; TKVERIFY_WORST_EXAMPLES) (default: ci when the CI variable is "
                         "set, else dev)")
    group.addoption("--tk-report", default=None, metavar="DIR", help="write report.json/.md/.html to DIR")
    group.addoption("--tk-load", action="append", default=[], metavar="MODULE",
                    help="import MODULE to register more ops or implementations (repeatable)")
    group.addoption("--tk-cases", default=None, metavar="DIR", help="where failing cases are saved "
                    "(default .tkverify/cases)")
    group.addoption("--tk-claims", default=None, metavar="DIR",
                    help="the accuracy claims each implementation is held to (claims/<impl>.toml; a row beyond "
                         "its claim fails the run even inside the contract); none: no claims (default: "
                         "TKVERIFY_CLAIMS, else the repository's claims/)")
    group.addoption("--tk-precompile", default="auto", metavar="JOBS",
                    help="compile every TileLang configuration in JOBS background processes while the tests "
                         "run (python -m kernels.precompile; a test that needs one waits for it, never "
                         "compiles it twice); auto: under pytest-xdist when tilelang is judged here, with "
                         "the cores the workers leave; 0: off")


def worker_id(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput else None


def worker_gpu(worker: str | None, device_count: int) -> int | None:
    """The GPU an xdist worker is pinned to: gwN takes GPU N mod the GPU count."""
    if worker is None or device_count < 2:
        return None
    m = re.fullmatch(r"gw(\d+)", worker)
    return int(m.group(1)) % device_count if m else None


def worker_threads(cpus: int, workers: int) -> int:
    """CPU threads for torch in each of `workers` xdist workers sharing `cpus` cores (at least one)."""
    return max(1, cpus // max(1, workers))


def _share_cpu_threads(config: pytest.Config) -> int | None:
    """Give each xdist worker its share of the cores for torch's CPU ops (the float64 oracles and their
    gradchecks): by default every worker takes them all, and with 8 workers on 16 cores the Engram
    oracle's gradcheck takes 43.9 s against 3.6 s in one process
    (reports/evidence/framework.md#cpu-threads-per-worker)."""
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker_id(config) is None or not count:
        return None
    import torch

    threads = worker_threads(len(os.sched_getaffinity(0)), int(count))
    if threads < torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def _pin_worker_to_gpu(config: pytest.Config) -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    gpu = worker_gpu(worker_id(config), torch.cuda.device_count())
    if gpu is not None:
        torch.cuda.set_device(gpu)
        print(f"[tkverify] worker {worker_id(config)} pinned to cuda:{gpu} "
              f"({torch.cuda.get_device_name(gpu)}), pid {os.getpid()}", file=sys.stderr)
    return gpu if gpu is not None else torch.cuda.current_device()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device")
    seed = config.getoption("hypothesis_seed", default=None)
    if seed is None:  # TKVERIFY_CI_SEED=commit: the ci profile draws from a seed of the commit
        seed = profiles.commit_seed(config.getoption("--tk-profile"))
        if seed is not None:
            profiles.force_seed(seed)
    profile = profiles.load(config.getoption("--tk-profile"), seeded=seed is not None)
    registry.load_plugins(config.getoption("--tk-load"))
    check_impl_choice(config.getoption("--tk-impl"))
    state = {
        "profile": profile,
        "seed": seed,
        "target": profiles.targets(profile),
        "collector": Collector(),
        "gpu": _pin_worker_to_gpu(config),
        "threads": _share_cpu_threads(config),
        "report": Path(config.getoption("--tk-report")) if config.getoption("--tk-report") else None,
        "cases": Path(config.getoption("--tk-cases") or os.environ.get("TKVERIFY_CASE_DIR", ".tkverify/cases")),
        "claims": claims.claims_dir_from(config.getoption("--tk-claims")),
    }
    config.stash[_STATE] = state
    if state["report"] is not None and worker_id(config) is None:
        # A report reflects this run only: earlier shards and the case files its rows named go.
        case_files = (".json", ".npz")
        for folder, suffixes in (("shards", (".json",)), (WORST_DIR, case_files), (CASES_DIR, case_files)):
            for old in (state["report"] / folder).glob("*"):
                if old.suffix in suffixes and old.is_file():
                    old.unlink()


_STATE = pytest.StashKey[dict]()


def precompile_jobs(choice: str, *, workers: int, cpus: int, tilelang_runs: bool) -> int:
    """Background compile processes for --tk-precompile: `auto` means under xdist only (one
    process fuzzes its ops one after another and compiles what it needs as it goes), on the
    cores the workers leave, at least one."""
    if choice != "auto":
        if not choice.isdigit():
            raise pytest.UsageError(f"--tk-precompile: {choice!r} is not auto or a process count")
        return int(choice) if tilelang_runs else 0
    return max(1, cpus - workers) if tilelang_runs and workers > 0 else 0


def _tilelang_runs(choice: str) -> bool:
    return any(name == "tilelang" and reason is None
               for spec in registry.all_specs() for name, reason in selected_impls(spec, choice))


def _start_precompile(config: pytest.Config) -> None:
    """Cold-cache runs: compile the kernels in the background, beside the workers' first tests.

    Without it each worker compiles what its tests need, one configuration after another: from an
    empty cache the suite takes 399 s with 79% of the differential tests' time in the implementations'
    first calls, against 271-284 s with the background pass and 268 s warm
    (reports/evidence/framework.md#background-precompile)."""
    workers = int(getattr(config.option, "numprocesses", 0) or 0)
    jobs = precompile_jobs(config.getoption("--tk-precompile"), workers=workers, cpus=len(os.sched_getaffinity(0)),
                           tilelang_runs=_tilelang_runs(config.getoption("--tk-impl")))
    found = importlib.util.find_spec("kernels.precompile")
    if not jobs or found is None:
        return
    state = config.stash[_STATE]
    log_path = (state["report"] or Path(".tkverify")) / "precompile.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    root = str(Path(found.origin).parent.parent)  # where `kernels` is importable from
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    with open(log_path, "w") as log:
        state["precompile"] = (subprocess.Popen(
            [sys.executable, "-m", "kernels.precompile", "--jobs", str(jobs), "--arch", "device"], stdout=log,
            stderr=subprocess.STDOUT, env=env, start_new_session=True), log_path, jobs, time.monotonic())


def _stop_precompile(config: pytest.Config) -> str | None:
    """End the background compile if the tests finished first; what it did, for the summary."""
    state = config.stash.get(_STATE, None)
    if not state or "precompile" not in state:
        return None
    process, log_path, jobs, started = state.pop("precompile")
    finished = process.poll() is not None
    if not finished:
        os.killpg(process.pid, 15)  # its pool's workers too
        process.wait()
    lines = log_path.read_text(errors="replace").splitlines()
    compiled = sum(line.startswith("compiled ") and ": " in line for line in lines)
    total = next((line for line in reversed(lines) if re.fullmatch(r"compiled \d+ configurations in .* s", line)), None)
    how = (f"finished: {total}" if finished and process.returncode == 0 and total else
           f"exit status {process.returncode}" if finished else
           f"stopped when the tests ended, {time.monotonic() - started:.0f} s after it started")
    return f"tkverify precompile ({jobs} processes): {compiled} configurations done, {how} (log: {log_path})"


def selected_impls(spec: registry.OpSpec, choice: str) -> list[tuple[str, str | None]]:
    """(implementation, reason it cannot run or None) for one op under --tk-impl."""
    names = list(spec.impls)
    if choice == "auto":
        return [(n, None) for n in names if spec.impls[n].unavailable_reason() is None]
    if choice == "all":
        wanted = list(dict.fromkeys([*registry.BUILTIN_IMPLS, *names]))
    else:
        wanted = [c.strip() for c in choice.split(",") if c.strip()]
    out = []
    for n in wanted:
        if n in spec.impls:
            out.append((n, spec.impls[n].unavailable_reason()))
        elif n in registry.BUILTIN_IMPLS:  # a built-in that lacks this op is worth a visible skip
            out.append((n, f"{spec.name} has no implementation {n!r} (it has: {', '.join(names)})"))
    return out


def check_impl_choice(choice: str) -> None:
    """Refuse a name no op implements (a typo would otherwise run nothing)."""
    if choice in ("auto", "all"):
        return
    known = set(registry.impl_names()) | set(registry.BUILTIN_IMPLS)
    unknown = [c.strip() for c in choice.split(",") if c.strip() and c.strip() not in known]
    if unknown:
        raise pytest.UsageError(f"--tk-impl: no op has an implementation named {', '.join(unknown)} "
                                f"(known: auto, all, {', '.join(sorted(known))})")


def gradient_params(choice: str) -> list:
    """(op, implementation) for every op with a backward: "oracle" (the gradcheck of the float64
    backward, which needs no device) and each selected implementation that has a backward."""
    from tkverify.gradients import ORACLE

    params = []
    for spec in registry.all_specs():
        if spec.backward is None:
            continue
        params.append(pytest.param((spec.name, ORACLE), id=f"{spec.name}-{ORACLE}"))
        for impl, reason in selected_impls(spec, choice):
            bwd = spec.backward.impls.get(impl)
            if reason is None:
                reason = (f"{spec.name} declares no backward for {impl!r}" if bwd is None
                          else bwd.unavailable_reason())
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            if impl in spec.impls and spec.impls[impl].device == "cuda":
                marks.append(pytest.mark.gpu)
            params.append(pytest.param((spec.name, impl), id=f"{spec.name}-{impl}", marks=marks))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tk_grad_op_impl" in metafunc.fixturenames:
        metafunc.parametrize("tk_grad_op_impl", gradient_params(metafunc.config.getoption("--tk-impl")))
    if "tk_op_impl" not in metafunc.fixturenames:
        return
    choice = metafunc.config.getoption("--tk-impl")
    params = []
    for spec in registry.all_specs():
        for impl, reason in selected_impls(spec, choice):
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            if impl in spec.impls and spec.impls[impl].device == "cuda":
                marks.append(pytest.mark.gpu)
            params.append(pytest.param((spec.name, impl), id=f"{spec.name}-{impl}", marks=marks))
    metafunc.parametrize("tk_op_impl", params)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """An `Unsupported` that reaches a test makes that phase a skip, reported as pytest reports its own:
    the exception's line as the reason, at the line that raised it (in the setup phase, a fixture: at the
    test, so that the skip names it).

    `Unsupported` is no pytest exception (the data model does not import pytest), so pytest first sees a
    failure; this hook runs inside the other report hooks (trylast), which then see the skip."""
    report = yield
    excinfo = call.excinfo
    if report.failed and excinfo is not None and excinfo.errisinstance(registry.Unsupported):
        if call.when == "setup":
            path, line = item.reportinfo()[:2]
        else:
            path, line = excinfo.traceback[-1].path, excinfo.traceback[-1].lineno
        report.outcome = "skipped"
        report.longrepr = (str(path), line + 1, excinfo.exconly(tryshort=True))
    return report


@pytest.fixture
def tk_state(request: pytest.FixtureRequest) -> dict:
    return request.config.stash[_STATE]


# A worker rewrites its shard at most this often while it runs, so that a run cut short (a time cap,
# a killed job) still leaves what it judged: `tkverify shards DIR --merge` makes a report of it.
SHARD_EVERY_S = float(os.environ.get("TKVERIFY_SHARD_EVERY_S", 15))


def _write_shard(config: pytest.Config, complete: bool) -> None:
    state = config.stash[_STATE]
    worker = worker_id(config) or "main"
    collector = state["collector"]
    if collector.rows or collector.gradients or collector.speed or collector.unsupported or worker == "main":
        collector.save_cases(state["report"])
        collector.write_shard(state["report"] / "shards" / f"{worker}.json", worker=worker, gpu=state["gpu"],
                              pid=os.getpid(), complete=complete, profile=state["profile"],
                              impl=config.getoption("--tk-impl"))
    state["shard_written"] = time.monotonic()


def pytest_runtest_teardown(item: pytest.Item) -> None:
    state = item.config.stash.get(_STATE, None)
    if state is not None and state["report"] is not None \
            and time.monotonic() - state.get("shard_written", 0.0) >= SHARD_EVERY_S:
        _write_shard(item.config, complete=False)
    end_worker_if_cuda_context_lost(item.config, item.nodeid)


def end_worker_if_cuda_context_lost(config: pytest.Config, nodeid: str, exit=os._exit, lost=None) -> bool:
    """After a test that lost this process's CUDA context (a device-side assert ends it: every later CUDA call
    raises it again, and each later test of the worker would fail for it), an xdist worker writes its shard and
    exits, so that xdist reports the test as crashed and runs the rest in a new worker.  Without xdist the
    run goes on, warned.  Returns whether the context was lost."""
    from tkverify.check import cuda_context_lost

    if not (lost or cuda_context_lost)():
        return False
    message = f"tkverify: {nodeid} lost the CUDA context of this process"
    if worker_id(config) is None:
        warnings.warn(f"{message}: every later CUDA test of this run fails for it (run under pytest-xdist to "
                      "have a new worker take the rest)", stacklevel=1)
        return True
    state = config.stash.get(_STATE, None)
    if state is not None and state["report"] is not None:
        _write_shard(config, complete=False)
    print(f"{message}: the worker exits, a new one takes the tests left", file=sys.stderr, flush=True)
    exit(3)
    return True


def pytest_sessionstart(session: pytest.Session) -> None:
    if worker_id(session.config) is None:
        _start_precompile(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    state = config.stash.get(_STATE, None)
    if state is not None and worker_id(config) is None:
        state["precompiled"] = _stop_precompile(config)
    if state is None:
        return
    if state["report"] is None:
        # No report: one process judges the rows it collected (under xdist they stay in the workers), under
        # the derandomised ci profile only, whose draws the claims were measured on (a dev run's random
        # examples are judged by the contract alone).
        if (worker_id(config) is None and state["claims"] is not None and state["profile"] == "ci"
                and state["collector"].rows):
            rows = list(state["collector"].rows.values())
            claims.judge(rows, {"versions": versions(), **device_info()}, state["claims"])  # torch-cuda on a GPU
            _fail_on_claims(session, rows)
        return
    _write_shard(config, complete=True)
    if worker_id(config) is None:  # the controller, with or without xdist
        # Claims hold on the fixed draws they were measured on (the plain ci profile); elsewhere a row beyond
        # its claim is listed in the report's meta for review, not failed (tkverify.claims.judge).
        written = report_from_shards(state["report"], meta(state["profile"], config.getoption("--tk-impl"),
                                                           seed=state["seed"]), claims_dir=state["claims"],
                                     enforce_claims=state["profile"] == "ci")
        state["written"] = written
        if state["claims"] is not None:
            doc = json.loads(written["json"].read_text())
            _fail_on_claims(session, [ResultRow.from_json(r) for r in doc["results"]])
            state["claims_beyond"] = doc["meta"].get("claims_beyond", [])


def _fail_on_claims(session: pytest.Session, rows: list[ResultRow]) -> None:
    """A row beyond its implementation's accuracy claim (rows judged by tkverify.claims.judge) fails the
    session even where every test passed (the contract held): its lines go to the summary and the exit
    status becomes pytest's "tests failed"."""
    state = session.config.stash[_STATE]
    state["claims_exceeded"] = [f"{r.op}:{r.output} {r.format} [{r.impl}]: {claims.exceeded_text(r)}"
                                for r in rows if r.claim_exceeded]
    state["unclaimed"] = sum(r.claim is None for r in rows)
    if state["claims_exceeded"] and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state and state.get("precompiled"):
        terminalreporter.write_line(state["precompiled"])
    if state and state.get("written"):
        terminalreporter.write_line(f"tkverify report: {state['written']['md']} (and .json, .html)")
    if state and state.get("claims_exceeded"):
        terminalreporter.write_line(f"tkverify: {len(state['claims_exceeded'])} rows beyond their accuracy claims "
                                    f"(the run fails; claims: {state['claims']}):", red=True)
        for line in state["claims_exceeded"]:
            terminalreporter.write_line(f"  {line}", red=True)
    if state and state.get("claims_beyond"):
        terminalreporter.write_line(f"tkverify: {len(state['claims_beyond'])} rows beyond their accuracy claims on "
                                    f"draws the claims were not measured on (profile {state['profile']}: not "
                                    "failed; review them, tkverify claims --update):", yellow=True)
        for line in state["claims_beyond"]:
            terminalreporter.write_line(f"  {line}", yellow=True)
    if state and state.get("unclaimed"):
        terminalreporter.write_line(f"tkverify: {state['unclaimed']} rows unclaimed (no accuracy claim: not failed; "
                                    "tkverify claims --update adds them)")
