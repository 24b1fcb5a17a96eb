"""A Hypothesis state machine: FanoutQueue (and its BigArray) against a list model."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bigarray import FanoutQueue, IndexOutOfRangeError, ItemTooLargeError

pytestmark = pytest.mark.timeout(240)

PAGE = 4096
GROUPS = ("g1", "g2", "g3")

# sizes chosen so data pages (4 KiB) fill and roll often; a few empty items too
item_sizes = st.one_of(st.integers(0, 300), st.integers(1000, 4096), st.just(0))
items_st = st.builds(lambda n, b: bytes([b]) * n, item_sizes, st.integers(0, 255))
groups_st = st.sampled_from(GROUPS)
limit_st = st.one_of(st.none(), st.integers(0, 12))
bytes_limit_st = st.one_of(st.none(), st.integers(0, 9000))


def expected_range(model, start, max_items, max_bytes):
    """The documented read_range result, computed on the model."""
    out = []
    total = 0
    for item in model[start:]:
        if max_items is not None and len(out) >= max(1, max_items):
            break
        if max_bytes is not None and out and total + len(item) > max_bytes:
            break
        if max_bytes is not None and not out and len(item) > max_bytes:
            out.append(item)  # always at least one item
            break
        out.append(item)
        total += len(item)
    return out


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="bigarray-stateful-")
        self.path = self.dir + "/q"
        self.q = FanoutQueue(self.path, data_page_size=PAGE)
        self.model: list[bytes] = []  # every item ever appended, by index
        self.tail = 0
        self.positions: dict[str, int] = {}  # group -> next index (before clamping to tail)

    def teardown(self) -> None:
        self.q.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def head(self) -> int:
        return len(self.model)

    def group_pos(self, g: str) -> int:
        return max(self.positions.get(g, self.tail), self.tail)

    # -- writing ---------------------------------------------------------------------
    @rule(item=items_st)
    def append(self, item):
        assert self.q.enqueue(item) == self.head
        self.model.append(item)

    @rule(items=st.lists(items_st, max_size=12))
    def append_many(self, items):
        assert self.q.enqueue_many(items) == self.head
        self.model.extend(items)

    @rule(items=st.lists(items_st, max_size=5), extra=st.integers(1, 3000))
    def append_many_too_large(self, items, extra):
        bad = [*items, b"!" * (PAGE + extra)]
        with pytest.raises(ItemTooLargeError):
            self.q.enqueue_many(bad)
        assert self.q.head == self.head

    # -- reading by index ------------------------------------------------------------
    @rule(data=st.data(), max_items=limit_st, max_bytes=bytes_limit_st)
    def read_range(self, data, max_items, max_bytes):
        start = data.draw(st.integers(self.tail, self.head), label="start")
        got = self.q.read_range(start, max_items=max_items, max_bytes=max_bytes)
        assert got == expected_range(self.model, start, max_items, max_bytes)

    @rule(data=st.data())
    def read_out_of_range(self, data):
        bad = data.draw(
            st.one_of(st.integers(-5, self.tail - 1), st.integers(self.head + 1, self.head + 5)), label="bad"
        )
        with pytest.raises(IndexOutOfRangeError):
            self.q.read_range(bad)

    @precondition(lambda self: self.head > self.tail)
    @rule(data=st.data())
    def get(self, data):
        i = data.draw(st.integers(self.tail, self.head - 1), label="index")
        assert self.q.get(i) == self.model[i]
        assert self.q.array.item_length(i) == len(self.model[i])

    @rule(data=st.data())
    def get_out_of_range(self, data):
        bad = data.draw(st.one_of(st.integers(-3, self.tail - 1), st.integers(self.head, self.head + 3)), label="bad")
        with pytest.raises(IndexOutOfRangeError):
            self.q.get(bad)

    # -- groups ----------------------------------------------------------------------
    @rule(g=groups_st)
    def dequeue(self, g):
        pos = self.group_pos(g)
        expected = self.model[pos] if pos < self.head else None
        assert self.q.dequeue(g) == expected
        self.positions[g] = pos + (expected is not None)

    @rule(g=groups_st, max_items=limit_st, max_bytes=bytes_limit_st)
    def dequeue_many(self, g, max_items, max_bytes):
        pos = self.group_pos(g)
        expected = expected_range(self.model, pos, max_items, max_bytes)
        assert self.q.dequeue_many(g, max_items=max_items, max_bytes=max_bytes) == expected
        self.positions[g] = pos + len(expected)

    @rule(g=groups_st)
    def peek(self, g):
        pos = self.group_pos(g)
        assert self.q.peek(g) == (self.model[pos] if pos < self.head else None)

    @rule(g=groups_st, data=st.data())
    def reset_group(self, g, data):
        index = data.draw(st.integers(self.tail, self.head), label="index")
        self.q.reset_group(g, index)
        self.positions[g] = index

    @rule(g=groups_st)
    def remove_group(self, g):
        self.q.remove_group(g)
        self.positions.pop(g, None)

    # -- retention and lifecycle ----------------------------------------------------------
    @rule(data=st.data())
    def remove_before_index(self, data):
        index = data.draw(st.integers(max(0, self.tail - 2), self.head), label="index")
        self.q.remove_before_index(index)
        self.tail = max(self.tail, index)

    @rule()
    def cleanup(self):
        self.q.cleanup()
        if self.positions:
            slowest = min(self.positions.values())
            self.tail = max(self.tail, min(slowest, self.head))

    @rule()
    def reopen(self):
        self.q.close()
        self.q = FanoutQueue(self.path, data_page_size=PAGE * 2)  # the stored size wins

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def counters(self):
        assert (self.q.tail, self.q.head) == (self.tail, self.head)
        assert self.q.size() == self.head - self.tail
        assert self.q.is_empty == (self.head == self.tail)
        assert self.q.groups() == sorted(self.positions)
        for g in GROUPS:
            assert self.q.group_index(g) == self.group_pos(g)
            assert self.q.size(g) == self.head - self.group_pos(g)


QueueMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestQueueMachine = QueueMachine.TestCase
