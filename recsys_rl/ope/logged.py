"""Logged feed decisions as flat numpy arrays: the one input every off-policy estimator reads.

Estimators need the same few columns whether the logs come from a transition dataset (Parquet shards
written by the pipeline) or straight from the simulator (tests and benchmarks, no Kafka), so both are
turned into one ``LoggedSteps``. Its rows are ordered by session and, within a session, by step, with
steps numbered 0, 1, ... without gaps: sequential estimators take cumulative products along that order
and single-decision ones sum over sessions, so the order is checked once here instead of assumed
everywhere.

Not every logged decision can be weighted. One that serving chose as the policy's mode (``serve
--no-explore``) logs the policy's density at that point, which is no propensity: the behaviour there was
a point mass. Reading transitions, ``LoggedSteps.from_parquet`` leaves out every session holding such a
decision (sequential estimators need whole sessions) and says how many it left out, and why, in
``LoggedSteps.excluded``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recsys_rl import signals as signal_registry
from recsys_rl.exploration import Exploration
from recsys_rl.state import ACTIVITY_GROUPS

if TYPE_CHECKING:  # the dataset reader imports TensorFlow; OPE only needs its shard paths
    from recsys_rl.sim.simulator import DayLog
    from recsys_rl.training.agents.data import TransitionDataset

#: Rows per call when a policy's log-density is evaluated; bounds the memory of a TensorFlow policy.
LOG_PROB_CHUNK_ROWS = 65_536

#: Why ``LoggedSteps.from_parquet`` leaves sessions out (the keys of ``LoggedSteps.excluded``), and what
#: each reason means.
EXCLUSION_REASONS: dict[str, str] = {
    "deterministic": (
        "the session holds a decision served as the policy's mode (serve --no-explore), whose logged "
        "log_propensity is the density of a point mass, not a behaviour propensity"
    ),
    "user_author_term": (
        "the session holds a ranking without the evaluated user-author term function (another term, or "
        "none), whose pages the term's weight alone cannot re-weight"
    ),
}
#: The transitions' columns of a Rank's user-author term (dataset schema 4 on): which term function
#: ranked, its weight logit (the action a user_author version is evaluated on) and that draw's density.
TERM_COLUMNS = ("user_author_term_id", "user_author_weight_logit", "user_author_log_propensity")
#: The transitions' column that marks such a decision; datasets of schema version 1 do not have it.
DETERMINISTIC_COLUMN = "deterministic"
#: The request rows' user-author rewards of their views, per ``PAIR_SIGNALS`` signal (schema 6 on).
PAIR_REWARD_COLUMN = "pair_reward"
_NOTHING_EXCLUDED: Mapping[str, Mapping[str, int]] = MappingProxyType({})


class ScoredPolicy(Protocol):
    """What OPE needs of a policy: log-densities of given actions, and draws from the same density.

    ``act`` must sample the distribution ``log_prob`` describes (an exported policy is loaded with
    ``sample=True`` for that), otherwise model-based and importance-weighted estimators would value
    two different policies.
    """

    def log_prob(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray: ...

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class LoggedSteps:
    """One row per logged decision, ordered by (session, step)."""

    states: np.ndarray  # (n, D) float32, what the behaviour policy saw
    actions: np.ndarray  # (n, K) float32, what it did
    rewards: np.ndarray  # (n, S) float64, in ``signals`` order
    behaviour_log_prob: np.ndarray  # (n,) float64, log-density of the action under the behaviour policy
    groups: np.ndarray  # (n,) int64 user group (index into ACTIVITY_GROUPS)
    session: np.ndarray  # (n,) int64 codes 0..sessions-1, non-decreasing
    step: np.ndarray  # (n,) int64 position within the session: 0, 1, ...
    done: np.ndarray  # (n,) bool: the session ended after this decision
    next_states: np.ndarray  # (n, D) float32; meaningless (zeros) where done
    signals: tuple[str, ...]
    # (n,) int64 identity of the user who was served; rows with equal values are one user, whatever part
    # of the logs they came from. None when the logs do not say: every session is then its own user.
    user: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.states.shape[0]
        if self.user is None:
            object.__setattr__(self, "user", self.session.astype(np.int64, copy=True))
        expected = {
            "actions": 2,
            "rewards": 2,
            "behaviour_log_prob": 1,
            "groups": 1,
            "session": 1,
            "step": 1,
            "done": 1,
            "next_states": 2,
            "user": 1,
        }
        for name, ndim in expected.items():
            value = getattr(self, name)
            if value.ndim != ndim or value.shape[0] != n:
                raise ValueError(
                    f"LoggedSteps.{name} should have {n} rows and {ndim} dims, has {value.shape}"
                )
        if self.states.ndim != 2 or self.next_states.shape != self.states.shape:
            raise ValueError(f"states {self.states.shape} and next_states {self.next_states.shape} disagree")
        if self.rewards.shape[1] != len(self.signals):
            raise ValueError(f"rewards have {self.rewards.shape[1]} columns for signals {self.signals}")
        if n == 0:
            raise ValueError("LoggedSteps needs at least one row")
        gap = np.diff(self.session)
        if self.session[0] != 0 or np.any((gap != 0) & (gap != 1)):
            raise ValueError("LoggedSteps.session should be codes 0, 1, ... in non-decreasing order")
        expected_step = np.arange(n) - self.session_starts[self.session]
        if not np.array_equal(self.step, expected_step):
            row = int(np.flatnonzero(self.step != expected_step)[0])
            raise ValueError(
                f"LoggedSteps row {row}: step {self.step[row]}, but it is decision {expected_step[row]} of "
                "its session; sessions must be sorted by step and numbered 0, 1, ... without gaps"
            )

    @property
    def excluded(self) -> Mapping[str, Mapping[str, int]]:
        """What the reader left out of these rows, and why: ``{reason: {"decisions": n, "sessions": m}}``
        (reasons: ``EXCLUSION_REASONS``; decisions: every decision of the sessions left out). Empty when
        nothing was. Not a dataclass field: the fields are row-aligned columns, which code slices and
        concatenates alike; this describes rows that are not here (``dataclasses.replace`` drops it)."""
        return self.__dict__.get("_excluded", _NOTHING_EXCLUDED)

    def _with_excluded(self, excluded: Mapping[str, Mapping[str, int]]) -> LoggedSteps:
        self.__dict__["_excluded"] = MappingProxyType(
            {k: MappingProxyType(dict(v)) for k, v in excluded.items()}
        )
        return self

    @property
    def rows(self) -> int:
        return int(self.states.shape[0])

    @cached_property
    def session_starts(self) -> np.ndarray:
        """Index of each session's first row, in session order."""
        return np.flatnonzero(np.r_[True, self.session[1:] != self.session[:-1]])

    @property
    def sessions(self) -> int:
        return int(self.session_starts.size)

    @property
    def session_groups(self) -> np.ndarray:
        """A session's group is that of its first decision (a user's group does not change mid-session)."""
        return self.groups[self.session_starts]

    @property
    def session_users(self) -> np.ndarray:
        """The user of each session (that of its first decision: a session is one user's)."""
        return self.user[self.session_starts]

    @classmethod
    def from_dataset(
        cls, dataset: TransitionDataset, term_id: str | None = None, pair_signals: Sequence[str] = ()
    ) -> LoggedSteps:
        """The rows of a transition dataset (its Parquet shards; the manifest was checked on opening),
        less the sessions `from_parquet` leaves out."""
        return cls.from_parquet(dataset.shard_paths("parquet"), dataset.signals, term_id, pair_signals)

    @classmethod
    def from_parquet(
        cls,
        paths: Sequence[str | Path],
        signals: Sequence[str],
        term_id: str | None = None,
        pair_signals: Sequence[str] = (),
    ) -> LoggedSteps:
        """Read transition Parquet shards (the pipeline's schema), sorted by (session_id, step).

        Every session holding a deterministic decision (``EXCLUSION_REASONS``) is left out and counted in
        ``excluded``; shards without the ``deterministic`` column (datasets of schema version 1, built
        from decision records that could not say) count as sampled. ValueError when nothing is left.

        With ``term_id``, the steps are the user-author term's decisions of feed rows: the action is the
        weight logit and the behaviour log-probability its draw's; every session with a ranking that had
        another term, or none, is left out too (shards before dataset schema 4 had no term anywhere).

        ``pair_signals`` (of ``PAIR_SIGNALS``) follow ``signals`` in the rewards, read from the request
        rows' ``pair_reward`` (dataset schema 6 on; ValueError naming a shard without it).
        """
        columns = ["session_id", "user_id", "step", "user_group", "done", "state", "next_state"]
        columns += ["action", "log_propensity"] if term_id is None else list(TERM_COLUMNS)
        columns += [f"reward_{s}" for s in signals] + ([PAIR_REWARD_COLUMN] if pair_signals else [])
        table = pa.concat_tables([_read_shard(p, columns) for p in paths])
        if table.num_rows == 0:
            raise ValueError(f"the Parquet shards {[str(p) for p in paths]} hold no rows")
        table = table.sort_by([("session_id", "ascending"), ("step", "ascending")])
        deterministic = table.column(DETERMINISTIC_COLUMN).to_numpy(zero_copy_only=False) != 0
        table, excluded = _without_sessions(table, deterministic, "deterministic", {})
        if term_id is not None:
            other_term = pc.not_equal(table.column(TERM_COLUMNS[0]), term_id).to_numpy(zero_copy_only=False)
            table, excluded = _without_sessions(table, other_term, "user_author_term", excluded)
        if table.num_rows == 0:
            raise ValueError(
                f"every session in the Parquet shards {[str(p) for p in paths]} was left out: "
                + "; ".join(
                    f"{c['sessions']} sessions ({c['decisions']} decisions), because {EXCLUSION_REASONS[r]}"
                    for r, c in excluded.items()
                )
                + "; nothing is left to weight (log with a server that explores: serve without "
                "--no-explore; and, for a user-author term, with that term serving: a new term has no "
                "logs until it serves, so approve its first exposure, registry approve-exposure)"
            )
        session = _session_codes(table)

        def ints(name: str) -> np.ndarray:
            return table.column(name).to_numpy().astype(np.int64)

        def floats(name: str) -> np.ndarray:
            return table.column(name).to_numpy().astype(np.float64)

        if term_id is None:
            actions, behaviour_log_prob = _list_matrix(table, "action"), floats("log_propensity")
        else:
            actions = floats(TERM_COLUMNS[1]).astype(np.float32).reshape(-1, 1)
            behaviour_log_prob = floats(TERM_COLUMNS[2])
        steps = cls(
            states=_list_matrix(table, "state"),
            actions=actions,
            rewards=np.column_stack(
                [table.column(f"reward_{s}").to_numpy() for s in signals] + _pair_rewards(table, pair_signals)
            ),
            behaviour_log_prob=behaviour_log_prob,
            groups=ints("user_group"),
            session=session,
            step=ints("step"),
            done=ints("done").astype(bool),
            next_states=_list_matrix(table, "next_state"),
            signals=(*signals, *pair_signals),
            user=user_identities(table.column("user_id")),
        )
        return steps._with_excluded(excluded)

    @classmethod
    def from_day_logs(cls, days: Sequence[DayLog]) -> LoggedSteps:
        """Feed decisions of simulated days, straight from the simulator's record.

        Sessions of different ``DayLog`` objects are kept apart even when their ids coincide, so logs of
        separate simulator runs can be pooled; users are the simulator's user ids, so one user's days are
        one user (pooling separate runs with the same ids treats their users as one, which only widens
        the intervals). The group is read from the state's one-hot group features;
        a terminal decision's next state is zeros, as in the pipeline's transitions.
        """
        feeds = [d.feed for d in days]
        source = np.concatenate([np.full(f.session.size, i) for i, f in enumerate(feeds)])
        raw_session = np.concatenate([f.session for f in feeds])
        page = np.concatenate([f.page for f in feeds])
        order = np.lexsort((page, raw_session, source))
        _, session = np.unique(np.column_stack([source, raw_session])[order], axis=0, return_inverse=True)
        states = np.concatenate([f.state for f in feeds])[order].astype(np.float32)
        done = np.concatenate([f.done for f in feeds])[order].astype(bool)
        next_states = np.zeros_like(states)
        next_states[:-1][~done[:-1]] = states[1:][~done[:-1]]
        session = session.reshape(-1).astype(np.int64)
        starts = np.flatnonzero(np.r_[True, session[1:] != session[:-1]])
        return cls(
            states=states,
            actions=np.concatenate([f.action for f in feeds])[order].astype(np.float32),
            rewards=np.concatenate([f.reward for f in feeds])[order].astype(np.float64),
            behaviour_log_prob=np.concatenate([f.log_propensity for f in feeds])[order].astype(np.float64),
            groups=np.argmax(states[:, : len(ACTIVITY_GROUPS)], axis=1).astype(np.int64),
            session=session,
            step=np.arange(session.size) - starts[session],
            done=done,
            next_states=next_states,
            signals=signal_registry.FEED_SIGNALS,
            user=np.concatenate([f.user for f in feeds])[order].astype(np.int64),
        )

    @classmethod
    def concatenate(cls, parts: Sequence[LoggedSteps]) -> LoggedSteps:
        """Several logs as one (days, datasets); each part's sessions stay its own."""
        if not parts or len({p.signals for p in parts}) != 1:
            raise ValueError(
                f"cannot concatenate {len(parts)} logs with signals {[p.signals for p in parts]}"
            )
        offsets = np.cumsum([0] + [p.sessions for p in parts[:-1]])
        arrays = {
            f.name: np.concatenate([getattr(p, f.name) for p in parts])
            for f in fields(cls)
            if f.name not in ("session", "signals")
        }
        session = np.concatenate([p.session + offset for p, offset in zip(parts, offsets, strict=True)])
        excluded: dict[str, dict[str, int]] = {}
        for part in parts:
            for reason, counts in part.excluded.items():
                total = excluded.setdefault(reason, {"decisions": 0, "sessions": 0})
                for key in total:
                    total[key] += counts[key]
        return cls(**arrays, session=session, signals=parts[0].signals)._with_excluded(excluded)


