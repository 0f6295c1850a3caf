#!/usr/bin/env python3
"""Compare benchmark results with the previous ones: every ratio a result
file holds (batonq against the raw loop or a peer, in the same run), old
against new, flagging each that fell by more than 10%.

The ratios, each oriented so that higher is better for batonq:

- ``userpath``: batonq's rate over PgQueuer's best and the raw loop's;
- ``workers``: each batonq setting's steady rate over each peer setting's;
- ``core``: batonq over the raw loop, per scenario;
- ``latency``: the raw loop's p50 and p99 over batonq's;
- ``graph``: the graph pipeline over the same tasks without edges;
- ``http``: each HTTP scenario over the Python client at its batch and threads;
- ``sustained``: per W, batonq's rate over the raw loop's and each peer's
  (``W64 batonq / pgq``, ...); the files written before the peers joined
  give ``W64 batonq / raw`` only;
- any other file with a top-level ``ratios`` object (numbers, or objects of
  numbers), higher being better.

(``backlog`` and ``idle`` give no ratio to another system and are left out.)

Usage::

    python bench/compare.py OLD.json NEW.json             # two files of one kind
    python bench/compare.py --results bench/results       # each kind's newest against the one before

``run_all.py`` runs the comparison after its steps: each kind it wrote
against the newest file of that kind written before it started.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

THRESHOLD = 0.10
"""A ratio that fell by more than this share of its old value is flagged."""


def kind_of(path: Path) -> str:
    return path.name.split("-", 1)[0]


def _workers(report: Any) -> dict[str, float]:
    summary = report["summary"]
    found = {}
    for mine in (k for k in summary if k.startswith("batonq ")):
        for peer in (k for k in summary if not k.startswith("batonq ")):
            steady = summary[mine]["steady_per_s"] and summary[peer]["steady_per_s"]
            metric = "steady_per_s" if steady else "total_per_s"
            found[f"{mine} / {peer}"] = summary[mine][metric]["median"] / summary[peer][metric]["median"]
    return found


def _latency(report: Any) -> dict[str, float]:
    found = {}
    for key in ("p50_ms", "p99_ms"):
        raw = statistics.median(r[key] for r in report["raw"])
        mine = statistics.median(r[key] for r in report["batonq"])
        found[f"{key.removesuffix('_ms')} raw / batonq"] = raw / mine
    return found


def _http(report: Any) -> dict[str, float]:
    results = report["results"]
    found = {}
    for s in report["scenarios"]:
        name, python = (f"{t}_b{s['batch']}_t{s['threads']}" for t in (s["target"], "python"))
        if s["target"] != "python" and python in results:
            found[f"{name} / python"] = results[name]["median"] / results[python]["median"]
    return found


_BY_KIND: dict[str, Callable[[Any], dict[str, float]]] = {
    "workers": _workers,
    "core": lambda report: {s["name"]: s["ratio"] for s in report["scenarios"] if "ratio" in s},
    "latency": _latency,
    "graph": lambda report: {
        f"graph / baseline {k}": report["summary"]["ratio_graph_to_baseline"][k] for k in ("steady", "total")
    },
    "http": _http,
    "sustained": lambda report: {f"{w} batonq / raw": v for w, v in report.get("batonq_vs_raw", {}).items()},
}


def ratios(kind: str, report: Any) -> dict[str, float]:
    """The named ratios of one result file, higher being better."""
    if isinstance(report, dict) and isinstance(report.get("ratios"), dict):
        found: dict[str, float] = {}
        for name, value in report["ratios"].items():
            if isinstance(value, dict):
                found |= {f"{name} / {other}": float(v) for other, v in value.items()}
            else:
                found[name] = float(value)
        return found
    return _BY_KIND[kind](report) if kind in _BY_KIND else {}


def compare(old: Path, new: Path, threshold: float = THRESHOLD) -> tuple[list[str], list[str]]:
    """(table lines, the names of the ratios that fell by more than ``threshold``)."""
    kind = kind_of(new)
    before = ratios(kind, json.loads(old.read_text()))
    after = ratios(kind, json.loads(new.read_text()))
    lines = [f"{kind}: {old.name} -> {new.name}"]
    fell: list[str] = []
    for name in sorted(set(before) & set(after)):
        change = after[name] / before[name] - 1
        flag = change < -threshold
        if flag:
            fell.append(f"{kind} {name}")
        mark = f"  FELL {-change:.0%}" if flag else ""
        lines.append(f"  {name:<58} {before[name]:>7.2f} -> {after[name]:>7.2f} ({change:+.0%}){mark}")
    return lines, fell


def newest(results: Path, kind: str, before: float | None = None) -> list[Path]:
    """The files of one kind, newest first (only those modified before
    ``before``, a time.time(), when given)."""
    files = [p for p in results.glob(f"{kind}-*.json") if before is None or p.stat().st_mtime < before]
    return sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)


def compare_runs(results: Path, since: float | None = None, threshold: float = THRESHOLD) -> list[str]:
    """Each kind's newest file (written at or after ``since`` when given)
    against the newest before it; prints the tables and returns what fell."""
    fell: list[str] = []
    for kind in sorted({kind_of(p) for p in results.glob("*-*.json")}):
        files = newest(results, kind)
        if not files or (since is not None and files[0].stat().st_mtime < since):
            continue
        previous = newest(results, kind, before=since if since is not None else files[0].stat().st_mtime)
        if not previous:
            if ratios(kind, json.loads(files[0].read_text())):
                print(f"{kind}: no earlier result to compare with")
            continue
        lines, found = compare(previous[0], files[0], threshold)
        if len(lines) > 1:  # a kind with ratios
            print("\n".join(lines))
        fell += found
    if fell:
        print(f"\nfell by more than {threshold:.0%}: " + "; ".join(fell))
    return fell


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("files", nargs="*", type=Path, help="OLD.json NEW.json, of one kind")
    parser.add_argument(
        "--results", type=Path, help="a results directory: each kind's newest against the one before"
    )
    parser.add_argument(
        "--threshold", type=float, default=THRESHOLD, help="flag falls larger than this share"
    )
    args = parser.parse_args(argv)
    if args.results is not None and not args.files:
        fell = compare_runs(args.results, threshold=args.threshold)
    elif len(args.files) == 2 and args.results is None:
        lines, fell = compare(*args.files, threshold=args.threshold)
        print("\n".join(lines))
    else:
        parser.error("give OLD.json NEW.json, or --results DIR")
    return 1 if fell else 0


if __name__ == "__main__":
    sys.exit(main())
