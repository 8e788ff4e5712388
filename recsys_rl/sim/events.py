"""Turn a simulated world and day into the production contracts: the user table, decisions, feedback.

This is the boundary where the simulator stops being a simulator: after it, the data look exactly like
what serving and clients write in production (protobuf, keyed by user id), and the pipelines cannot tell
the difference. Ids are strings derived from the run's seed, so two runs with the same seed produce the
same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recsys_rl import contracts, signals
from recsys_rl.feature_tables import write_user_activity
from recsys_rl.sim.simulator import VIEW_SIGNAL_COLUMNS, DayLog, FeedLog, LiveLog, ViewLog
from recsys_rl.sim.world import World
from recsys_rl.state import FEATURE_VERSION, FEED_STATE_FEATURES, LIVE_STATE_FEATURES, user_groups

#: Names of the upstream predictions logged with a live-allocation decision.
LIVE_PREDICTION_NAMES: tuple[str, ...] = signals.LIVE_SIGNALS

_VIEW_COLUMN = {name: i for i, name in enumerate(VIEW_SIGNAL_COLUMNS)}


@dataclass(frozen=True)
class EventIds:
    """String ids of a simulated run; ``run`` keeps ids of runs with different seeds apart."""

    run: str

    @classmethod
    def for_seed(cls, seed: int) -> EventIds:
        return cls(f"sim{seed}")

    def request(self, request: int) -> str:
        return f"{self.run}-r{request:010d}"

    def live_request(self, request: int) -> str:
        return f"{self.run}-r{request:010d}-live"

    def session(self, session: int) -> str:
        return f"{self.run}-s{session:09d}"

    @staticmethod
    def user(user: int) -> str:
        return f"u{user}"

    @staticmethod
    def video(video: int) -> str:
        return f"v{video}"

    @staticmethod
    def live(live: int) -> str:
        return f"l{live}"

    @staticmethod
    def author(author: int) -> str:
        return f"a{author}"


def decision_records(
    log: DayLog, world: World, ids: EventIds, policy_versions: tuple[str, str]
) -> Iterator[contracts.DecisionRecord]:
    """Feed decisions, then live-allocation decisions, of one simulated day.

    ``policy_versions`` is (feed policy version, allocation policy version).
    """
    feed_version, live_version = policy_versions
    feed, live = log.feed, log.live
    video_author, live_author = world.videos.author, world.lives.author
    for i in range(feed.request.size):
        record = _decision(feed, i, ids, "feed", ids.request(int(feed.request[i])), feed_version)
        record.feature_names.extend(FEED_STATE_FEATURES)
        record.prediction_names.extend(signals.FEED_SIGNALS)
        record.action.extend(feed.action[i].tolist())
        for video, preds in zip(feed.candidates[i], feed.predictions[i], strict=True):
            record.candidates.add(
                item_id=ids.video(int(video)),
                author_id=ids.author(int(video_author[video])),
                item_type=contracts.ITEM_TYPES["video"],
                predictions=preds.tolist(),
            )
        live_slot = feed.live_slot[i]
        record.served_item_ids.extend(
            ids.live(int(item)) if slot == live_slot else ids.video(int(item))
            for slot, item in enumerate(feed.served[i])
        )
        yield record

    for i in range(live.request.size):
        stream = int(live.live[i])
        record = _decision(
            live, i, ids, "live_allocation", ids.live_request(int(live.request[i])), live_version
        )
        record.feature_names.extend(LIVE_STATE_FEATURES)
        record.prediction_names.extend(LIVE_PREDICTION_NAMES)
        record.action.append(float(live.action[i]))
        record.candidates.add(
            item_id=ids.live(stream),
            author_id=ids.author(int(live_author[stream])),
            item_type=contracts.ITEM_TYPES["live"],
            predictions=live.predictions[i].tolist(),
        )
        if live.action[i]:
            record.served_item_ids.append(ids.live(stream))
        yield record


def _decision(
    log: FeedLog | LiveLog, i: int, ids: EventIds, surface: str, request_id: str, version: str
) -> contracts.DecisionRecord:
    """The fields every decision record has, whatever its surface."""
    user = int(log.user[i])
    return contracts.DecisionRecord(
        schema_version=contracts.DECISION_SCHEMA_VERSION,
        request_id=request_id,
        user_id=ids.user(user),
        surface=contracts.SURFACES[surface],
        event_time_ms=int(log.time_ms[i]),
        state=log.state[i].tolist(),
        feature_version=FEATURE_VERSION,
        user_group=int(user_groups(log.state[i])),
        log_propensity=float(log.log_propensity[i]),
        policy_version=version,
        routing_arm=contracts.ROUTING_ARMS["behaviour"],
        session_id=ids.session(int(log.session[i])),
        # the simulator's behaviour policies always draw their actions
        action_selection=contracts.ACTION_SELECTIONS["sampled"],
    )


def write_user_table(world: World, ids: EventIds, directory: str | Path, as_of_ms: int) -> Path:
    """The platform's user table as the world has it: every account's activity group, as of ``as_of_ms``."""
    users = world.users.group.size
    return write_user_activity(directory, [ids.user(u) for u in range(users)], world.users.group, as_of_ms)


def view_signal_columns(views: ViewLog) -> dict[str, np.ndarray]:
    """A day's views as columns of the signals their feedback events carry, each under its field name on
    the wire (the feature pipeline's fact columns, ``recsys_rl.feature_sums``)."""
    return {
        field: views.signals[:, _VIEW_COLUMN[name]]
        for name, field in contracts.FEEDBACK_SIGNAL_FIELDS.items()
    }


#: Signal fields that are counts on the wire; the others are seconds or coins.
_COUNT_FIELDS = frozenset(
    f.name for f in contracts.FeedbackSignals.DESCRIPTOR.fields if f.type != f.TYPE_DOUBLE
)


def feedback_events(log: DayLog, world: World, ids: EventIds) -> Iterator[contracts.FeedbackEvent]:
    """One feedback event per viewed item; a live view answers the live-allocation decision."""
    views = log.views
    video_author, live_author = world.videos.author, world.lives.author
    columns = view_signal_columns(views)
    signal_columns = {
        field: (columns[field].astype(np.int64) if field in _COUNT_FIELDS else columns[field]).tolist()
        for field in contracts.FEEDBACK_SIGNAL_FIELDS.values()
    }
    for i in range(views.request.size):
        item = int(views.item[i])
        is_live = bool(views.is_live[i])
        yield contracts.FeedbackEvent(
            schema_version=contracts.FEEDBACK_SCHEMA_VERSION,
            request_id=(ids.live_request if is_live else ids.request)(int(views.request[i])),
            user_id=ids.user(int(views.user[i])),
            item_id=ids.live(item) if is_live else ids.video(item),
            author_id=ids.author(int(live_author[item] if is_live else video_author[item])),
            item_type=contracts.ITEM_TYPES["live" if is_live else "video"],
            event_time_ms=int(views.time_ms[i]),
            signals=contracts.FeedbackSignals(
                **{field: values[i] for field, values in signal_columns.items()}
            ),
            session_end=bool(views.session_end[i]),
            position=int(views.position[i]),
        )
