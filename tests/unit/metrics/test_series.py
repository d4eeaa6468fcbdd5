"""The plain-dict series expose exactly what prometheus_client's own classes do."""

from __future__ import annotations

import sys
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from relay.adapters.metrics.series import CounterSeries, HistogramSeries


def _exposition(registry: CollectorRegistry) -> list[str]:
    """The text exposition without the ``_created`` lines (their values are clocks)."""
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_a_counter_series_exposes_what_a_prometheus_counter_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = CounterSeries("events_received", "Events.", registry=ours)
    labelled = CounterSeries("handled", "By function.", ["function", "outcome"], registry=ours)
    reference = Counter("events_received", "Events.", registry=theirs)
    reference_labelled = Counter(
        "handled", "By function.", ["function", "outcome"], registry=theirs
    )
    for labels, amount in [(("fn", "ok"), 1), (("fn", "ok"), 2), (("other", "failed"), 1)]:
        labelled.inc(labels, amount)
        reference_labelled.labels(*labels).inc(amount)
    plain.inc()
    reference.inc()
    assert _exposition(ours) == _exposition(theirs)
    assert ours.get_sample_value("handled_created", {"function": "fn", "outcome": "ok"})


def test_an_unlabelled_counter_is_exposed_at_zero_before_its_first_increment() -> None:
    registry = CollectorRegistry()
    CounterSeries("events_received", "Events.", registry=registry)
    assert registry.get_sample_value("events_received_total") == 0


@pytest.mark.parametrize("value", [0.0, 0.005, 0.0051, 0.1, 7.5, 10.0, 11.0, 1e9, -1.0])
def test_a_histogram_series_buckets_like_a_prometheus_histogram(value: float) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    series = HistogramSeries("duration_seconds", "Time.", ["function"], registry=ours)
    reference = Histogram("duration_seconds", "Time.", ["function"], registry=theirs)
    for observed in (value, 0.3, value):
        series.observe(("fn",), observed)
        reference.labels("fn").observe(observed)
    assert _exposition(ours) == _exposition(theirs)
    assert ours.get_sample_value("duration_seconds_created", {"function": "fn"})


def test_custom_buckets_gain_an_infinite_one() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    series = HistogramSeries("build_seconds", "Builds.", registry=ours, buckets=(1, 5))
    reference = Histogram("build_seconds", "Builds.", registry=theirs, buckets=(1, 5))
    for observed in (0.5, 3, 60):
        series.observe((), observed)
        reference.observe(observed)
    assert _exposition(ours) == _exposition(theirs)


def test_a_wrong_number_of_labels_is_refused() -> None:
    registry = CollectorRegistry()
    counter = CounterSeries("handled", "By function.", ["function"], registry=registry)
    histogram = HistogramSeries("took", "Time.", ["function"], registry=registry)
    with pytest.raises(ValueError, match="takes labels"):
        counter.inc(("fn", "extra"))
    with pytest.raises(ValueError, match="takes labels"):
        histogram.observe((), 1.0)


def test_remove_where_deletes_only_the_matching_series() -> None:
    registry = CollectorRegistry()
    counter = CounterSeries("handled", "By handler.", ["outcome", "function"], registry=registry)
    histogram = HistogramSeries("took", "Time.", ["function"], registry=registry)
    counter.inc(("success", "fn"))
    counter.inc(("success", "other"))
    histogram.observe(("fn",), 0.1)
    counter.remove_where(1, "fn")
    histogram.remove_where(0, "fn")
    text = generate_latest(registry).decode()
    assert 'function="fn"' not in text
    assert 'function="other"' in text
    counter.inc(("success", "fn"))  # comes back fresh
    assert registry.get_sample_value(
        "handled_total", {"outcome": "success", "function": "fn"}
    ) == 1


def test_a_scrape_in_another_thread_never_breaks_while_series_are_added() -> None:
    registry = CollectorRegistry()
    counter = CounterSeries("handled", "By function.", ["function"], registry=registry)
    histogram = HistogramSeries("took", "Time.", ["function"], registry=registry)
    failures: list[BaseException] = []
    done = threading.Event()

    def scrape() -> None:
        try:
            while not done.is_set():
                generate_latest(registry)
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, mid-iteration of a scrape
    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i in range(5_000):
            counter.inc((f"fn{i}",))  # a new series each time: the dicts grow
            histogram.observe((f"fn{i}",), i / 1000)
    finally:
        done.set()
        scraper.join()
        sys.setswitchinterval(interval)
    assert failures == []
    assert registry.get_sample_value("handled_total", {"function": "fn0"}) == 1
