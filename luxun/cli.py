"""The ``luxun`` command: run a broker, and small tools for people.

::

    luxun serve [--config server.properties] [--data-dir DIR] [--host H] [--port P] ...
    luxun --version
    luxun produce TOPIC [--async]  lines from stdin, one item each
    luxun consume TOPIC (--group G | --from-index N | --from earliest|latest) [--max N] [--wait-ms MS]
                  [--commit | --no-commit]   (with --group: read from the committed position)
                  [--raw]   (a pack's messages are printed one per line; --raw: the pack's bytes)
    luxun topics [--metrics URL]   topics, sizes, group lag (listTopics, or the metrics endpoint)
    luxun delete TOPIC --password PW
    luxun agent --broker H:P [--dgram PATH] [--stream PATH] [--tcp-port N] [--config dory.xml] [--status-port N]
    luxun kafka-user add NAME [--admin] (--users-file F | --config server.properties)   password from stdin/prompt
    luxun kafka-user remove NAME (--users-file F | --config ...);  luxun kafka-user list (--users-file F | ...)
    luxun kafka-acl add|remove --principal User:NAME --operation OP [--operation OP...]
                    (--topic T | --group G | --cluster | --transactional-id ID) [--prefixed] [--deny] [--host H]
                    (--data-dir D | --config server.properties);  luxun kafka-acl list (--data-dir D | --config ...)

Client commands talk to a broker through :class:`clients.connection.BrokerConnection`
(``--broker host:port``, default 127.0.0.1:9092; ``host`` alone means port 9092) with a
connect timeout and a call timeout. Every failure is one line on stderr naming the
broker's host:port (or the port, path, size and limit involved) and a non-zero exit
code: 1 for a failure, 2 for a usage error (such as a topic name no broker takes, see
``idl.names``: refused before connecting); never a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from typing import IO, Any

DEFAULT_BROKER = "127.0.0.1:9092"
DEFAULT_METRICS = "http://127.0.0.1:9093"
#: Client timeouts (ms): establishing the connection; each call (consume adds --wait-ms).
DEFAULT_CONNECT_TIMEOUT_MS = 5_000
DEFAULT_TIMEOUT_MS = 30_000
#: Java Luxun's (and our) default max.message.size: the CLI cannot ask a broker its limit.
DEFAULT_MAX_ITEM_BYTES = 1024 * 1024
#: A broker closes the connection of a frame over its max.message.size + 1 MiB: an item
#: (plus the call's other bytes, the topic included, within the allowance) of no more than
#: 1 MiB is not why a connection closed (rather: not a broker's QueueService port).
_FRAME_SLACK_BYTES = 1 << 20
_CALL_HEAD_ALLOWANCE = 1024
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_READ_CHUNK = 1 << 20

DELETE_PASSWORD_HELP = (
    "the broker's deleteTopic password, in the broker's own form where it can be used: "
    "'plain:s3cret' and 's3cret' both send s3cret; md5:/crc32: forms are refused (a digest cannot "
    "be turned back into the password: pass the password itself); write plain:<password> for a "
    "password that starts with plain:, md5: or crc32:"
)


class CliError(Exception):
    """A failure told to the person in one line (``luxun: <message>``), exit ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """An argparse parser that refuses what it does not know itself, with its own usage.

    argparse leaves a subcommand's unknown arguments to the top-level parser (which
    prints the top-level usage), and checks required arguments before unknown ones (so
    ``consume logs --gruop g`` asked for one of ``--group --from-index --from``). Here
    each parser, the subcommands' included, first parses with nothing required and
    names an unknown argument, with a close match when there is one; then parses as
    declared.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        args = sys.argv[1:] if args is None else list(args)
        required: list[Any] = [a for a in self._actions if a.required]
        required += [g for g in self._mutually_exclusive_groups if g.required]
        for declared in required:
            declared.required = False
        try:
            _, unknown = super().parse_known_args(args, argparse.Namespace())
        finally:
            for declared in required:
                declared.required = True
        if not unknown:
            parsed, unknown = super().parse_known_args(args, namespace)
            if not unknown:
                return parsed, unknown
        self.error(f"unrecognized arguments: {' '.join(unknown)}{self._did_you_mean(unknown)}")

    def _did_you_mean(self, unknown: list[str]) -> str:
        """`` (did you mean --group?)`` for the first unknown option like a known one."""
        for arg in unknown:
            if arg.startswith("-"):
                close = difflib.get_close_matches(
                    arg.split("=", 1)[0], list(self._option_string_actions), n=1, cutoff=0.75
                )
                return f" (did you mean {close[0]}?)" if close else ""
        return ""


def _package_version() -> str:
    """luxun's version: its installed distribution's, else ``luxun.__version__``, else the
    ``version`` of the ``setup.cfg`` beside the package (a source tree), else ``"unknown"``."""
    from importlib import metadata

    try:
        return metadata.version("luxun")
    except metadata.PackageNotFoundError:
        pass
    import luxun

    version = getattr(luxun, "__version__", None)
    if isinstance(version, str):
        return version
    import configparser
    from pathlib import Path

    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parent.parent / "setup.cfg", encoding="utf-8")
    return setup.get("metadata", "version", fallback="unknown")


class _VersionAction(argparse.Action):
    """``--version``: print ``luxun <version>`` and exit 0 (the version looked up only then)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"luxun {_package_version()}")
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="luxun", description="luxun: a persistent publish/subscribe message queue")
    parser.add_argument("--version", action=_VersionAction, help="print luxun's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a broker (defaults: ./luxun-data, 127.0.0.1:9092)")
    serve.add_argument("--config", help="a Luxun server.properties file")
    serve.add_argument("--data-dir", help="data directory (log.dir); default ./luxun-data")
    serve.add_argument("--host", help="address to listen on; default 127.0.0.1")
    serve.add_argument("--port", type=int, help="QueueService port; default 9092 (0: any free port)")
    serve.add_argument(
        "--password",
        help="deleteTopic password: plain:<password> (or the bare password), md5:<hex digest of it> or "
        "crc32:<decimal CRC-32 of it>; clients always send the password itself; without one, deletion is disabled",
    )
    serve.add_argument("--metrics-host", help="metrics HTTP address; default 127.0.0.1")
    serve.add_argument("--metrics-port", type=int, help="metrics HTTP port; default 9093, 0 turns it off")
    serve.add_argument(
        "--kafka-port", type=int, help="Kafka-protocol port (kafka.port); default 0: off (9092 is the Thrift port's)"
    )
    serve.add_argument("--kafka-host", help="the Kafka port's address (kafka.host); default: --host")
    serve.add_argument(
        "--kafka-sasl-mechanisms",
        help="SASL on the Kafka port (kafka.sasl.mechanisms): some of PLAIN,SCRAM-SHA-256,SCRAM-SHA-512; default off",
    )
    serve.add_argument(
        "--kafka-sasl-users-file", help="the Kafka port's users (kafka.sasl.users.file; see luxun kafka-user add)"
    )
    serve.add_argument(
        "--kafka-allow-unauthenticated",
        action="store_const",
        const=True,
        help="let the Kafka port listen on a non-loopback address without SASL (kafka.allow.unauthenticated)",
    )
    serve.add_argument("--log-level", default="INFO", help=f"{', '.join(_LOG_LEVELS)} (default INFO)")

    produce = sub.add_parser("produce", help="send stdin lines to a topic, one item per line")
    produce.add_argument("topic")
    produce.add_argument(
        "--async",
        dest="oneway",
        action="store_true",
        help="use oneway asyncProduce (faster; the broker reports no refusals to oneway calls)",
    )
    produce.add_argument(
        "--max-item-bytes",
        type=int,
        default=DEFAULT_MAX_ITEM_BYTES,
        help=f"refuse a line longer than this before sending it (default {DEFAULT_MAX_ITEM_BYTES}, the default "
        "max.message.size; set it to the broker's max.message.size)",
    )
    consume = sub.add_parser(
        "consume", help="print a topic's messages, one per line (a pack's messages; an item that is no pack whole)"
    )
    consume.add_argument("topic")
    where = consume.add_mutually_exclusive_group(required=True)
    where.add_argument("--group", help="consume as this consumer group (the broker keeps its position)")
    where.add_argument("--from-index", type=int, help="consume from this index")
    where.add_argument("--from", dest="from_", choices=["earliest", "latest"], help="consume from tail or head")
    consume.add_argument(
        "--max", type=int, default=0, help="stop after this many items (a pack is one item; 0: no limit)"
    )
    consume.add_argument(
        "--raw",
        action="store_true",
        help="print each item as stored, a pack as its encoded bytes (a pack committed in part: a pack of its "
        "uncommitted messages), one per line",
    )
    consume.add_argument("--wait-ms", type=int, default=0, help="at the end, wait this long for more (0: exit)")
    consume.add_argument("--fetch-bytes", type=int, default=1 << 20, help="bytes per fetch (default 1 MiB)")
    commit_mode = consume.add_mutually_exclusive_group()
    commit_mode.add_argument(
        "--commit",
        dest="commit",
        action="store_const",
        const=True,
        help="with --group: read from the group's committed position and commit after printing (at-least-once; "
        "the group then only accepts committed reads)",
    )
    commit_mode.add_argument(
        "--no-commit",
        dest="commit",
        action="store_const",
        const=False,
        help="with --group: read from the group's committed position and move nothing (a peek)",
    )

    topics = sub.add_parser("topics", help="list topics with sizes and group lag")
    topics.add_argument(
        "--metrics",
        help="read the broker's metrics endpoint (e.g. http://127.0.0.1:9093) instead of asking its "
        "QueueService port (--broker) with listTopics",
    )
    delete = sub.add_parser("delete", help="delete a topic and its files")
    delete.add_argument("topic")
    delete.add_argument("--password", required=True, help=DELETE_PASSWORD_HELP)
    for p in (produce, consume, topics, delete):
        p.add_argument(
            "--broker", default=DEFAULT_BROKER, help=f"host:port (default {DEFAULT_BROKER}; host alone: 9092)"
        )
        p.add_argument(
            "--connect-timeout-ms",
            type=int,
            default=DEFAULT_CONNECT_TIMEOUT_MS,
            help=f"give up connecting after this long (ms, default {DEFAULT_CONNECT_TIMEOUT_MS}; 0: as --timeout-ms)",
        )
        p.add_argument(
            "--timeout-ms",
            type=int,
            default=DEFAULT_TIMEOUT_MS,
            help=f"give up on a call the broker does not answer within this long (ms, default {DEFAULT_TIMEOUT_MS}; "
            "consume adds --wait-ms; 0: no limit)",
        )

    kafka_user = sub.add_parser("kafka-user", help="add, remove or list the Kafka port's SASL users")
    kafka_user.add_argument("action", choices=["add", "remove", "list"])
    kafka_user.add_argument("name", nargs="?", help="the user (add, remove)")
    where_users = kafka_user.add_mutually_exclusive_group(required=True)
    where_users.add_argument("--users-file", help="the users file (created by add if missing)")
    where_users.add_argument("--config", help="a server.properties whose kafka.sasl.users.file to use")
    kafka_user.add_argument(
        "--admin", action="store_true", help="add: a super user, allowed everything whatever the ACLs"
    )
    kafka_user.add_argument(
        "--mechanisms",
        default="SCRAM-SHA-256,SCRAM-SHA-512",
        help="add: SCRAM credentials to store (default both; PLAIN logins are checked against either)",
    )
    kafka_user.add_argument(
        "--iterations", type=int, default=4096, help="add: PBKDF2 iterations of each credential (default 4096)"
    )

    kafka_acl = sub.add_parser("kafka-acl", help="add, remove or list the Kafka port's ACLs (docs/kafka-acls.md)")
    kafka_acl.add_argument("action", choices=["add", "remove", "list"])
    where_acls = kafka_acl.add_mutually_exclusive_group(required=True)
    where_acls.add_argument("--data-dir", help="the broker's data directory (log.dir), which holds the ACL file")
    where_acls.add_argument("--config", help="a server.properties whose log.dir to use")
    kafka_acl.add_argument("--principal", help="add, remove: User:NAME, or User:* for every user")
    kafka_acl.add_argument(
        "--operation", action="append", default=[], help="add, remove: READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, "
        "DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, CLUSTER_ACTION or ALL (repeatable)",
    )  # fmt: skip
    resource = kafka_acl.add_mutually_exclusive_group()
    resource.add_argument("--topic", help="the topic (* for every topic)")
    resource.add_argument("--group", help="the consumer group (* for every group)")
    resource.add_argument("--transactional-id", help="the transactional id (* for every one)")
    resource.add_argument("--cluster", action="store_true", help="the cluster (kafka-cluster)")
    kafka_acl.add_argument("--prefixed", action="store_true", help="the name is a prefix (KIP-290), not a literal")
    kafka_acl.add_argument("--deny", action="store_true", help="a DENY binding (default: ALLOW)")
    kafka_acl.add_argument("--host", default="*", help="the client address it applies to (default *: any)")

    agent = sub.add_parser("agent", help="a local Dory-compatible agent that forwards to brokers")
    from clients.agent import add_arguments as _agent_arguments

    _agent_arguments(agent)

    args = parser.parse_args(argv)
    from clients.errors import LuxunClientError

    try:
        if args.command in _TOPIC_COMMANDS:
            _check_topic(args.topic)
        return int(globals()[f"_cmd_{args.command.replace('-', '_')}"](args))
    except CliError as exc:
        return _fail(str(exc), exc.code)
    except LuxunClientError as exc:  # BrokerUnavailableError: its message names host:port
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed (luxun consume ... | head)
        return 0


