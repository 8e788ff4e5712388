"""``serving.heap.settle``: garbage collected first, the rest frozen, and frozen garbage freed next time."""

from __future__ import annotations

import gc
import weakref

import pytest

from recsys_rl.serving import heap


class _Node:
    """An object that can be in a reference cycle (only the cyclic collector frees those)."""


def _cycle() -> _Node:
    node = _Node()
    node.itself = node
    return node


@pytest.fixture(autouse=True)
def _unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_settle_collects_the_garbage_before_freezing_the_rest():
    garbage = weakref.ref(_cycle())  # unreachable at once, but a cycle: alive until a collection
    kept = _cycle()
    heap.settle()
    assert garbage() is None
    assert gc.get_freeze_count() > 0
    kept_ref = weakref.ref(kept)
    del kept
    gc.collect()
    assert kept_ref() is not None, "alive at the settle, so frozen: later collections leave it alone"


def test_settling_again_frees_what_was_frozen_and_has_become_garbage():
    dropped_later = _cycle()
    heap.settle()
    ref = weakref.ref(dropped_later)
    del dropped_later
    heap.settle()
    assert ref() is None
