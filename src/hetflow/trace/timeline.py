"""A timeline picture of co-executed loops: one lane per worker, one bar per chunk.

Drawn from a Chrome trace (:mod:`hetflow.trace.chrome`), so a saved trace file and a
live recording give the same picture. Lanes are grouped by device (GPUs first); a bar
is coloured by its device's kind and hatched when its range was stolen from another
worker's queue, with a thin line from the victim's lane to the thief's at the moment of
the steal; a red X marks a worker failure. Chunks a GPU had in flight together share
their lane in thinner sub-rows. The top rows show the loops (by kernel name or label)
and the phases the user marked (a distributed run's trace: a loops row and phase rows
per rank). Rendering uses matplotlib's Agg canvas directly, never pyplot, so it changes
no global state and needs no display.

Steals are counted as the run reports count them (the ``steals`` column of a run's
table): every entry taken from another worker's queue. A thief with a large chunk size
(a GPU) may gather several adjacent entries into one chunk, so there can be fewer
stolen chunks (hatched bars, each with its line) than steals; the title gives both.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections import Counter
from pathlib import Path

from ..errors import ArgumentError, warn_user
from .chrome import TraceContents, read_chrome_trace, to_chrome_trace

KIND_COLOURS = {"cpu": "#4C72B0", "gpu": "#55A868"}
OTHER_COLOUR = "#8C8C8C"
STEAL_COLOUR = "#C44E52"
FAILURE_COLOUR = "#D62728"
_BAR = 0.8          # lane height taken by bars (the rest separates lanes)


@dataclasses.dataclass(frozen=True)
class TimelineSummary:
    """What :func:`plot_timeline` drew: counts of the drawn artists (``stolen``: the stolen
    chunks, each a hatched bar with a line from victim to thief), ``steals`` as the run
    reports of the loops drawn count them (see the module docstring; the stolen chunks
    when the trace does not say), and ``span_ms``, the time range drawn."""

    path: Path
    lanes: int
    bars: int
    stolen: int
    steals: int
    failures: int
    loops: int
    phases: int
    span_ms: float


def _contents(source) -> TraceContents:
    if isinstance(source, TraceContents):
        return source
    if isinstance(source, (str, os.PathLike)) or (isinstance(source, dict) and "traceEvents" in source):
        return read_chrome_trace(source)
    if isinstance(source, list) and source and all(isinstance(e, dict) for e in source):
        return read_chrome_trace(source)          # the bare event-list form of the format
    return read_chrome_trace(to_chrome_trace(source))


_ABUT_S = 1e-9  # a chunk starting this close to another's end follows it (times are rounded)


def _slots(chunks) -> tuple[dict[int, int], Counter]:
    """Sub-row of each chunk within its lane: chunks overlapping in time (a GPU's chunks
    in flight) go to different sub-rows. Returns chunk index -> slot, lane -> slot count.
    (A core's next chunk starts when its last one ended; the trace's microseconds, back
    in seconds, may put that start a rounding error before the end.)"""
    ends: dict[int, list[float]] = {}
    slot_of = {}
    for k in sorted(range(len(chunks)), key=lambda k: chunks[k].start):
        c = chunks[k]
        lane_ends = ends.setdefault(c.lane, [])
        free = next((s for s, end in enumerate(lane_ends) if end <= c.start + _ABUT_S), None)
        if free is None:
            free = len(lane_ends)
            lane_ends.append(0.0)
        lane_ends[free] = c.end
        slot_of[k] = free
    return slot_of, Counter({lane: len(e) for lane, e in ends.items()})


def _rect(x0, x1, y, h):
    return [(x0, y - h / 2), (x0, y + h / 2), (x1, y + h / 2), (x1, y - h / 2)]


class _Rows:
    """y positions, top to bottom: per group (a rank; one group "" for a process of its
    own) the loops row and one row per phase depth; then the lanes."""

    def __init__(self, contents: TraceContents):
        depths = 1 + max((p.depth for p in contents.phases), default=-1)
        # "rank 2" before "rank 10"
        groups = sorted({s.group for s in contents.loops + contents.phases}, key=lambda g: (len(g), g)) or [""]
        self.labels, self._at = [], {}
        for group in groups:
            prefix = f"{group} · " if group else ""
            self._at[(group, None)] = len(self.labels)
            self.labels.append(f"{prefix}loops")
            for d in range(depths):
                self._at[(group, d)] = len(self.labels)
                self.labels.append(f"{prefix}phases {d}" if depths > 1 else f"{prefix}phases")
        self.first_lane = len(self.labels)
        self.count = self.first_lane + len(contents.lanes)

    def loop(self, span) -> float:
        return float(self._at[(span.group, None)])

    def phase(self, span) -> float:
        return float(self._at[(span.group, span.depth)])

    def lane(self, k: int) -> float:
        return float(self.first_lane + k)


def _lane_labels(contents) -> list[str]:
    return [lane.worker if lane.worker.startswith(lane.device_id) else f"{lane.worker} · {lane.device_id}"
            for lane in contents.lanes]


def _draw_chunks(ax, contents, rows) -> tuple[int, int]:
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgb

    slot_of, slots = _slots(contents.chunks)
    groups: dict[tuple[str, bool], list] = {}
    for k, c in enumerate(contents.chunks):
        n = slots[c.lane]
        h = _BAR / n
        y = rows.lane(c.lane) - _BAR / 2 + h * (slot_of[k] + 0.5)
        kind = contents.lanes[c.lane].kind
        groups.setdefault((kind, c.stolen_from is not None), []).append(
            _rect(c.start * 1e3, c.end * 1e3, y, h * 0.92))
    bars = stolen = 0
    for (kind, was_stolen), verts in groups.items():
        colour = KIND_COLOURS.get(kind, OTHER_COLOUR)
        # A darker edge of the same hue keeps back-to-back chunks apart and tiny ones coloured.
        edge = "#202020" if was_stolen else tuple(0.6 * v for v in to_rgb(colour))
        coll = PolyCollection(verts, facecolors=colour, edgecolors=[edge], linewidths=0.4,
                              hatch="////" if was_stolen else None, zorder=2)
        ax.add_collection(coll)
        bars += len(coll.get_paths())
        stolen += len(coll.get_paths()) if was_stolen else 0
    return bars, stolen


def _draw_steals(ax, contents, rows) -> int:
    from matplotlib.collections import LineCollection

    lane_of = {lane.worker: k for k, lane in enumerate(contents.lanes)}
    segments, tips = [], []
    for c in contents.chunks:
        victim = lane_of.get(c.stolen_from)
        if victim is None:
            continue
        t = c.start * 1e3
        segments.append([(t, rows.lane(victim)), (t, rows.lane(c.lane))])
        tips.append((t, rows.lane(c.lane)))
    if segments:
        alpha = 0.55 if len(segments) <= 50 else 0.3       # many steals: keep the bars readable
        ax.add_collection(LineCollection(segments, colors=STEAL_COLOUR, linewidths=0.7, alpha=alpha,
                                         zorder=3))
        ax.scatter(*zip(*tips), s=9, color=STEAL_COLOUR, zorder=4, linewidths=0)
    return len(segments)


def _draw_failures(ax, contents, rows, window) -> int:
    for f in contents.failures:
        t, y = f.t * 1e3, rows.lane(f.lane)
        ax.scatter([t], [y], marker="X", s=150, color=FAILURE_COLOUR, edgecolors="black",
                   linewidths=0.6, zorder=6)
        error = f.error if len(f.error) <= 60 else f.error[:57] + "..."
        # Text to the right of the mark, or to its left near the right edge.
        left = t > window[0] + 0.7 * (window[1] - window[0])
        ax.annotate(error, (t, y), xytext=(-8 if left else 8, -9), textcoords="offset points",
                    ha="right" if left else "left", fontsize=7, color=FAILURE_COLOUR, zorder=6,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8})
    return len(contents.failures)


def _fitting(name: str, points: float) -> str | None:
    """``name``, or its head before `` (`` or ``:`` (``start-up`` of ``start-up (compile,
    first transfers)``), whichever fits in ``points``; None if neither does."""
    for text in (name, name.split(" (")[0].split(":")[0]):
        if points > 5.5 * len(text) + 6:
            return text
    return None


def _draw_spans(ax, spans, y_of, colour, window, width_in) -> None:
    """Loop or phase spans as labelled bars in their header rows."""
    from matplotlib.collections import PolyCollection

    if not spans:
        return
    from matplotlib.colors import to_rgb

    verts = [_rect(s.start * 1e3, s.end * 1e3, y_of(s), _BAR * 0.8) for s in spans]
    # A darker edge of the same hue, as for chunks: a white one hid spans narrower than
    # itself (a GPU's steps of 90 us in a zoom of 18 ms).
    edge = tuple(0.6 * v for v in to_rgb(colour))
    ax.add_collection(PolyCollection(verts, facecolors=colour, edgecolors=[edge], linewidths=0.4, zorder=2))
    points_per_ms = width_in * 72 / (window[1] - window[0])
    for s in spans:
        visible_ms = min(s.end * 1e3, window[1]) - max(s.start * 1e3, window[0])
        text = _fitting(s.name, visible_ms * points_per_ms)
        if text is not None:
            middle = (max(s.start * 1e3, window[0]) + min(s.end * 1e3, window[1])) / 2
            ax.text(middle, y_of(s), text, ha="center", va="center",
                    fontsize=7, color="black", zorder=3, clip_on=True)


def _legend(ax, kinds, stolen, steals, failures):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=KIND_COLOURS.get(k, OTHER_COLOUR), label=f"{k or 'other'} chunk")
               for k in kinds]
    if stolen:
        handles.append(Patch(facecolor="white", edgecolor="#202020", hatch="////", label="stolen chunk"))
    if steals:
        handles.append(Line2D([], [], color=STEAL_COLOUR, marker="o", markersize=3, linewidth=0.8,
                              label="steal (victim → thief)"))
    if failures:
        handles.append(Line2D([], [], color=FAILURE_COLOUR, marker="X", markersize=9, linestyle="none",
                              markeredgecolor="black", label="worker failure"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              frameon=False, borderaxespad=0.0)


def _steals(contents, stolen: int) -> int:
    """The loops' steals as their reports count them; the stolen chunks when the trace
    does not say (a trace of bare events)."""
    counted = [s.steals for s in contents.loops if s.steals is not None]
    return sum(counted) if contents.loops and len(counted) == len(contents.loops) else stolen


_NAMED_LOOPS = 3  # loop names the title lists; more would not fit on its line


def _what_ran(loops) -> str:
    """The loops by name, the most frequent first: ``3 loop(s): axpy ×2, scale``."""
    counts = Counter(s.name for s in loops)
    names = [f"{name} ×{k}" if k > 1 else name for name, k in counts.most_common(_NAMED_LOOPS)]
    if len(counts) > _NAMED_LOOPS:
        names.append(f"{len(counts) - _NAMED_LOOPS} other(s)")
    return f"{len(loops)} loop(s)" + (f": {', '.join(names)}" if names else "")


def _title(contents, span_ms, steals, stolen) -> str:
    indices = Counter()
    for c in contents.chunks:
        indices[contents.lanes[c.lane].kind or "other"] += c.hi - c.lo
    total = sum(indices.values())
    shares = " / ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(indices.items())) if total else ""
    devices = len({lane.device_id for lane in contents.lanes})
    parts = [_what_ran(contents.loops), f"{total} indices in {len(contents.chunks)} chunks",
             f"{len(contents.lanes)} workers on {devices} device(s)",
             f"{steals} steal(s)" + (f" ({stolen} stolen chunk(s))" if stolen != steals else ""),
             f"{len(contents.failures)} failure(s)", f"{span_ms:.4g} ms"]
    return " · ".join(parts) + (f"\nindices by kind: {shares}" if shares else "")


def _device_bands(ax, contents, rows) -> None:
    """Alternate a light band per device, so a device's lanes read as a group."""
    start = 0
    for k in range(1, len(contents.lanes) + 1):
        if k == len(contents.lanes) or contents.lanes[k].device_id != contents.lanes[start].device_id:
            if (len({lane.device_id for lane in contents.lanes[:start]}) % 2) == 1:
                ax.axhspan(rows.lane(start) - 0.5, rows.lane(k - 1) + 0.5, color="#F0F0F0", zorder=0)
            ax.axhline(rows.lane(k - 1) + 0.5, color="#C8C8C8", linewidth=0.6, zorder=1)
            start = k


def _extent(contents) -> tuple[float, float]:
    """The first start and the last end of the trace's events, in ms."""
    spans = contents.loops + contents.phases
    starts = [c.start for c in contents.chunks] + [s.start for s in spans] + [f.t for f in contents.failures]
    ends = [c.end for c in contents.chunks] + [s.end for s in spans] + [f.t for f in contents.failures]
    return min(starts, default=0.0) * 1e3, max(ends, default=0.0) * 1e3


def _window(contents, window, what="window") -> tuple[float, float]:
    """The time range drawn, in ms: ``window`` (the option named ``what``) checked, or
    everything in the trace."""
    if window is None:
        return 0.0, max(_extent(contents)[1], 1e-3)
    try:
        lo, hi = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ArgumentError(f"{what} must be two numbers (start_ms, end_ms), got {window!r}") from None
    if not 0 <= lo < hi:
        raise ArgumentError(f"{what} must satisfy 0 <= start_ms < end_ms, got ({lo}, {hi})")
    if not math.isfinite(hi):
        raise ArgumentError(f"{what} must end at a finite time, got ({lo}, {hi})")
    return lo, hi


def _check_drawn(view, contents, window, what) -> None:
    """A ``window`` (the option named ``what``) in which nothing was recorded draws an
    empty panel: refused where it lies outside the trace's events (a mistaken range),
    warned of where it falls in a gap between them."""
    if view.chunks or view.loops or view.phases or view.failures:
        return
    first, last = _extent(contents)
    message = (f"{what} {window[0]:.4g}-{window[1]:.4g} ms holds no recorded event; the trace's "
               f"events span {first:.4g}-{last:.4g} ms")
    if window[1] < first or window[0] > last:
        raise ArgumentError(message)
    warn_user(f"{message}: its panel is empty", UserWarning)


def _clip(contents, window) -> TraceContents:
    """Only what overlaps the window (times in ms), so the counts are of drawn things."""
    lo, hi = window[0] * 1e-3, window[1] * 1e-3
    return TraceContents(contents.lanes,
                         [c for c in contents.chunks if c.end >= lo and c.start <= hi],
                         [f for f in contents.failures if lo <= f.t <= hi],
                         [s for s in contents.loops if s.end >= lo and s.start <= hi],
                         [s for s in contents.phases if s.end >= lo and s.start <= hi])


def _zoom(contents, zoom) -> tuple[float, float] | None:
    """The zoomed time range in ms: ``zoom`` checked as a window, or, given a phase's name,
    the time from the first start to the last end of the phases so named (every rank's)."""
    if zoom is None:
        return None
    if not isinstance(zoom, str):
        return _window(contents, zoom, "zoom")
    spans = [p for p in contents.phases if p.name == zoom]
    if not spans:
        names = sorted({p.name for p in contents.phases})
        raise ArgumentError(f"no phase named {zoom!r} to zoom to; the trace's phases: "
                            f"{', '.join(map(repr, names)) or 'none'}")
    return min(p.start for p in spans) * 1e3, max(p.end for p in spans) * 1e3


def _panel(ax, contents, rows, window, width) -> tuple[int, int, int, int]:
    """Draw ``contents`` (clipped to ``window``, ms) on ``rows`` into ``ax``: (bars,
    stolen chunks, steal lines, failures)."""
    bars, stolen = _draw_chunks(ax, contents, rows)
    lines = _draw_steals(ax, contents, rows)
    failures = _draw_failures(ax, contents, rows, window)
    plot_width_in = width * 0.75
    _draw_spans(ax, contents.loops, rows.loop, "#B0B0B0", window, plot_width_in)
    _draw_spans(ax, contents.phases, rows.phase, "#E6C87A", window, plot_width_in)
    _device_bands(ax, contents, rows)
    ax.set_yticks(range(rows.count))
    ax.set_yticklabels(rows.labels + _lane_labels(contents),
                       fontsize=8 if len(contents.lanes) <= 12 else 7)
    ax.set_ylim(rows.count - 0.5, -0.5)
    ax.set_xlim(window[0], window[1] + 0.01 * (window[1] - window[0]))
    ax.set_xlabel("time since recording began (ms)")
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    return bars, stolen, lines, failures


def plot_timeline(source, path, *, title: str | None = None, window=None, zoom=None,
                  width: float = 12.0, dpi: int = 120) -> TimelineSummary:
    """Draw the timeline of ``source`` into the image file ``path`` (format by suffix;
    none adds ``.png``).

    ``source`` is a Chrome trace (a file path or the loaded dict), a
    :class:`~hetflow.trace.Recorder`, a run report or a list of run reports.
    ``window=(start_ms, end_ms)`` draws only that time range. ``zoom``, a time range or
    the name of a phase, adds a second panel below that draws it across the full width
    (its range shaded above): where a long start-up dwarfs the steps after it, they stay
    readable. A range in which nothing was recorded is refused (ArgumentError) where it
    lies outside the trace's events, and warned of where it falls in a gap between them.
    Returns the counts of what the first panel drew.
    """
    from matplotlib.figure import Figure

    for name, value in (("width", width), ("dpi", dpi)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e5:
            raise ArgumentError(f"{name} must be a positive number, got {value!r}")
    contents = _contents(source)
    if not contents.lanes:
        raise ArgumentError("nothing to draw: the trace has no workers (it holds no run report). "
                            "Record launches with hetflow.trace.record(): every loop run while "
                            "recording, on one device or several, adds its run report")
    window_given = window is not None
    window = _window(contents, window)
    zoomed = _zoom(contents, zoom)
    windows = [window] + ([zoomed] if zoomed else [])
    views = [_clip(contents, w) for w in windows]  # what each panel draws, and its rows
    if window_given:
        _check_drawn(views[0], contents, window, "window")
    if zoomed and not isinstance(zoom, str):  # a phase's zoom holds at least that phase
        _check_drawn(views[1], contents, zoomed, "zoom")
    rows = [_Rows(v) for v in views]
    heights = [max(2.8, 1.3 + 0.24 * r.count) for r in rows]
    fig = Figure(figsize=(width, sum(heights) + 0.4 * (len(windows) - 1)), dpi=dpi)
    axes = fig.subplots(len(windows), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    drawn = views[0]
    bars, stolen, lines, failures = _panel(axes[0], drawn, rows[0], window, width)
    kinds = sorted({lane.kind for lane in contents.lanes}, key=lambda k: (k != "gpu", k))
    _legend(axes[0], kinds, stolen, lines, failures)
    span_ms = window[1] - window[0]
    steals = _steals(drawn, stolen)
    heading = _title(drawn, span_ms, steals, stolen)
    axes[0].set_title(f"{title}\n{heading}" if title else heading, fontsize=9, loc="left")
    if zoomed:
        axes[0].axvspan(*zoomed, color="#FFF1B8", zorder=0)
        part = views[1]
        _, part_stolen, _, _ = _panel(axes[1], part, rows[1], zoomed, width)
        what = zoom if isinstance(zoom, str) else f"{zoomed[0]:.4g}-{zoomed[1]:.4g} ms"
        heading = _title(part, zoomed[1] - zoomed[0], _steals(part, part_stolen), part_stolen)
        axes[1].set_title(f"zoom, shaded above: {what}\n{heading}", fontsize=9, loc="left")
        fig.set_layout_engine("constrained")  # the two panels' titles apart, their axes aligned
    path = Path(os.fspath(path))
    if not path.suffix:
        path = path.with_suffix(".png")  # what savefig would write: the summary names that file
    try:
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"cannot write the timeline to {path}: {exc}") from exc
    return TimelineSummary(path, len(drawn.lanes), bars, stolen, steals, failures,
                           len(drawn.loops), len(drawn.phases), span_ms)


# -- the ``hetflow trace`` command -------------------------------------------------------------
_EPILOG = """\
Record a trace in Python, then draw it here:

  with hetflow.trace.record() as rec:
      hetflow.forall(n, kernel, x, out, device=["cpu0", "gpu0"])
  rec.save("run.json")            # also opens in https://ui.perfetto.dev

  hetflow trace run.json -o run.png
"""


class _ZoomAction(argparse.Action):
    """``--zoom``: one value, a phase's name, or two numbers, a time range in ms; any other
    count or form is a usage error naming the two forms."""

    def __call__(self, parser, namespace, values, option_string=None):
        if len(values) == 1:
            setattr(namespace, self.dest, values[0])
            return
        try:
            lo, hi = map(float, values)
        except ValueError:
            raise argparse.ArgumentError(
                self, f"takes one phase's name (quoted if it holds spaces) or two numbers START_MS "
                      f"END_MS, got {len(values)} values: {' '.join(values)}") from None
        setattr(namespace, self.dest, (lo, hi))


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows ``--zoom``'s two forms (its metavar) where argparse would show a list of any length."""

    def _format_args(self, action, default_metavar):
        if isinstance(action, _ZoomAction):
            return action.metavar
        return super()._format_args(action, default_metavar)


def add_trace_command(subparsers) -> None:
    """Register ``hetflow trace TRACE.json -o timeline.png`` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "trace", help="draw the timeline of a saved hetflow trace (Chrome trace JSON) as an image",
        description="Draw a saved hetflow trace as a timeline: one lane per worker (CPU core,\n"
                    "GPU), one bar per chunk, stolen chunks hatched, steals and failures marked.",
        epilog=_EPILOG, formatter_class=_Formatter)
    p.add_argument("trace", metavar="TRACE.json",
                   help="a trace written by Recorder.save / hetflow.trace.write_chrome_trace")
    p.add_argument("-o", "--output", metavar="IMAGE", default=None,
                   help="image to write; the format follows the suffix (.png, .svg, .pdf). "
                        "Default: TRACE with the suffix .png")
    p.add_argument("--title", default=None, help="a first title line above the totals")
    p.add_argument("--window", type=float, nargs=2, metavar=("START_MS", "END_MS"), default=None,
                   help="draw only this time range (ms since recording began)")
    p.add_argument("--zoom", nargs="+", action=_ZoomAction, metavar="PHASE | START_MS END_MS", default=None,
                   help="add a panel below that draws one phase, by name (quoted if it holds "
                        "spaces), or the time range START_MS END_MS")
    p.add_argument("--width", type=float, default=12.0, help="figure width in inches (default 12)")
    p.add_argument("--dpi", type=int, default=120, help="resolution of raster images (default 120)")
    p.set_defaults(func=_cmd_trace)


def _cmd_trace(args) -> int:
    output = Path(args.output) if args.output else Path(args.trace).with_suffix(".png")
    drawn = plot_timeline(args.trace, output, title=args.title, window=args.window, zoom=args.zoom,
                          width=args.width, dpi=args.dpi)
    print(f"wrote {drawn.path}: {drawn.bars} chunks on {drawn.lanes} workers, {drawn.steals} steal(s), "
          f"{drawn.failures} failure(s), {drawn.loops} loop(s) in {drawn.span_ms:.4g} ms")
    return 0
