"""Simulated users on the live server: the closed loop of ``recsys-rl demo`` and the end-to-end test.

The simulator's users send every feed request to ``RankingService.Rank`` and every live-allocation
decision to ``AllocationService.Allocate`` over a real socket, exactly as production callers would, and
react to what the server chose. Their feedback goes to the feedback topic the way clients send it, while
the server logs its own decisions to the decisions topic: the next pipeline run joins the two by request
id, with nothing taken from the simulator's side of the loop.

A request carries the context the simulator built its own state from (``PageContext.request``), time
included, so the server's state for it is the simulator's whenever the server read the same stored rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import numpy as np

from recsys_rl import contracts, signals
from recsys_rl.exploration import Exploration
from recsys_rl.kafka.producer import EventProducer
from recsys_rl.proto import serving_pb2_grpc
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.events import LIVE_PREDICTION_NAMES, EventIds, feedback_events
from recsys_rl.sim.simulator import DayLog, PageContext, Simulator
from recsys_rl.sim.world import World

CALLS_IN_FLIGHT = 32  # concurrent calls per page: enough to keep the server's threads busy
PROGRESS_EVERY_PAGES = 5


@dataclass
class TrafficReport:
    """What one simulated day sent to the server and to Kafka."""

    rank_calls: int = 0
    allocate_calls: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # failed calls by gRPC status
    feedback_events: int = 0
    seconds: float = 0.0  # wall time of the calls
    policy_versions: dict[str, int] = field(default_factory=dict)  # answers per "surface/version/arm"

    @property
    def calls_per_s(self) -> float:
        return (self.rank_calls + self.allocate_calls) / self.seconds if self.seconds else 0.0

    def add(self, other: TrafficReport) -> None:
        self.rank_calls += other.rank_calls
        self.allocate_calls += other.allocate_calls
        self.feedback_events += other.feedback_events
        self.seconds += other.seconds
        for mine, theirs in ((self.errors, other.errors), (self.policy_versions, other.policy_versions)):
            for key, count in theirs.items():
                mine[key] = mine.get(key, 0) + count


_ARM_NAMES = {number: name for name, number in contracts.ROUTING_ARMS.items()}


class _RemotePolicy:
    """Calls one RPC per row of a page, a window at a time; a failed call falls back to ``fallback``.

    A production caller whose ranking call fails shows its default ranking; here that is the behaviour
    policy. The server logged no decision for it, so the feedback on it arrives as an orphan and the
    pipeline dead-letters it: counted, never silently used.
    """

    surface = ""

    def __init__(self, call, fallback, world: World, ids: EventIds, deadline_s: float) -> None:
        self.version = f"remote-{self.surface}"
        self._call, self._fallback, self._deadline_s = call, fallback, deadline_s
        self.world, self.ids = world, ids
        self.report = TrafficReport()

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        raise TypeError(f"{type(self).__name__} answers through the server and needs the page's context")

    def act_in_context(
        self, states: np.ndarray, rng: Exploration, context: PageContext
    ) -> tuple[np.ndarray, np.ndarray]:
        messages = [self.request(context, i) for i in range(states.shape[0])]
        started = time.perf_counter()
        answers = []
        for start in range(0, len(messages), CALLS_IN_FLIGHT):
            window = messages[start : start + CALLS_IN_FLIGHT]
            answers.extend(
                self._settle(c) for c in [self._call.future(m, timeout=self._deadline_s) for m in window]
            )
        self.report.seconds += time.perf_counter() - started
        if any(answer is None for answer in answers):
            fallback_actions, fallback_log_p = self._fallback.act(states, rng)
        actions, log_p = [], []
        for i, answer in enumerate(answers):
            actions.append(fallback_actions[i] if answer is None else self.action(answer))
            log_p.append(fallback_log_p[i] if answer is None else answer.log_propensity)
        return np.array(actions), np.array(log_p, dtype=np.float64)

    def _settle(self, call):
        try:
            answer = call.result()
        except grpc.RpcError as err:
            code = err.code().name if err.code() is not None else "UNKNOWN"
            self.report.errors[code] = self.report.errors.get(code, 0) + 1
            return None
        key = (
            f"{self.surface}/{answer.policy_version}/{_ARM_NAMES.get(answer.routing_arm, answer.routing_arm)}"
        )
        self.report.policy_versions[key] = self.report.policy_versions.get(key, 0) + 1
        return answer

    def _fill_common(self, message, context: PageContext, i: int) -> None:
        message.schema_version = contracts.SERVING_SCHEMA_VERSION
        message.request_id = self.request_id(int(context.requests[i]))
        message.user_id = self.ids.user(int(context.users[i]))
        request = context.request
        message.context.event_time_ms = int(request.time_ms[i])
        message.context.page_index = int(request.page_index[i])
        message.context.session_id = self.ids.session(int(context.sessions[i]))
        message.context.session_watch_s = float(request.session_watch_s[i])
        message.context.last_page_click_rate = float(request.last_page_click_rate[i])
        message.context.utc_offset_minutes = int(request.utc_offset_minutes[i])


class RemoteFeedPolicy(_RemotePolicy):
    """The feed ranking of each request, as RankingService.Rank chose it (its fusion-weight action)."""

    surface = "feed"

    def __init__(
        self,
        channel: grpc.Channel,
        world: World,
        ids: EventIds,
        page_size: int,
        deadline_s: float,
        on_page: Callable[[int], None] = lambda calls: None,
    ):
        stub = serving_pb2_grpc.RankingServiceStub(channel)
        super().__init__(stub.Rank, behaviour_feed_policy(), world, ids, deadline_s)
        self._page_size, self._on_page = page_size, on_page

    def act_in_context(
        self, states: np.ndarray, rng: Exploration, context: PageContext
    ) -> tuple[np.ndarray, np.ndarray]:
        answered = super().act_in_context(states, rng, context)
        if context.request.page_index.size and context.request.page_index[0] % PROGRESS_EVERY_PAGES == 0:
            self._on_page(self.report.rank_calls)
        return answered

    def request_id(self, request: int) -> str:
        return self.ids.request(request)

    def request(self, context: PageContext, i: int) -> contracts.RankRequest:
        message = contracts.RankRequest(
            prediction_names=list(signals.FEED_SIGNALS), page_size=self._page_size
        )
        self._fill_common(message, context, i)
        authors = self.world.videos.author
        # The simulated upstream draws candidates with replacement; a real caller sends each item once
        # (the server refuses repeats), so repeats go, keeping the first. The simulator still ranks its
        # own list with the action the server returns.
        _, first = np.unique(context.candidates[i], return_index=True)
        for j in np.sort(first):
            video, predictions = context.candidates[i, j], context.predictions[i, j]
            message.candidates.add(
                item_id=self.ids.video(int(video)),
                author_id=self.ids.author(int(authors[video])),
                item_type=contracts.ITEM_TYPES["video"],
                predictions=predictions.tolist(),
            )
        self.report.rank_calls += 1
        return message

    @staticmethod
    def action(answer) -> np.ndarray:
        return np.asarray(answer.action, dtype=np.float64)


class RemoteAllocationPolicy(_RemotePolicy):
    """Live-stream insertions as AllocationService.Allocate decided them."""

    surface = "live_allocation"

    def __init__(self, channel: grpc.Channel, world: World, ids: EventIds, deadline_s: float):
        stub = serving_pb2_grpc.AllocationServiceStub(channel)
        super().__init__(stub.Allocate, behaviour_allocation_policy(), world, ids, deadline_s)

    def request_id(self, request: int) -> str:
        return self.ids.live_request(request)

    def request(self, context: PageContext, i: int) -> contracts.AllocateRequest:
        message = contracts.AllocateRequest(prediction_names=list(LIVE_PREDICTION_NAMES))
        self._fill_common(message, context, i)
        live = int(context.candidates[i, 0])
        candidate = message.live_candidate
        candidate.item_id = self.ids.live(live)
        candidate.author_id = self.ids.author(int(self.world.lives.author[live]))
        candidate.item_type = contracts.ITEM_TYPES["live"]
        candidate.predictions.extend(context.predictions[i, 0].tolist())
        self.report.allocate_calls += 1
        return message

    @staticmethod
    def action(answer) -> int:
        return int(answer.insert)


@dataclass(frozen=True)
class ServedDay:
    traffic: TrafficReport
    log: DayLog  # the simulator's record of the day: the states it built, the contexts it sent, the views


def drive_day(
    sim: Simulator,
    channel: grpc.Channel,
    bootstrap_servers: str,
    feedback_topic: str,
    ids: EventIds,
    deadline_s: float = 1.0,
    progress: Callable[[int], None] = lambda calls: None,
) -> ServedDay:
    """One simulated day whose every decision the server makes; its feedback goes to ``feedback_topic``.

    ``progress`` hears the number of Rank calls made so far, every few pages of the day.
    """
    feed = RemoteFeedPolicy(channel, sim.world, ids, sim.config.page_size, deadline_s, progress)
    allocation = RemoteAllocationPolicy(channel, sim.world, ids, deadline_s)
    log = sim.run_day(feed, allocation)
    report = TrafficReport()
    report.add(feed.report)
    report.add(allocation.report)
    with EventProducer(bootstrap_servers) as producer:
        for event in feedback_events(log, sim.world, ids):
            producer.send(
                feedback_topic, event.user_id.encode(), contracts.encode(event), event.event_time_ms
            )
            report.feedback_events += 1
    return ServedDay(report, log)
