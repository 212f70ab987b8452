"""Seeing what happened: traces, timelines and progress (SPEC §3's run reports, drawn).

* :func:`record` — collect the run reports of every co-executed loop, and phases you
  mark, on one clock (:mod:`hetflow.trace.recorder`);
* :func:`to_chrome_trace` / :func:`write_chrome_trace` — a Chrome / Perfetto trace with
  one process per device and one thread per worker; :func:`merge_chrome_traces` — one
  trace of a distributed run's ranks (:mod:`hetflow.trace.chrome`);
* :func:`plot_timeline` — the same as a picture (also ``hetflow trace TRACE.json -o
  timeline.png``; :mod:`hetflow.trace.timeline`);
* :func:`progress` — a progress bar, silent when output is not a terminal.

Importing this package loads neither matplotlib nor rich; they load when first used.
"""
from .chrome import merge_chrome_traces, read_chrome_trace, to_chrome_trace, write_chrome_trace
from .progress import Progress, progress
from .recorder import Phase, RecordedLoop, Recorder, notify, record
from .timeline import TimelineSummary, add_trace_command, plot_timeline

__all__ = ["Phase", "Progress", "RecordedLoop", "Recorder", "TimelineSummary", "add_trace_command",
           "merge_chrome_traces", "notify", "plot_timeline", "progress", "read_chrome_trace", "record",
           "to_chrome_trace", "write_chrome_trace"]
