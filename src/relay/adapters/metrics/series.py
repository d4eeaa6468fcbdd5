"""Counters and histograms kept in plain dicts, exposed by a collector at scrape time.

prometheus_client's own ``Counter.inc`` and ``Histogram.observe`` take a lock and
run several checks per call; a handled event makes about ten such calls, and at
a steady few thousand events per second that was about 5% of the worker's CPU
(``bench/throughput.py``, metrics wired versus unwired). The series here cost one
dict update per call (one ``bisect`` more for a histogram) and produce the same
exposition: ``_total`` and ``_created`` samples for a counter; cumulative ``le``
buckets, ``_count``, ``_sum`` and ``_created`` for a histogram.

Only the worker's event loop updates them; the metrics server's thread reads
them, through copies taken in one step each (``list(dict.items())``), so a scrape
never sees a dict change size under it.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

Labels = tuple[str, ...]
V = TypeVar("V")


class _Series(Collector, Generic[V]):
    """A family's label values -> value (``V``), with when each was first seen."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[Labels, V] = {}
        self._created: dict[Labels, float] = {}
        registry.register(self)

    def describe(self) -> Iterable[Metric]:
        return ()

    def _add(self, labels: Labels, value: V) -> V:
        """A series seen for the first time: check its labels, stamp ``_created``."""
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {labels}")
        self._created[labels] = time.time()
        self.values[labels] = value
        return value

    def remove_where(self, position: int, value: str) -> None:
        """Delete every series whose label at ``position`` is ``value``."""
        for labels in [k for k in self._created if len(k) > position and k[position] == value]:
            self.values.pop(labels, None)
            self._created.pop(labels, None)


class CounterSeries(_Series[float]):
    """A counter family: label values -> count. An unlabelled one starts at zero."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry,
    ) -> None:
        super().__init__(name, documentation, labelnames, registry)
        if not self.labelnames:
            self.inc((), 0)

    def inc(self, labels: Labels = (), amount: float = 1) -> None:
        values = self.values
        if labels in values:
            values[labels] += amount
        else:
            self._add(labels, amount)

    def value(self, labels: Labels = ()) -> float:
        return self.values.get(labels, 0.0)

    def items(self) -> list[tuple[Labels, float]]:
        return _copied(self.values)

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = dict(_copied(self._created))
        for labels, value in self.items():
            family.add_metric(labels, value, created=created.get(labels))
        return (family,)


class HistogramSeries(_Series[list[float]]):
    """A histogram family: label values -> per-bucket counts, then the sum."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry,
        buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
    ) -> None:
        super().__init__(name, documentation, labelnames, registry)
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._bounds = tuple(bounds)
        self._le = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]

    def observe(self, labels: Labels, value: float) -> None:
        entry = self.values.get(labels)
        if entry is None:
            entry = self._add(labels, [0.0] * (len(self._bounds) + 1))
        entry[bisect_left(self._bounds, value)] += 1
        entry[-1] += value

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = dict(_copied(self._created))
        for labels, entry in _copied(self.values):
            counts = list(entry)  # one step: the event loop may be updating it
            cumulative, buckets = 0.0, []
            for le, count in zip(self._le, counts, strict=False):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(labels, buckets, sum_value=counts[-1])
            if labels in created:
                family.samples.append(
                    Sample(self.name + "_created", dict(zip(self.labelnames, labels, strict=True)),
                           created[labels])
                )
        return (family,)


def _copied(values: dict[Labels, V]) -> list[tuple[Labels, V]]:
    """``values``' items in one step. A copy runs in C without releasing the GIL,
    except when an allocation inside it triggers a garbage collection whose
    finalizers run Python code: then the event loop's thread may add a series
    meanwhile and the copy raises; it is simply taken again."""
    while True:
        try:
            return list(values.items())
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
