#!/usr/bin/env python3
"""PNG plots of the benchmark results in ``bench/results/``, for docs/benchmarks.md.

One PNG per kind of result file, from the newest file of that kind (by the
timestamp in its name) unless a file is named on the command line:

- ``core-throughput.png`` (``core-*.json``, bench_core.py): claim + complete
  tasks/s against batch size (1, 10, 100), batonq and the raw baseline, one
  line per connection count, log y; beside it enqueue tasks/s (single task on
  1 and 8 connections, batches of 100 and 10,000) as bars, with the ratio
  batonq / baseline over each pair.
- ``workers.png`` (``workers-*.json``, bench_workers.py): worker throughput
  in jobs/s for each system and setting, horizontal bars at the median of
  the runs with min-max error bars; steady state (start-up excluded) and
  total (worker process start-up included) side by side.
- ``latency.png`` (``latency-*.json``, bench_latency.py): enqueue -> handler
  start latency p50 and p99, batonq's worker against a raw LISTEN/NOTIFY
  loop, bars at the median of the runs with min-max error bars, log y (the
  file holds per-run p50 and p99 only, no samples, so no distribution).
- ``backlog.png`` (``backlog-*.json``, bench_backlog.py ``--json``): claim
  latency p50 and p99 against the pending backlog (log x), batch 1 and
  batch 100 in two panels; the "again" (noise check) and "+ N done"
  (finished tasks retained) rows as separate markers.

A footer on each plot names the result file, when it was measured and the
machine's CPU count, as far as the file records them. A missing result file
is skipped with a one-line note. HTTP results (``http-*.json``) are not
plotted.

Usage::

    .venv/bin/python bench/plot.py                           # bench/results -> docs/img
    .venv/bin/python bench/plot.py --results DIR --out DIR
    .venv/bin/python bench/plot.py --core bench/results/core-20261202T120000Z.json

Needs matplotlib (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from matplotlib.typing import LineStyleType

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
OUT_DIR = BENCH_DIR.parent / "docs" / "img"

WIDTH_IN = 8.0  # at DPI / 2 this is 800 px: the layout reads at 800 px wide
DPI = 200
STYLE: dict[Any, Any] = {  # rc keys (matplotlib types them as a Literal)
    "font.size": 9.5,
    "axes.titlesize": 10.5,
    "axes.labelsize": 9.5,
    "legend.fontsize": 8.5,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
}
SYSTEM_COLORS = {
    "batonq": "#1f77b4",
    "baseline": "#7f7f7f",
    "raw": "#7f7f7f",
    "pgqueuer": "#ff7f0e",
    "procrastinate": "#2ca02c",
}
EXTRA_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
CONNECTION_STYLES: tuple[tuple[str, LineStyleType], ...] = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."))
FOOTER_CHARS = 165  # at 7 pt across WIDTH_IN
STAMP = re.compile(r"(\d{8}T\d{6})")


class ResultError(Exception):
    """A result file that is not shaped like its benchmark's output."""


# --------------------------------------------------------------------------
# Helpers


def color_of(system: str) -> str:
    if system in SYSTEM_COLORS:
        return SYSTEM_COLORS[system]
    return EXTRA_COLORS[sum(map(ord, system)) % len(EXTRA_COLORS)]


def file_stamp(path: Path) -> datetime | None:
    """The UTC timestamp in a result file's name (``kind-20261202T142437Z.json``)."""
    found = STAMP.search(path.name)
    if found is None:
        return None
    return datetime.strptime(found.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=UTC)


def newest(results: Path, kind: str) -> Path | None:
    """The newest ``<kind>-*.json`` in ``results``: by the name's timestamp,
    else by modification time."""

    def key(path: Path) -> datetime:
        return file_stamp(path) or datetime.fromtimestamp(path.stat().st_mtime, UTC)

    files = [p for p in results.glob(f"{kind}-*.json") if p.is_file()]
    return max(files, key=key) if files else None


