"""Where the fuzzing time of (op, impl) pairs goes, function by function: cProfile of the differential
suite's hypothesis run of each, under the ci profile, one after another in one process.

    python3 -m scripts.profile_fuzz engram.gate:tile_kernels quant.per_token_cast:tile_kernels > prof.txt

Name a pair twice to see what a second run in the same process costs (imports and JIT caches warm).
The report's fuzzing-speed table says which phase the time is in; this says which functions.
"""

import cProfile
import io
import pstats
import sys
import time
import warnings

from tkverify import profiles, registry
from tkverify.report import Collector
from tkverify.suite import verify


def profile_pair(op: str, impl: str, top: int = 22) -> None:
    spec = registry.get(op)
    collector = Collector()
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    try:
        verify(spec, spec.impls[impl], case_dir=None, record=collector.record,
               record_unsupported=collector.add_unsupported)
    except BaseException as e:  # a skip (every case refused) or a failure: the profile is still worth reading
        print("ended:", type(e).__name__, str(e)[:200])
    prof.disable()
    print(f"=== {op}[{impl}]: {time.perf_counter() - start:.2f} s; speed {collector.speed.get((op, impl))}")
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(order).print_stats(top)
        print(out.getvalue()[-6000:])


def main(pairs: list[str]) -> None:
    profiles.load("ci")
    warnings.simplefilter("ignore")
    for pair in pairs:
        profile_pair(*pair.split(":"))


if __name__ == "__main__":
    main(sys.argv[1:])
