"""The day-by-day, page-by-page simulation loop.

A day starts by deciding which users come back (driven by yesterday's satisfaction, so long-term effects
exist) and how many sessions each opens, at planned hours. The sessions then run in steps: each step
advances every open session by one page, as numpy arrays over those sessions (the Python loop runs over
steps and page slots, never over users). A user's next session opens the step after the previous one
ended, at its planned hour or the sessionisation gap after that end if that is later, so every request
carries the time it will be logged with. One step serves every user's first, second and later sessions
at once: running each user's k-th sessions as a separate wave took three times as many, smaller steps
and was 10% slower. A large page runs in chunks of rows on the simulator's threads (one a core by default),
the policies acting on the whole page between them (``Simulator._run_page``).

Every random number a user's episode needs is keyed by user, day, session, page, purpose and position
(``recsys_rl.sim.draws``), so runs of two policies on one world share the users' draws (common random
numbers); the policies' own exploration comes from a separate generator.

Every state is built by ``recsys_rl.state.feed_states`` from the user's stored rows
(``SimulatedFeatureStore``, updated when a day is over) and the request's context, as serving builds it.

The result of a day is a ``DayLog``: column arrays of every feed request, every live-allocation decision
and every viewed item, with the rewards the simulator itself attributes to each decision (the record that
pipeline tests compare transitions against).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import TypeVar

import numpy as np

from recsys_rl.fusion import fusion_scores, top_k
from recsys_rl.sim.behaviour import AllocationPolicy, FeedPolicy
from recsys_rl.sim.draws import KeyedDraws, KeyedExploration, Purpose
from recsys_rl.sim.familiarity import Familiarity
from recsys_rl.sim.follows import FollowGraph
from recsys_rl.sim.interests import drifted
from recsys_rl.sim.pair_table import PairTable
from recsys_rl.sim.parameters import ResponseModel, SimConfig
from recsys_rl.sim.responses import (
    FEED_RESPONSE_COLUMNS,
    LiveResponseProbs,
    VideoResponseProbs,
    take_in_rows,
)
from recsys_rl.sim.retention import remembered_satisfaction, return_probability
from recsys_rl.sim.stored_features import SimulatedFeatureStore
from recsys_rl.sim.world import World
from recsys_rl.state import RequestContexts, feed_states, live_states

#: Columns of ``ViewLog.signals``: the feedback event's signals.
VIEW_SIGNAL_COLUMNS: tuple[str, ...] = (
    "watch_time",
    "click",
    "like",
    "follow",
    "comment",
    "share",
    "hate",
    "gift",
    "live_watch_time",
)

_DAY_S = 86_400.0
_FIRST_SESSION_HOUR = 7.0
_SESSION_WINDOW_H = 16.0
# A session pushed past the end of the planning window by the gap after the user's previous one is not
# opened: a simulated day stays within its UTC day (sessions end minutes, not an hour, after they start),
# which is the unit the loop ingests and the feature pipeline aggregates. Without this, a late user's
# chain of sessions could run past midnight and its views land in the next day's feature row.
_LAST_SESSION_START_H = _FIRST_SESSION_HOUR + _SESSION_WINDOW_H

#: The simulator's threads when the constructor is not told: this variable's value, else one a core, up to
#: four (beyond that the interpreter's lock, held between numpy calls, leaves the threads waiting). A
#: benchmark that runs a process a core sets it to 1 (``bench/workers.py``).
THREADS_VARIABLE = "RECSYS_RL_SIMULATOR_THREADS"
_MOST_THREADS = 4
# Rows a chunk of a page has at least: a smaller one takes longer to hand to a thread than to simulate.
_CHUNK_ROWS = 1024

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class PageContext:
    """Who asks for each row of a page, beyond its state: what a policy behind an API needs.

    The simulator's own policies read only the state. A policy that answers through the live server
    (``recsys_rl.sim.live_client``) has to send what production callers send: the user, the request id the
    day's log will give the row, the session context, the candidates with their predictions and, for a
    live-allocation decision, the live candidate. A policy opts in by defining ``act_in_context``.

    A feed policy may also add a term of its own to each candidate's fusion score, as the user-author
    value does (issue 22), by defining ``candidate_scores(context) -> (n, C)``; its context then carries
    each candidate's pair state.

    ``request`` is what the request message's context says (its time is the one the day's log holds).
    """

    users: np.ndarray  # (n,) user index
    requests: np.ndarray  # (n,) request number of each row in the day's log
    sessions: np.ndarray  # (n,) session number
    request: RequestContexts
    candidates: np.ndarray  # (n, C) video ids; for live rows: (n, 1) live ids
    predictions: np.ndarray  # (n, C, K) upstream predictions of each candidate
    # (n, C, len(PAIR_STATE_FEATURES)) the state of each candidate's user-author pair, as the feature
    # store serves it; filled only for a feed policy that scores candidates itself (``candidate_scores``)
    pair_states: np.ndarray | None = None
    # (n, C, K) the world's own expected responses of each candidate, which no ranker knows; filled only
    # for a policy that scores candidates and says ``reads_expected_responses``: an oracle reference line
    expected_responses: np.ndarray | None = None

    def rows(self, index: np.ndarray, candidates: np.ndarray, predictions: np.ndarray) -> PageContext:
        """The context of a subset of rows, with other candidates (the live one of each row)."""
        return PageContext(
            users=self.users[index],
            requests=self.requests[index],
            sessions=self.sessions[index],
            request=self.request.take(index),
            candidates=candidates,
            predictions=predictions,
        )


def _inverse_cdf_rows(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """For each row of ``weights`` (n, k), the categories (n, m) that the row's ``uniforms`` (n, m) pick
    with probability proportional to the weights: the number of the row's cumulative weights below each
    uniform, counted one category at a time (k small), which touches each draw k times but never builds
    the (n, m, k) comparison cube."""
    cum = np.cumsum(weights, axis=1)
    scaled = uniforms * cum[:, -1:]
    found = np.zeros(uniforms.shape, np.min_scalar_type(weights.shape[1]))  # narrow: fewer bytes per pass
    for k in range(weights.shape[1] - 1):
        found += scaled > cum[:, k : k + 1]
    return found


def _leave(
    surplus: np.ndarray,
    exit_base: np.ndarray,
    patience: np.ndarray,
    uniforms: np.ndarray,
    model: ResponseModel,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Who leaves the page where (docs/simulator.md, "Leaving the session"): after the view in each slot
    a user still there leaves with probability ``min(1, exit_base * exp(-exit_satisfaction * surplus
    - patience_weight * patience))``, the patience before the view: when the slot's uniform is below it.
    Each view seen then moves the patience to ``patience_decay * patience + surplus``. ``surplus`` (n,
    slots) is each view's satisfaction above the exit reference; ``patience`` (n,) is updated in place.
    Returns whether the user saw each slot, left after it, and is still there after the page."""
    n, size = surplus.shape
    viewed = np.empty((n, size), dtype=bool)
    exits = np.empty((n, size), dtype=bool)
    alive = np.ones(n, dtype=bool)
    for s in range(size):
        viewed[:, s] = alive
        hazard = -model.exit_satisfaction * surplus[:, s] - model.patience_weight * patience
        patience[alive] = model.patience_decay * patience[alive] + surplus[alive, s]
        exits[:, s] = alive & (uniforms[:, s] < exit_base * np.exp(hazard))  # above 1: a uniform is below
        alive &= ~exits[:, s]
    return viewed, exits, alive


