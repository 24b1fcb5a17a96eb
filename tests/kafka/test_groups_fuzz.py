"""Hypothesis: any request kio can express, of every API and version the coordinator
serves, is answered (never an exception) within its bound, with a response of the
request's version that encodes.

Requests are drawn by kio's own type strategies, then steered so they reach the group
logic: group ids and member ids from small pools (member ids the coordinator handed
out), generations near the real ones, and short timeouts so that waits stay short.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_writer

from luxun.kafka.groups import GroupCoordinator
from luxun.topics import TopicManager

from .test_groups import make

pytestmark = pytest.mark.timeout(300)

GROUPS = ["g", "h", ""]
APIS = [(key, v) for key, (lo, hi) in sorted(GroupCoordinator.VERSIONS.items()) for v in range(lo, hi + 1)]


@pytest.fixture(scope="module")
def coord(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupCoordinator]:
    path: Path = tmp_path_factory.mktemp("fuzz")
    topics = TopicManager(str(path / "data"), data_page_size_bytes=1 << 16)
    topics.create_and_append("t", [b"x"] * 5)
    with make(topics) as c:
        yield c
    topics.close()


members: list[str] = []


def steer(key: int, request: Any, data: st.DataObject) -> Any:
    """``request`` with its group-related fields drawn from small pools."""
    names = {f.name for f in dataclasses.fields(request)}
    changes: dict[str, Any] = {}
    draw = data.draw
    if "group_id" in names:
        changes["group_id"] = draw(st.sampled_from(GROUPS))
    if "member_id" in names:
        k = draw(st.sampled_from([-2, -1, 0, 0, 0, 1, 2, 3]))  # "", a stranger, or a recent id (newest first)
        recent = members[::-1][:4]
        changes["member_id"] = "" if k == -2 else recent[k] if 0 <= k < len(recent) else "stranger"
    for name in ("generation_id", "generation_id_or_member_epoch"):
        if name in names:
            changes[name] = draw(st.integers(-1, 4))
    if "session_timeout" in names:
        changes["session_timeout"] = datetime.timedelta(milliseconds=draw(st.integers(100, 300)))
    if "rebalance_timeout" in names:
        changes["rebalance_timeout"] = datetime.timedelta(milliseconds=draw(st.integers(-1, 300)))
    if "protocol_type" in names:
        changes["protocol_type"] = draw(st.sampled_from(["consumer", "consumer", "connect", None]))
        if key == 11 and changes["protocol_type"] is None:
            changes["protocol_type"] = "consumer"
    if "protocol_name" in names:
        changes["protocol_name"] = draw(st.sampled_from(["range", "roundrobin", None]))
    if "protocols" in names:
        protocol = type(request.protocols[0]) if request.protocols else None
        if protocol is not None:
            chosen = draw(st.lists(st.sampled_from(["range", "roundrobin", "sticky"]), max_size=3, unique=True))
            changes["protocols"] = tuple(protocol(name=n, metadata=draw(st.binary(max_size=8))) for n in chosen)
    if "groups" in names and request.groups and isinstance(request.groups[0], str):  # DescribeGroups
        changes["groups"] = tuple(draw(st.lists(st.sampled_from(GROUPS), max_size=3)))
    if "groups_names" in names:
        changes["groups_names"] = tuple(draw(st.lists(st.sampled_from(GROUPS), max_size=3)))
    return dataclasses.replace(request, **changes)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(api=st.sampled_from(APIS), data=st.data())
def test_any_request_is_answered(coord: GroupCoordinator, api: tuple[int, int], data: st.DataObject) -> None:
    key, version = api
    request = steer(key, data.draw(st.from_type(load_request_schema(key, version))), data)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(coord.handle, key, version, request, client_id="fuzz", client_host="127.0.0.1")
        response = future.result(timeout=10)  # the longest wait: a 300 ms rebalance or sync timeout, a few times
    rtype = load_response_schema(key, version)
    assert type(response) is rtype
    entity_writer(rtype)(io.BytesIO(), response)
    member_id = getattr(response, "member_id", None)
    if key == 11 and member_id and member_id not in members:  # handed out (MEMBER_ID_REQUIRED or joined)
        members.append(member_id)
