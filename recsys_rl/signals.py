"""The registry of reward signals: the one place where signal names, units and directions are defined.

Every other module (simulator, event contracts, pipelines, critics, OPE, serving) takes signal names from
here, so a renamed or added signal cannot silently disagree between the transition builder and a critic
head. Discounts are defaults only: each critic head may override its own (DESIGN 3.1, one gamma per signal).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Direction(enum.Enum):
    """Which way a signal should move; constraints on lower-is-better signals are upper bounds."""

    HIGHER_IS_BETTER = "higher"
    LOWER_IS_BETTER = "lower"

    @property
    def sign(self) -> int:
        """+1 or -1: multiplying a signal by this turns it into something to maximise."""
        return 1 if self is Direction.HIGHER_IS_BETTER else -1


@dataclass(frozen=True)
class Signal:
    name: str
    unit: str
    direction: Direction
    default_discount: float
    description: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.default_discount < 1.0:
            raise ValueError(
                f"signal {self.name!r}: default_discount should be in [0, 1), but is {self.default_discount}"
            )


_HIGHER = Direction.HIGHER_IS_BETTER
_LOWER = Direction.LOWER_IS_BETTER

# Dense time signals get a longer horizon than the sparse interactions: a watched second now and one
# a few pages later are both worth having, while an interaction is mostly attributable to the page that
# showed the item.
_ALL_SIGNALS: tuple[Signal, ...] = (
    Signal("watch_time", "seconds", _HIGHER, 0.95, "short-video watch time; the feed's main signal"),
    Signal("click", "count", _HIGHER, 0.9, "item opened or played past the preview"),
    Signal("like", "count", _HIGHER, 0.9, "explicit like"),
    Signal("follow", "count", _HIGHER, 0.9, "follow of the item's author"),
    Signal("comment", "count", _HIGHER, 0.9, "comment written"),
    Signal("share", "count", _HIGHER, 0.9, "item shared"),
    Signal("hate", "count", _LOWER, 0.9, "explicit 'not interested'; a cost"),
    Signal("live_watch_time", "seconds", _HIGHER, 0.95, "live-stream watch time; allocation's main signal"),
    Signal("gift", "coins", _HIGHER, 0.9, "value of gifts sent to a live stream"),
    Signal(
        "video_watch_displaced",
        "seconds",
        _LOWER,
        0.95,
        "short-video watch time lost to an inserted live stream; the platform-usage cost",
    ),
    Signal(
        "author_return",
        "count",
        _HIGHER,
        0.9,
        "a user-author pair interacting again on a later day than its previous interaction",
    ),
)

SIGNALS: dict[str, Signal] = {s.name: s for s in _ALL_SIGNALS}

#: Reward vector of a feed-ranking step, main signal first (TSCAC, DESIGN 3.1).
FEED_SIGNALS: tuple[str, ...] = ("watch_time", "click", "like", "follow", "comment", "share", "hate")
FEED_MAIN_SIGNAL = "watch_time"

#: Reward vector of a live-allocation step, main signal first (SL-MGAC, DESIGN 3.2).
LIVE_SIGNALS: tuple[str, ...] = ("live_watch_time", "gift", "video_watch_displaced")
LIVE_MAIN_SIGNAL = "live_watch_time"

#: Reward vector of a user-author pair's interaction (RLIV-UA, issue 22), in the order of the progressive
#: funnel: the dense click first, then follow, then the sparse gift and the pair's return.
PAIR_SIGNALS: tuple[str, ...] = ("click", "follow", "gift", "author_return")


def get(name: str) -> Signal:
    """Look a signal up by name, with an error that lists the known names."""
    try:
        return SIGNALS[name]
    except KeyError:
        raise KeyError(f"unknown signal {name!r}; known signals are {sorted(SIGNALS)}") from None


def discounts(names: tuple[str, ...] | list[str]) -> tuple[float, ...]:
    """Default discounts for a reward vector, in the vector's order."""
    return tuple(get(n).default_discount for n in names)


def directions(names: tuple[str, ...] | list[str]) -> tuple[int, ...]:
    """+1/-1 per signal, in the vector's order: the sign that turns each into something to maximise."""
    return tuple(get(n).direction.sign for n in names)