def _cmd_agent(args: argparse.Namespace) -> int:
    from clients.agent import run

    return run(args)


#: The commands that take a topic name, checked before connecting.
_TOPIC_COMMANDS = ("produce", "consume", "delete")


def _check_topic(topic: str) -> None:
    """A usage error (exit 2) for a name no broker takes as a topic (``idl.names``' rules)."""
    from idl.names import topic_name_problem

    problem = topic_name_problem(topic)
    if problem is not None:
        raise CliError(f"topic {topic!r}: {problem}", 2)


def _counted(n: int, noun: str) -> str:
    """``"1 item"``, ``"2 items"``, ``"0 items"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _fail(message: str, code: int) -> int:
    print(f"luxun: {message}", file=sys.stderr)
    return code


def _cmd_serve(args: argparse.Namespace) -> int:
    from .broker import Broker, StartupError, tune_allocator
    from .config import BrokerConfig, ConfigError, load_properties
    from .topics import DataDirLockedError

    level = args.log_level.strip().upper()
    if level not in _LOG_LEVELS:
        raise CliError(f"--log-level {args.log_level!r} is not one of {', '.join(_LOG_LEVELS)}", 2)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {
        key: value
        for key, value in {
            "data_dir": args.data_dir,
            "host": args.host,
            "port": args.port,
            "password": args.password,
            "metrics_host": args.metrics_host,
            "metrics_port": args.metrics_port,
            "kafka_port": args.kafka_port,
            "kafka_host": args.kafka_host,
            "kafka_sasl_mechanisms": args.kafka_sasl_mechanisms,
            "kafka_sasl_users_file": args.kafka_sasl_users_file,
            "kafka_allow_unauthenticated": args.kafka_allow_unauthenticated,
        }.items()
        if value is not None
    }
    try:
        props = load_properties(args.config) if args.config else {}
        config = BrokerConfig.from_properties(props, overrides=overrides)
        broker = Broker(config)  # checks ports and data directory first: one line when they fail
    except (ConfigError, DataDirLockedError) as exc:
        raise CliError(str(exc), 2) from exc
    except OSError as exc:  # StartupError (port in use, data dir a file) or the data directory itself
        raise CliError(_os_error(exc), 2) from exc
    if not tune_allocator():
        logging.getLogger(__name__).info("malloc thresholds left as they are (set by the environment, or no glibc)")
    try:
        broker.serve_forever()
    except StartupError as exc:  # a port taken between the check and listening
        raise CliError(str(exc), 2) from exc
    return 0


def _cmd_kafka_user(args: argparse.Namespace) -> int:
    from .kafka import sasl

    path = args.users_file or _users_file_of(args.config)
    if args.action == "list":
        try:
            with open(path, encoding="utf-8") as f:
                users = sasl.parse_users(f.read(), source=path)
        except OSError as exc:
            raise CliError(_os_error(exc)) from exc
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        for user in users.values():
            print(f"{user.name} {'admin' if user.admin else 'user'} {','.join(user.credentials)}")
        return 0
    if not args.name:
        raise CliError(f"kafka-user {args.action} needs a NAME", 2)
    try:
        if args.action == "remove":
            if not sasl.remove_user(path, args.name):
                raise CliError(f"no user {args.name!r} in {path}")
            print(f"removed user {args.name!r} from {path}", file=sys.stderr)
            return 0
        problem = sasl.user_name_problem(args.name)
        if problem is not None:
            raise CliError(problem, 2)
        mechanisms = [m.strip().upper() for m in args.mechanisms.split(",") if m.strip()]
        user = sasl.new_user(
            args.name, _read_new_password(args.name), admin=args.admin, mechanisms=mechanisms,
            iterations=args.iterations,
        )  # fmt: skip
        replaced = sasl.write_user(path, user)
    except OSError as exc:
        raise CliError(_os_error(exc)) from exc
    except ValueError as exc:
        raise CliError(str(exc), 2) from exc
    print(
        f"{'replaced' if replaced else 'added'} user {args.name!r} ({'admin' if args.admin else 'user'}; "
        f"{', '.join(user.credentials)}) in {path}; a running broker reads the file again at the next login",
        file=sys.stderr,
    )
    return 0


def _cmd_kafka_acl(args: argparse.Namespace) -> int:
    from .config import BrokerConfig, ConfigError
    from .kafka import acls as A

    if args.data_dir:
        data_dir = args.data_dir
    else:
        try:
            data_dir = BrokerConfig.from_file(args.config).data_dir
        except ConfigError as exc:
            raise CliError(str(exc), 2) from exc
    path = os.path.join(data_dir, A.ACL_FILE)
    try:
        if args.action == "list":
            for acl in A.read_acl_file(path)[0]:
                print(_acl_line(acl))
            return 0
        wanted = _acls_of(args)
        if args.action == "add":
            A.edit_acl_file(path, lambda acls: acls + wanted)
        else:
            missing: list[A.Acl] = []

            def drop(acls: list[A.Acl]) -> list[A.Acl]:
                missing.extend(a for a in wanted if a not in acls)
                return [a for a in acls if a not in wanted]

            A.edit_acl_file(path, drop)
            if missing:
                raise CliError("no such ACL: " + "; ".join(_acl_line(a) for a in missing))
    except OSError as exc:
        raise CliError(_os_error(exc)) from exc
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    verb = "added" if args.action == "add" else "removed"
    for acl in wanted:
        print(f"{verb}: {_acl_line(acl)}", file=sys.stderr)
    print(f"in {path}; a running broker reads it again within a second", file=sys.stderr)
    return 0


def _acl_line(acl: Any) -> str:
    return (
        f"{acl.permission.name} {acl.principal} host={acl.host} {acl.operation.name} "
        f"{acl.resource_type.name} {acl.pattern.name} {acl.name}"
    )


def _acls_of(args: argparse.Namespace) -> list[Any]:
    """The bindings ``kafka-acl add/remove`` names (usage errors: exit 2)."""
    from .kafka import acls as A

    if not args.principal or not args.operation:
        raise CliError(f"kafka-acl {args.action} needs --principal and --operation", 2)
    if args.topic is not None:
        rtype, name = A.ResourceType.TOPIC, args.topic
    elif args.group is not None:
        rtype, name = A.ResourceType.GROUP, args.group
    elif args.transactional_id is not None:
        rtype, name = A.ResourceType.TRANSACTIONAL_ID, args.transactional_id
    elif args.cluster:
        rtype, name = A.ResourceType.CLUSTER, A.CLUSTER_NAME
    else:
        raise CliError(f"kafka-acl {args.action} needs --topic, --group, --transactional-id or --cluster", 2)
    out = []
    for op in args.operation:
        try:
            operation = A.Operation[op.strip().upper()]
        except KeyError:
            raise CliError(f"unknown operation {op!r}", 2) from None
        acl = A.Acl(
            rtype, name, A.PatternType.PREFIXED if args.prefixed else A.PatternType.LITERAL, args.principal,
            args.host, operation, A.Permission.DENY if args.deny else A.Permission.ALLOW,
        )  # fmt: skip
        problem = acl.problem()
        if problem is not None:
            raise CliError(problem, 2)
        out.append(acl)
    return out


def _users_file_of(config_path: str) -> str:
    """``kafka.sasl.users.file`` of a server.properties (relative to the working directory, as the broker's)."""
    from .config import ConfigError, load_properties

    try:
        path = load_properties(config_path).get("kafka.sasl.users.file", "").strip()
    except ConfigError as exc:
        raise CliError(str(exc), 2) from exc
    if not path:
        raise CliError(f"{config_path} has no kafka.sasl.users.file; pass --users-file", 2)
    return path


def _read_new_password(name: str) -> str:
    """The password: asked twice on a terminal, else the first line of stdin."""
    import getpass

    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {name}: ")
        if getpass.getpass("again: ") != password:
            raise CliError("the two passwords differ; nothing written", 2)
    else:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not password:
        raise CliError("empty password; nothing written (give it on stdin or at the prompt)", 2)
    return password


def _os_error(exc: OSError) -> str:
    """``path: reason`` rather than ``[Errno 13] Permission denied: 'path'``."""
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


# -- client commands ----------------------------------------------------------------------
def _connect(args: argparse.Namespace, extra_timeout_ms: int = 0) -> Any:
    """A :class:`~clients.connection.BrokerConnection` to ``--broker`` with the timeout flags."""
    from clients.connection import BrokerConnection

    for flag in ("connect_timeout_ms", "timeout_ms"):
        if getattr(args, flag) < 0:
            raise CliError(f"--{flag.replace('_', '-')} must be >= 0", 2)
    try:
        return BrokerConnection(
            args.broker,
            timeout_ms=(args.timeout_ms + max(extra_timeout_ms, 0)) if args.timeout_ms else None,
            connect_timeout_ms=args.connect_timeout_ms or None,
        )
    except ValueError as exc:
        raise CliError(f"--broker: {exc}", 2) from exc


def _failure(result: Any) -> str | None:
    """``"NAME: message"`` of a failed Result, or None on success."""
    from idl import ERROR_CODE_NAMES
    from idl import luxun_thrift as T

    if result.resultCode == T.ResultCode.SUCCESS:
        return None
    return f"{ERROR_CODE_NAMES.get(result.errorCode, result.errorCode)}: {result.errorMessage}"


def _read_items(stream: IO[bytes], limit: int) -> Iterator[tuple[int, bytes | None, int]]:
    """``(line number, item, size)`` per line of ``stream`` (newline dropped); ``item``
    is None for a line over ``limit`` bytes, whose size is counted without holding it."""
    number = 0
    while True:
        line = stream.readline(limit + 2)
        if not line:
            return
        number += 1
        if line.endswith(b"\n"):
            size = len(line) - 1
            yield number, line[:-1] if size <= limit else None, size
            continue
        if len(line) <= limit:  # the last line, without a newline
            yield number, line, len(line)
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = stream.readline(_READ_CHUNK)
            if not line:
                break
            size += len(line)
        yield number, None, size - line.endswith(b"\n")


def _cmd_produce(args: argparse.Namespace) -> int:
    from clients.errors import BrokerUnavailableError
    from idl import luxun_thrift as T

    if args.max_item_bytes < 1:
        raise CliError("--max-item-bytes must be >= 1", 2)
    verb = "sent" if args.oneway else "produced"
    count = largest = 0
    conn = _connect(args)
    with conn:
        try:
            for number, item, size in _read_items(sys.stdin.buffer, args.max_item_bytes):
                if item is None:
                    raise CliError(
                        f"line {number} of stdin is {size} bytes, over --max-item-bytes {args.max_item_bytes} "
                        f"(default: the broker's default max.message.size); not sent, nor anything after it "
                        f"({_counted(count, 'item')} {verb} before it); if the broker's max.message.size is larger, "
                        "raise --max-item-bytes to it"
                    )
                request = T.ProduceRequest(item=item, topic=args.topic)
                largest = max(largest, size)
                if args.oneway:
                    conn.call("asyncProduce", request)
                else:
                    error = _failure(conn.call("produce", request).result)
                    if error:
                        raise CliError(
                            f"produce of line {number} to {args.topic!r} on {conn.where} failed: {error} "
                            f"({_counted(count, 'item')} produced before it)"
                        )
                count += 1
            if args.oneway and count:
                # A round trip: the broker has read every oneway call once it answers.
                error = _failure(conn.call("getSize", T.GetSizeRequest(topic=args.topic)).result)
                if error:
                    raise CliError(
                        f"sent {_counted(count, 'item')} to {args.topic!r} on {conn.where} with asyncProduce, "
                        f"but then: {error}; "
                        "the broker refused them (oneway calls get no answer: see the broker log/metrics)"
                    )
        except BrokerUnavailableError as exc:
            if _connection_lost(exc.__cause__) and largest + _CALL_HEAD_ALLOWANCE > _FRAME_SLACK_BYTES:
                raise CliError(
                    f"{exc}; an item of up to {largest} bytes may exceed the broker's max.message.size "
                    f"({_counted(count, 'item')} {verb} before)"
                ) from exc
            raise
    if args.oneway:
        print(
            f"sent {_counted(count, 'item')} to {args.topic!r} on {conn.where} "
            "(oneway: refusals are not reported; check the broker log/metrics)",
            file=sys.stderr,
        )
    else:
        print(f"produced {_counted(count, 'item')} to {args.topic!r} on {conn.where}", file=sys.stderr)
    return 0


def _connection_lost(cause: BaseException | None) -> bool:
    """True when a call failed because the broker reset or closed the connection (which
    it does to a frame over max.message.size + 1 MiB), not because it was unreachable."""
    from thriftpy2.transport import TTransportException

    if isinstance(cause, TTransportException):
        return cause.type == TTransportException.END_OF_FILE
    return isinstance(cause, ConnectionResetError | BrokenPipeError)


def _cmd_consume(args: argparse.Namespace) -> int:
    from clients.connection import consume_request
    from idl import luxun_thrift as T

    if args.commit is not None:
        if not args.group:
            raise CliError("--commit and --no-commit need --group", 2)
        return _consume_committed(args)

    out = sys.stdout.buffer
    printed = _Printer(out, args.raw)
    seen = 0
    conn = _connect(args, extra_timeout_ms=args.wait_ms)
    with conn:
        index = args.from_index
        if args.from_ is not None:
            when = T.EARLIEST_TIME if args.from_ == "earliest" else T.LATEST_TIME
            request = T.FindClosestIndexByTimeRequest(timestamp=when, topic=args.topic)
            response = conn.call("findClosestIndexByTime", request)
            error = _failure(response.result)
            if error:
                raise CliError(f"consume from {args.topic!r} on {conn.where}: {error}")
            index = response.index
        while not args.max or seen < args.max:
            request = consume_request(
                args.topic,
                group=args.group,
                index=None if args.group else index or 0,
                # A group's position moves past everything fetched: with --max, fetch one
                # item per call (maxFetchSize 0) so the group keeps what is not printed.
                max_bytes=0 if args.group and args.max else args.fetch_bytes,
                wait_ms=args.wait_ms,
            )
            response = conn.call("consume", request)
            result = response.result
            if result.resultCode != T.ResultCode.SUCCESS:
                if result.resultCode == T.ResultCode.TRY_LATER or result.errorCode == T.ErrorCode.TOPIC_IS_EMPTY:
                    break
                raise CliError(f"consume from {args.topic!r} on {conn.where}: {_failure(result)}")
            items = response.itemList or []
            if args.max:
                items = items[: args.max - seen]
            for item in items:
                printed.write(item)
            out.flush()
            seen += len(items)
            if index is not None:
                index = response.lastConsumedIndex + 1
    print(f"consumed {_counted(seen, 'item')}{printed.packs_said()} from {args.topic!r}", file=sys.stderr)
    return 0


def _consume_committed(args: argparse.Namespace) -> int:
    """``consume --group G --commit/--no-commit``: read by index from the group's
    committed position; with --commit, commit after each printed batch, just after
    its last item (the CLI commits whole items). Of a pack the group committed in part
    (``firstMessage``), only the other messages are printed (with --raw: as a pack)."""
    from clients.connection import consume_request
    from idl import luxun_thrift as T

    out = sys.stdout.buffer
    printed = _Printer(out, args.raw)
    seen = 0
    conn = _connect(args, extra_timeout_ms=args.wait_ms)
    with conn:
        index: int | None = None  # None: from the committed position
        while not args.max or seen < args.max:
            request = consume_request(
                args.topic,
                group=args.group,
                index=index,
                max_bytes=args.fetch_bytes,
                wait_ms=args.wait_ms,
                from_committed=True,
            )
            response = conn.call("consume", request)
            result = response.result
            if result.resultCode != T.ResultCode.SUCCESS:
                if result.resultCode == T.ResultCode.TRY_LATER or result.errorCode == T.ErrorCode.TOPIC_IS_EMPTY:
                    break
                raise CliError(f"consume from {args.topic!r} on {conn.where}: {_failure(result)}")
            items = response.itemList or []
            first = response.lastConsumedIndex - len(items) + 1
            if args.max:
                items = items[: args.max - seen]
            # from the committed position, the first item may be a pack whose first
            # firstMessage messages the group committed: print the rest
            skip = (response.firstMessage or 0) if index is None else 0
            for i, item in enumerate(items):
                printed.write(item, skip=skip if i == 0 else 0)
            out.flush()
            seen += len(items)
            index = first + len(items)
            if args.commit:
                commit = T.CommitOffsetRequest(topic=args.topic, fanoutId=args.group, index=index)
                error = _failure(conn.call("commitOffset", commit).result)
                if error:
                    raise CliError(f"commit of group {args.group!r} on {args.topic!r} on {conn.where}: {error}")
    verb = f"committed up to index {index}" if args.commit and seen else "nothing committed"
    where = f"from {args.topic!r} from the committed position of group {args.group!r}"
    print(f"consumed {_counted(seen, 'item')}{printed.packs_said()} {where} ({verb})", file=sys.stderr)
    return 0


class _Printer:
    """Writes consumed items to ``out``, one line each: a pack's messages (``raw``: the
    pack's bytes), an item that is no pack as it is; counts the packs and their messages."""

    def __init__(self, out: IO[bytes], raw: bool) -> None:
        self.out = out
        self.raw = raw
        self.packs = 0
        self.messages = 0

    def write(self, item: bytes, skip: int = 0) -> None:
        """Print ``item`` less its first ``skip`` messages (committed) if it is a pack."""
        from idl.pack import PackError, decode_pack, pack_rest

        try:
            if self.raw:
                lines = [pack_rest(item, skip)]  # item itself when skip is 0
            else:
                lines = decode_pack(item)[skip:]
                self.packs += 1
                self.messages += len(lines)
        except PackError:  # not a pack: one raw message
            lines = [item]
        for line in lines:
            self.out.write(line)
            self.out.write(b"\n")

    def packs_said(self) -> str:
        """`` (2 packs, 20 messages)`` once a pack was read; else nothing."""
        if not self.packs:
            return ""
        return f" ({_counted(self.packs, 'pack')}, {_counted(self.messages, 'message')})"


def _cmd_topics(args: argparse.Namespace) -> int:
    if args.metrics:
        rows = _topics_from_metrics(args.metrics, args.timeout_ms)
    else:
        from idl import luxun_thrift as T

        with _connect(args) as conn:
            response = conn.call("listTopics", T.ListTopicsRequest())
            error = _failure(response.result)
            if error:
                raise CliError(f"listTopics on {conn.where}: {error}")
        rows = [
            {
                "name": t.name,
                "size": t.size or 0,
                "tail": t.tailIndex or 0,
                "head": t.headIndex or 0,
                "disk": t.diskBytes or 0,
                "groups": sorted((t.groupLag or {}).items()),
            }
            for t in sorted(response.topics or [], key=lambda t: str(t.name))
        ]
    print(f"{'topic':<30} {'items':>12} {'tail':>12} {'head':>12} {'disk MB':>10}  groups (lag)")
    for row in rows:
        groups = ", ".join(f"{g} ({lag})" for g, lag in row["groups"]) or "-"
        print(
            f"{row['name']:<30} {row['size']:>12} {row['tail']:>12} {row['head']:>12} "
            f"{row['disk'] / 1e6:>10.1f}  {groups}"
        )
    return 0


def _topics_from_metrics(base: str, timeout_ms: int) -> list[dict[str, Any]]:
    url = base.rstrip("/") + "/topics.json"
    try:
        with urllib.request.urlopen(url, timeout=(timeout_ms or DEFAULT_TIMEOUT_MS) / 1000) as response:
            rows: list[dict[str, Any]] = json.load(response)
    except OSError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise CliError(f"cannot read {url}: {getattr(reason, 'strerror', None) or reason}") from exc
    except ValueError as exc:
        raise CliError(f"{url} did not answer JSON (is it a luxun broker's metrics endpoint?)") from exc
    return rows


def _cmd_delete(args: argparse.Namespace) -> int:
    from idl import luxun_thrift as T

    from .config import ConfigError, password_to_send

    try:
        password = password_to_send(args.password)
    except ConfigError as exc:
        raise CliError(f"--password: {exc}", 2) from exc
    with _connect(args) as conn:
        # deleteTopic answers SUCCESS for a topic that is not there: look first.
        size = conn.call("getSize", T.GetSizeRequest(topic=args.topic))
        if size.result.errorCode == T.ErrorCode.TOPIC_NOT_EXIST:
            raise CliError(f"topic {args.topic!r} does not exist on {conn.where}")
        error = _failure(size.result)
        if error:
            raise CliError(f"delete of {args.topic!r} on {conn.where}: {error}")
        error = _failure(conn.call("deleteTopic", T.DeleteTopicRequest(topic=args.topic, password=password)).result)
        if error:
            raise CliError(f"delete of {args.topic!r} on {conn.where} refused: {error}")
    print(f"deleted topic {args.topic!r} on {conn.where} ({_counted(size.size, 'item')})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
