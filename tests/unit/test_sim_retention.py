"""The retention model: memory of past days drives return, and what a day is worth differs by user."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recsys_rl.sim.parameters import ResponseModel
from recsys_rl.sim.retention import remembered_satisfaction, return_probability

MODEL = ResponseModel()
REF = MODEL.return_reference


def remember(previous, mean_sat, interactions, views, social):
    arrays = (previous, mean_sat, interactions, views, social)
    return remembered_satisfaction(*(np.asarray(a, dtype=float) for a in arrays), MODEL)


def test_return_rises_with_memory_from_the_group_base_at_the_reference():
    base = np.full(3, 0.6)
    p = return_probability(base, np.array([REF - 0.2, REF, REF + 0.2]), MODEL)
    assert p[1] == pytest.approx(0.6) and p[0] < p[1] < p[2]


def test_interactions_bring_back_social_users_and_not_watchers():
    typical = MODEL.interaction_reference * 100
    social, watcher = 0.9, 0.1
    # the same watch satisfaction, with many interactions (5 in 100 views) or none
    lively = remember([REF] * 2, [0.5] * 2, [5.0, 5.0], [100, 100], [social, watcher])
    quiet = remember([REF] * 2, [0.5] * 2, [0.0, 0.0], [100, 100], [social, watcher])
    assert lively[0] - quiet[0] > 5 * (lively[1] - quiet[1]) > 0
    # at the typical rate, the social trait changes nothing
    typical_day = remember([REF] * 2, [0.5] * 2, [typical] * 2, [100, 100], [social, watcher])
    assert typical_day[0] == pytest.approx(typical_day[1])


def test_memory_averages_over_days_and_fades_on_a_day_away():
    good = REF + 0.4
    one = remember([REF], [good], [0.0], [0], [0.5])
    two = remember(one, [good], [0.0], [0], [0.5])
    assert REF < one[0] < two[0] < good  # a second good day adds to the first
    away = remember(two, [np.nan], [0.0], [0], [0.5])
    assert REF < away[0] < two[0]  # fading toward the reference, not forgotten at once


def test_a_days_memory_by_hand():
    """Round parameters: memory 0.5, interactions weighted 2 against a typical 0.1 a view, reference 0.4."""
    model = ResponseModel(
        return_memory=0.5, return_interactions=2.0, interaction_reference=0.1, return_reference=0.4
    )
    after = remembered_satisfaction(
        previous=np.array([0.2, 0.2, 0.2, 0.2, 0.6]),
        mean_view_satisfaction=np.array([0.5, 0.5, 0.5, 0.5, np.nan]),
        interactions=np.array([1.0, 3.0, 0.0, 0.0, 0.0]),
        video_views=np.array([1, 4, 0, 10, 0]),
        social=np.array([0.5, 1.0, 0.8, 0.25, 0.5]),
        model=model,
    )
    days = [
        0.5 + 0.5 * 2.0 * (1.0 - 0.1),  # one view, one interaction
        0.5 + 1.0 * 2.0 * (0.75 - 0.1),  # three interactions on four views
        0.5,  # live streams only: no short-video view, so no interaction rate to judge
        0.5 + 0.25 * 2.0 * (0.0 - 0.1),  # ten quiet views
        0.4,  # away: the reference
    ]
    np.testing.assert_allclose(after, 0.5 * np.array([0.2, 0.2, 0.2, 0.2, 0.6]) + 0.5 * np.array(days))
    # and tomorrow's return from it: the base's log-odds moved by return_satisfaction per unit above 0.4
    p = return_probability(np.array([0.5, 0.8]), np.array([0.65, 0.4]), model)
    np.testing.assert_allclose(p, [1.0 / (1.0 + math.exp(-4.0 * 0.25)), 0.8])