def _sum_over_slots(values: np.ndarray) -> np.ndarray:
    """(n, K) float64 sums of ``values`` (n, slots, K) over slots, added slot by slot as the views
    happened: the same floats whatever the batch (a reduction may pair its terms differently)."""
    total = values[:, 0].astype(np.float64)
    for slot in range(1, values.shape[1]):
        total += values[:, slot]
    return total


def _act(policy, states: np.ndarray, rng: KeyedExploration, context: PageContext):
    """A policy's actions for a page: with the page's context when the policy asks for it, exploring
    with draws keyed by the page's rows (``recsys_rl.exploration``)."""
    act_in_context = getattr(policy, "act_in_context", None)
    return policy.act(states, rng) if act_in_context is None else act_in_context(states, rng, context)


@dataclass
class FeedLog:
    """One row per feed request (= one decision of the ranking policy)."""

    request: np.ndarray  # (n,) int64, unique within a run
    session: np.ndarray  # (n,) int64, unique within a run
    user: np.ndarray
    page: np.ndarray
    time_ms: np.ndarray
    session_watch_s: np.ndarray  # (n,) with page and time: the request context the state was built from
    last_click_rate: np.ndarray  # (n,)
    state: np.ndarray  # (n, len(FEED_STATE_FEATURES)) float32
    candidates: np.ndarray  # (n, C) video ids
    predictions: np.ndarray  # (n, C, K) float32
    action: np.ndarray  # (n, K) float32
    log_propensity: np.ndarray
    served: np.ndarray  # (n, page_size) item ids in page order; the live slot holds the live id
    live_inserted: np.ndarray  # (n,) bool
    live_slot: np.ndarray  # (n,) slot of ``served`` that holds the live stream, -1 for none
    reward: np.ndarray  # (n, K) sum of feed signals over the viewed videos of the page
    # (n, K) the same sum of the viewed videos' expected responses (probabilities and means given the
    # user's state on the page, not draws): ground truth without the per-view sampling noise
    expected_reward: np.ndarray
    done: np.ndarray  # (n,) bool: the session ended on this page

    def contexts(self) -> RequestContexts:
        """What each request said about itself: with the user's stored rows, all its state was built from."""
        return RequestContexts(
            time_ms=self.time_ms,
            page_index=self.page,
            session_watch_s=self.session_watch_s,
            last_page_click_rate=self.last_click_rate,
            utc_offset_minutes=np.zeros(self.page.size, np.int64),  # the simulated users live on UTC
        )


@dataclass
class LiveLog:
    """One row per live-allocation decision (requests that had a live candidate)."""

    request: np.ndarray  # the feed request the decision belongs to
    session: np.ndarray
    user: np.ndarray
    page: np.ndarray
    time_ms: np.ndarray
    state: np.ndarray  # (n, len(LIVE_STATE_FEATURES)) float32
    live: np.ndarray  # live stream id
    predictions: np.ndarray  # (n, 3): live watch s, gift, displaced video watch s
    action: np.ndarray  # (n,) 0/1
    log_propensity: np.ndarray
    reward: np.ndarray  # (n, 3): live watch s, gift, displaced video watch s (LIVE_SIGNALS order)
    # (n, 3) the same from expected responses (the live stream's entry probability times its mean watch,
    # its expected gift, the displaced video's expected watch) where the draws had them viewed
    expected_reward: np.ndarray
    done: np.ndarray  # the session ended on this decision's page


