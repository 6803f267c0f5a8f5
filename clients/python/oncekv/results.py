"""What a call returns: a reply and how it was obtained."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple


@dataclass(frozen=True)
class Completed:
    """The reply to a mutation, and how it was obtained.

    ``value`` holds the reply's main value:

    ==================  ==============================================
    call                ``value``
    ==================  ==============================================
    put, delete         the previous value (bytes) or ``None``
    append              the new length of the value
    incr                the new integer value
    cas                 whether it swapped (also ``swapped``, ``current``)
    lease_grant         the expiry in cluster time, ms (also ``name``,
                        ``ttl_ms``, ``expires_at_ms``)
    lease_keep_alive    the new expiry (also ``name``, ``expires_at_ms``)
    lease_revoke        how many keys were deleted (also ``name``,
                        ``keys_deleted``)
    compact             the compacted revision now
    get (in a txn)      the value or ``None`` (also ``meta``)
    scan (in a txn)     a :class:`ScanResult` of :class:`KeyValue`
    delete_prefix       how many keys were deleted
    ==================  ==============================================
    """

    #: The reply's main value (see above).
    value: Any
    #: Whether the reply came from a completion record: the request had
    #: applied before (on an earlier attempt or run) and was not applied again.
    replayed: bool
    #: The log index where the request was applied.
    applied_index: int
    #: How many times this call sent it.
    attempts: int = 1
    #: The name of the reply kind (``"incr"``, ``"put"``, ...).
    kind: str = ""
    swapped: Optional[bool] = None
    current: Optional[bytes] = None
    name: Optional[str] = None
    ttl_ms: Optional[int] = None
    expires_at_ms: Optional[int] = None
    keys_deleted: Optional[int] = None
    #: A get's revisions (inside a transaction), when the key exists.
    meta: Optional["KeyMeta"] = None
    #: The ``oncekv.v1.Reply`` message as received.
    reply: Any = field(default=None, repr=False, compare=False)


class ScanResult(List[Tuple[bytes, bytes]]):
    """The ``(key, value)`` pairs of a scan, in key order; ``more`` says
    whether the limit cut it short."""

    def __init__(self, entries=(), more: bool = False):
        super().__init__(entries)
        self.more = more


@dataclass(frozen=True)
class LeaseInfo:
    """A live lease."""

    name: str
    ttl_ms: int
    expires_at_ms: int
    keys: int


@dataclass(frozen=True)
class SessionOpened:
    """What the cluster answered to a session open."""

    session_id: int
    secret: bytes
    ttl_ms: int
    window: int


@dataclass(frozen=True)
class KeyMeta:
    """A key's revisions (log indexes, equal on every replica): the
    revision that created it, the one that last changed it, and how many
    times it was written since it was created (the Rust ``KeyMeta``)."""

    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0


@dataclass(frozen=True)
class KeyValue:
    """A key with its value and revisions (the Rust ``KeyValue``)."""

    key: bytes
    value: bytes
    meta: KeyMeta = field(default_factory=KeyMeta)

    @property
    def create_revision(self) -> int:
        return self.meta.create_revision

    @property
    def mod_revision(self) -> int:
        return self.meta.mod_revision

    @property
    def version(self) -> int:
        return self.meta.version


@dataclass(frozen=True)
class TxnResult:
    """What a transaction did (the Rust ``TxnOutcome``)."""

    #: Whether every compare held (the success branch ran).
    succeeded: bool
    #: One :class:`Completed` per operation of the branch that ran.
    results: List[Completed]
    #: The revision it applied at (the original one for a replay).
    revision: int
    #: Whether this is the original answer of an earlier attempt.
    replayed: bool
    #: How many times this call sent it.
    attempts: int = 1
    #: The ``oncekv.v1.Reply`` message as received.
    reply: Any = field(default=None, repr=False, compare=False)


#: Event kinds of a watch.
PUT = "put"
DELETE = "delete"


@dataclass(frozen=True)
class Event:
    """One change of one key (the Rust ``watch::Event``)."""

    #: ``"put"`` or ``"delete"``.
    kind: str
    key: bytes
    #: The value after a put (empty after a delete).
    value: bytes
    #: The key's revisions after a put.
    meta: KeyMeta
    #: The value before, if asked for (``previous=True``) and the key existed.
    previous: Optional[bytes]
    #: The revision of the change.
    revision: int


@dataclass(frozen=True)
class Changes:
    """The changes of one revision to watched keys, in order (a
    transaction may change several keys at one revision); the Rust
    ``WatchUpdate::Changes``."""

    revision: int
    events: List[Event]


@dataclass(frozen=True)
class Progress:
    """Every change up to ``revision`` has been delivered (the Rust
    ``WatchUpdate::Progress``)."""

    revision: int
