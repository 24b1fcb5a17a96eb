"""Which library parses and writes the Kafka protocol for the Kafka port: measured.

Candidates: kio (Aiven; generated from Apache Kafka's JSON message definitions, native
reader/writer), kafka-python 3.x (``kafka.protocol``, also generated from the JSON
schemas, pure Python) and aiokafka 0.14 (``aiokafka.protocol``, hand-written structs
per version, pure Python). For each: the newest version of the APIs the port serves
that it has a schema for, and the time to parse a Metadata v12 request and a Produce
request, and to write a Produce response (the per-request work of the port).

    .venv/bin/python perf/bench_kafka_protocol.py [--json out.json]

Prints a table and the machine. No peers to compare with: the libraries are the peers.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import timeit
from typing import Any

APIS = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 11: "JoinGroup", 18: "ApiVersions"}
RECORDS = bytes(1000)  # a record batch's bytes: opaque to the protocol layer


def kio_case() -> dict[str, Any]:
    from kio.index import load_request_schema
    from kio.schema.index import api_key_map, schema_name_map
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.schema.produce.v9.response import PartitionProduceResponse, ProduceResponse, TopicProduceResponse
    from kio.serial import entity_reader, entity_writer

    newest = {name: max(schema_name_map[api_key_map[k]]) for k, name in APIS.items()}
    load_request_schema(0, 9)
    meta = MetadataRequest(
        topics=(MetadataRequestTopic(name="t", topic_id=None),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    buf = io.BytesIO()
    entity_writer(MetadataRequest)(buf, meta)
    meta_bytes = buf.getvalue()
    import datetime

    prod = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(TopicProduceData(name="t", partition_data=(PartitionProduceData(index=0, records=RECORDS),)),),
    )
    buf = io.BytesIO()
    entity_writer(ProduceRequest)(buf, prod)
    prod_bytes = buf.getvalue()
    read_meta, read_prod = entity_reader(MetadataRequest), entity_reader(ProduceRequest)
    write_resp = entity_writer(ProduceResponse)
    from kio.schema.errors import ErrorCode

    def response() -> bytes:
        r = ProduceResponse(
            responses=(
                TopicProduceResponse(
                    name="t",
                    partition_responses=(
                        PartitionProduceResponse(
                            index=0,
                            error_code=ErrorCode.none,
                            base_offset=5,
                            log_append_time=None,
                            log_start_offset=0,
                            record_errors=(),
                            error_message=None,
                        ),
                    ),
                ),
            ),
            throttle_time=datetime.timedelta(0),
        )
        out = io.BytesIO()
        write_resp(out, r)
        return out.getvalue()

    return {
        "newest": newest,
        "parse_metadata": lambda: read_meta(meta_bytes, 0),
        "parse_produce": lambda: read_prod(prod_bytes, 0),
        "write_produce_response": response,
    }


def kafka_python_case() -> dict[str, Any]:
    from kafka.protocol.metadata import MetadataRequest
    from kafka.protocol.producer import ProduceRequest, ProduceResponse

    def newest_of(cls: Any) -> int:
        return int(getattr(cls, "max_version", -1))

    import kafka.protocol.admin as admin
    import kafka.protocol.consumer as consumer
    import kafka.protocol.metadata as metadata
    import kafka.protocol.producer as producer

    classes = {
        "Produce": producer.ProduceRequest,
        "Fetch": getattr(consumer, "FetchRequest", None),
        "ListOffsets": getattr(consumer, "ListOffsetsRequest", None),
        "Metadata": metadata.MetadataRequest,
        "JoinGroup": getattr(consumer, "JoinGroupRequest", None),
        "ApiVersions": getattr(metadata, "ApiVersionsRequest", getattr(admin, "ApiVersionsRequest", None)),
    }
    newest = {name: (newest_of(cls) if cls is not None else None) for name, cls in classes.items()}
    meta = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="t")], allow_auto_topic_creation=True)
    meta_bytes = meta.encode(version=12)
    data = ProduceRequest.TopicProduceData(
        name="t", partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=RECORDS)]
    )
    prod = ProduceRequest(acks=-1, timeout_ms=30000, topic_data=[data])
    prod_bytes = prod.encode(version=9)

    def response() -> bytes:
        part = ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
            index=0, error_code=0, base_offset=5, log_append_time_ms=-1, log_start_offset=0
        )
        r = ProduceResponse(responses=[ProduceResponse.TopicProduceResponse(name="t", partition_responses=[part])])
        return bytes(r.encode(version=9))

    return {
        "newest": newest,
        "parse_metadata": lambda: MetadataRequest.decode(meta_bytes, version=12),
        "parse_produce": lambda: ProduceRequest.decode(prod_bytes, version=9),
        "write_produce_response": response,
    }


def aiokafka_case() -> dict[str, Any]:
    import re

    from aiokafka.protocol import api, fetch, group, metadata, offset, produce

    def newest_of(module: Any, base: str) -> int:
        found = [int(m.group(1)) for n in dir(module) if (m := re.fullmatch(base + r"Request_v(\d+)", n))]
        return max(found, default=-1)

    newest = {
        "Produce": newest_of(produce, "Produce"),
        "Fetch": newest_of(fetch, "Fetch"),
        "ListOffsets": newest_of(offset, "Offset"),
        "Metadata": newest_of(metadata, "Metadata"),
        "JoinGroup": newest_of(group, "JoinGroup"),
        "ApiVersions": newest_of(api, "ApiVersion"),
    }
    v = newest["Produce"]
    req_cls = getattr(produce, f"ProduceRequest_v{v}")
    fields = list(req_cls.SCHEMA.names)
    values: dict[str, Any] = {"required_acks": -1, "timeout": 30000, "topics": [("t", [(0, RECORDS)])]}
    values["transactional_id"] = None
    prod_bytes = req_cls(*[values[k] for k in fields]).encode()
    mv = newest["Metadata"]
    mreq = getattr(metadata, f"MetadataRequest_v{mv}")
    mvalues: dict[str, Any] = {"topics": ["t"], "allow_auto_topic_creation": True}
    mbytes = mreq(*[mvalues.get(n, False) for n in mreq.SCHEMA.names]).encode()
    resp_cls = getattr(produce, f"ProduceResponse_v{v}")

    def response() -> bytes:
        names = resp_cls.SCHEMA.names
        topic = ("t", [(0, 0, 5, -1, 0, [], None)])  # v8: record errors, error message
        return bytes(resp_cls(*[[topic] if n == "topics" else 0 for n in names]).encode())

    return {
        "newest": newest,
        "versions": {"produce": v, "metadata": mv},
        "parse_metadata": lambda: mreq.decode(io.BytesIO(mbytes)),
        "parse_produce": lambda: req_cls.decode(io.BytesIO(prod_bytes)),
        "write_produce_response": response,
    }


def measure(fn: Any) -> float:
    number = 2000
    best = min(timeit.repeat(fn, number=number, repeat=5))
    return best / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    results: dict[str, Any] = {}
    for name, case in (("kio", kio_case), ("kafka-python", kafka_python_case), ("aiokafka", aiokafka_case)):
        try:
            c = case()
        except Exception as exc:  # a library that cannot express the case is reported as such
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        row: dict[str, Any] = {"newest": c["newest"]}
        for op in ("parse_metadata", "parse_produce", "write_produce_response"):
            try:
                row[op + "_us"] = round(measure(c[op]), 2)
            except Exception as exc:
                row[op + "_us"] = f"{type(exc).__name__}: {exc}"
        if "versions" in c:
            row["versions"] = c["versions"]
        results[name] = row
    print(f"{'library':<14}{'Metadata parse us':>18}{'Produce parse us':>18}{'Produce resp us':>17}  newest versions")
    for name, row in results.items():
        if "error" in row:
            print(f"{name:<14} {row['error']}")
            continue
        cells = [row[k] for k in ("parse_metadata_us", "parse_produce_us", "write_produce_response_us")]
        text = "".join(f"{c:>18}" if not isinstance(c, float) else f"{c:>18.2f}" for c in cells)
        print(f"{name:<14}{text}  {row['newest']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