@dataclass
class ViewLog:
    """One row per viewed item: what a client reports as a feedback event."""

    request: np.ndarray
    session: np.ndarray
    user: np.ndarray
    item: np.ndarray
    is_live: np.ndarray  # (n,) bool
    position: np.ndarray
    time_ms: np.ndarray  # when the view ended
    signals: np.ndarray  # (n, 9) in VIEW_SIGNAL_COLUMNS order
    # (n, 9) the same signals' expected values given everything before the view (the probabilities and
    # means the draws came from): ground truth for measuring how much of a signal is luck of the draw
    expected: np.ndarray
    session_end: np.ndarray  # (n,) bool: the user left the app after this view


@dataclass
class DayLog:
    day: int
    feed: FeedLog
    live: LiveLog
    views: ViewLog
    returning_users: int
    sessions: int


def pair_meetings(views: ViewLog, world: World) -> tuple[np.ndarray, ...]:
    """A day's views as meetings of user-author pairs, as ``PairTable.add_day`` counts them (and
    ``bench/user_author.py`` chains them): user, the item's author, time, click, follow and gift of each
    (a live stream's author for a live view)."""
    is_live = views.is_live
    authors = np.empty(views.item.size, np.int64)
    authors[is_live] = world.lives.author[views.item[is_live]]
    authors[~is_live] = world.videos.author[views.item[~is_live]]
    columns = [VIEW_SIGNAL_COLUMNS.index(name) for name in ("click", "follow", "gift")]
    return (views.user, authors, views.time_ms, *views.signals[:, columns].T)


