import pytest

from recsys_rl import signals


def test_feed_and_live_vectors_use_registered_names_main_first():
    assert signals.FEED_SIGNALS[0] == signals.FEED_MAIN_SIGNAL
    assert signals.LIVE_SIGNALS[0] == signals.LIVE_MAIN_SIGNAL
    for name in signals.FEED_SIGNALS + signals.LIVE_SIGNALS:
        assert signals.get(name).name == name


def test_costs_are_lower_is_better_and_flip_sign():
    assert signals.get("hate").direction is signals.Direction.LOWER_IS_BETTER
    assert signals.get("video_watch_displaced").direction is signals.Direction.LOWER_IS_BETTER
    assert signals.directions(["watch_time", "hate"]) == (1, -1)


def test_dense_time_signals_discount_less_than_sparse_interactions():
    watch, click = signals.discounts(["watch_time", "click"])
    assert watch > click
    assert all(0.0 <= g < 1.0 for g in signals.discounts(list(signals.SIGNALS)))


def test_unknown_signal_names_the_known_ones():
    with pytest.raises(KeyError, match="known signals are"):
        signals.get("watchtime")


def test_discount_outside_unit_interval_is_rejected():
    with pytest.raises(ValueError, match="default_discount should be in"):
        signals.Signal("x", "count", signals.Direction.HIGHER_IS_BETTER, 1.0, "")
