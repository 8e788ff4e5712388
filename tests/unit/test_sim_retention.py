"""The retention model: memory of past days drives return, and what a day is worth differs by user."""

from __future__ import annotations

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
