// Luxun QueueService: the original Luxun IDL (bulldog2011/luxun,
// src/main/resources/thrift/api.thrift), kept wire-compatible: same namespaces,
// constants, enums (implicit values 0..n), structs, field ids, requiredness and
// types (GetSizeRequest really has fields 1 and 3). Code generated from the
// original file talks to a broker built from this one, and the reverse.
//
// Transport: framed; protocol: binary. Errors come back in Result
// {resultCode, errorCode, errorMessage}, never as Thrift exceptions.
//
// Changes to the original (additive only, so old clients keep working):
//   - `namespace py luxun_thrift` (generated Python module name);
//   - EXTENSION: ConsumeRequest field 5 `maxWaitMs` (optional; see below);
//   - EXTENSION: ConsumeRequest field 6 `withTimestamps` and ConsumeResponse
//     field 4 `timestampList` / field 5 `firstIndex` (optional; see below);
//   - EXTENSION: method `listTopics` and its structs TopicInfo,
//     ListTopicsRequest, ListTopicsResponse (see below);
//   - EXTENSION: committed positions (at-least-once groups): ConsumeRequest
//     field 7 `fromCommitted` and field 8 `memberId`, methods `commitOffset`
//     and `getCommitted` and their structs (see below);
//   - EXTENSION: committed positions that name a message: CommitOffsetRequest
//     field 6 `message`, GetCommittedResponse field 4 `message`, ConsumeResponse
//     field 7 `firstMessage` (optional; see below);
//   - EXTENSION: items as one blob: ConsumeRequest field 9 `itemsAsBlob`,
//     ConsumeResponse field 8 `itemBlob` and field 9 `itemLengths` (optional; see
//     below).
// Further extensions must be new optional fields or new methods only.

namespace java com.leansoft.luxun.api.generated
namespace csharp Leansoft.luxun.Api.Generated
namespace py luxun_thrift

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
    // EXTENSION (luxun-py; not in the original Luxun IDL).
    // Long poll: when there is nothing to return (the result would be
    // TRY_LATER/ALL_MESSAGE_CONSUMED), the broker waits up to maxWaitMs
    // milliseconds for new items before replying. Unset or <= 0: reply at once,
    // exactly as the original broker does. The broker may cap the wait.
    // Original brokers skip the unknown field and reply at once.
    5: optional i32 maxWaitMs,
    // EXTENSION (luxun-py). true: the reply also carries each item's append time
    // (timestampList) and the index of its first item (firstIndex). Unset or
    // false: neither is sent, exactly as the original broker replies.
    6: optional bool withTimestamps,
    // EXTENSION (luxun-py). true, with fanoutId: read the group's items by index
    // without moving any position: from startIndex when it is set and >= 0 (it
    // must lie in [committed position, head]), else from the group's committed
    // position (a group that never committed: where it stands, tail for a new
    // group). The reply always sets firstIndex, and firstMessage when the committed
    // position is inside the first item. A group that has committed refuses
    // consumes without fromCommitted (FAILURE/INTERNAL_ERROR).
    7: optional bool fromCommitted,
    // EXTENSION (luxun-py), with fromCommitted: the reading member's id. The
    // first member to read a (topic, group) holds it on this broker until it makes
    // no call for the broker's lease time (a few seconds); meanwhile other members
    // get TRY_LATER/ALL_MESSAGE_CONSUMED (nothing to read for them).
    8: optional string memberId,
    // EXTENSION (luxun-py). true: a successful reply carries its items as one buffer
    // instead of itemList: itemBlob (the items back to back) and itemLengths (each
    // item's length), so that a reader needs no object per item (the Spark source
    // makes an Arrow column of them without copying). Unset or false: itemList, exactly
    // as the original broker replies. Original and older brokers skip the field and
    // answer with itemList: a reader that sets it reads whichever of the two is set.
    9: optional bool itemsAsBlob,
}

