"""The transaction coordinator of the Kafka port: Kafka's transactions on one broker (KIP-98).

This broker is every transactional id's coordinator (FindCoordinator with key type 1,
TRANSACTION, names it: :mod:`.groups` answers both key types). A transactional id has a
stable producer id and an epoch that each InitProducerId bumps, and goes through Kafka's
states:

``Empty``
    initialised (InitProducerId), no transaction yet.
``Ongoing``
    AddPartitionsToTxn or AddOffsetsToTxn began one: the producer may write
    transactional batches to the partitions added (the log checks it:
    :meth:`TransactionCoordinator.check_produce`), TxnOffsetCommit keeps offsets
    pending in it.
``PrepareCommit`` / ``PrepareAbort``
    EndTxn decided it: the decision is persisted (the commit point), then the markers
    are written to every partition of the transaction and, on commit, the pending
    offsets are committed (:class:`~.offsets.OffsetStore`).
``CompleteCommit`` / ``CompleteAbort``
    done; the next transaction may begin.

Fencing: InitProducerId bumps the epoch (a new producer id when it would overflow),
aborting the previous epoch's open transaction; every request of an older epoch is
refused (PRODUCER_FENCED where the version has it, else INVALID_PRODUCER_EPOCH), and so
is its produce (the markers carry the new epoch). An Ongoing transaction older than its
timeout is aborted by the broker with a bumped epoch (the producer is fenced, as Kafka
does), checked every ``abort_check_interval_ms``. A transactional id unused for
``id_expiration_ms`` (Kafka's transactional.id.expiration.ms, 7 days) while no
transaction is open is forgotten; at most ``max_transactional_ids`` are kept (an
InitProducerId for one more is refused with POLICY_VIOLATION naming the limit).

Persistence (crash safety): every state change is one JSON line appended (unbuffered,
so a kill -9 loses none that returned) to ``.luxun-kafka-transactions.log`` in the data
directory, a line holding the whole state of one transactional id (or its deletion);
the last line of each id wins, a torn last line is ignored. The file is rewritten
(temporary file, fsync, rename) with one line per live id when it grows past twice that
plus 1000 lines. At start, :meth:`TransactionCoordinator.recover` finishes what a crash
interrupted: a PrepareCommit transaction gets its commit markers (written again where
they were) and its offsets; an Ongoing or PrepareAbort one is aborted with a bumped
epoch. So a transaction is never half visible.

Producer ids come from :meth:`KafkaLog.next_producer_id` (the idempotent producers'
counter, which starts at each start above every id handed out before), so the two kinds
never collide.

With SASL on, a transactional id needs WRITE on its TRANSACTIONAL_ID (ACLs,
:mod:`.acls`; answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED), checked once per request.

Thread-safety: every method may be called from any connection's thread. Each
transactional id has a lock, held while its markers are written (which take the
partitions' locks); the produce path's check reads two dicts without locks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from kio.schema.errors import ErrorCode

from ..config import (
    DEFAULT_MAX_TRANSACTIONAL_IDS,
    DEFAULT_TRANSACTION_ABORT_CHECK_INTERVAL_MS,
    DEFAULT_TRANSACTION_MAX_TIMEOUT_MS,
    DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
)
from ..partitions import partition_of, partition_topic
from .acls import Authorizer, Operation, ResourceType, allows
from .log import KafkaLog
from .membership import ms_of
from .offsets import OffsetStore
from .protocol import build, response_schema

__all__ = ["STATE_FILE", "TransactionCoordinator"]

log = logging.getLogger(__name__)

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
STATE_FILE: Final = ".luxun-kafka-transactions.log"
_MAX_EPOCH: Final = 32766  # Short.MaxValue - 1: one more bump would overflow
_SLACK_LINES: Final = 1000

EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
_IDLE = (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT)
_E = ErrorCode


@dataclass
class _Txn:
    """One transactional id's state (what a line of the state file holds)."""

    tid: str
    producer_id: int
    epoch: int
    timeout_ms: int
    state: str = EMPTY
    #: The luxun topics (partitions) of the open transaction.
    partitions: set[str] = field(default_factory=set)
    #: Groups added (AddOffsetsToTxn) and their pending offsets: (topic, partition) -> (offset, metadata).
    offsets: dict[str, dict[tuple[str, int], tuple[int, str | None]]] = field(default_factory=dict)
    started_ms: int = 0
    used_ms: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def line(self) -> str:
        return json.dumps(
            {
                "id": self.tid,
                "pid": self.producer_id,
                "epoch": self.epoch,
                "timeout": self.timeout_ms,
                "state": self.state,
                "partitions": sorted(self.partitions),
                "offsets": {g: [[t, p, o, m] for (t, p), (o, m) in v.items()] for g, v in self.offsets.items()},
                "started": self.started_ms,
                "used": self.used_ms,
            },
            separators=(",", ":"),
        )

    @classmethod
    def of(cls, d: dict[str, Any]) -> _Txn:
        return cls(
            str(d["id"]),
            int(d["pid"]),
            int(d["epoch"]),
            int(d["timeout"]),
            str(d["state"]),
            {str(p) for p in d.get("partitions", ())},
            {str(g): {(str(t), int(p)): (int(o), m) for t, p, o, m in v} for g, v in d.get("offsets", {}).items()},
            int(d.get("started", 0)),
            int(d.get("used", 0)),
        )


