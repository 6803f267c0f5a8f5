"""The oncekv client for Python: exactly-once from the caller's side.

A :class:`Client` finds the leader (following ``NotLeader`` hints, falling
back to the endpoints in turn) and retries with jittered exponential backoff
under a deadline. A :class:`Session` registers through the replicated log,
keeps itself alive, numbers requests and retries each with the same sequence
number, so every request applies once and a retry returns the original
response. One-shot calls use an idempotency key instead.

The client tells what is known: a reply, or an exception whose
``not_applied`` says whether the request definitely did not apply
(:class:`OutcomeUnknown` is the one that may have applied).

    from oncekv import Client

    with Client(["127.0.0.1:7379"]) as client:
        with client.open_session() as session:
            print(session.incr("balance", by=10).value)   # 10
"""

from oncekv.client import Backoff, Client
from oncekv.errors import (
    ClientError,
    Compacted,
    ConfigError,
    FutureRevision,
    Invalid,
    Malformed,
    NotVersioned,
    OncekvError,
    OutcomeUnknown,
    Overloaded,
    PermissionDenied,
    Rejected,
    RequestMismatch,
    SequenceGap,
    SessionExpired,
    Stale,
    TxnConflict,
    TxnTooLarge,
    ReplyTooLarge,
    Unauthenticated,
    Unauthorized,
    Unreachable,
)
from oncekv.results import (
    Changes,
    Completed,
    Event,
    KeyMeta,
    KeyValue,
    LeaseInfo,
    Progress,
    ScanResult,
    TxnResult,
)
from oncekv.session import Session
from oncekv.txn import Compare, Txn, TxnOp
from oncekv.watch import Watcher

__version__ = "0.1.0"

__all__ = [
    "Backoff",
    "Changes",
    "Client",
    "ClientError",
    "Compacted",
    "Compare",
    "Completed",
    "ConfigError",
    "Event",
    "FutureRevision",
    "Invalid",
    "KeyMeta",
    "KeyValue",
    "LeaseInfo",
    "Malformed",
    "NotVersioned",
    "OncekvError",
    "OutcomeUnknown",
    "Overloaded",
    "PermissionDenied",
    "Progress",
    "Rejected",
    "RequestMismatch",
    "ScanResult",
    "SequenceGap",
    "Session",
    "SessionExpired",
    "Stale",
    "Txn",
    "TxnConflict",
    "TxnOp",
    "TxnResult",
    "TxnTooLarge",
    "ReplyTooLarge",
    "Unauthenticated",
    "Unauthorized",
    "Unreachable",
    "Watcher",
]
