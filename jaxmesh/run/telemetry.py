"""Per-call timings of a host-stepped run (``result.telemetry``; docs/cli.md,
``--telemetry``), also spans of the run's timeline under ``trace=``."""

from __future__ import annotations

import collections

import numpy as np

from jaxmesh import trace as trace_mod

#: Series -> the span's name on the timeline (others: the series' own).
TRACE_NAMES = {"predict": "plan", "env_step": "env step"}


class Telemetry:
    """Samples per series, in the order they were recorded."""

    def __init__(self) -> None:
        self.series: dict[str, list[float]] = collections.defaultdict(list)
        #: The run's timeline (``evaluate(..., trace=)``), or None.
        self.trace = trace_mod.current()

    def add(self, name: str, value: float) -> None:
        self.series[name].append(float(value))

    def span(
        self, name: str, begin: float, end: float, row: str, **args: object
    ) -> None:
        """A timed sample, and its span on the timeline when the run is traced."""
        self.series[name].append(end - begin)
        if self.trace is not None:
            self.trace.add(TRACE_NAMES.get(name, name), begin, end, row, args or None)

    def call(self, row: str, sent: float, arrived: float, server: float) -> None:
        """A served call's round trip, the server's env time centred inside."""
        self.series["env_step"].append(server)
        self.series["wire"].append(max(0.0, arrived - sent - server))
        if self.trace is not None:
            self.trace.add("call", sent, arrived, row)
            mid = sent + max(0.0, arrived - sent - server) / 2
            self.trace.add("server step", mid, mid + server, row)

    def stats(self) -> dict[str, dict[str, float]]:
        """``{series: {count, mean, p50, p95, p99}}`` of the non-empty series."""
        out = {}
        for name, values in self.series.items():
            if not values:
                continue
            x = np.asarray(values, np.float64)
            out[name] = {"count": int(x.size), "mean": float(x.mean())}
            for q in (50, 95, 99):
                out[name][f"p{q}"] = float(np.percentile(x, q))
        return out
