"""Rule matching: the equality index against a linear scan, in the same run.

    .venv/bin/python bench/match.py [--functions 200] [--rules 5] [--events 20000]

Builds FUNCTIONS templates of RULES event rules each (table/event-name equality rules,
a nested prefix rule and a temporal now() rule, as real templates have), then matches
the same stream of events (hits, misses and near misses) with ``RuleIndex.match`` and
with ``RuleIndex.match_linear``, checks both give identical results, and prints events
per second for each and the ratio. Figures are machine-dependent; compare the ratio.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from relay.domain.rule_index import RuleIndex
from relay.domain.template import Template, parse_template

NOW = time.time()


def function_template(i: int, rules: int) -> Template:
    table = f"table_{i}"
    shapes: list[dict[str, Any]] = [
        {"event_name": ["INSERT"], "table_name": [table]},
        {"event_name": ["MODIFY"], "table_name": [table]},
        {"event_name": ["REMOVE"], "table_name": [table]},
        {"source": [f"svc-{i}"], "detail": {"kind": {"prefix": ["order."]}}},
        {
            "event_name": ["INSERT", "MODIFY"],
            "table_name": [table],
            "new_image": {"created_at": {"gt": "now()-5m"}, "status": {"exists": True}},
        },
    ]
    events = [
        {"handler": f"events.rule{r}.handler", "pattern": shapes[r % len(shapes)]}
        for r in range(rules)
    ]
    return parse_template({"runtime": "python3.14", "events": events})


def make_events(count: int, functions: int, rng: random.Random) -> list[dict[str, Any]]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 60))
    out: list[dict[str, Any]] = []
    for _ in range(count):
        i = rng.randrange(functions * 2)  # half the events name a table nobody listens to
        kind = rng.randrange(3)
        if kind == 0:
            out.append(
                {
                    "event_name": rng.choice(["INSERT", "MODIFY", "REMOVE"]),
                    "table_name": f"table_{i}",
                    "new_image": {"created_at": stamp, "status": "new", "id": i},
                }
            )
        elif kind == 1:
            out.append({"source": f"svc-{i}", "detail": {"kind": rng.choice(["order.x", "x"])}})
        else:
            out.append({"event_name": "INSERT", "table_name": f"table_{i}", "extra": [1, 2]})
    return out


def rate(match: Any, events: list[dict[str, Any]]) -> tuple[float, int]:
    matched = 0
    start = time.perf_counter()
    for event in events:
        matched += len(match(event, NOW))
    elapsed = time.perf_counter() - start
    return len(events) / elapsed, matched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=200)
    parser.add_argument("--rules", type=int, default=5)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    index = RuleIndex.build(
        (f"fn-{i:03d}", function_template(i, args.rules)) for i in range(args.functions)
    )
    events = make_events(args.events, args.functions, rng)
    for event in events[:2000]:
        assert index.match(event, NOW) == index.match_linear(event, NOW), event

    linear_rate, linear_matched = rate(index.match_linear, events)
    indexed_rate, indexed_matched = rate(index.match, events)
    assert linear_matched == indexed_matched
    print(f"{args.functions} functions x {args.rules} rules = {len(index)} rules, "
          f"{len(events)} events, {indexed_matched} matches")  # fmt: skip
    print(f"linear scan: {linear_rate:12,.0f} events/s")
    print(f"indexed:     {indexed_rate:12,.0f} events/s")
    print(f"ratio:       {indexed_rate / linear_rate:12.1f}x")


if __name__ == "__main__":
    main()
