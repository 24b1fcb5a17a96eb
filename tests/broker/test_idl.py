"""The IDL: wire compatibility with Java Luxun's api.thrift and message.thrift, and the error tree.

The original Luxun IDL is embedded below (bulldog2011/luxun,
src/main/resources/thrift/api.thrift and message.thrift, Apache-2.0; comments dropped
and one long line wrapped, nothing else changed), so these tests
compare our files with it field by field and byte by byte.
"""

from __future__ import annotations

import itertools
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory, TCyBinaryProtocolFactory
from thriftpy2.thrift import TType
from thriftpy2.utils import deserialize, serialize

import idl
from idl import QueueService
from idl import luxun_thrift as T
from idl import message_thrift as M
from luxun import errors

pytestmark = pytest.mark.timeout(60)

ORIGINAL_API_THRIFT = """\
namespace java com.leansoft.luxun.api.generated
namespace csharp Leansoft.luxun.Api.Generated

const i32 RANDOM_PARTION = -1;

const string EARLIEST_INDEX_STRING = "earliest";
const string LATEST_INDEX_STRING = "latest";

const i64 EARLIEST_TIME = -1;
const i64 LATEST_TIME = -2;

enum ResultCode
{
  SUCCESS,
  FAILURE,
  TRY_LATER
}

enum ErrorCode
{
  INTERNAL_ERROR,
  TOPIC_NOT_EXIST,
  INDEX_OUT_OF_BOUNDS,
  INVALID_TOPIC,
  TOPIC_IS_EMPTY,
  AUTHENTICATION_FAILURE,
  MESSAGE_SIZE_TOO_LARGE,
  ALL_MESSAGE_CONSUMED
}

struct Result
{
    1: required ResultCode resultCode,
    2: ErrorCode errorCode,
    3: string errorMessage
}

struct ProduceRequest {
    1: required binary item,
    2: required string topic,
}

struct ProduceResponse {
    1: required Result result,
    2: i64 index
}

struct ConsumeRequest {
    1: required string topic,
    2: string fanoutId,
    3: i64 startIndex,
    4: i32 maxFetchSize,
}

struct ConsumeResponse {
    1: required Result result,
    2: list<binary> itemList,
    3: i64 lastConsumedIndex
}

struct FindClosestIndexByTimeRequest {
    1: required i64 timestamp,
    2: required string topic,
}

struct FindClosestIndexByTimeResponse {
    1: required Result result,
    2: i64 index,
    3: i64 timestampOfIndex
}

struct DeleteTopicRequest {
    1: required string topic,
    2: required string password
}

struct DeleteTopicResponse {
    1: required Result result,
}

struct GetSizeRequest {
    1: required string topic,
    3: string fanoutId
}

struct GetSizeResponse {
    1: required Result result,
    2: i64 size
}

service QueueService {
    ProduceResponse produce(1: ProduceRequest produceRequest);
    oneway void asyncProduce(1: ProduceRequest produceRequest);
    ConsumeResponse consume(1: ConsumeRequest consumeRequest);
    FindClosestIndexByTimeResponse findClosestIndexByTime(
        1: FindClosestIndexByTimeRequest findClosestIndexByTimeRequest);
    DeleteTopicResponse deleteTopic(1: DeleteTopicRequest deleteTopicRequest);
    GetSizeResponse getSize(1: GetSizeRequest getSizeRequest);
}
"""

ORIGINAL_MESSAGE_THRIFT = """\
namespace java com.leansoft.luxun.message.generated
namespace csharp Leansoft.luxun.message.Generated
struct TMessageList {
    1: list<binary> messages
}
struct TMessagePack {
    1: byte magic = 1,
    2: byte attribute,
    3: i32 crc32,
    4: required binary messageList
}
enum CompressionCodec
{
  NO_COMPRESSION,
  GZIP,
  SNAPPY
}
"""

