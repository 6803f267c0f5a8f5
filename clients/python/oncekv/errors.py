"""What the client knows when a call does not end with a reply.

Every exception derives from :class:`OncekvError` and says, in
``not_applied``, whether the request definitely did not apply. Only
:class:`OutcomeUnknown` has ``not_applied = False``: the request may or may
not have applied (and may still apply). This mirrors the Rust client's
``ClientError`` and its ``not_applied()``.
"""

from __future__ import annotations

from typing import Optional, Tuple


class OncekvError(Exception):
    """The base of every error the client raises."""

    #: Whether the request definitely did not apply (so the caller may
    #: safely do something else instead).
    not_applied: bool = True


class Rejected(OncekvError):
    """Applied with an application-level "no" (a CAS on a missing lease,
    INCR on text, a lease that exists, a value over the limit, ...).
    Definite: nothing changed."""

    def __init__(self, kind: str, message: str, detail=None):
        self.kind = kind
        self.message = message
        #: The ``oncekv.v1.Rejection`` message as received.
        self.detail = detail
        super().__init__(f"rejected: {message or kind}")


class SessionExpired(OncekvError):
    """The session expired (or was closed): this call did not apply the
    request. Open a new session. (When an earlier attempt of the same call
    may have applied, the client raises :class:`OutcomeUnknown` instead.)"""

    def __init__(self):
        super().__init__("session expired: this send of the request was not applied")


class Unauthorized(OncekvError):
    """The session secret was wrong (or, with authentication on, the session
    belongs to another user): not applied."""

    def __init__(self):
        super().__init__("unauthorized: wrong session secret, not applied")


class Stale(OncekvError):
    """The sequence number was already acknowledged and its record freed:
    not applied again."""

    def __init__(self, floor: int):
        self.floor = floor
        super().__init__(f"stale request: sequence numbers below {floor} were acknowledged")


class SequenceGap(OncekvError):
    """The sequence number is beyond the session's window: not applied."""

    def __init__(self, expected: int):
        self.expected = expected
        super().__init__(f"sequence gap: the next sequence number expected is {expected}")


class RequestMismatch(OncekvError):
    """The sequence number or idempotency key was used before for a
    different command: not applied."""

    def __init__(self):
        super().__init__(
            "request mismatch: that sequence number or key was used for another command"
        )


class Malformed(OncekvError):
    """The request's framing was refused (sequence number 0, an
    acknowledgement ahead of the request, a bad key length): not applied."""

    def __init__(self, kind: str, reason: str):
        self.kind = kind
        self.reason = reason
        super().__init__(f"malformed request: {reason or kind}")