struct ConsumeResponse {
    1: required Result result,
    2: list<binary> itemList,
    3: i64 lastConsumedIndex,
    // EXTENSION (luxun-py), only when the request set withTimestamps: the append
    // time (ms since the epoch) of each item of itemList, in the same order, and
    // the index of itemList's first item (by index and by fanout id alike).
    4: optional list<i64> timestampList,
    5: optional i64 firstIndex,
    // EXTENSION (luxun-py), with fromCommitted and a memberId: set (with TRY_LATER /
    // ALL_MESSAGE_CONSUMED) when another member holds the (topic, group) on this
    // broker: that member's id. The asking member reads again from the committed
    // position once the holder's lease runs out (see commitOffset).
    6: optional string heldBy,
    // EXTENSION (luxun-py), only with fromCommitted and no startIndex, when the
    // read starts at the group's committed index: the committed message position
    // in the first item (GetCommittedResponse.message). The first item's messages
    // before it are committed: the reader skips them. Unset: skip nothing (an
    // original or older broker; a reader that ignores it re-reads them).
    7: optional i32 firstMessage,
    // EXTENSION (luxun-py), only when the request set itemsAsBlob, in a reply that
    // succeeded: the items itemList would hold, back to back (itemList is then unset),
    // and each one's length as a big-endian i32, in order (4 bytes per item: the
    // number of items is len(itemLengths) / 4). timestampList, firstIndex and
    // firstMessage are as with itemList.
    8: optional binary itemBlob,
    9: optional binary itemLengths,
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

// EXTENSION (luxun-py; not in the original Luxun IDL): the topics a broker
// holds, for tools (`luxun topics --broker host:port`), so they work without the
// metrics endpoint. A broker built from the original IDL answers listTopics with a
// TApplicationException UNKNOWN_METHOD; no other call changes.
struct TopicInfo {
    1: required string name,
    // items between tailIndex and headIndex
    2: i64 size,
    3: i64 tailIndex,
    4: i64 headIndex,
    // bytes of the topic's files on disk
    5: i64 diskBytes,
    // consumer group (fanout id) -> items it has not read yet
    6: map<string, i64> groupLag,
}

struct ListTopicsRequest {
}

struct ListTopicsResponse {
    1: required Result result,
    // sorted by name
    2: list<TopicInfo> topics,
}

// EXTENSION (luxun-py; not in the original Luxun IDL): committed positions of
// consumer groups (at-least-once consumption). A broker built from the original
// IDL answers these methods with a TApplicationException UNKNOWN_METHOD.
struct CommitOffsetRequest {
    1: required string topic,
    2: required string fanoutId,
    // the next index the group reads: tail <= index <= head (else FAILURE/INDEX_OUT_OF_BOUNDS)
    3: required i64 index,
    // set: refused (FAILURE/INTERNAL_ERROR) unless this member holds the group's lease
    4: optional string memberId,
    // true, with memberId: then give up the member's lease, so that another member
    // reads the group at once (a member that closes). index -1: release only.
    5: optional bool release,
    // EXTENSION (luxun-py): a position inside the item at index: the number of its
    // messages (message-pack entries) processed, so the group reads on from message
    // `message` of item `index`. Unset or 0: from the start of item `index`, exactly
    // as before this field existed. Over 0 needs index < head (the item exists);
    // negative: FAILURE/INDEX_OUT_OF_BOUNDS. A count past the item's messages
    // commits the whole item (readers skip them all). The broker keeps it beside
    // the index, in the same crash-safe write.
    6: optional i32 message,
}

struct CommitOffsetResponse {
    1: required Result result,
}

struct GetCommittedRequest {
    1: required string topic,
    2: required string fanoutId,
}

struct GetCommittedResponse {
    1: required Result result,
    // the committed index; for a group that never committed, where it would read from
    2: i64 index,
    // true when the group has committed a position
    3: bool committed,
    // EXTENSION (luxun-py): the committed message position in the item at index
    // (see CommitOffsetRequest.message); set by brokers that know it, 0 when the
    // commit named a whole item or the group never committed.
    4: optional i32 message,
}

service QueueService {
    ProduceResponse produce(1: ProduceRequest produceRequest);

    // The 'oneway' modifier indicates that the client only makes a request and
    // does not wait for any response at all. Oneway methods MUST be void.
    oneway void asyncProduce(1: ProduceRequest produceRequest);

    ConsumeResponse consume(1: ConsumeRequest consumeRequest);

    FindClosestIndexByTimeResponse findClosestIndexByTime(1: FindClosestIndexByTimeRequest findClosestIndexByTimeRequest);

    DeleteTopicResponse deleteTopic(1: DeleteTopicRequest deleteTopicRequest);

    GetSizeResponse getSize(1: GetSizeRequest getSizeRequest);

    // EXTENSION (luxun-py), see ListTopicsResponse.
    ListTopicsResponse listTopics(1: ListTopicsRequest listTopicsRequest);

    // EXTENSION (luxun-py), see CommitOffsetRequest.
    CommitOffsetResponse commitOffset(1: CommitOffsetRequest commitOffsetRequest);

    // EXTENSION (luxun-py), see GetCommittedRequest.
    GetCommittedResponse getCommitted(1: GetCommittedRequest getCommittedRequest);
}