def user_identities(user_id: pa.ChunkedArray) -> np.ndarray:
    """Logged user id strings as int64 identities: the first 8 bytes of each id's BLAKE2b digest.

    A digest rather than codes of this read, so that logs read separately and concatenated still agree on
    who is who; ids are at most 128 characters (``contracts.MAX_ID_LENGTH``), and a collision of two users
    among millions (probability ~1e-7) would only merge their clusters.
    """
    encoded = user_id.combine_chunks().dictionary_encode()
    digests = [
        int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little", signed=True)
        for value in encoded.dictionary.to_pylist()
    ]
    return np.asarray(digests, dtype=np.int64)[encoded.indices.to_numpy(zero_copy_only=False)]


#: Columns a shard of an older dataset schema lacks, and what each row of it holds instead: nothing was
#: deterministic before schema 2, and no ranking had a user-author term before schema 4.
_DEFAULTS = {
    DETERMINISTIC_COLUMN: pa.int64(),
    TERM_COLUMNS[0]: pa.string(),
    TERM_COLUMNS[1]: pa.float64(),
    TERM_COLUMNS[2]: pa.float64(),
}


def _read_shard(path: str | Path, columns: list[str]) -> pa.Table:
    """A shard's ``columns`` and its ``deterministic`` flags, with the defaults of ``_DEFAULTS`` for the
    ones a shard of an older schema lacks."""
    wanted = [*columns, DETERMINISTIC_COLUMN]
    present = set(pq.read_schema(path).names)
    table = pq.read_table(path, columns=[c for c in wanted if c in present])
    for name in wanted:
        if name not in present:
            if name not in _DEFAULTS:
                raise ValueError(
                    f"the Parquet shard {path} has no column {name!r}: it is older than this reader needs "
                    "(a request row's pair_reward came in dataset schema 6); rebuild the dataset"
                )
            default = "" if _DEFAULTS[name] == pa.string() else 0
            table = table.append_column(name, pa.array([default] * table.num_rows, _DEFAULTS[name]))
    return table