def when(stamp: str | None, path: Path) -> str:
    """A measurement time for the footer: the file's own field, else its name's."""
    if stamp:
        try:
            return datetime.fromisoformat(stamp).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        except ValueError:
            return stamp
    from_name = file_stamp(path)
    if from_name is not None:
        return from_name.strftime("%Y-%m-%d %H:%M UTC") + " (from file name)"
    return "time not recorded"


def cpus(count: object) -> str:
    return f"{count} CPUs" if isinstance(count, int) else "CPU count not recorded"


def rate(value: float, _pos: object = None) -> str:
    """Tick and label text for a rate: 950, 12k, 1.2M."""
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def number(value: float, _pos: object = None) -> str:
    """Tick text: 0.5, 20, 1,000, 20,000."""
    return f"{value:,.0f}" if value >= 1_000 else f"{value:g}"


def duration(ms: float) -> str:
    """A label for a latency in ms: 0.84 ms, 26.8 ms, 15.0 s."""
    return f"{ms / 1_000:.3g} s" if ms >= 1_000 else f"{ms:.3g} ms"


def runs_text(counts: set[int]) -> str:
    """'3 runs', '1 run', or 'the runs' when the systems had different counts."""
    if len(counts) != 1:
        return "the runs"
    [n] = counts
    return f"{n} run{'' if n == 1 else 's'}"


def count_label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return f"{n:,}"


def new_figure(height_in: float, ncols: int = 1, **kwargs: Any) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False, **kwargs)
    return fig, list(axes[0])


def footer(fig: Figure, path: Path, *parts: str) -> None:
    """Small grey text under the axes: file, time, machine; wrapped to the width."""
    lines: list[str] = []
    for part in [path.name, *(p for p in parts if p)]:
        if lines and len(lines[-1]) + len(part) + 5 <= FOOTER_CHARS:
            lines[-1] += "  ·  " + part
        else:
            lines.append(part)
    # As the figure's x label, so that the layout keeps room for it.
    fig.supxlabel("\n".join(lines), x=0.006, ha="left", fontsize=7, color="#555555", linespacing=1.3)


def save(fig: Figure, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, facecolor="white")
    return out


def log_axis_rates(ax: Axes, axis: str = "y") -> None:
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(rate))
    target.set_minor_formatter(NullFormatter())


def spread(summary: dict[str, Any], median: str, low: str, high: str) -> tuple[float, float, float]:
    m, lo, hi = float(summary[median]), float(summary[low]), float(summary[high])
    return m, max(0.0, m - lo), max(0.0, hi - m)


def styled(draw: Callable[[Path, Path], Path]) -> Callable[[Path, Path], Path]:
    def wrapper(path: Path, out_dir: Path) -> Path:
        with matplotlib.rc_context(STYLE):
            return draw(path, out_dir)

    return wrapper


def load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ResultError(f"cannot read {path}: {error}") from error


# --------------------------------------------------------------------------
# core-throughput.png