def _view_expected(video: np.ndarray, is_live: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Views' expected signals (n, 9) in VIEW_SIGNAL_COLUMNS order, from the viewed videos' expected
    responses (n, 7) and the live streams' entry probability, expected gift and watch (n, 3), each row
    taking the one its view was (a live view's click is its entry, as in ``signals``)."""
    out = np.zeros((is_live.size, len(VIEW_SIGNAL_COLUMNS)))
    out[:, :7] = np.where(is_live[:, None], 0.0, video)
    out[is_live, 1] = live[is_live, 0]
    out[is_live, 7:] = live[is_live, 1:]
    return out


def _thread_count(threads: int | None) -> int:
    """The threads asked for, else ``THREADS_VARIABLE``'s (unset or empty: one a core, up to four)."""
    if threads is None:
        setting = os.environ.get(THREADS_VARIABLE, "").strip()
        if not setting:
            return min(os.cpu_count() or 1, _MOST_THREADS)
        if not setting.isdigit() or int(setting) < 1:
            raise ValueError(
                f"{THREADS_VARIABLE} should be a number of threads, at least 1, but is {setting!r}"
            )
        return int(setting)
    if threads < 1:
        raise ValueError(f"Simulator threads should be at least 1, but is {threads}")
    return threads


def _concat(cls, parts: list[dict[str, np.ndarray]]):
    """Build a log dataclass from per-page column dicts."""
    return cls(**{f.name: np.concatenate([p[f.name] for p in parts]) for f in fields(cls)})


class Simulator:
    """A seeded world plus what the feature store knows of its users; ``run_day`` advances it by one day."""

    def __init__(
        self, config: SimConfig, seed: int, episode_seed: int = 0, threads: int | None = None
    ) -> None:
        """``seed`` fixes the world; ``episode_seed`` the users' draws on it, so that ground truth can
        replay the world of a logged run with episodes independent of the logged ones. ``threads`` run a
        page's rows in chunks (``THREADS_VARIABLE`` says how many by default); the logs do not depend on it.

        They come from distinct spawn keys of one ``SeedSequence``: the world is child 0, the users' draws
        of ``episode_seed`` are child ``episode_seed`` of child 1 (what ``spawn`` would hand out); the
        policies' exploration is keyed from the same key with purposes of its own. Entropy lists are not
        enough, since ``SeedSequence([seed, 0])`` equals ``SeedSequence([seed])``: day 0's return draws
        would reuse the numbers that assigned the activity groups. The users' draws are keyed by user,
        day, session and page (``recsys_rl.sim.draws``), so runs of two policies share them.
        """
        self.config = config
        self.world = World.of_seed(config, seed)
        self.draws = KeyedDraws(np.random.SeedSequence(seed, spawn_key=(1, episode_seed)))
        # the platform's user table holds every account's group from the start (see events.write_user_table)
        self.store = SimulatedFeatureStore(self.world.users.group)
        self.follows = FollowGraph(config.n_authors, self.world.videos.author)
        # every user-author pair's history through the last day, as the feature store serves it to a feed
        # policy that scores candidates by their pairs
        self.pairs = PairTable(config.n_users, config.n_authors)
        self.familiarity = Familiarity(
            config.n_users, config.n_authors, config.response.familiarity_saturation_views
        )
        self.day = 0
        self._next_request = 0
        self._next_session = 0
        # satisfaction of yesterday per user; the reference value for day 0
        self._satisfaction = np.full(config.n_users, config.response.return_reference)
        self._threads = _thread_count(threads)
        self._pool: ThreadPoolExecutor | None = None  # started at the first page that is worth chunking
        self._pool_pid = os.getpid()

    @property
    def threads(self) -> int:
        """How many threads run a page's chunks of rows."""
        return self._threads

    # ------------------------------------------------------------------ day level
    def run_day(self, feed_policy: FeedPolicy, allocation_policy: AllocationPolicy) -> DayLog:
        cfg, draws = self.config, self.draws
        users = self.world.users
        base = np.asarray(cfg.return_base)[users.group]
        user_days = draws.rows(np.arange(cfg.n_users), np.full(cfg.n_users, self.day))
        returning = draws.uniform(user_days, Purpose.RETURN) < return_probability(
            base, self._satisfaction, cfg.response
        )
        extra = draws.poisson(
            user_days, Purpose.EXTRA_SESSIONS, np.asarray(cfg.sessions_per_day)[users.group] - 1.0
        )
        n_sessions = np.where(returning, 1 + extra, 0)
        lane_user = np.repeat(np.arange(cfg.n_users), n_sessions)
        n_lanes = lane_user.size
        lane_session = self._next_session + np.arange(n_lanes)
        self._next_session += n_lanes
        first = np.r_[True, lane_user[1:] != lane_user[:-1]] if n_lanes else np.zeros(0, bool)
        rank = np.arange(n_lanes) - np.maximum.accumulate(np.where(first, np.arange(n_lanes), 0))
        # planned start hour of each session, ascending within a user (lane_user is sorted)
        hour_draws = draws.uniform(
            draws.rows(lane_user, np.full(n_lanes, self.day), rank), Purpose.SESSION_HOUR
        )
        planned_h = _FIRST_SESSION_HOUR + _SESSION_WINDOW_H * hour_draws
        planned_h = planned_h[np.lexsort((planned_h, lane_user))]

        planned_s = self.day * _DAY_S + planned_h * 3600.0  # seconds since the run's start
        last_start_s = self.day * _DAY_S + _LAST_SESSION_START_H * 3600.0
        lanes = _Lanes.planned(lane_user, lane_session, rank, planned_s, cfg.n_topics)
        parts = _Parts()
        # Every open session advances one page per step, whichever of the user's sessions it is: a user's
        # next session opens at its planned hour, or the gap after the previous one ended if that is later,
        # the step after the previous one ended. The first step runs even on a day without sessions, so
        # that every log has its columns.
        active = np.flatnonzero(rank == 0)
        opened = active.size
        while True:
            going_on = self._run_step(lanes, active, parts, feed_policy, allocation_policy)
            following = active[~going_on] + 1  # the same user's next session, if the user planned one
            following = following[following < n_lanes]
            following = following[rank[following] > 0]
            start_s = lanes.start_s
            gap_end = start_s[following - 1] + lanes.elapsed[following - 1] + cfg.min_session_gap_s
            start_s[following] = np.maximum(start_s[following], gap_end)
            # a session pushed past the window is not opened, and neither are the user's later ones
            following = following[start_s[following] <= last_start_s]
            opened += following.size
            active = np.concatenate([active[going_on], following])
            if active.size == 0:
                break
        # the logs, and below the nightly stores, are independent of each other: built side by side
        feed, views, live = self._each(
            lambda log: _concat(*log), [(FeedLog, parts.feed), (ViewLog, parts.viewed), (LiveLog, parts.live)]
        )
        day_sat = np.bincount(lane_user, weights=lanes.satisfaction, minlength=cfg.n_users)
        day_views = np.bincount(lane_user, weights=lanes.views, minlength=cfg.n_users)
        video = ~views.is_live
        self._satisfaction = remembered_satisfaction(
            self._satisfaction,
            np.where(day_views > 0, day_sat / np.maximum(day_views, 1), np.nan),
            np.bincount(
                views.user[video], weights=views.signals[video, 2:6].sum(axis=1), minlength=cfg.n_users
            ),
            np.bincount(views.user[video], minlength=cfg.n_users),
            self.world.users.social,
            cfg.response,
        )
        clicked = video & (views.signals[:, 1] > 0)
        self.world.users.interest[:] = drifted(
            self.world.users.interest,
            views.user[clicked],
            self.world.videos.topic[views.item[clicked]],
            views.signals[clicked, 0],
            cfg.interest_drift,
            cfg.interest_floor,
        )
        meetings = pair_meetings(views, self.world)
        nightly = (  # the nightly pipeline: tomorrow's states see today
            functools.partial(self.store.add_views, views),
            functools.partial(self.pairs.add_day, *meetings),
            functools.partial(self.familiarity.add_day, *meetings[:2]),
        )
        self._each(operator.call, list(nightly))
        log = DayLog(self.day, feed, live, views, int(returning.sum()), opened)
        self.day += 1
        return log

    # ------------------------------------------------------------------ page level
    def _run_step(self, lanes: _Lanes, active, parts: _Parts, feed_policy, allocation_policy) -> np.ndarray:
        """One page of each ``active`` session, its logs added to ``parts``; whether each session goes on."""
        cfg = self.config
        lane_user, lane_session = lanes.user, lanes.session
        start_ms = cfg.start_time_ms + np.round(lanes.start_s[active] * 1000.0).astype(np.int64)
        users = lane_user[active]
        page = lanes.page[active]
        request_ms = start_ms + np.round(lanes.elapsed[active] * 1000.0).astype(np.int64)
        request = RequestContexts(
            time_ms=request_ms,
            page_index=page,
            session_watch_s=lanes.session_watch[active],
            last_page_click_rate=lanes.last_click_rate[active],
            utc_offset_minutes=np.zeros(active.size, np.int64),  # the simulated users live on UTC
        )
        state = feed_states(self.store.lookup(users), request)
        # whose draws: the user's day, session and page, whatever happened to anyone else
        rows = self.draws.rows(users, np.full(active.size, self.day), lanes.rank[active], page)
        requests = self._next_request + np.arange(active.size)
        context = PageContext(
            users=users,
            requests=requests,
            sessions=lane_session[active],
            request=request,
            candidates=np.empty((active.size, 0), dtype=np.int64),
            predictions=np.empty((active.size, 0, 0)),
        )
        session = _SessionState(lanes.topic_clicks[active], lanes.patience[active])
        outcome = self._run_page(users, rows, state, feed_policy, allocation_policy, context, session)
        lanes.patience[active] = session.patience
        self._next_request += active.size

        views = outcome.views
        last_page = page + 1 == cfg.max_pages  # the page cap ends the session after the page's last view
        last_view = np.r_[views.row[1:] != views.row[:-1], True][: views.row.size]
        views.session_end |= last_view & last_page[views.row]
        view_lane = active[views.row]
        parts.viewed.append(
            {
                "request": requests[views.row],
                "session": lane_session[view_lane],
                "user": lane_user[view_lane],
                "item": views.item,
                "is_live": views.is_live,
                "position": views.slot,
                "time_ms": request_ms[views.row] + np.round(views.offset_s * 1000.0).astype(np.int64),
                "signals": views.signals,
                "expected": views.expected,
                "session_end": views.session_end,
            }
        )
        continuing = ~outcome.left & ~last_page
        parts.feed.append(
            {
                "request": requests,
                "session": lane_session[active],
                "user": users,
                "page": page,
                "time_ms": request_ms,
                "session_watch_s": request.session_watch_s,
                "last_click_rate": request.last_page_click_rate,
                "state": state,
                "candidates": outcome.candidates,
                "predictions": outcome.predictions.astype(np.float32, copy=False),
                "action": outcome.action.astype(np.float32),
                "log_propensity": outcome.log_propensity,
                "served": outcome.served,
                "live_inserted": outcome.live_inserted,
                "live_slot": np.where(outcome.live_inserted, cfg.live_position, -1),
                "reward": outcome.feed_reward,
                "expected_reward": outcome.expected_feed_reward,
                "done": ~continuing,
            }
        )
        lr = outcome.live_rows
        parts.live.append(
            {
                "request": requests[lr],
                "session": lane_session[active[lr]],
                "user": users[lr],
                "page": page[lr],
                "time_ms": request_ms[lr],
                "state": outcome.live_state,
                "live": outcome.live_id,
                "predictions": outcome.live_predictions,
                "action": outcome.live_action,
                "log_propensity": outcome.live_log_propensity,
                "reward": outcome.live_reward,
                "expected_reward": outcome.live_expected_reward,
                "done": ~continuing[lr],
            }
        )
        lanes.page[active] += 1
        lanes.elapsed[active] += outcome.page_seconds
        lanes.session_watch[active] += outcome.feed_reward[:, 0]
        lanes.last_click_rate[active] = outcome.click_rate
        followed = ~views.is_live & (views.signals[:, 3] > 0)
        self.follows.add(lane_user[view_lane[followed]], self.world.videos.author[views.item[followed]])
        clicked_video = ~views.is_live & (views.signals[:, 1] > 0)
        n_topics = cfg.n_topics
        clicked_topic = (
            views.row[clicked_video] * n_topics + self.world.videos.topic[views.item[clicked_video]]
        )
        lanes.topic_clicks[active] += np.bincount(clicked_topic, minlength=active.size * n_topics).reshape(
            active.size, n_topics
        )
        lanes.satisfaction[active] += np.bincount(views.row, views.satisfaction, minlength=active.size)
        lanes.views[active] += np.bincount(views.row, minlength=active.size)
        return continuing

    def _run_page(
        self, users, rows, state, feed_policy, allocation_policy, context: PageContext, session: _SessionState
    ) -> PageOutcome:
        """One page for each row, with the rows' keyed draws; ``session`` (the rows' session so far) is
        updated with its views.

        What the world does runs on chunks of the rows, in the simulator's threads: the candidates and the
        world's responses to them before the policies act, the views after. The policies act on the whole
        page, in this thread: a network's floats may depend on the batch it is given, and a policy need
        not be thread-safe. Every draw is keyed by its row and every sum runs along a row, so the logs are
        the same floats however the rows are chunked (``test_sim_threads``)."""
        cfg, draws, world = self.config, self.draws, self.world
        model = cfg.response
        n, size = users.size, cfg.page_size
        chunks = self._chunks(n)
        candidates = np.empty((n, cfg.n_candidates), np.int64)
        candidate_authors = np.empty_like(candidates)
        expected = np.empty((n, cfg.n_candidates, len(FEED_RESPONSE_COLUMNS)), np.float32)
        predictions = np.empty_like(expected)

        def offer(chunk: slice) -> VideoResponseProbs:
            """The chunk's part of the page arrays above; its response probabilities, kept for its views."""
            offered = self._candidates(users[chunk], rows[chunk], session.topic_clicks[chunk])
            candidates[chunk], candidate_authors[chunk] = offered.candidates, offered.authors
            expected[chunk], predictions[chunk] = offered.expected, offered.predictions
            return offered.probs

        chunk_probs = self._each(offer, chunks)
        context = dataclasses.replace(context, candidates=candidates, predictions=predictions)
        exploration = KeyedExploration(draws, rows, Purpose.FEED_EXPLORATION)
        action, log_propensity = _act(feed_policy, state, exploration, context)
        scores = fusion_scores(predictions, action)
        if (candidate_scores := getattr(feed_policy, "candidate_scores", None)) is not None:
            at_ms = context.request.time_ms[:, None]
            pairs = self.pairs.states(users[:, None], candidate_authors, at_ms)
            truth = expected if getattr(feed_policy, "reads_expected_responses", False) else None
            scored = dataclasses.replace(context, pair_states=pairs, expected_responses=truth)
            scores = scores + candidate_scores(scored)
        ranked_cols = top_k(scores, size)

        # live allocation for requests that have a live candidate
        live_rows = np.flatnonzero(draws.uniform(rows, Purpose.LIVE_OFFERED) < cfg.live_availability)
        live_id = (draws.uniform(rows[live_rows], Purpose.LIVE_ID) * cfg.n_lives).astype(np.int64)
        live_probs = LiveResponseProbs.of(world, model, users[live_rows], live_id)
        exp_watch, exp_gift = live_probs.expected(model)
        noise = np.exp(
            model.prediction_noise * draws.normal(rows[live_rows], Purpose.LIVE_PREDICTION_NOISE, (2,))
        )
        displaced_pred = predictions[live_rows, ranked_cols[live_rows, size - 1], 0]
        # float32, as the allocation request carries them: the live state is built from what serving sees
        live_predictions = np.column_stack(
            [exp_watch * noise[:, 0], exp_gift * noise[:, 1], displaced_pred]
        ).astype(np.float32)
        live_state = live_states(state[live_rows], live_predictions)
        live_context = context.rows(live_rows, live_id[:, None], live_predictions[:, None, :])
        exploration = KeyedExploration(draws, rows[live_rows], Purpose.ALLOCATION_EXPLORATION)
        live_action, live_log_propensity = _act(allocation_policy, live_state, exploration, live_context)
        inserted = np.zeros(n, dtype=bool)
        inserted[live_rows] = live_action == 1
        live_of_row = np.full(n, -1)
        live_of_row[live_rows] = live_id

        def respond(chunk_and_probs: tuple[slice, VideoResponseProbs]) -> _Views:
            chunk, probs = chunk_and_probs
            return self._views(
                users[chunk], rows[chunk], probs, expected[chunk], candidates[chunk], ranked_cols[chunk],
                inserted[chunk], live_of_row[chunk], session.patience[chunk],
            )  # fmt: skip

        seen = _Views.joined(self._each(respond, list(zip(chunks, chunk_probs, strict=True))), chunks)
        live_reward = np.column_stack(
            [
                np.where(seen.live_viewed, seen.live_watch, 0.0)[live_rows],
                np.where(seen.live_viewed, seen.live_gift, 0.0)[live_rows],
                np.where(inserted & seen.reached_end, seen.last_video_watch, 0.0)[live_rows],
            ]
        )
        # the same with expected responses: the live stream's expected watch and gift where it was viewed,
        # the displaced video's expected watch where the user would have reached it
        displaced_expected = expected[live_rows, ranked_cols[live_rows, size - 1], 0]
        live_expected_reward = np.column_stack(
            [
                np.where(seen.live_viewed[live_rows], exp_watch, 0.0),
                np.where(seen.live_viewed[live_rows], exp_gift, 0.0),
                np.where((inserted & seen.reached_end)[live_rows], displaced_expected, 0.0),
            ]
        ).astype(np.float64)
        return PageOutcome(
            candidates=candidates,
            predictions=predictions,
            action=action,
            log_propensity=log_propensity,
            served=seen.served,
            live_inserted=inserted,
            feed_reward=seen.feed_reward,
            expected_feed_reward=seen.expected_feed_reward,
            live_rows=live_rows,
            live_id=live_id,
            live_state=live_state,
            live_predictions=live_predictions,
            live_action=live_action,
            live_log_propensity=live_log_propensity,
            live_reward=live_reward,
            live_expected_reward=live_expected_reward,
            left=seen.left,
            page_seconds=seen.page_seconds,
            click_rate=seen.click_rate,
            views=seen.views,
        )

    def _candidates(self, users, rows, topic_clicks) -> _Offer:
        """The rows' upstream candidates, the world's responses to them and the ranker's predictions."""
        cfg, draws, world = self.config, self.draws, self.world
        model = cfg.response
        # upstream candidates: topics drawn from the user's interests, then a random video of the topic
        c = cfg.n_candidates
        topic = _inverse_cdf_rows(
            world.users.interest[users], draws.uniform(rows, Purpose.CANDIDATE_TOPIC, (c,))
        )
        candidates = world.videos.topic_start[topic] + (
            draws.uniform(rows, Purpose.CANDIDATE_VIDEO, (c,)) * world.videos.topic_count[topic]
        ).astype(np.int64)
        # the following feed: the last candidates come from followed authors, for users who follow any
        # (looked up for those rows only: most users follow no one); every followed author has videos,
        # since follows come from views of them
        fans = np.flatnonzero(self.follows.following_anyone(users))
        pick = draws.uniform(rows[fans], Purpose.FOLLOWED_VIDEO, (cfg.followed_candidates,))
        for i, j in enumerate(range(c - cfg.followed_candidates, c)):
            candidates[fans, j] = self.follows.followed_videos(users[fans], pick[:, i])
        followed = np.zeros(candidates.shape, bool)
        candidate_authors = world.videos.author[candidates]
        followed[fans] = self.follows.follows(users[fans, None], candidate_authors[fans])
        author_views = self.familiarity.views(users[:, None], candidate_authors)
        probs = VideoResponseProbs.of(world, model, users, candidates, topic_clicks, followed, author_views)
        expected = probs.expected(model)
        noise = draws.normal(rows, Purpose.PREDICTION_NOISE, expected.shape[1:])
        predictions = expected * np.exp(model.prediction_noise * noise)
        return _Offer(candidates, candidate_authors, probs, expected, predictions)

    def _views(
        self, users, rows, probs, expected, candidates, ranked_cols, inserted, live_of_row, patience
    ) -> _Views:
        """What the rows' users see of their pages and do, slot by slot until they leave; ``patience``
        (the rows' session so far) is updated in place."""
        cfg, draws, world = self.config, self.draws, self.world
        model = cfg.response
        n, size = users.size, cfg.page_size
        # page layout: rank of the video in each slot, -1 for the live slot; an insertion drops rank size-1
        slot = np.arange(size)
        slot_rank = np.where(inserted[:, None] & (slot >= cfg.live_position), slot - 1, slot)
        slot_rank[inserted, cfg.live_position] = -1

        video_signals, video_sat = probs.take(ranked_cols).sample(
            model, draws.uniform(rows, Purpose.VIDEO_RESPONSE, (size, 7))
        )
        live_watch = np.zeros(n)
        live_gift = np.zeros(n)
        live_sat = np.zeros(n)
        ins_rows = np.flatnonzero(inserted)
        ins_probs = LiveResponseProbs.of(world, model, users[ins_rows], live_of_row[ins_rows])
        live_draws = draws.uniform(rows[ins_rows], Purpose.LIVE_RESPONSE, (4,))
        live_watch[ins_rows], live_gift[ins_rows], live_sat[ins_rows] = ins_probs.sample(model, live_draws)
        live_expected = np.zeros((n, 3))  # entry probability, expected gift, expected watch
        live_expected[ins_rows, 0] = ins_probs.enter
        live_expected[ins_rows, 2], live_expected[ins_rows, 1] = ins_probs.expected(model)

        # every slot's item and response at once; only leaving is sequential (it depends on the page so far)
        is_live = slot_rank < 0
        safe_rank = np.maximum(slot_rank, 0)
        slot_cols = take_in_rows(ranked_cols, safe_rank)  # the candidate in each slot
        served = np.where(is_live, live_of_row[:, None], take_in_rows(candidates, slot_cols))
        slot_video = np.where(is_live[..., None], 0.0, take_in_rows(video_signals, safe_rank))
        signals = np.zeros((n, size, len(VIEW_SIGNAL_COLUMNS)))
        signals[..., :7] = slot_video
        signals[..., 1] = np.where(is_live, (live_watch > 0)[:, None], signals[..., 1])
        signals[..., 7] = np.where(is_live, live_gift[:, None], 0.0)
        signals[..., 8] = np.where(is_live, live_watch[:, None], 0.0)
        sat = np.where(is_live, live_sat[:, None], take_in_rows(video_sat, safe_rank))
        slot_expected = take_in_rows(expected, slot_cols)
        surplus = sat - model.exit_reference

        exit_base = np.asarray(cfg.exit_base)[world.users.group[users]]
        exit_draws = draws.uniform(rows, Purpose.EXIT, (size,))
        viewed, exits, alive = _leave(surplus, exit_base, patience, exit_draws, model)
        # cumulative sums run slot by slot, as the views happened: the same floats in any batch
        offset = np.cumsum(signals[..., 0] + signals[..., 8] + cfg.item_overhead_s, axis=1)
        feed_reward = _sum_over_slots(np.where(viewed[..., None], slot_video, 0.0))
        viewed_count = viewed.sum(axis=1)
        row, slot = np.nonzero(viewed)  # by row, then slot
        return _Views(
            served=served,
            feed_reward=feed_reward,
            expected_feed_reward=_sum_over_slots(
                np.where((viewed & ~is_live)[..., None], slot_expected, 0.0)
            ),
            live_viewed=(viewed & is_live).any(axis=1),
            live_watch=live_watch,
            live_gift=live_gift,
            reached_end=viewed[:, size - 1],
            last_video_watch=video_signals[:, size - 1, 0],
            left=~alive,
            page_seconds=offset[np.arange(n), viewed_count - 1],
            click_rate=feed_reward[:, 1] / np.maximum(viewed_count, 1),
            views=PageViews(
                row=row,
                slot=slot,
                item=served[row, slot],
                is_live=is_live[row, slot],
                offset_s=offset[row, slot],
                signals=signals[row, slot],
                expected=_view_expected(slot_expected[row, slot], is_live[row, slot], live_expected[row]),
                session_end=exits[row, slot],
                satisfaction=sat[row, slot],
            ),
        )

    def _chunks(self, n: int) -> list[slice]:
        """A page's ``n`` rows in contiguous chunks, one a thread, each of at least ``_CHUNK_ROWS`` rows:
        below that, handing a chunk to another thread costs more than it saves."""
        count = max(1, min(self._threads, n // _CHUNK_ROWS))
        bounds = [n * i // count for i in range(count + 1)]
        return [slice(low, high) for low, high in itertools.pairwise(bounds)]

    def _each(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        """``fn`` of each item, in order: the first in this thread, the others in the pool's at once."""
        if len(items) == 1 or self._threads == 1:
            return [fn(item) for item in items]
        if self._pool is None or self._pool_pid != os.getpid():  # a forked child has none of the threads
            self._pool = ThreadPoolExecutor(self._threads - 1, thread_name_prefix="simulator")
            self._pool_pid = os.getpid()
        later = [self._pool.submit(fn, item) for item in items[1:]]
        return [fn(items[0]), *(future.result() for future in later)]


@dataclass(frozen=True)
class _Offer:
    """A page's candidates before the policy ranks them."""

    candidates: np.ndarray  # (n, C) video ids
    authors: np.ndarray  # (n, C) their authors
    probs: VideoResponseProbs  # the world's response probabilities
    expected: np.ndarray  # (n, C, K) the world's expected responses
    predictions: np.ndarray  # (n, C, K) the upstream ranker's: the expected responses with model noise


@dataclass
class _Views:
    """What the users of a page's rows saw and did, per row, and the views themselves."""

    served: np.ndarray  # (n, page_size) item ids in page order
    feed_reward: np.ndarray  # (n, K)
    expected_feed_reward: np.ndarray  # (n, K)
    live_viewed: np.ndarray  # (n,) the user reached the live slot
    live_watch: np.ndarray  # (n,) realised live watch seconds, were it viewed; 0 without an insertion
    live_gift: np.ndarray  # (n,)
    reached_end: np.ndarray  # (n,) the user viewed the page's last slot
    last_video_watch: np.ndarray  # (n,) watch of the last-ranked video: an insertion's displaced one
    left: np.ndarray  # (n,) the user left the session on the page
    page_seconds: np.ndarray
    click_rate: np.ndarray
    views: PageViews

    @classmethod
    def joined(cls, parts: list[_Views], chunks: list[slice]) -> _Views:
        """The views of a page's chunks of rows as one page's (row numbers from each chunk's start)."""
        if len(parts) == 1:
            return parts[0]
        for part, chunk in zip(parts, chunks, strict=True):
            part.views.row += chunk.start
        views = _concat(PageViews, [vars(part.views) for part in parts])
        return cls(
            **{
                f.name: np.concatenate([getattr(p, f.name) for p in parts])
                for f in fields(cls)
                if f.name != "views"
            },
            views=views,
        )


@dataclass
class _SessionState:
    """What the session so far does to the next page, per row: satiation and patience."""

    topic_clicks: np.ndarray  # (n, topics) clicked short-video views of each topic so far
    patience: np.ndarray  # (n,) decayed sum of view satisfaction above the exit reference


@dataclass
class _Lanes:
    """Per session of the day (a lane): who, when, where it is and what it has done so far."""

    user: np.ndarray
    session: np.ndarray  # session number
    rank: np.ndarray  # the user's how-manieth session of the day
    start_s: np.ndarray  # start, seconds since the run's start (moved past the gap after the one before)
    page: np.ndarray  # the next page's index
    elapsed: np.ndarray  # seconds from the session's start to the end of its last page
    session_watch: np.ndarray  # watch seconds so far (request context)
    last_click_rate: np.ndarray  # click rate of the last page (request context)
    topic_clicks: np.ndarray  # (lanes, topics): satiation
    patience: np.ndarray
    satisfaction: np.ndarray  # summed view satisfaction
    views: np.ndarray

    @classmethod
    def planned(cls, user, session, rank, start_s, n_topics: int) -> _Lanes:
        n = user.size
        return cls(
            user=user,
            session=session,
            rank=rank,
            start_s=start_s,
            page=np.zeros(n, np.int64),
            elapsed=np.zeros(n),
            session_watch=np.zeros(n),
            last_click_rate=np.zeros(n),
            topic_clicks=np.zeros((n, n_topics)),
            patience=np.zeros(n),
            satisfaction=np.zeros(n),
            views=np.zeros(n),
        )


@dataclass
class _Parts:
    """The day's logs as per-step column dicts, concatenated when the day is over."""

    feed: list[dict] = field(default_factory=list)
    live: list[dict] = field(default_factory=list)
    viewed: list[dict] = field(default_factory=list)


@dataclass
class PageViews:
    row: np.ndarray  # row of the page batch the view belongs to
    slot: np.ndarray
    item: np.ndarray
    is_live: np.ndarray
    offset_s: np.ndarray  # seconds from the request to the end of the view
    signals: np.ndarray
    expected: np.ndarray
    session_end: np.ndarray
    satisfaction: np.ndarray


@dataclass
class PageOutcome:
    candidates: np.ndarray
    predictions: np.ndarray
    action: np.ndarray
    log_propensity: np.ndarray
    served: np.ndarray
    live_inserted: np.ndarray
    feed_reward: np.ndarray
    expected_feed_reward: np.ndarray
    live_rows: np.ndarray
    live_id: np.ndarray
    live_state: np.ndarray
    live_predictions: np.ndarray
    live_action: np.ndarray
    live_log_propensity: np.ndarray
    live_reward: np.ndarray
    live_expected_reward: np.ndarray
    left: np.ndarray
    page_seconds: np.ndarray
    click_rate: np.ndarray
    views: PageViews
