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