def _claim_panel(ax: Axes, scenarios: list[dict[str, Any]]) -> None:
    claims = [s for s in scenarios if s["op"] == "claim_complete"]
    connections = sorted({int(s["connections"]) for s in claims})
    batches = sorted({int(s["batch"]) for s in claims})
    for i, conns in enumerate(connections):
        marker, line = CONNECTION_STYLES[i % len(CONNECTION_STYLES)]
        dodge = 10 ** (0.025 * (i - (len(connections) - 1) / 2))  # error bars side by side, not stacked
        rows = sorted((s for s in claims if int(s["connections"]) == conns), key=lambda s: int(s["batch"]))
        for system in ("baseline", "batonq"):
            points = [
                spread(s[system], "median_tasks_per_s", "min_tasks_per_s", "max_tasks_per_s") for s in rows
            ]
            ax.errorbar(
                [int(s["batch"]) * dodge for s in rows],
                [p[0] for p in points],
                yerr=[[p[1] for p in points], [p[2] for p in points]],
                color=color_of(system),
                marker=marker,
                linestyle=line,
                markersize=5,
                linewidth=1.6,
                capsize=3,
                alpha=0.95 if system == "batonq" else 0.8,
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(batches, [f"{b:,}" for b in batches])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", which="minor", bottom=False)
    ax.set_xlim(min(batches) / 1.6, max(batches) * 1.6)
    log_axis_rates(ax)
    ax.set_xlabel("tasks per claim (batch size)")
    ax.set_ylabel("tasks/s (claimed and completed)")
    ax.set_title("Claim + complete")
    handles: list[Any] = [
        Line2D([], [], color=color_of("batonq"), linewidth=2, label="batonq"),
        Line2D([], [], color=color_of("baseline"), linewidth=2, label="raw SQL baseline"),
    ]
    for i, conns in enumerate(connections):
        marker, line = CONNECTION_STYLES[i % len(CONNECTION_STYLES)]
        handles.append(
            Line2D(
                [],
                [],
                color="black",
                marker=marker,
                linestyle=line,
                markersize=5,
                label=f"{conns} connection{'s' if conns != 1 else ''}",
            )
        )
    ax.legend(handles=handles, loc="upper left", frameon=False)


def _enqueue_label(s: dict[str, Any]) -> str:
    batch, conns = int(s["batch"]), int(s["connections"])
    head = "single" if batch == 1 else f"batch\n{batch:,}"
    tail = f"\n{conns} conn{'s' if conns != 1 else ''}" if batch == 1 or conns != 1 else ""
    return head + tail


def _enqueue_panel(ax: Axes, scenarios: list[dict[str, Any]]) -> None:
    rows = sorted(
        (s for s in scenarios if s["op"] == "enqueue"), key=lambda s: (int(s["batch"]), int(s["connections"]))
    )
    width = 0.38
    tops: list[float] = []
    for offset, system, label in (
        (-width / 2, "batonq", "batonq"),
        (width / 2, "baseline", "raw SQL baseline"),
    ):
        points = [spread(s[system], "median_tasks_per_s", "min_tasks_per_s", "max_tasks_per_s") for s in rows]
        ax.bar(
            [i + offset for i in range(len(rows))],
            [p[0] for p in points],
            width,
            yerr=[[p[1] for p in points], [p[2] for p in points]],
            capsize=2.5,
            color=color_of(system),
            label=label,
            error_kw={"linewidth": 0.9},
        )
        tops = [max(t, p[0] + p[2]) for t, p in zip(tops or [0.0] * len(rows), points, strict=True)]
    for i, s in enumerate(rows):
        if "ratio" in s:
            ax.annotate(
                f"{float(s['ratio']):.2f}\u00d7",
                (i, tops[i]),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_yscale("log")
    log_axis_rates(ax)
    ax.set_ylim(top=max(tops) * 3)
    ax.set_xticks(range(len(rows)), [_enqueue_label(s) for s in rows])
    ax.grid(axis="x", visible=False)
    ax.set_ylabel("tasks/s (enqueued)")
    ax.set_title("Enqueue (\u00d7 = batonq / baseline)")
    ax.legend(loc="upper left", frameon=False)


@styled
def plot_core(path: Path, out_dir: Path) -> Path:
    report = load(path)
    try:
        scenarios: list[dict[str, Any]] = report["scenarios"]
        if not any(s["op"] == "claim_complete" for s in scenarios):
            raise ResultError(f"{path.name}: no claim_complete scenarios")
        has_enqueue = any(s["op"] == "enqueue" for s in scenarios)
        fig, axes = new_figure(4.4, 2 if has_enqueue else 1, width_ratios=[3, 2] if has_enqueue else None)
        _claim_panel(axes[0], scenarios)
        if has_enqueue:
            _enqueue_panel(axes[1], scenarios)
        fig.suptitle(
            f"batonq core throughput vs a raw SQL loop (median of {runs_text({report['runs']})},"
            " bars min-max)",
            fontsize=11.5,
        )
        machine = report.get("machine", {})
        model = machine.get("cpu_model")
        footer(
            fig,
            path,
            f"measured {when(report.get('started_at'), path)}",
            cpus(machine.get("nproc")) + (f" ({model})" if model else ""),
            f"{report.get('mode', '?')} mode",
            f"commit {report['git_commit']}" if report.get("git_commit") else "",
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ResultError(f"{path.name} is not shaped like bench_core.py's output: {error!r}") from error
    return save(fig, out_dir / "core-throughput.png")


# --------------------------------------------------------------------------
# workers.png


def _tick(key: str) -> str:
    system, _, setting = key.partition(" ")
    return f"{system}\n{setting}" if setting else system


def _workers_panel(ax: Axes, report: dict[str, Any], metric: str, title: str) -> None:
    summary: dict[str, Any] = report["summary"]
    keys = [k for k in summary if summary[k].get(metric)]  # None: too few jobs to tell
    points = [spread(summary[k][metric], "median", "min", "max") for k in keys]
    colors = [color_of(k.split(" ", 1)[0]) for k in keys]
    ys = range(len(keys))
    ax.barh(
        ys,
        [p[0] for p in points],
        0.62,
        xerr=[[p[1] for p in points], [p[2] for p in points]],
        color=colors,
        capsize=3,
        error_kw={"linewidth": 0.9},
    )
    right = max(p[0] + p[2] for p in points)
    for y, p in zip(ys, points, strict=True):
        ax.annotate(
            f"{p[0]:,.0f}",
            (p[0] + p[2], y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            ha="left",
            fontsize=8,
        )
    ax.set_xlim(0, right * 1.22)
    ax.xaxis.set_major_formatter(FuncFormatter(rate))
    ax.set_yticks(list(ys), [_tick(k) for k in keys])
    if not ax.yaxis_inverted():  # the panels share it: the first panel turns it
        ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("jobs/s")
    ax.set_title(title)


@styled
def plot_workers(path: Path, out_dir: Path) -> Path:
    report = load(path)
    try:
        summary: dict[str, Any] = report["summary"]
        if not summary:
            raise ResultError(f"{path.name}: no systems in the summary")
        fig, axes = new_figure(max(3.0, 1.5 + 0.5 * len(summary)), 2, sharey=True)
        _workers_panel(axes[0], report, "steady_per_s", "Steady state (start-up excluded)")
        _workers_panel(axes[1], report, "total_per_s", "Total (worker start-up included)")
        axes[1].tick_params(axis="y", left=False)
        systems = list(dict.fromkeys(k.split(" ", 1)[0] for k in summary))
        fig.legend(
            handles=[Patch(color=color_of(s), label=s) for s in systems],
            loc="outside right upper",
            frameon=False,
        )
        args = report.get("args", {})
        n_runs = runs_text({len(v) for v in report.get("runs", {}).values()})
        jobs = f"{args['jobs']:,} jobs per run" if "jobs" in args else ""
        if jobs and "slow_jobs" in args and any(k.startswith("procrastinate") for k in summary):
            jobs += f" (Procrastinate {args['slow_jobs']:,})"
        fig.suptitle(f"Worker throughput, no-op jobs (median of {n_runs}, bars min-max)", fontsize=11.5)
        versions = ", ".join(f"{k} {v}" for k, v in report.get("versions", {}).items())
        skipped = ", ".join(report.get("skipped") or {})
        footer(
            fig,
            path,
            f"measured {when(report.get('when'), path)}",
            cpus(report.get("machine", {}).get("cpus")),
            jobs,
            "quick mode" if args.get("quick") else "",
            versions,
            f"skipped: {skipped}" if skipped else "",
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ResultError(f"{path.name} is not shaped like bench_workers.py's output: {error!r}") from error
    return save(fig, out_dir / "workers.png")


# --------------------------------------------------------------------------
# latency.png


@dataclass(frozen=True)
class Percentiles:
    system: str
    runs: int
    samples: int
    points: dict[str, tuple[float, float, float]]  # "p50_ms" -> (median, below, above)


def _percentiles(system: str, runs: list[dict[str, Any]]) -> Percentiles:
    points: dict[str, tuple[float, float, float]] = {}
    for key in ("p50_ms", "p99_ms"):
        values = sorted(float(r[key]) for r in runs)
        mid = len(values) // 2
        median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
        points[key] = (median, median - values[0], values[-1] - median)
    return Percentiles(system, len(runs), sum(int(r.get("n", 0)) for r in runs), points)


def _latency_cdf(ax: Axes, pooled: dict[str, list[float]]) -> None:
    """The whole distribution: the share of tasks started within x ms, every
    run's samples together."""
    for system, samples in pooled.items():
        label = "raw LISTEN/NOTIFY loop" if system == "raw" else f"{system} worker"
        shares = [(i + 1) / len(samples) for i in range(len(samples))]
        ax.step(samples, shares, where="post", color=color_of(system), label=label)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(number))
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("share of tasks started")
    ax.legend(loc="lower right", frameon=False)
    ax.set_title("Distribution: every run's samples", fontsize=11)


@styled
def plot_latency(path: Path, out_dir: Path) -> Path:
    report = load(path)
    try:
        systems = [
            _percentiles(name, runs)
            for name, runs in report.items()
            if isinstance(runs, list) and runs and isinstance(runs[0], dict)
        ]
        systems.sort(key=lambda s: (s.system != "batonq", s.system))
        if not systems:
            raise ResultError(f"{path.name}: no per-system runs")
        pooled = {
            s.system: sorted(ms for run in report[s.system] for ms in run.get("samples_ms", []))
            for s in systems
        }
        fig, axes = new_figure(4.2, ncols=2 if all(pooled.values()) else 1)
        ax = axes[0]
        keys = ("p50_ms", "p99_ms")
        width = 0.8 / len(systems)
        top = 0.0
        for i, s in enumerate(systems):
            offset = (i - (len(systems) - 1) / 2) * width
            label = "raw LISTEN/NOTIFY loop" if s.system == "raw" else f"{s.system} worker"
            pts = [s.points[k] for k in keys]
            ax.bar(
                [j + offset for j in range(len(keys))],
                [p[0] for p in pts],
                width * 0.95,
                yerr=[[p[1] for p in pts], [p[2] for p in pts]],
                capsize=3,
                color=color_of(s.system),
                label=f"{label} ({s.samples:,} samples)",
                error_kw={"linewidth": 0.9},
            )
            for j, p in enumerate(pts):
                ax.annotate(
                    duration(p[0]),
                    (j + offset, p[0] + p[2]),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
                top = max(top, p[0] + p[2])
        # Bars start at 0 on a linear axis: on a log axis a bar's length
        # says nothing about its value.
        ax.yaxis.set_major_formatter(FuncFormatter(number))
        ax.set_ylim(0, top * 1.25)
        ax.set_xticks(range(len(keys)), ["p50 (median)", "p99"])
        ax.grid(axis="x", visible=False)
        ax.set_ylabel("latency (ms)")
        ax.legend(loc="upper left", frameon=False)
        n_runs = runs_text({s.runs for s in systems})
        pace = f" at {report['rate']:g} tasks/s" if "rate" in report else ""
        each = f", {report['seconds']:g} s each" if "seconds" in report else ""
        fig.suptitle(f"Enqueue → handler start{pace} ({n_runs}{each})")
        ax.set_title(f"p50 and p99: median of {n_runs}, bars min-max", fontsize=11)
        if len(axes) == 2:
            _latency_cdf(axes[1], pooled)
        footer(fig, path, f"measured {when(None, path)}", cpus(None))
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise ResultError(f"{path.name} is not shaped like bench_latency.py's output: {error!r}") from error
    return save(fig, out_dir / "latency.png")


# --------------------------------------------------------------------------
# backlog.png


EXTRA_ROW = "#d62728"


def _extra_style(row: dict[str, Any]) -> tuple[str, str]:
    """Marker and legend text of a row off the main line: a repeat, or with finished tasks."""
    archived = int(row.get("archived", 0))
    size = count_label(int(row["pending_target"]))
    if archived:
        return "D", f"{size} pending + {count_label(archived)} done retained"
    return "s", f"{size} pending again (noise check)"


def _backlog_panel(ax: Axes, rows: list[dict[str, Any]], batch: int) -> list[Any]:
    """One batch size's panel; returns the legend handles."""
    seen: set[int] = set()
    main: list[dict[str, Any]] = []
    extra: list[dict[str, Any]] = []
    for row in rows:
        size = int(row["pending_target"])
        if int(row.get("archived", 0)) == 0 and size not in seen:
            seen.add(size)
            main.append(row)
        else:
            extra.append(row)
    main.sort(key=lambda r: int(r["pending_target"]))
    color = color_of("batonq")
    xs = [int(r["pending_target"]) for r in main]
    handles: list[Any] = []
    for q, style, alpha in (("p50", "-", 1.0), ("p99", "--", 0.55)):
        [line] = ax.plot(
            xs,
            [float(r[f"claim{batch}_{q}_ms"]) for r in main],
            linestyle=style,
            marker="o",
            color=color,
            alpha=alpha,
            linewidth=1.8,
            markersize=5,
            label=q,
        )
        handles.append(line)
    for row in extra:
        marker, label = _extra_style(row)
        x = int(row["pending_target"])
        for q, alpha in (("p50", 1.0), ("p99", 0.55)):
            ax.plot(
                [x],
                [float(row[f"claim{batch}_{q}_ms"])],
                linestyle="none",
                marker=marker,
                markersize=7,
                markerfacecolor="none",
                markeredgecolor=EXTRA_ROW,
                alpha=alpha,
                markeredgewidth=1.4,
            )
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker=marker,
                markersize=7,
                markerfacecolor="none",
                markeredgecolor=EXTRA_ROW,
                markeredgewidth=1.4,
                label=label,
            )
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.margins(y=0.12)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: count_label(round(v))))
    ax.set_xlim(min(xs) / 2.5, max(xs) * 2.5)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(number))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("pending tasks in the claimed queue")
    ax.set_ylabel("claim latency (ms)")
    ax.set_title(f"claim(max_tasks={batch}), one connection")
    return handles


@styled
def plot_backlog(path: Path, out_dir: Path) -> Path:
    rows = load(path)
    try:
        if not isinstance(rows, list) or not rows:
            raise ResultError(f"{path.name}: expected a list of rows")
        fig, axes = new_figure(4.2, 2, sharey=True)
        handles = _backlog_panel(axes[0], rows, 1)
        _backlog_panel(axes[1], rows, 100)
        axes[1].set_ylabel("")
        axes[1].tick_params(axis="y", labelleft=True)
        axes[0].legend(handles=handles, loc="best", framealpha=0.9, edgecolor="none")
        fig.suptitle(
            "Claim latency against the pending backlog (4 other queues hold as many again); p99 faint",
            fontsize=11,
        )
        footer(fig, path, f"measured {when(None, path)}", cpus(None))
    except (KeyError, TypeError, ValueError) as error:
        raise ResultError(f"{path.name} is not shaped like bench_backlog.py's output: {error!r}") from error
    return save(fig, out_dir / "backlog.png")


# --------------------------------------------------------------------------
# Entry point

KINDS: dict[str, tuple[str, Callable[[Path, Path], Path]]] = {
    "core": ("bench_core.py", plot_core),
    "workers": ("bench_workers.py", plot_workers),
    "latency": ("bench_latency.py", plot_latency),
    "backlog": ("bench_backlog.py --json bench/results/backlog-<UTC stamp>.json", plot_backlog),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="plot.py",
        description="PNG plots of the benchmark result files (newest of each kind by default).",
    )
    parser.add_argument(
        "--results", type=Path, default=RESULTS_DIR, help="result files (default %(default)s)"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="PNG directory (default %(default)s)")
    for kind in KINDS:
        parser.add_argument(f"--{kind}", type=Path, metavar="FILE", help=f"this {kind} result file")
    args = parser.parse_args(argv)
    for kind in KINDS:
        given: Path | None = getattr(args, kind)
        if given is not None and not given.is_file():
            parser.error(f"--{kind}: no such file: {given}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    matplotlib.use("Agg")
    failed = False
    for kind, (script, draw) in KINDS.items():
        path: Path | None = getattr(args, kind) or newest(args.results, kind)
        if path is None:
            print(f"note: no {kind}-*.json in {args.results} ({script}); {kind} skipped", file=sys.stderr)
            continue
        try:
            print(draw(path, args.out))
        except ResultError as error:
            print(f"error: {error}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