class Invalid(OncekvError):
    """The request was refused before proposing: not applied."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"invalid request: {reason}")


class Compacted(Rejected):
    """A read of the past (or a watch) from a revision the history no
    longer reaches: ``revision`` asked for, ``compacted`` the history's
    compacted revision (everything at or below it is gone). Definite.
    For a watch, raised when its start (or next) revision is compacted."""

    def __init__(self, revision: int, compacted: int, message: str = "", detail=None):
        self.revision = revision
        self.compacted = compacted
        super().__init__(
            "compacted", message or f"revision {revision} is compacted (history starts after {compacted})", detail
        )


class FutureRevision(Rejected):
    """A read of (or compaction to) a revision beyond the last applied one,
    ``current``. Definite."""

    def __init__(self, revision: int, current: int, message: str = "", detail=None):
        self.revision = revision
        self.current = current
        super().__init__("future_revision", message or f"revision {revision} is beyond {current}", detail)


class NotVersioned(Rejected):
    """Only a get or a scan can read a past revision. Definite."""

    def __init__(self, message: str = "", detail=None):
        super().__init__("not_versioned", message or "only a get or a scan reads a past revision", detail)


class _TxnRefused(Rejected, Invalid):
    """A transaction refused for its shape, before anything ran: nothing
    applied. The leader refuses it before proposing (the wire's
    ``Failure.invalid``, recognized by its text, so it is an
    :class:`Invalid` too); should the state machine refuse it, it is the
    rejection of the same name."""

    def _init(self, kind: str, message: str, detail) -> None:
        self.kind = kind
        self.message = message
        self.detail = detail
        self.reason = message
        Exception.__init__(self, f"rejected: {message}")


class TxnTooLarge(_TxnRefused):
    """A transaction with more compares or operations per branch (``ops``)
    than the cluster allows (``max``, ``serve --txn-ops-max``)."""

    def __init__(self, ops: int, maximum: int, message: str = "", detail=None):
        self.ops = ops
        self.max = maximum
        self._init(
            "txn_too_large",
            message or f"a transaction may hold {maximum} compares and {maximum} operations per branch, got {ops}",
            detail,
        )


class TxnConflict(_TxnRefused):
    """A transaction writes ``key`` twice, or under a prefix it deletes."""

    def __init__(self, key: str, message: str = "", detail=None):
        self.key = key
        self._init(
            "txn_conflict", message or f"a transaction writes key {key!r} twice, or under a prefix it deletes", detail
        )


class ReplyTooLarge(Rejected):
    """A transaction whose reads would answer more than the cluster allows
    in one reply (``max`` bytes, twice ``serve --scan-bytes-max``): refused
    whole, its writes undone. Definite: nothing changed. Read less per
    transaction (scans with a limit, fewer gets)."""

    def __init__(self, size: int, maximum: int, message: str = "", detail=None):
        #: The bytes the reply reached when it was refused.
        self.bytes = size
        self.max = maximum
        super().__init__(
            "reply_too_large",
            message or f"the transaction's reply reaches {size} bytes, over the limit of {maximum}",
            detail,
        )


class Overloaded(OncekvError):
    """A bounded table or budget of the cluster is full of live entries
    (sessions, idempotency keys, record bytes, the store's quota): not
    applied, nothing evicted. The client retries it until its deadline
    before raising this, except ``OVERLOAD_KIND_NO_SPACE`` (the store's
    quota or an alarm: only an operator lifts it), raised at once."""

    def __init__(self, kind: str, maximum: int, reason: str):
        self.kind = kind
        self.max = maximum
        self.reason = reason
        super().__init__(f"overloaded, not applied: {reason or kind}")


class Unauthenticated(OncekvError):
    """The cluster enforces authentication and the call named no valid user
    (no credentials, a wrong password, an expired token): not applied."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"unauthenticated, not applied: {reason}")


class PermissionDenied(OncekvError):
    """The user may not do this (a key outside its grants, an admin call,
    another user's session): not applied."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"permission denied, not applied: {reason}")


class Unreachable(OncekvError):
    """No node could be reached, and nothing was sent: no attempt was ever
    handed to a connection (none became ready before the deadline), or
    every node that answered promised it proposed nothing. Not applied.

    Never raised for a request that changes state once a send of it may
    have been delivered, in this call or, as ``maybe_delivered=True`` says,
    an earlier one: that is :class:`OutcomeUnknown`."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"no node reachable: {reason}")


class ConfigError(OncekvError, ValueError):
    """The client was configured wrongly (nothing was sent)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"configuration: {reason}")


class OutcomeUnknown(OncekvError):
    """No definite answer: the request may or may not have applied (and may
    still apply).

    A send may have been delivered when a call was made on a ready
    connection and failed without a typed promise that nothing was
    proposed (a reset, a closed connection, a deadline, an unexpected
    answer). Raised when:

    * a plain (not deduplicated) mutation may have been sent: it is never
      sent again;
    * the deadline passes after a send that may have been delivered;
    * a request that changes state had a send that may have been
      delivered, in this call or in an earlier one (``maybe_delivered=True``
      to :meth:`Session.execute_seq`, :meth:`Session.txn_seq` or
      :meth:`Client.execute_request`), and the call then ends with anything
      but the request's reply (applied or replayed, an application-level
      rejection included) or :class:`RequestMismatch`: an error
      (:class:`Unreachable`, :class:`Unauthenticated`,
      :class:`PermissionDenied`, :class:`Invalid`, a failed login, still
      :class:`Overloaded` at the deadline) or a refusal
      (``SessionExpired``, ``Stale``, ``Unauthorized``, ``SequenceGap``,
      ``Malformed``, ``Overloaded``, ``PermissionDenied``), none of which
      says anything about that send.

    ``last_error`` says why it may have applied and what the last attempt
    answered. To learn the outcome, send the request again under the same
    id, saying an earlier send may have been delivered: a session request
    with the same sequence number (:meth:`Session.execute_seq` with
    ``maybe_delivered=True``), a one-shot request with the same idempotency
    key (:meth:`Client.execute_request` with ``maybe_delivered=True``)."""

    not_applied = False

    def __init__(self, request_id: Optional[Tuple[int, int]], attempts: int, last_error: str = ""):
        #: ``(session_id, seq)`` for a session request, else ``None``.
        self.request_id = request_id
        self.attempts = attempts
        self.last_error = last_error
        of = f" of request {request_id[0]}:{request_id[1]}" if request_id else ""
        why = f" (last: {last_error})" if last_error else ""
        super().__init__(
            f"outcome unknown after {attempts} attempt(s){of}: "
            f"it may or may not have applied{why}"
        )


#: The Rust client's name for the base class.
ClientError = OncekvError

__all__ = [
    "OncekvError",
    "ClientError",
    "Rejected",
    "Compacted",
    "FutureRevision",
    "NotVersioned",
    "TxnTooLarge",
    "TxnConflict",
    "SessionExpired",
    "Unauthorized",
    "Stale",
    "SequenceGap",
    "RequestMismatch",
    "Malformed",
    "Invalid",
    "Overloaded",
    "Unauthenticated",
    "PermissionDenied",
    "Unreachable",
    "ConfigError",
    "OutcomeUnknown",
]