def _pair_rewards(table: pa.Table, pair_signals: Sequence[str]) -> list[np.ndarray]:
    """The ``pair_signals`` columns of the table's pair rewards, in that order."""
    if not pair_signals:
        return []
    matrix = _list_matrix(table, PAIR_REWARD_COLUMN).astype(np.float64)
    return [matrix[:, signal_registry.PAIR_SIGNALS.index(name)] for name in pair_signals]


def _session_codes(table: pa.Table) -> np.ndarray:
    """Codes 0, 1, ... of a table sorted by session id: one per run of equal ids."""
    session_id = table.column("session_id").combine_chunks()
    changed = pc.not_equal(session_id[1:], session_id[:-1]).to_numpy(zero_copy_only=False)
    return np.concatenate([[0], np.cumsum(changed)]).astype(np.int64)


def _without_sessions(
    table: pa.Table, rows: np.ndarray, reason: str, excluded: dict[str, dict[str, int]]
) -> tuple[pa.Table, dict[str, dict[str, int]]]:
    """The sorted table less every session that holds one of ``rows`` (a mask), and ``excluded`` with
    what was left out for ``reason`` (unchanged when nothing was)."""
    if not rows.any():
        return table, excluded
    session = _session_codes(table)
    dropped = np.zeros(int(session[-1]) + 1, dtype=bool)
    dropped[session[rows]] = True
    keep = ~dropped[session]
    counts = {"decisions": int(np.sum(~keep)), "sessions": int(np.sum(dropped))}
    return table.filter(pa.array(keep)), {**excluded, reason: counts}


def _list_matrix(table: pa.Table, name: str) -> np.ndarray:
    """A list<float32> column as an (n, width) array; every row must have the same width."""
    column = table.column(name).combine_chunks()
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    width = int(lengths[0])
    if np.any(lengths != width):
        raise ValueError(f"column {name!r} holds lists of lengths {sorted(set(lengths.tolist()))[:5]}")
    values = column.flatten().to_numpy(zero_copy_only=False)
    return values.astype(np.float32, copy=False).reshape(-1, width)


def target_log_prob(
    policy: ScoredPolicy, states: np.ndarray, actions: np.ndarray, chunk_rows: int = LOG_PROB_CHUNK_ROWS
) -> np.ndarray:
    """``policy.log_prob`` over all rows, ``chunk_rows`` at a time, as float64."""
    out = np.empty(states.shape[0])
    for start in range(0, states.shape[0], chunk_rows):
        stop = start + chunk_rows
        out[start:stop] = policy.log_prob(states[start:stop], actions[start:stop])
    return out


def group_label(code: int) -> str:
    """A user group's name in reports: its ACTIVITY_GROUPS name, or the code when it has none."""
    return ACTIVITY_GROUPS[code] if 0 <= code < len(ACTIVITY_GROUPS) else str(code)