class _StateLog:
    """The append-only state file (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._lines: dict[str, str] = {}  # the last line of each live id
        self._written = 0
        self._fd: int | None = None

    def load(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        states: dict[str, dict[str, Any]] = {}
        bad = 0
        for raw in data.split(b"\n"):
            if not raw:
                continue
            try:
                d = json.loads(raw)
                tid = str(d["id"])
            except (ValueError, KeyError, TypeError):
                bad += 1  # a torn last line (a crash in its write)
                continue
            if d.get("deleted"):
                states.pop(tid, None)
            else:
                states[tid] = d
        if bad:
            log.info("%s: ignored %d unreadable line(s) (a write cut by a crash)", self.path, bad)
        with self._lock:
            self._lines = {tid: json.dumps(d, separators=(",", ":")) for tid, d in states.items()}
            self._compact()
        return list(states.values())

    def write(self, tid: str, line: str | None) -> None:
        """Record ``tid``'s new state (its line), or its deletion (None)."""
        with self._lock:
            if line is None:
                line = json.dumps({"id": tid, "deleted": True})
                self._lines.pop(tid, None)
            else:
                self._lines[tid] = line
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, line.encode() + b"\n")
            self._written += 1
            if self._written > 2 * len(self._lines) + _SLACK_LINES:
                self._compact()

    def _compact(self) -> None:
        """Rewrite the file with one line per live id (``_lock`` held)."""
        self.close_file()
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(line.encode() + b"\n" for line in list(self._lines.values())))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        with contextlib.suppress(OSError):
            fd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._written = len(self._lines)

    def close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message)
        self.code = code


