// Luxun message packs: what a producer puts in one queue item.
// Mirrors Java Luxun's src/main/resources/thrift/message.thrift (same structs,
// field ids, requiredness, types and enum values), so packs written by Java
// producers decode here and the reverse.
//
// A producer batch is ONE queue item: a TMessagePack whose messageList is a
// TMessageList serialised with the Thrift binary protocol and then compressed
// according to `attribute` (a CompressionCodec value):
//   0 NO_COMPRESSION  the serialised TMessageList as is
//   1 GZIP            a gzip stream
//   2 SNAPPY          snappy in the xerial stream framing used by snappy-java
// crc32 is a CRC-32 of the payload (as a signed i32; which bytes it covers is
// pinned down by the clients' pack codec). Java Luxun always left it 0, so
// readers accept 0 as "not set".
// So a topic index addresses a pack, not a single message.

namespace java com.leansoft.luxun.message.generated
namespace csharp Leansoft.luxun.message.Generated
namespace py message_thrift

enum CompressionCodec
{
  NO_COMPRESSION = 0,
  GZIP = 1,
  SNAPPY = 2
}

// The list of messages of one producer batch.
struct TMessageList {
    1: list<binary> messages
}

// A package of a list of messages (current magic byte is 1):
//   1. magic: format version, to allow format changes;
//   2. attribute: annotations independent of the version (the codec);
//   3. crc32: CRC-32 of the payload (0 = not set);
//   4. messageList: a binary-serialised TMessageList, compressed per attribute.
struct TMessagePack {
    1: byte magic = 1,
    2: byte attribute,
    3: i32 crc32,
    4: required binary messageList
}
