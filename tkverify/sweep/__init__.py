"""`tkverify sweep`: exhaustive element paths and verification at production shapes.

* `tkverify.sweep.domains`     the inputs (every fp32 pattern, every bf16 / fp16 / element code) and
                               the scale factors; why the float64 quotients round as the exact ones;
* `tkverify.sweep.judge`       codes judged on the device, folded into report rows and deviation tables;
* `tkverify.sweep.elements`    the sweeps through quant.per_token_cast_with_precomputed_sf and cast_back;
* `tkverify.sweep.production`  each op's bench shapes judged once against the float64 oracle;
* this module                  the command: its options, and the files it writes.

Files (in --out): report.json / report.md / report.html (tkverify.report's writers: a row per sweep
and format and implementation, coverage "exhaustive"; a row per production shape and output,
"sampled"), and sweep.md / sweep.json: each sweep's domain, time (wall and the oracle's share) and,
per implementation, the deviations from the correctly rounded code (how many the contract allows,
per sf, up to ten examples); the production shapes with the oracle's time and where it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from tkverify import registry
from tkverify.report import meta, write_report
from tkverify.sweep.elements import Settings, SweepRun, cast_back_sweep, chosen_impls, codes16_sweep, fp32_sweep
from tkverify.sweep.production import ShapeRun, production_runs

PARTS = ("fp32", "bf16", "fp16", "cast_back")
QUANT_OP = "quant.per_token_cast_with_precomputed_sf"
CAST_BACK_OP = "quant.cast_back"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `sweep` subcommand on the CLI's subparsers."""
    p = subparsers.add_parser("sweep", help="exhaustive element sweeps of the casts (every fp32 pattern, every "
                              "bf16 / fp16 / element code at a set of sf) and, with --production, every op's "
                              "bench shapes judged against the float64 oracle")
    p.add_argument("--load", action="append", default=[], metavar="MODULE", help="import MODULE first")
    p.add_argument("--out", default="tkverify-sweep", type=Path, help="output folder (default tkverify-sweep)")
    p.add_argument("--impl", default=None, help="comma list (default: every available implementation)")
    p.add_argument("--fmt", default="e4m3,e2m1,e5m6", help="element formats (default e4m3,e2m1,e5m6)")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"sweeps to run, a comma list of {', '.join(PARTS)} (default all; 'none' for none)")
    p.add_argument("--production", action="store_true", help="also judge every op's bench shapes")
    p.add_argument("-k", default=None, help="--production: comma list of substrings of the ops to judge")
    p.add_argument("--slice", type=int, default=None, metavar="N",
                   help="only the first N patterns or codes of each domain (the CPU tests)")
    p.add_argument("--drawn-sf", type=int, default=8, help="sf drawn from the seeded generator (default 8)")
    p.add_argument("--sf-limit", type=int, default=None, metavar="K", help="only the first K sf of the set")
    p.add_argument("--seed", type=int, default=29, help="seed of the drawn sf (numpy default_rng; default 29)")
    p.add_argument("--chunk", type=int, default=1 << 26, help="elements of a chunk of the fp32 sweep (2^26)")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="start no new chunk, sweep or shape after S seconds (what was done is reported)")
    p.add_argument("--shape-scale", type=float, default=1.0,
                   help="--production: cut the leading (token) dimension of the bench shapes to this share")
    p.add_argument("--host-limit", type=float, default=60.0,
                   help="--production: skip a shape whose host oracle is estimated over this many seconds")
    p.add_argument("--host-workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="--production: threads that judge a row-local shape in token chunks (default: the "
                        "host's cores, at most 8: each holds a chunk's float64 oracle)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    registry.load_plugins(args.load)
    wanted = [n.strip() for n in args.impl.split(",") if n.strip()] if args.impl else None
    parts = [] if args.parts == "none" else [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        print(f"tkverify sweep: unknown parts {', '.join(unknown)} (known: {', '.join(PARTS)})")
        return 2
    settings = Settings(fmts=tuple(f.strip() for f in args.fmt.split(",") if f.strip()), slice=args.slice,
                        drawn_sf=args.drawn_sf, sf_limit=args.sf_limit, seed=args.seed, chunk=args.chunk,
                        budget_s=args.budget)
    log = lambda line: print(line, flush=True)  # noqa: E731
    started = time.perf_counter()
    quant, quant_unavailable = chosen_impls(registry.get(QUANT_OP), wanted)
    back, back_unavailable = chosen_impls(registry.get(CAST_BACK_OP), wanted)
    sweeps: list[SweepRun] = []
    if "fp32" in parts:
        sweeps += fp32_sweep(registry.get(QUANT_OP), quant, settings, log)
    for dtype in ("bf16", "fp16"):
        if dtype in parts:
            sweeps += codes16_sweep(registry.get(QUANT_OP), quant, settings, dtype, log)
    if "cast_back" in parts:
        sweeps += cast_back_sweep(registry.get(CAST_BACK_OP), back, settings, log)
    unavailable = {QUANT_OP: quant_unavailable, CAST_BACK_OP: back_unavailable}

    def write(shapes: list[ShapeRun]) -> tuple[dict[str, Any], dict[str, Path]]:
        doc = sweep_document(sweeps, shapes, unavailable, settings, args, time.perf_counter() - started)
        return doc, write_outputs(args.out, doc, sweeps, shapes)

    shapes: list[ShapeRun] = []
    if args.production:
        write(shapes)  # the sweeps' results stay if the production shapes are cut short; each shape adds its own
        words = [w.strip() for w in (args.k or "").split(",") if w.strip()]
        specs = [s for s in registry.all_specs() if s.bench and (not words or any(w in s.name for w in words))]
        shapes = production_runs(specs, wanted, scale=args.shape_scale, host_limit_s=args.host_limit,
                                 out_of_time=settings.out_of_time, log=log, done=write, workers=args.host_workers)
    doc, paths = write(shapes)
    failing = [r for r in doc["rows"] if r["verdict"] != "pass"]
    print(f"sweep: {paths['sweep_md']} (and sweep.json, report.md, report.json, report.html); "
          f"{len(doc['rows'])} rows, {len(failing)} failing, {doc['wall_s']:.1f} s")
    return 1 if failing else 0


def sweep_document(sweeps: list[SweepRun], shapes: list[ShapeRun], unavailable: dict[str, dict[str, str]],
                   settings: Settings, args: argparse.Namespace, wall_s: float) -> dict[str, Any]:
    """sweep.json: the settings, every sweep with its deviation tables, the production shapes, the rows."""
    rows = [r for s in sweeps for r in s.rows()] + [r for s in shapes for r in s.rows]
    return {
        "settings": {"fmts": list(settings.fmts), "slice": settings.slice, "drawn_sf": settings.drawn_sf,
                     "sf_limit": settings.sf_limit, "seed": settings.seed, "chunk": settings.chunk,
                     "budget_s": settings.budget_s, "shape_scale": args.shape_scale if args.production else None},
        "wall_s": wall_s,
        "unavailable": unavailable,
        "sweeps": [{"sweep": s.name, "op": s.op, "format": s.fmt, "label": s.label, "total": s.total,
                    "covered": s.covered, "wall_s": s.wall_s, "oracle_s": s.oracle_s, "stopped": s.stopped,
                    "scale_factors": s.scale_factors, "refused": s.refused, "errors": s.errors,
                    "impls": [t.summary() for t in s.tallies.values() if t.count]} for s in sweeps],
        "production": [s.summary() for s in shapes],
        "rows": [r.to_json() for r in rows],
    }


def sweep_markdown(doc: dict[str, Any]) -> str:
    """sweep.md: per sweep its time and the deviations of each implementation, then the production shapes."""
    lines = ["# tkverify sweep", "", f"Wall time {doc['wall_s']:.1f} s; settings: `{json.dumps(doc['settings'])}`.",
             "", "Every element is judged bitwise against the correctly rounded code from the float64 encoder "
             "(references/encode.py) on the device; 'allowed' counts the deviations the op's contract allows "
             "(a zero of the other sign; where sf is not a power of two, the neighbour within 2^-22 of a "
             "rounding boundary).", ""]
    for op, missing in doc["unavailable"].items():
        lines += [f"- {op} [{name}] not run: {reason}" for name, reason in missing.items()]
    lines += ["", "## Sweeps", "", "| sweep | op | format | domain | elements | impl | deviations | allowed | "
              "max ULP | wall s | oracle s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in doc["sweeps"]:
        for t in s["impls"]:
            lines.append(f"| {s['sweep']} | {s['op']} | {s['format']} | {s['label']} | {t['count']} | {t['impl']} | "
                         f"{t['deviations']} | {t['allowed']} | {t['max_ulp']:.3g} | {s['wall_s']:.2f} | "
                         f"{s['oracle_s']:.2f} |")
        for name, reason in {**s["refused"], **s["errors"]}.items():
            lines.append(f"| {s['sweep']} | {s['op']} | {s['format']} | {s['label']} | - | {name} | {reason} | | | | |")
        if s["stopped"]:
            lines.append(f"| {s['sweep']} | {s['op']} | {s['format']} | stopped: {s['stopped']} | | | | | | | |")
    examples = [(s, t) for s in doc["sweeps"] for t in s["impls"] if t["deviations"]]
    if examples:
        lines += ["", "## Deviations", ""]
    for s, t in examples:
        lines += [f"### {s['op']} {s['label']} {s['format']} [{t['impl']}]: {t['deviations']} deviations, "
                  f"{t['allowed']} allowed by the contract", ""]
        by_sf = ", ".join(f"sf {k}: {v}" for k, v in sorted(t["by_sf"].items(), key=lambda kv: -kv[1])[:12])
        lines += [f"Per sf: {by_sf}", "", "| input bits | sf | actual code | expected code | allowed |",
                  "|---|---|---|---|---|"]
        lines += [f"| {e['input']} | {e['sf']:.9g} | {e['actual_code']:#x} | {e['expected_code']:#x} | "
                  f"{'yes' if e['allowed'] else 'no'} |" for e in t["examples"]]
        lines.append("")
    if doc["production"]:
        lines += ["", "## Production shapes", "", "| op | shape | oracle | oracle s | impl s | note |",
                  "|---|---|---|---|---|---|"]
        for p in doc["production"]:
            impl_s = ", ".join(f"{k} {v:.3f}" for k, v in p["impl_s"].items())
            note = "; ".join(filter(None, [p["skipped"] and f"skipped: {p['skipped']}",
                                           *(f"{k} refused: {v}" for k, v in p["refused"].items()),
                                           *(f"{k} unavailable: {v}" for k, v in p["unavailable"].items())]))
            lines.append(f"| {p['op']} | {p['shape']} | {p['oracle']} | {p['oracle_s']:.2f} | {impl_s} | {note} |")
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, doc: dict[str, Any], sweeps: list[SweepRun], shapes: list[ShapeRun]) -> dict[str, Path]:
    """report.{json,md,html} through tkverify.report, and sweep.{json,md}."""
    rows = [r for s in sweeps for r in s.rows()] + [r for s in shapes for r in s.rows]
    unsupported = [u for s in sweeps for u in s.unsupported()]
    report_meta = meta("sweep", ",".join(sorted({r.impl for r in rows})) or "-")
    report_meta["sweep_wall_s"] = doc["wall_s"]
    skipped = [f"{p.op} [{p.shape}]: {p.skipped}" for p in shapes if p.skipped]
    if skipped:
        report_meta["production_skipped"] = skipped
    paths = write_report(out, rows, report_meta, unsupported=unsupported)
    paths["sweep_json"] = out / "sweep.json"
    paths["sweep_md"] = out / "sweep.md"
    paths["sweep_json"].write_text(json.dumps({"meta": report_meta, **doc}, indent=1, default=str))
    paths["sweep_md"].write_text(sweep_markdown(doc))
    return paths