API_STRUCTS = [
    "Result",
    "ProduceRequest",
    "ProduceResponse",
    "ConsumeRequest",
    "ConsumeResponse",
    "FindClosestIndexByTimeRequest",
    "FindClosestIndexByTimeResponse",
    "DeleteTopicRequest",
    "DeleteTopicResponse",
    "GetSizeRequest",
    "GetSizeResponse",
]
#: Structs and methods of ours that the original IDL does not have (new names only).
EXTENSION_STRUCTS = [
    "TopicInfo",
    "ListTopicsRequest",
    "ListTopicsResponse",
    "CommitOffsetRequest",
    "CommitOffsetResponse",
    "GetCommittedRequest",
    "GetCommittedResponse",
]
EXTENSION_METHODS = ["listTopics", "commitOffset", "getCommitted"]
MESSAGE_STRUCTS = ["TMessageList", "TMessagePack"]

PROTOCOLS = [TBinaryProtocolFactory(), TCyBinaryProtocolFactory()]
PROTOCOL_IDS = ["python", "cython"]

_counter = itertools.count()


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The original Java Luxun api.thrift, loaded with thriftpy2."""
    path = tmp_path_factory.mktemp("orig") / "api.thrift"
    path.write_text(ORIGINAL_API_THRIFT)
    return thriftpy2.load(str(path), module_name=f"orig_api{next(_counter)}_thrift")


@pytest.fixture(scope="module")
def original_message(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("orig") / "message.thrift"
    path.write_text(ORIGINAL_MESSAGE_THRIFT)
    return thriftpy2.load(str(path), module_name=f"orig_message{next(_counter)}_thrift")


def _normalise(spec: dict[int, tuple[Any, ...]]) -> dict[int, tuple[Any, ...]]:
    """A thrift_spec with struct/enum classes replaced by their names (comparable across modules)."""
    return {fid: tuple(x.__name__ if isinstance(x, type) else x for x in entry) for fid, entry in spec.items()}


# -- the module --------------------------------------------------------------------------
def test_module_attributes() -> None:
    assert Path(idl.LUXUN_THRIFT).is_absolute() and Path(idl.LUXUN_THRIFT).name == "luxun.thrift"
    assert Path(idl.MESSAGE_THRIFT).is_absolute() and Path(idl.MESSAGE_THRIFT).name == "message.thrift"
    assert Path(idl.LUXUN_THRIFT).is_file() and Path(idl.MESSAGE_THRIFT).is_file()
    assert idl.QueueService is T.QueueService
    assert sys.modules["luxun_thrift"] is T
    assert sys.modules["message_thrift"] is M
    assert sorted(idl.__all__) == sorted(
        [
            "ERROR_CODE_NAMES",
            "LUXUN_THRIFT",
            "MESSAGE_THRIFT",
            "RESULT_CODE_NAMES",
            "QueueService",
            "luxun_thrift",
            "message_thrift",
        ]
    )


def test_structs_pickle_through_registered_module_names() -> None:
    request = T.ConsumeRequest(topic="t", fanoutId="g", maxFetchSize=10, maxWaitMs=5)
    assert pickle.loads(pickle.dumps(request)) == request
    pack = M.TMessagePack(attribute=1, crc32=7, messageList=b"x")
    assert pickle.loads(pickle.dumps(pack)) == pack


def test_py_namespace_is_declared() -> None:
    assert re.search(r"^namespace py luxun_thrift$", Path(idl.LUXUN_THRIFT).read_text(), re.M)
    assert re.search(r"^namespace py message_thrift$", Path(idl.MESSAGE_THRIFT).read_text(), re.M)


# -- luxun.thrift: enums, constants ------------------------------------------------------------
def test_result_code_values() -> None:
    assert T.ResultCode._VALUES_TO_NAMES == {0: "SUCCESS", 1: "FAILURE", 2: "TRY_LATER"}


def test_error_code_values() -> None:
    assert T.ErrorCode._VALUES_TO_NAMES == {
        0: "INTERNAL_ERROR",
        1: "TOPIC_NOT_EXIST",
        2: "INDEX_OUT_OF_BOUNDS",
        3: "INVALID_TOPIC",
        4: "TOPIC_IS_EMPTY",
        5: "AUTHENTICATION_FAILURE",
        6: "MESSAGE_SIZE_TOO_LARGE",
        7: "ALL_MESSAGE_CONSUMED",
    }


def test_constants() -> None:
    assert T.RANDOM_PARTION == -1
    assert T.EARLIEST_INDEX_STRING == "earliest"
    assert T.LATEST_INDEX_STRING == "latest"
    assert T.EARLIEST_TIME == -1
    assert T.LATEST_TIME == -2
    assert T.__thrift_meta__["consts"] == [-1, "earliest", "latest", -1, -2]


def test_java_namespaces_kept() -> None:
    text = Path(idl.LUXUN_THRIFT).read_text()
    assert re.search(r"^namespace java com\.leansoft\.luxun\.api\.generated$", text, re.M)
    assert re.search(r"^namespace csharp Leansoft\.luxun\.Api\.Generated$", text, re.M)
    text = Path(idl.MESSAGE_THRIFT).read_text()
    assert re.search(r"^namespace java com\.leansoft\.luxun\.message\.generated$", text, re.M)


# -- luxun.thrift: structs ------------------------------------------------------------------
EXPECTED_SPECS: dict[str, dict[int, tuple[Any, ...]]] = {
    "Result": {
        1: (TType.I32, "resultCode", "ResultCode", True),
        2: (TType.I32, "errorCode", "ErrorCode", False),
        3: (TType.STRING, "errorMessage", False),
    },
    "ProduceRequest": {1: (TType.BINARY, "item", True), 2: (TType.STRING, "topic", True)},
    "ProduceResponse": {1: (TType.STRUCT, "result", "Result", True), 2: (TType.I64, "index", False)},
    "ConsumeRequest": {
        1: (TType.STRING, "topic", True),
        2: (TType.STRING, "fanoutId", False),
        3: (TType.I64, "startIndex", False),
        4: (TType.I32, "maxFetchSize", False),
        5: (TType.I32, "maxWaitMs", False),
        6: (TType.BOOL, "withTimestamps", False),
        7: (TType.BOOL, "fromCommitted", False),
        8: (TType.STRING, "memberId", False),
        9: (TType.BOOL, "itemsAsBlob", False),
    },
    "ConsumeResponse": {
        1: (TType.STRUCT, "result", "Result", True),
        2: (TType.LIST, "itemList", TType.BINARY, False),
        3: (TType.I64, "lastConsumedIndex", False),
        4: (TType.LIST, "timestampList", TType.I64, False),
        5: (TType.I64, "firstIndex", False),
        6: (TType.STRING, "heldBy", False),
        7: (TType.I32, "firstMessage", False),
        8: (TType.BINARY, "itemBlob", False),
        9: (TType.BINARY, "itemLengths", False),
    },
    "FindClosestIndexByTimeRequest": {1: (TType.I64, "timestamp", True), 2: (TType.STRING, "topic", True)},
    "FindClosestIndexByTimeResponse": {
        1: (TType.STRUCT, "result", "Result", True),
        2: (TType.I64, "index", False),
        3: (TType.I64, "timestampOfIndex", False),
    },
    "DeleteTopicRequest": {1: (TType.STRING, "topic", True), 2: (TType.STRING, "password", True)},
    "DeleteTopicResponse": {1: (TType.STRUCT, "result", "Result", True)},
    "GetSizeRequest": {1: (TType.STRING, "topic", True), 3: (TType.STRING, "fanoutId", False)},
    "GetSizeResponse": {1: (TType.STRUCT, "result", "Result", True), 2: (TType.I64, "size", False)},
    "TopicInfo": {
        1: (TType.STRING, "name", True),
        2: (TType.I64, "size", False),
        3: (TType.I64, "tailIndex", False),
        4: (TType.I64, "headIndex", False),
        5: (TType.I64, "diskBytes", False),
        6: (TType.MAP, "groupLag", (TType.STRING, TType.I64), False),
    },
    "ListTopicsRequest": {},
    "ListTopicsResponse": {
        1: (TType.STRUCT, "result", "Result", True),
        2: (TType.LIST, "topics", (TType.STRUCT, T.TopicInfo), False),
    },
    "CommitOffsetRequest": {
        1: (TType.STRING, "topic", True),
        2: (TType.STRING, "fanoutId", True),
        3: (TType.I64, "index", True),
        4: (TType.STRING, "memberId", False),
        5: (TType.BOOL, "release", False),
        6: (TType.I32, "message", False),
    },
    "CommitOffsetResponse": {1: (TType.STRUCT, "result", "Result", True)},
    "GetCommittedRequest": {1: (TType.STRING, "topic", True), 2: (TType.STRING, "fanoutId", True)},
    "GetCommittedResponse": {
        1: (TType.STRUCT, "result", "Result", True),
        2: (TType.I64, "index", False),
        3: (TType.BOOL, "committed", False),
        4: (TType.I32, "message", False),
    },
    "TMessageList": {1: (TType.LIST, "messages", TType.BINARY, False)},
    "TMessagePack": {
        1: (TType.BYTE, "magic", False),
        2: (TType.BYTE, "attribute", False),
        3: (TType.I32, "crc32", False),
        4: (TType.BINARY, "messageList", True),
    },
}


@pytest.mark.parametrize("name", API_STRUCTS + MESSAGE_STRUCTS + EXTENSION_STRUCTS)
def test_struct_field_ids_types_and_requiredness(name: str) -> None:
    module = M if name in MESSAGE_STRUCTS else T
    assert _normalise(getattr(module, name).thrift_spec) == EXPECTED_SPECS[name]


def test_every_struct_is_covered() -> None:
    assert sorted(s.__name__ for s in T.__thrift_meta__["structs"]) == sorted(API_STRUCTS + EXTENSION_STRUCTS)
    assert sorted(s.__name__ for s in M.__thrift_meta__["structs"]) == sorted(MESSAGE_STRUCTS)


def test_get_size_request_has_fields_1_and_3() -> None:
    assert sorted(T.GetSizeRequest.thrift_spec) == [1, 3]
    # On the wire: field 1 (string), then field 3 (string), then STOP.
    data = serialize(T.GetSizeRequest(topic="t", fanoutId="g"), TBinaryProtocolFactory())
    assert data == b"\x0b\x00\x01\x00\x00\x00\x01t" + b"\x0b\x00\x03\x00\x00\x00\x01g" + b"\x00"


def test_consume_request_max_wait_ms_is_an_optional_extension() -> None:
    text = Path(idl.LUXUN_THRIFT).read_text()
    block = re.search(r"struct ConsumeRequest \{(.*?)\n\}", text, re.S)
    assert block is not None
    assert re.search(r"^\s*5: optional i32 maxWaitMs,?$", block.group(1), re.M)
    assert "EXTENSION" in block.group(1)
    # Unset, it is not sent: the bytes are what the original IDL produces.
    assert T.ConsumeRequest(topic="t").maxWaitMs is None
    assert b"\x08\x00\x05" not in serialize(T.ConsumeRequest(topic="t", maxFetchSize=3), TBinaryProtocolFactory())
    assert b"\x08\x00\x05\x00\x00\x00\x07" in serialize(
        T.ConsumeRequest(topic="t", maxWaitMs=7), TBinaryProtocolFactory()
    )


def test_consume_timestamps_are_optional_extensions() -> None:
    text = Path(idl.LUXUN_THRIFT).read_text()
    request = re.search(r"struct ConsumeRequest \{(.*?)\n\}", text, re.S)
    response = re.search(r"struct ConsumeResponse \{(.*?)\n\}", text, re.S)
    assert request is not None and response is not None
    assert re.search(r"^\s*6: optional bool withTimestamps,?$", request.group(1), re.M)
    assert re.search(r"^\s*4: optional list<i64> timestampList,?$", response.group(1), re.M)
    assert re.search(r"^\s*5: optional i64 firstIndex,?$", response.group(1), re.M)
    # Unset, neither is sent: the bytes are what the original IDL produces.
    plain = T.ConsumeResponse(result=T.Result(resultCode=0), itemList=[b"a"], lastConsumedIndex=3)
    assert plain.timestampList is None and plain.firstIndex is None
    assert serialize(plain, TBinaryProtocolFactory()).endswith(b"\x0a\x00\x03" + (3).to_bytes(8, "big") + b"\x00")


# -- compatibility with the original IDL ----------------------------------------------------------
@pytest.mark.parametrize("name", API_STRUCTS)
def test_struct_matches_original(name: str, original: Any) -> None:
    ours = _normalise(getattr(T, name).thrift_spec)
    theirs = _normalise(getattr(original, name).thrift_spec)
    if name == "ConsumeRequest":
        assert ours.pop(5) == (TType.I32, "maxWaitMs", False)
        assert ours.pop(6) == (TType.BOOL, "withTimestamps", False)
        assert ours.pop(7) == (TType.BOOL, "fromCommitted", False)
        assert ours.pop(8) == (TType.STRING, "memberId", False)
        assert ours.pop(9) == (TType.BOOL, "itemsAsBlob", False)
    if name == "ConsumeResponse":
        assert ours.pop(4) == (TType.LIST, "timestampList", TType.I64, False)
        assert ours.pop(5) == (TType.I64, "firstIndex", False)
        assert ours.pop(6) == (TType.STRING, "heldBy", False)
        assert ours.pop(7) == (TType.I32, "firstMessage", False)
        assert ours.pop(8) == (TType.BINARY, "itemBlob", False)
        assert ours.pop(9) == (TType.BINARY, "itemLengths", False)
    assert ours == theirs
    assert getattr(T, name).default_spec[: len(theirs)] == getattr(original, name).default_spec


@pytest.mark.parametrize("name", MESSAGE_STRUCTS)
def test_message_struct_matches_original(name: str, original_message: Any) -> None:
    assert _normalise(getattr(M, name).thrift_spec) == _normalise(getattr(original_message, name).thrift_spec)
    assert getattr(M, name).default_spec == getattr(original_message, name).default_spec


def test_enums_and_constants_match_original(original: Any, original_message: Any) -> None:
    assert T.ResultCode._VALUES_TO_NAMES == original.ResultCode._VALUES_TO_NAMES
    assert T.ErrorCode._VALUES_TO_NAMES == original.ErrorCode._VALUES_TO_NAMES
    assert T.__thrift_meta__["consts"] == original.__thrift_meta__["consts"]
    assert M.CompressionCodec._VALUES_TO_NAMES == original_message.CompressionCodec._VALUES_TO_NAMES


def test_service_matches_original(original: Any) -> None:
    """Every original method is unchanged; ours only adds new methods, at the end."""
    assert T.QueueService.thrift_services == original.QueueService.thrift_services + EXTENSION_METHODS
    for method in original.QueueService.thrift_services:
        for suffix in ("_args", "_result"):
            ours = getattr(T.QueueService, method + suffix)
            theirs = getattr(original.QueueService, method + suffix)
            assert _normalise(ours.thrift_spec) == _normalise(theirs.thrift_spec), method + suffix
        assert (
            getattr(T.QueueService, method + "_result").oneway
            == getattr(original.QueueService, method + "_result").oneway
        )


def test_list_topics_is_a_documented_extension() -> None:
    text = Path(idl.LUXUN_THRIFT).read_text()
    before = text[: text.index("struct TopicInfo")]
    assert "EXTENSION" in before[before.rindex("\n\n") :]
    assert re.search(r"EXTENSION.*\n\s*ListTopicsResponse listTopics\(1: ListTopicsRequest listTopicsRequest\);", text)
    assert _normalise(QueueService.listTopics_args.thrift_spec) == {
        1: (TType.STRUCT, "listTopicsRequest", "ListTopicsRequest", False)
    }


def test_service_methods_and_oneway() -> None:
    assert QueueService.thrift_services == [
        "produce",
        "asyncProduce",
        "consume",
        "findClosestIndexByTime",
        "deleteTopic",
        "getSize",
        "listTopics",
        "commitOffset",
        "getCommitted",
    ]
    oneway = {m for m in QueueService.thrift_services if getattr(QueueService, m + "_result").oneway}
    assert oneway == {"asyncProduce"}
    assert _normalise(QueueService.produce_result.thrift_spec) == {
        0: (TType.STRUCT, "success", "ProduceResponse", False)
    }
    assert _normalise(QueueService.getSize_args.thrift_spec) == {
        1: (TType.STRUCT, "getSizeRequest", "GetSizeRequest", False)
    }


@pytest.mark.parametrize("factory", PROTOCOLS, ids=PROTOCOL_IDS)
def test_original_and_ours_read_each_others_bytes(original: Any, factory: Any) -> None:
    theirs = original.ConsumeRequest(topic="logs", fanoutId="g", startIndex=5, maxFetchSize=1024)
    ours = deserialize(T.ConsumeRequest(), serialize(theirs, factory), factory)
    assert (ours.topic, ours.fanoutId, ours.startIndex, ours.maxFetchSize, ours.maxWaitMs) == (
        "logs",
        "g",
        5,
        1024,
        None,
    )
    # The extension field is skipped by a reader built from the original IDL.
    back = deserialize(
        original.ConsumeRequest(), serialize(T.ConsumeRequest(topic="logs", maxWaitMs=250), factory), factory
    )
    assert back.topic == "logs" and not hasattr(back, "maxWaitMs")
    response = T.ConsumeResponse(
        result=T.Result(
            resultCode=T.ResultCode.TRY_LATER, errorCode=T.ErrorCode.ALL_MESSAGE_CONSUMED, errorMessage="m"
        ),
        itemList=[b"a", b"\x00\xff"],
        lastConsumedIndex=9,
    )
    seen = deserialize(original.ConsumeResponse(), serialize(response, factory), factory)
    assert seen.result.errorCode == original.ErrorCode.ALL_MESSAGE_CONSUMED
    assert seen.itemList == [b"a", b"\x00\xff"] and seen.lastConsumedIndex == 9
    # The timestamp and heldBy extension fields are skipped by a reader built from the original IDL.
    response.timestampList, response.firstIndex, response.heldBy, response.firstMessage = [1, 2], 8, "member-1", 3
    seen = deserialize(original.ConsumeResponse(), serialize(response, factory), factory)
    assert (seen.itemList, seen.lastConsumedIndex) == ([b"a", b"\x00\xff"], 9) and not hasattr(seen, "firstIndex")
    assert not hasattr(seen, "heldBy") and not hasattr(seen, "firstMessage")
    request = deserialize(
        original.ConsumeRequest(), serialize(T.ConsumeRequest(topic="t", withTimestamps=True), factory), factory
    )
    assert request.topic == "t" and not hasattr(request, "withTimestamps")
    # itemsAsBlob too; a blob reply (our broker's, only when asked) decodes there without its items.
    request = deserialize(
        original.ConsumeRequest(), serialize(T.ConsumeRequest(topic="t", itemsAsBlob=True), factory), factory
    )
    assert request.topic == "t" and not hasattr(request, "itemsAsBlob")
    blob = T.ConsumeResponse(
        result=T.Result(resultCode=0), lastConsumedIndex=1, itemBlob=b"ab", itemLengths=b"\0\0\0\2"
    )
    seen = deserialize(original.ConsumeResponse(), serialize(blob, factory), factory)
    assert seen.itemList is None and seen.lastConsumedIndex == 1 and not hasattr(seen, "itemBlob")


# -- round trips -------------------------------------------------------------------------------
def _result(code: int = 0, error: int | None = None, message: str | None = None) -> Any:
    return T.Result(resultCode=code, errorCode=error, errorMessage=message)


SAMPLES: list[Any] = [
    _result(),
    _result(T.ResultCode.FAILURE, T.ErrorCode.TOPIC_NOT_EXIST, "topic 'x' does not exist ✓"),
    T.ProduceRequest(item=b"\x00\x01payload\xff", topic="logs"),
    T.ProduceRequest(item=b"", topic="t\u00e9"),
    T.ProduceResponse(result=_result(), index=(1 << 63) - 1),
    T.ConsumeRequest(topic="logs"),
    T.ConsumeRequest(topic="logs", fanoutId="g", startIndex=-1, maxFetchSize=-(1 << 31), maxWaitMs=(1 << 31) - 1),
    T.ConsumeResponse(result=_result(), itemList=[b"a", b"", b"\xff" * 1000], lastConsumedIndex=42),
    T.ConsumeResponse(result=_result(T.ResultCode.TRY_LATER, T.ErrorCode.ALL_MESSAGE_CONSUMED, "later")),
    T.FindClosestIndexByTimeRequest(timestamp=T.LATEST_TIME, topic="logs"),
    T.FindClosestIndexByTimeResponse(result=_result(), index=3, timestampOfIndex=1_700_000_000_000),
    T.DeleteTopicRequest(topic="logs", password="plain:luxun"),
    T.DeleteTopicResponse(result=_result(T.ResultCode.FAILURE, T.ErrorCode.AUTHENTICATION_FAILURE, "no")),
    T.GetSizeRequest(topic="logs", fanoutId="g"),
    T.GetSizeResponse(result=_result(), size=-(1 << 63)),
    M.TMessageList(messages=[b"m1", b"", b"m3\x00"]),
    M.TMessagePack(magic=1, attribute=M.CompressionCodec.SNAPPY, crc32=-(1 << 31), messageList=b"\x00\x01"),
]


def test_samples_cover_every_struct() -> None:
    assert {type(s).__name__ for s in SAMPLES} == set(API_STRUCTS + MESSAGE_STRUCTS)


@pytest.mark.parametrize("factory", PROTOCOLS, ids=PROTOCOL_IDS)
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: type(s).__name__)
def test_binary_round_trip(sample: Any, factory: Any) -> None:
    data = serialize(sample, factory)
    back = deserialize(type(sample)(), data, factory)
    assert back == sample
    # Both protocol implementations write the same bytes.
    assert data == serialize(sample, PROTOCOLS[0])


# -- message.thrift ------------------------------------------------------------------------------
def test_compression_codec_values() -> None:
    assert M.CompressionCodec._VALUES_TO_NAMES == {0: "NO_COMPRESSION", 1: "GZIP", 2: "SNAPPY"}


def test_message_pack_magic_defaults_to_1_and_nests_a_message_list() -> None:
    assert M.TMessagePack().magic == 1
    assert M.TMessagePack().attribute is None
    inner = serialize(M.TMessageList(messages=[b"hello", b"world"]))
    pack = M.TMessagePack(attribute=M.CompressionCodec.NO_COMPRESSION, crc32=0, messageList=inner)
    data = serialize(pack)
    assert data.startswith(b"\x03\x00\x01\x01")  # field 1, byte, value 1
    back = deserialize(M.TMessagePack(), data)
    assert deserialize(M.TMessageList(), back.messageList).messages == [b"hello", b"world"]


# -- Apache Thrift compiler ----------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("thrift") is None, reason="Apache Thrift compiler not installed")
@pytest.mark.parametrize("language", ["py", "java"])
@pytest.mark.parametrize("path", [idl.LUXUN_THRIFT, idl.MESSAGE_THRIFT], ids=["luxun", "message"])
def test_compiles_with_apache_thrift(tmp_path: Path, language: str, path: str) -> None:
    done = subprocess.run(
        ["thrift", "--gen", language, "-out", str(tmp_path), path], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    generated = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    if path == idl.LUXUN_THRIFT:
        assert ("QueueService.java" if language == "java" else "QueueService.py") in generated
    else:
        assert ("TMessagePack.java" if language == "java" else "ttypes.py") in generated


# -- errors map to the IDL ---------------------------------------------------------------------------
ERROR_NAMES: dict[type[errors.LuxunError], str] = {
    errors.InternalError: "INTERNAL_ERROR",
    errors.TopicNotExist: "TOPIC_NOT_EXIST",
    errors.IndexOutOfBounds: "INDEX_OUT_OF_BOUNDS",
    errors.InvalidTopic: "INVALID_TOPIC",
    errors.TopicIsEmpty: "TOPIC_IS_EMPTY",
    errors.AuthenticationFailure: "AUTHENTICATION_FAILURE",
    errors.MessageSizeTooLarge: "MESSAGE_SIZE_TOO_LARGE",
    errors.AllMessageConsumed: "ALL_MESSAGE_CONSUMED",
}


def test_every_error_code_has_one_exception() -> None:
    assert {cls.error_code: T.ErrorCode._VALUES_TO_NAMES[cls.error_code] for cls in ERROR_NAMES} == {
        getattr(T.ErrorCode, name): name for name in ERROR_NAMES.values()
    }
    assert set(errors.ERROR_CLASSES.values()) == set(ERROR_NAMES)
    assert len(errors.ERROR_CLASSES) == len(T.ErrorCode._VALUES_TO_NAMES)
    for cls in ERROR_NAMES:
        assert issubclass(cls, errors.LuxunError)


def test_data_dir_locked_joins_the_tree() -> None:
    from luxun.topics import DataDirLockedError

    assert DataDirLockedError is errors.DataDirLockedError
    assert issubclass(DataDirLockedError, errors.InternalError) and issubclass(DataDirLockedError, RuntimeError)
    assert DataDirLockedError("held").to_result().errorCode == T.ErrorCode.INTERNAL_ERROR


def test_only_all_message_consumed_is_retriable_and_try_later() -> None:
    retriable = {cls for cls in ERROR_NAMES if cls.retriable}
    assert retriable == {errors.AllMessageConsumed}
    assert errors.AllMessageConsumed.result_code == T.ResultCode.TRY_LATER
    for cls in set(ERROR_NAMES) - retriable:
        assert cls.result_code == T.ResultCode.FAILURE


@pytest.mark.parametrize(
    ("error", "code", "parts"),
    [
        (errors.TopicNotExist("logs", broker_id=3), "TOPIC_NOT_EXIST", ["topic logs does not", "broker 3"]),
        (errors.IndexOutOfBounds("logs", 17, 5, 10), "INDEX_OUT_OF_BOUNDS", ["17", "'logs'", "[5, 10)"]),
        (errors.InvalidTopic("a/b", "must not contain '/'"), "INVALID_TOPIC", ["'a/b'", "'/'"]),
        (errors.TopicIsEmpty("logs"), "TOPIC_IS_EMPTY", ["topic logs is empty"]),
        (errors.AuthenticationFailure("logs"), "AUTHENTICATION_FAILURE", ["'logs'", "wrong password"]),
        (errors.MessageSizeTooLarge("logs", 2000, 1024), "MESSAGE_SIZE_TOO_LARGE", ["2000", "1024", "'logs'"]),
        (errors.AllMessageConsumed("logs", fanout_id="g"), "ALL_MESSAGE_CONSUMED", ["'logs'", "'g'", "try later"]),
        (errors.AllMessageConsumed("logs", index=12), "ALL_MESSAGE_CONSUMED", ["'logs'", "12"]),
        (errors.InternalError("disk full in /data"), "INTERNAL_ERROR", ["disk full"]),
        (errors.ConfigError("bad port", key="port"), "INTERNAL_ERROR", ["bad port"]),
    ],
)
def test_error_messages_and_results(error: errors.LuxunError, code: str, parts: list[str]) -> None:
    for part in parts:
        assert part in str(error)
    result = error.to_result()
    assert result.errorCode == getattr(T.ErrorCode, code)
    assert result.resultCode == error.result_code
    assert result.errorMessage == str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.__dict__ == error.__dict__


def test_config_error_is_a_value_error() -> None:
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.ConfigError, errors.LuxunError)
    assert errors.ConfigError("x", key="port").key == "port"


def test_error_for_code() -> None:
    error = errors.error_for_code(T.ErrorCode.TOPIC_IS_EMPTY, "topic 'x' is empty on broker 1")
    assert type(error) is errors.TopicIsEmpty and str(error) == "topic 'x' is empty on broker 1"
    error = errors.error_for_code(T.ErrorCode.ALL_MESSAGE_CONSUMED, "later")
    assert error.retriable and error.result_code == T.ResultCode.TRY_LATER
    unknown = errors.error_for_code(99, "from the future")
    assert type(unknown) is errors.LuxunError and unknown.error_code == 99 and "from the future" in str(unknown)