class TransactionCoordinator:
    """Kafka's transaction coordinator over a :class:`~.log.KafkaLog`.

    Args:
        kafka_log: the partitions (markers are written through it; it asks
            :meth:`check_produce` of every transactional batch).
        offsets: where a committed transaction's offsets go.
        data_dir: where the state file lives.
        max_timeout_ms: the longest transaction timeout a producer may ask
            (transaction.max.timeout.ms; INVALID_TRANSACTION_TIMEOUT beyond).
        id_expiration_ms: a transactional id without an open transaction is forgotten
            after this long unused (transactional.id.expiration.ms).
        abort_check_interval_ms: how often timed-out transactions are looked for.
        max_transactional_ids: the most transactional ids kept.
        clock: wall-clock seconds (the state file keeps times across restarts).
        acls: the authorizer (None: nothing is checked).
        groups: the group coordinator, whose ``check_txn_offset_commit`` judges a
            TxnOffsetCommit v3+'s generation, member id and group instance id (KIP-447);
            None: not checked.
    """

    #: API key -> (min, max) version answered (InitProducerId is the handler's, which
    #: hands the transactional ones here).
    VERSIONS: ClassVar[dict[int, tuple[int, int]]] = {
        ADD_PARTITIONS_TO_TXN: (0, 3),  # v4+ is broker-to-broker (KIP-890)
        ADD_OFFSETS_TO_TXN: (0, 3),
        END_TXN: (0, 3),
        TXN_OFFSET_COMMIT: (0, 3),
    }

    def __init__(
        self,
        kafka_log: KafkaLog,
        offsets: OffsetStore,
        data_dir: str,
        *,
        max_timeout_ms: int = DEFAULT_TRANSACTION_MAX_TIMEOUT_MS,
        id_expiration_ms: int = DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
        abort_check_interval_ms: int = DEFAULT_TRANSACTION_ABORT_CHECK_INTERVAL_MS,
        max_transactional_ids: int = DEFAULT_MAX_TRANSACTIONAL_IDS,
        clock: Callable[[], float] = time.time,
        acls: Authorizer | None = None,
        groups: Any = None,
    ) -> None:
        #: With SASL on, the ACLs: a transactional id needs WRITE on its TRANSACTIONAL_ID.
        self.acls = acls
        self.groups = groups
        self.log = kafka_log
        self.offsets = offsets
        self.max_timeout_ms = max_timeout_ms
        self.id_expiration_ms = id_expiration_ms
        self.abort_check_s = abort_check_interval_ms / 1000
        self.max_transactional_ids = max_transactional_ids
        self.clock = clock
        self._lock = threading.Lock()  # guards _txns
        self._txns: dict[str, _Txn] = {}
        #: What the produce path reads (no locks): producer id -> its current epoch, and
        #: -> (epoch, partitions) of its Ongoing transaction.
        self._epochs: dict[int, int] = {}
        self._ongoing: dict[int, tuple[int, frozenset[str]]] = {}
        #: The offsets of open transactions not yet committed (KIP-447's pending offsets):
        #: group -> (topic, partition) -> the transactional ids holding one, and each
        #: id's entries; kept by :meth:`_persist`, read by OffsetFetch's require_stable.
        self._pending_lock = threading.Lock()
        self._pending: dict[str, dict[tuple[str, int], set[str]]] = {}
        self._pending_of: dict[str, set[tuple[str, str, int]]] = {}
        self._state = _StateLog(os.path.join(data_dir, STATE_FILE))
        self._handlers: dict[int, Callable[[Any, int, Any], dict[str, Any]]] = {
            INIT_PRODUCER_ID: self._init_producer_id,
            ADD_PARTITIONS_TO_TXN: self._add_partitions,
            ADD_OFFSETS_TO_TXN: self._add_offsets,
            END_TXN: self._end_txn,
            TXN_OFFSET_COMMIT: self._txn_offset_commit,
        }
        self._closed = threading.Event()
        self._reaper: threading.Thread | None = None

    # -- life ------------------------------------------------------------------------------
    def recover(self) -> None:
        """Load the state file and finish what a crash left (see the module docstring),
        then start the timeout thread and take the log's transactional batches."""
        for d in self._state.load():
            try:
                txn = _Txn.of(d)
            except (KeyError, ValueError, TypeError) as exc:
                log.warning("transaction state of %r unreadable, dropped: %s", d.get("id"), exc)
                continue
            self._txns[txn.tid] = txn
            self._epochs[txn.producer_id] = txn.epoch
            self._index_pending(txn)
        finished = 0
        for txn in list(self._txns.values()):
            with txn.lock:
                if txn.state == PREPARE_COMMIT:
                    self._complete(txn)
                elif txn.state in (ONGOING, PREPARE_ABORT):
                    self._bump(txn)
                    self._decide(txn, commit=False)
                else:
                    continue
                finished += 1
        log.info(
            "transactions: %d transactional ids loaded, %d interrupted transactions finished", len(self._txns), finished
        )
        self.log.transactions = self.check_produce
        self._reaper = threading.Thread(target=self._reap, name="kafka-txn-coordinator", daemon=True)
        self._reaper.start()

    def close(self) -> None:
        self._closed.set()
        if self._reaper is not None and self._reaper.is_alive() and self._reaper is not threading.current_thread():
            self._reaper.join(timeout=5)
        self._state.close_file()

    def _reap(self) -> None:
        while not self._closed.wait(self.abort_check_s):
            try:
                self.expire()
            except Exception:
                log.exception("transaction timeout check failed")

    def expire(self) -> None:
        """Abort the Ongoing transactions older than their timeout (with an epoch bump:
        the producer is fenced), forget ids unused for ``id_expiration_ms``."""
        now = self._now_ms()
        with self._lock:
            txns = list(self._txns.values())
        for txn in txns:
            with txn.lock:
                if txn.state == ONGOING and now - txn.started_ms > txn.timeout_ms:
                    log.info(
                        "transaction of %r (producer %d, epoch %d) timed out after %d ms: aborted",
                        txn.tid, txn.producer_id, txn.epoch, txn.timeout_ms,
                    )  # fmt: skip
                    self._bump(txn)
                    self._decide(txn, commit=False)
                elif txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                    self._complete(txn)  # markers that failed before: again
                elif (
                    txn.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) and now - txn.used_ms > self.id_expiration_ms
                ):
                    with self._lock:
                        self._txns.pop(txn.tid, None)
                    self._epochs.pop(txn.producer_id, None)
                    self._state.write(txn.tid, None)
                    log.info("transactional id %r expired (unused for %d ms)", txn.tid, now - txn.used_ms)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- the produce path's check (no locks) ------------------------------------------------
    def check_produce(self, producer_id: int, epoch: int, name: str) -> tuple[int, str] | None:
        """None if a transactional batch of ``producer_id`` at ``epoch`` may go to luxun
        topic ``name``, else ``(error code, message)``."""
        current = self._epochs.get(producer_id)
        if current is not None and epoch < current:
            return _E.invalid_producer_epoch.value, f"producer {producer_id} epoch {epoch} is fenced (now {current})"
        ongoing = self._ongoing.get(producer_id)
        if ongoing is None or ongoing[0] != epoch or name not in ongoing[1]:
            topic, partition = partition_of(name)
            return _E.invalid_txn_state.value, (
                f"partition {topic}-{partition} is not in an open transaction of producer {producer_id} "
                f"epoch {epoch} (AddPartitionsToTxn first)"
            )
        return None

    # -- requests ------------------------------------------------------------------------
    def handle(self, api_key: int, version: int, request: Any, session: Any = None) -> Any:
        """The response (a kio entity) to a transaction request."""
        values = self._handlers[api_key](request, version, session)
        return build(response_schema(api_key, version), **values)

    def _persist(self, txn: _Txn) -> None:
        txn.used_ms = self._now_ms()
        self._state.write(txn.tid, txn.line())
        self._index_pending(txn)

    def _index_pending(self, txn: _Txn) -> None:
        """Make the pending-offsets index hold what ``txn`` holds (its lock held)."""
        now = {(g, t, p) for g, pending in txn.offsets.items() for (t, p) in pending}
        with self._pending_lock:
            before = self._pending_of.get(txn.tid, set())
            if now == before:
                return
            for g, t, p in before - now:
                holders = self._pending[g][(t, p)]
                holders.discard(txn.tid)
                if not holders:
                    del self._pending[g][(t, p)]
                    if not self._pending[g]:
                        del self._pending[g]
            for g, t, p in now - before:
                self._pending.setdefault(g, {}).setdefault((t, p), set()).add(txn.tid)
            if now:
                self._pending_of[txn.tid] = now
            else:
                self._pending_of.pop(txn.tid, None)

    def pending_offsets(self, group: str) -> frozenset[tuple[str, int]]:
        """The ``(topic, partition)`` of ``group`` with an offset in an open transaction
        (TxnOffsetCommit'ed, not yet committed or aborted): OffsetFetch with
        ``require_stable`` answers UNSTABLE_OFFSET_COMMIT for them, as Kafka."""
        with self._pending_lock:
            return frozenset(self._pending.get(group, ()))

    def _publish(self, txn: _Txn) -> None:
        """Make the produce path's view of ``txn`` what its state says."""
        self._epochs[txn.producer_id] = txn.epoch
        if txn.state == ONGOING:
            self._ongoing[txn.producer_id] = (txn.epoch, frozenset(txn.partitions))
        else:
            self._ongoing.pop(txn.producer_id, None)

    def _bump(self, txn: _Txn) -> None:
        """A new epoch (a new producer id when the epoch would overflow)."""
        if txn.epoch >= _MAX_EPOCH:
            self._ongoing.pop(txn.producer_id, None)
            txn.producer_id, txn.epoch = self.log.next_producer_id(), 0
        else:
            txn.epoch += 1
        self._epochs[txn.producer_id] = txn.epoch

    def _authorize(self, session: Any, tid: str) -> bool:
        """Whether ``session`` may use transactional id ``tid``: WRITE on its
        TRANSACTIONAL_ID (with SASL off, or for a super user, always)."""
        return self._may(session, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid)

    def _may(self, session: Any, op: Operation, rtype: ResourceType, name: str) -> bool:
        """Whether ``session`` may do ``op`` on the resource (SASL off: always)."""
        return allows(self.acls, session, op, rtype, name)

    def _init_producer_id(self, request: Any, version: int, session: Any) -> dict[str, Any]:
        tid = request.transactional_id
        timeout_ms = ms_of(request.transaction_timeout)

        def error(code: ErrorCode) -> dict[str, Any]:
            return {"error_code": code, "producer_id": -1, "producer_epoch": -1}

        if tid == "":
            return error(_E.invalid_request)
        if not self._authorize(session, tid):
            return error(_E.transactional_id_authorization_failed)
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return error(_E.invalid_transaction_timeout)
        with self._lock:
            txn = self._txns.get(tid)
            if txn is None:
                if len(self._txns) >= self.max_transactional_ids:
                    log.warning(
                        "InitProducerId for %r refused: %d transactional ids are kept, the most allowed "
                        "(max.transactional.ids)", tid, len(self._txns),
                    )  # fmt: skip
                    return error(_E.policy_violation)
                txn = _Txn(tid, self.log.next_producer_id(), -1, timeout_ms)
                self._txns[tid] = txn
        with txn.lock:
            given_pid, given_epoch = getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1)
            if given_pid != -1 and (given_pid != txn.producer_id or given_epoch != txn.epoch):  # KIP-360
                return error(_fenced(version, 4))
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT) and not self._complete(txn):
                return error(_E.concurrent_transactions)
            if txn.state == ONGOING:  # the previous epoch's transaction: aborted, that producer fenced
                self._bump(txn)
                if not self._decide(txn, commit=False):
                    return error(_E.concurrent_transactions)
            else:
                self._bump(txn)
            txn.timeout_ms = timeout_ms
            txn.state = EMPTY
            self._persist(txn)
            self._publish(txn)
            return {"error_code": _E.none, "producer_id": txn.producer_id, "producer_epoch": txn.epoch}

    def _check(self, tid: str, producer_id: int, session: Any) -> _Txn:
        """The transaction of a request, its lock NOT held; raises :class:`_Refused`."""
        if not self._authorize(session, tid):
            raise _Refused(_E.transactional_id_authorization_failed)
        txn = self._txns.get(tid)
        if txn is None or txn.producer_id != producer_id:
            raise _Refused(_E.invalid_producer_id_mapping)
        return txn

    def _check_locked(self, txn: _Txn, producer_id: int, epoch: int, version: int, fenced_since: int | None) -> None:
        if txn.producer_id != producer_id:
            raise _Refused(_E.invalid_producer_id_mapping)
        if epoch != txn.epoch:
            raise _Refused(_fenced(version, fenced_since))
        if txn.state in (PREPARE_COMMIT, PREPARE_ABORT) and not self._complete(txn):
            raise _Refused(_E.concurrent_transactions)

    def _begin(self, txn: _Txn) -> None:
        if txn.state != ONGOING:
            txn.state = ONGOING
            txn.started_ms = self._now_ms()
            txn.partitions.clear()
            txn.offsets.clear()

    def _add_partitions(self, request: Any, version: int, session: Any) -> dict[str, Any]:
        tid = request.v3_and_below_transactional_id
        pid, epoch = request.v3_and_below_producer_id, request.v3_and_below_producer_epoch
        topics = request.v3_and_below_topics

        def answer(codes: dict[tuple[str, int], ErrorCode]) -> dict[str, Any]:
            return {
                "results_by_topic_v3_and_below": [
                    {
                        "name": t.name,
                        "results_by_partition": [
                            {"partition_index": p, "partition_error_code": codes[(t.name, p)]} for p in t.partitions
                        ],
                    }
                    for t in topics
                ]
            }

        wanted = [(t.name, int(p)) for t in topics for p in t.partitions]
        try:
            txn = self._check(tid, pid, session)
            with txn.lock:
                self._check_locked(txn, pid, epoch, version, 2)
                # Kafka: WRITE on each topic; then each partition known
                denied = {tp for tp in wanted if not self._may(session, Operation.WRITE, ResourceType.TOPIC, tp[0])}
                first_error = _E.topic_authorization_failed
                unknown = denied or {tp for tp in wanted if not self._exists(*tp)}
                if unknown and not denied:
                    first_error = _E.unknown_topic_or_partition
                if unknown:
                    return answer({tp: first_error if tp in unknown else _E.operation_not_attempted for tp in wanted})
                self._begin(txn)
                txn.partitions.update(partition_topic(t, p) for t, p in wanted)
                self._persist(txn)
                self._publish(txn)
        except _Refused as exc:
            return answer(dict.fromkeys(wanted, exc.code))
        return answer(dict.fromkeys(wanted, _E.none))

    def _exists(self, topic: str, partition: int) -> bool:
        info = self.log.describe(topic)
        return info is not None and 0 <= partition < info.partitions

    def _add_offsets(self, request: Any, version: int, session: Any) -> dict[str, Any]:
        try:
            txn = self._check(request.transactional_id, request.producer_id, session)
            if not self._may(session, Operation.READ, ResourceType.GROUP, request.group_id):
                raise _Refused(_E.group_authorization_failed)
            with txn.lock:
                self._check_locked(txn, request.producer_id, request.producer_epoch, version, 2)
                if not request.group_id:
                    raise _Refused(_E.invalid_group_id)
                self._begin(txn)
                txn.offsets.setdefault(request.group_id, {})
                self._persist(txn)
                self._publish(txn)
        except _Refused as exc:
            return {"error_code": exc.code}
        return {"error_code": _E.none}

    def _txn_offset_commit(self, request: Any, version: int, session: Any) -> dict[str, Any]:
        codes: dict[tuple[str, int], ErrorCode] = {}

        def answer() -> dict[str, Any]:
            return {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {"partition_index": p.partition_index, "error_code": codes[(t.name, p.partition_index)]}
                            for p in t.partitions
                        ],
                    }
                    for t in request.topics
                ]
            }

        wanted = [(t.name, p) for t in request.topics for p in t.partitions]
        try:
            txn = self._check(request.transactional_id, request.producer_id, session)
            if not self._may(session, Operation.READ, ResourceType.GROUP, request.group_id):
                raise _Refused(_E.group_authorization_failed)
            with txn.lock:
                self._check_locked(txn, request.producer_id, request.producer_epoch, version, None)
                pending = txn.offsets.get(request.group_id)
                if txn.state != ONGOING or pending is None:  # AddOffsetsToTxn first
                    raise _Refused(_E.invalid_txn_state)
                if version >= 3 and self.groups is not None:  # KIP-447: the group's member?
                    refusal = self.groups.check_txn_offset_commit(
                        request.group_id, request.member_id, request.group_instance_id, request.generation_id
                    )
                    if refusal is not None:
                        log.info(
                            "TxnOffsetCommit of %r to group %r (member %r, instance %r, generation %d): %s",
                            txn.tid, request.group_id, request.member_id, request.group_instance_id,
                            request.generation_id, refusal.name,
                        )  # fmt: skip
                        raise _Refused(refusal)
                for topic, p in wanted:
                    meta = p.committed_metadata
                    if not self._may(session, Operation.READ, ResourceType.TOPIC, topic):
                        codes[(topic, p.partition_index)] = _E.topic_authorization_failed
                    elif not self._exists(topic, p.partition_index):
                        codes[(topic, p.partition_index)] = _E.unknown_topic_or_partition
                    elif meta is not None and len(meta.encode()) > self.offsets.max_metadata_bytes:
                        codes[(topic, p.partition_index)] = _E.offset_metadata_too_large
                    elif p.committed_offset < 0:
                        codes[(topic, p.partition_index)] = _E.invalid_request
                    else:
                        pending[(topic, p.partition_index)] = (int(p.committed_offset), meta)
                        codes[(topic, p.partition_index)] = _E.none
                self._persist(txn)
        except _Refused as exc:
            codes = {(t, p.partition_index): exc.code for t, p in wanted}
        return answer()

    def _end_txn(self, request: Any, version: int, session: Any) -> dict[str, Any]:
        commit = bool(request.committed)
        try:
            txn = self._check(request.transactional_id, request.producer_id, session)
            with txn.lock:
                if txn.producer_id != request.producer_id:
                    raise _Refused(_E.invalid_producer_id_mapping)
                if request.producer_epoch != txn.epoch:
                    raise _Refused(_fenced(version, 2))
                done = COMPLETE_COMMIT if commit else COMPLETE_ABORT
                preparing = PREPARE_COMMIT if commit else PREPARE_ABORT
                if txn.state == done:
                    return {"error_code": _E.none}  # a retry
                if txn.state == preparing:
                    return {"error_code": _E.none if self._complete(txn) else _E.concurrent_transactions}
                if txn.state != ONGOING:
                    log.info(
                        "EndTxn(%s) of %r in state %s refused (INVALID_TXN_STATE)",
                        "commit" if commit else "abort", txn.tid, txn.state,
                    )  # fmt: skip
                    raise _Refused(_E.invalid_txn_state)
                if not self._decide(txn, commit):
                    return {"error_code": _E.concurrent_transactions}  # the markers are retried
        except _Refused as exc:
            return {"error_code": exc.code}
        return {"error_code": _E.none}

    # -- ending a transaction (txn.lock held) ---------------------------------------------
    def _decide(self, txn: _Txn, commit: bool) -> bool:
        """Persist the decision (the commit point), then complete it: True if done."""
        txn.state = PREPARE_COMMIT if commit else PREPARE_ABORT
        self._persist(txn)
        self._publish(txn)  # no more transactional batches of it
        return self._complete(txn)

    def _complete(self, txn: _Txn) -> bool:
        """Write the markers of a Prepare* transaction and, on commit, its offsets; then
        Complete*. False if a marker could not be written (the state stays Prepare*:
        done again by the next request or the timeout thread)."""
        commit = txn.state == PREPARE_COMMIT
        for name in sorted(txn.partitions):
            code, message = self.log.write_marker(name, txn.producer_id, txn.epoch, commit)
            if code != 0:
                log.warning("transaction of %r: %s (tried again later)", txn.tid, message)
                return False
        if commit:
            for group, pending in txn.offsets.items():
                for (topic, partition), (offset, meta) in pending.items():
                    code = self.offsets.commit(group, topic, partition, offset, meta)
                    if code != _E.none:
                        log.warning(
                            "transaction of %r: offset %d of group %r on %s-%d not committed: %s",
                            txn.tid, offset, group, topic, partition, code.name,
                        )  # fmt: skip
        txn.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        txn.partitions.clear()
        txn.offsets.clear()
        self._persist(txn)
        self._publish(txn)
        return True

    # -- for tests and status pages ----------------------------------------------------------
    def describe(self, tid: str) -> tuple[str, int, int] | None:
        """``(state, producer id, epoch)`` of a transactional id, None if unknown."""
        txn = self._txns.get(tid)
        return None if txn is None else (txn.state, txn.producer_id, txn.epoch)


def _fenced(version: int, fenced_since: int | None) -> ErrorCode:
    """PRODUCER_FENCED from the version that has it (KIP-588), else INVALID_PRODUCER_EPOCH."""
    if fenced_since is not None and version >= fenced_since:
        return _E.producer_fenced
    return _E.invalid_producer_epoch
