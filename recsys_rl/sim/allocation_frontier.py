"""Greedy allocation's frontier: the total usage a threshold rule reaches at each level of live watch.

One greedy threshold is one point on a trade-off. A higher threshold inserts fewer live streams: less
live watch, and (up to a point) more short-video watch and total usage. A learned allocation that beats
the 13-second threshold on usage may only have moved along that curve, which a retuned threshold does
as well; what the learning adds is what it earns beyond the curve at the live watch it chose.

The curve is the upper concave hull of the thresholds' (mean live watch, mean total usage) points: a
mixture of two threshold rules (each user served one of them, at random with a fixed weight) earns, in
expectation, the same mixture of their per-user outcomes, so every point between two rules on the hull
is reachable. A policy is compared, paired per user, with the mixture of the two hull rules whose live
watch brackets its own, weighted to match its mean live watch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from recsys_rl.sim.sim_eval import AllocationOutcome

LIVE, USAGE = "live_watch_s", "total_usage_s"


def mixture(first: AllocationOutcome, second: AllocationOutcome, weight: float) -> AllocationOutcome:
    """What serving each user ``first`` with probability ``weight`` (else ``second``) earns in
    expectation: per user, weight * first + (1 - weight) * second; the rates mixed the same way."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight should be in [0, 1], but is {weight}")
    return replace(
        first,
        per_user={
            name: weight * values + (1.0 - weight) * second.per_user[name]
            for name, values in first.per_user.items()
        },
        return_rate=weight * first.return_rate + (1.0 - weight) * second.return_rate,
        allocation_rate=weight * first.allocation_rate + (1.0 - weight) * second.allocation_rate,
        decisions=round(weight * first.decisions + (1.0 - weight) * second.decisions),
    )


def upper_hull(points: Sequence[AllocationOutcome]) -> list[AllocationOutcome]:
    """The outcomes on the upper concave hull of (mean live watch, mean usage), by live watch.

    A point on or under the chord of its neighbours is matched or beaten there by their mixture, and of
    points with the same live watch the one with the most usage stands for them, so it is left out."""
    ordered = sorted(points, key=_means)
    hull: list[AllocationOutcome] = []
    for point in ordered:
        while hull and _means(hull[-1])[0] == _means(point)[0]:  # the same live watch, less usage
            hull.pop()
        while len(hull) >= 2 and _not_above_chord(hull[-2], hull[-1], point):
            hull.pop()
        hull.append(point)
    return hull


def _not_above_chord(left: AllocationOutcome, middle: AllocationOutcome, right: AllocationOutcome) -> bool:
    (x0, y0), (x1, y1), (x2, y2) = (_means(o) for o in (left, middle, right))
    # the cross product of (middle - left) and (right - left): >= 0 when middle is on or below the chord
    return (x1 - x0) * (y2 - y0) - (y1 - y0) * (x2 - x0) >= 0.0


def _means(outcome: AllocationOutcome) -> tuple[float, float]:
    return float(outcome.per_user[LIVE].mean()), float(outcome.per_user[USAGE].mean())


def frontier_at(hull: Sequence[AllocationOutcome], live_watch_s: float) -> AllocationOutcome | None:
    """The hull's mixture with mean live watch ``live_watch_s``; None outside the hull's range (more or
    less live watch than any threshold gave: no threshold rule to compare with)."""
    lives = [_means(o)[0] for o in hull]
    if not hull or not lives[0] <= live_watch_s <= lives[-1]:
        return None
    for i in range(1, len(hull)):
        if live_watch_s <= lives[i]:
            # the hull's live watch rises strictly, so span > 0
            return mixture(hull[i], hull[i - 1], (live_watch_s - lives[i - 1]) / (lives[i] - lives[i - 1]))
    return hull[0]  # one point, and live_watch_s is exactly its live watch
