"""The ``luxun`` command: run a broker, and small tools for people.

::

    luxun serve [--config server.properties] [--data-dir DIR] [--host H] [--port P] ...
    luxun produce TOPIC            lines from stdin, one item each
    luxun consume TOPIC (--group G | --from-index N | --from earliest|latest) [--max N] [--wait-ms MS]
    luxun topics                   topics, sizes, group lag (from the metrics endpoint)
    luxun delete TOPIC --password PW
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEFAULT_BROKER = "127.0.0.1:9092"
DEFAULT_METRICS = "http://127.0.0.1:9093"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="luxun", description="luxun: a persistent publish/subscribe message queue")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a broker (defaults: ./luxun-data, 127.0.0.1:9092)")
    serve.add_argument("--config", help="a Luxun server.properties file")
    serve.add_argument("--data-dir", help="data directory (log.dir); default ./luxun-data")
    serve.add_argument("--host", help="address to listen on; default 127.0.0.1")
    serve.add_argument("--port", type=int, help="QueueService port; default 9092 (0: any free port)")
    serve.add_argument("--password", help="deleteTopic password (plain:, md5: or crc32: form)")
    serve.add_argument("--metrics-host", help="metrics HTTP address; default 127.0.0.1")
    serve.add_argument("--metrics-port", type=int, help="metrics HTTP port; default 9093, 0 turns it off")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")

    for name, text in (("produce", "send stdin lines to a topic"), ("consume", "print a topic's items")):
        p = sub.add_parser(name, help=text)
        p.add_argument("topic")
        p.add_argument("--broker", default=DEFAULT_BROKER, help=f"host:port (default {DEFAULT_BROKER})")
    produce = sub.choices["produce"]
    produce.add_argument("--async", dest="oneway", action="store_true", help="use oneway asyncProduce")
    consume = sub.choices["consume"]
    where = consume.add_mutually_exclusive_group(required=True)
    where.add_argument("--group", help="consume as this consumer group (the broker keeps its position)")
    where.add_argument("--from-index", type=int, help="consume from this index")
    where.add_argument("--from", dest="from_", choices=["earliest", "latest"], help="consume from tail or head")
    consume.add_argument("--max", type=int, default=0, help="stop after this many items (0: no limit)")
    consume.add_argument("--wait-ms", type=int, default=0, help="at the end, wait this long for more (0: exit)")
    consume.add_argument("--fetch-bytes", type=int, default=1 << 20, help="bytes per fetch (default 1 MiB)")

    topics = sub.add_parser("topics", help="list topics with sizes and group lag")
    topics.add_argument("--metrics", default=DEFAULT_METRICS, help=f"broker metrics URL (default {DEFAULT_METRICS})")
    delete = sub.add_parser("delete", help="delete a topic and its files")
    delete.add_argument("topic")
    delete.add_argument("--password", required=True)
    delete.add_argument("--broker", default=DEFAULT_BROKER)

    args = parser.parse_args(argv)
    try:
        return int(globals()[f"_cmd_{args.command}"](args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from .broker import Broker, tune_allocator
    from .config import BrokerConfig, ConfigError, load_properties
    from .topics import DataDirLockedError

    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides = {
        key: value
        for key, value in {
            "data_dir": args.data_dir,
            "host": args.host,
            "port": args.port,
            "password": args.password,
            "metrics_host": args.metrics_host,
            "metrics_port": args.metrics_port,
        }.items()
        if value is not None
    }
    try:
        props = load_properties(args.config) if args.config else {}
        config = BrokerConfig.from_properties(props, overrides=overrides)
        if not tune_allocator():
            logging.getLogger(__name__).info("malloc thresholds left as they are (set by the environment, or no glibc)")
        broker = Broker(config)
    except (ConfigError, DataDirLockedError, OSError) as exc:
        print(f"luxun: {exc}", file=sys.stderr)
        return 2
    broker.serve_forever()
    return 0


@contextmanager
def _client(broker: str) -> Iterator[Any]:
    from thriftpy2.protocol import TCyBinaryProtocolFactory
    from thriftpy2.rpc import make_client
    from thriftpy2.transport import TCyFramedTransportFactory

    from idl import QueueService

    host, _, port = broker.rpartition(":")
    client = make_client(
        QueueService,
        host or "127.0.0.1",
        int(port),
        proto_factory=TCyBinaryProtocolFactory(),
        trans_factory=TCyFramedTransportFactory(),
        timeout=None,  # type: ignore[arg-type]  # None: no timeout (long polls)
    )
    try:
        yield client
    finally:
        client.close()


def _failed(result: Any) -> str | None:
    from idl import luxun_thrift as T

    if result.resultCode == T.ResultCode.SUCCESS:
        return None
    return f"{T.ErrorCode._VALUES_TO_NAMES.get(result.errorCode, result.errorCode)}: {result.errorMessage}"


def _cmd_produce(args: argparse.Namespace) -> int:
    from idl import luxun_thrift as T

    count = 0
    with _client(args.broker) as client:
        for line in sys.stdin.buffer:
            request = T.ProduceRequest(item=line.rstrip(b"\n"), topic=args.topic)
            if args.oneway:
                client.asyncProduce(request)
            else:
                error = _failed(client.produce(request).result)
                if error:
                    print(f"luxun: produce to {args.topic!r} failed: {error}", file=sys.stderr)
                    return 1
            count += 1
        if args.oneway:
            client.getSize(T.GetSizeRequest(topic=args.topic))  # a round trip: the oneway calls were read
    print(f"produced {count} items to {args.topic!r}", file=sys.stderr)
    return 0


def _cmd_consume(args: argparse.Namespace) -> int:
    from idl import luxun_thrift as T

    out = sys.stdout.buffer
    seen = 0
    with _client(args.broker) as client:
        index = args.from_index
        if args.from_ is not None:
            when = T.EARLIEST_TIME if args.from_ == "earliest" else T.LATEST_TIME
            response = client.findClosestIndexByTime(T.FindClosestIndexByTimeRequest(timestamp=when, topic=args.topic))
            error = _failed(response.result)
            if error:
                print(f"luxun: {error}", file=sys.stderr)
                return 1
            index = response.index
        while not args.max or seen < args.max:
            request = T.ConsumeRequest(
                topic=args.topic,
                fanoutId=args.group,
                startIndex=index or 0,
                maxFetchSize=args.fetch_bytes,
                maxWaitMs=args.wait_ms or None,
            )
            response = client.consume(request)
            if response.result.resultCode != T.ResultCode.SUCCESS:
                if response.result.resultCode == T.ResultCode.TRY_LATER or response.result.errorCode in (
                    T.ErrorCode.TOPIC_IS_EMPTY,
                ):
                    break
                print(f"luxun: {_failed(response.result)}", file=sys.stderr)
                return 1
            items = response.itemList or []
            if args.max:
                items = items[: args.max - seen]
            for item in items:
                out.write(item + b"\n")
            out.flush()
            seen += len(items)
            if index is not None:
                index = response.lastConsumedIndex + 1
    print(f"consumed {seen} items from {args.topic!r}", file=sys.stderr)
    return 0


def _cmd_topics(args: argparse.Namespace) -> int:
    url = args.metrics.rstrip("/") + "/topics.json"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            rows = json.load(response)
    except OSError as exc:
        print(f"luxun: cannot read {url}: {exc}", file=sys.stderr)
        return 1
    print(f"{'topic':<30} {'items':>12} {'tail':>12} {'head':>12} {'disk MB':>10}  groups (lag)")
    for row in rows:
        groups = ", ".join(f"{g} ({lag})" for g, lag in row["groups"]) or "-"
        print(
            f"{row['name']:<30} {row['size']:>12} {row['tail']:>12} {row['head']:>12} "
            f"{row['disk'] / 1e6:>10.1f}  {groups}"
        )
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    from idl import luxun_thrift as T

    with _client(args.broker) as client:
        error = _failed(client.deleteTopic(T.DeleteTopicRequest(topic=args.topic, password=args.password)).result)
    if error:
        print(f"luxun: delete of {args.topic!r} failed: {error}", file=sys.stderr)
        return 1
    print(f"deleted topic {args.topic!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
