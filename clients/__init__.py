"""luxun clients: producer, consumers and the Spark data source. They reach brokers only through ``idl``.

The public face, importable from here::

    from clients import Producer, StreamConsumer

    with Producer("127.0.0.1:9092", serializer="json") as producer:
        producer.send("logs", {"level": "info"})

The Spark data source is ``clients.spark`` (it needs pyspark; not imported here).
"""

from __future__ import annotations

from .connection import BrokerConnection, parse_broker, parse_broker_list
from .consumer import Message, Position, SimpleConsumer, StreamConsumer
from .errors import (
    AllMessagesConsumedError,
    AuthenticationError,
    BrokerError,
    BrokerUnavailableError,
    BufferFullError,
    ClientClosedError,
    ConsumerTimeoutError,
    IndexOutOfBoundsError,
    InternalBrokerError,
    InvalidTopicError,
    LuxunClientError,
    MessageDroppedError,
    MessageSizeTooLargeError,
    PackError,
    TopicIsEmptyError,
    TopicNotExistError,
)
from .messages import (
    GZIP,
    NO_COMPRESSION,
    SNAPPY,
    BytesSerde,
    JsonSerde,
    Serde,
    StrSerde,
    decode_pack,
    encode_pack,
    get_serde,
)
from .producer import Producer, ProducerConfig

__all__ = [
    "GZIP",
    "NO_COMPRESSION",
    "SNAPPY",
    "AllMessagesConsumedError",
    "AuthenticationError",
    "BrokerConnection",
    "BrokerError",
    "BrokerUnavailableError",
    "BufferFullError",
    "BytesSerde",
    "ClientClosedError",
    "ConsumerTimeoutError",
    "IndexOutOfBoundsError",
    "InternalBrokerError",
    "InvalidTopicError",
    "JsonSerde",
    "LuxunClientError",
    "Message",
    "MessageDroppedError",
    "MessageSizeTooLargeError",
    "PackError",
    "Position",
    "Producer",
    "ProducerConfig",
    "Serde",
    "SimpleConsumer",
    "StrSerde",
    "StreamConsumer",
    "TopicIsEmptyError",
    "TopicNotExistError",
    "decode_pack",
    "encode_pack",
    "get_serde",
    "parse_broker",
    "parse_broker_list",
]
