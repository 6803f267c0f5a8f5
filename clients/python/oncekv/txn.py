"""Transactions: compares, then one branch of operations, applied whole at
one revision (the Rust ``Txn``, ``Compare`` and ``TxnOp`` builders).

    from oncekv import Compare, Txn, TxnOp

    transfer = (
        Txn()
        .compare(Compare.value("acct/a", ">=", b"10"), Compare.exists("acct/b"))
        .on_success(TxnOp.incr("acct/a", -10), TxnOp.incr("acct/b", 10))
        .on_failure(TxnOp.get("acct/a"))
    )
    result = client.txn(transfer)        # or session.txn(transfer)
    result.succeeded, result.results, result.revision, result.replayed

The builders make the wire's ``oncekv.v1.Compare`` and ``oncekv.v1.TxnOp``
messages; ``Txn.to_proto()`` makes an ``oncekv.v1.Txn``. An absent key has
version and revisions 0, and a value compare on it is false (even
``!=``). With ``prefix=True`` a compare holds when it holds for every
key under the prefix (``exists``: for any). Value compares order bytes,
as the server does (``b"10" < b"9"``).
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Union

from oncekv._proto import kv_pb2 as pb

Bytes = Union[bytes, str]

_OPS = {
    "==": pb.COMPARE_OP_EQUAL,
    "=": pb.COMPARE_OP_EQUAL,
    "!=": pb.COMPARE_OP_NOT_EQUAL,
    "<": pb.COMPARE_OP_LESS,
    ">": pb.COMPARE_OP_GREATER,
}


def _b(value, what: str) -> bytes:
    from oncekv.client import _bytes

    return _bytes(value, what)


def _op(op) -> int:
    if isinstance(op, str):
        try:
            return _OPS[op.strip()]
        except KeyError:
            raise ValueError(f"a compare operator is one of == != < >, not {op!r}") from None
    if isinstance(op, int) and op in _OPS.values():
        return op
    raise ValueError(f"a compare operator is one of == != < > (or a CompareOp), not {op!r}")


class Compare:
    """Makes ``oncekv.v1.Compare`` messages. ``op`` is ``"=="``, ``"!="``,
    ``"<"`` or ``">"``; ``prefix=True`` compares every key under ``key``."""

    @staticmethod
    def value(key: Bytes, op, value: Bytes, prefix: bool = False) -> pb.Compare:
        """The value against ``value`` (bytes order)."""
        return pb.Compare(key=_b(key, "key"), prefix=prefix, op=_op(op), value=_b(value, "value"))

    @staticmethod
    def version(key: Bytes, op, version: int, prefix: bool = False) -> pb.Compare:
        """How many times the key was written since it was created (0:
        absent)."""
        return pb.Compare(key=_b(key, "key"), prefix=prefix, op=_op(op), version=int(version))

    @staticmethod
    def create_revision(key: Bytes, op, revision: int, prefix: bool = False) -> pb.Compare:
        """The revision that created the key (0: absent)."""
        return pb.Compare(key=_b(key, "key"), prefix=prefix, op=_op(op), create_revision=int(revision))

    @staticmethod
    def mod_revision(key: Bytes, op, revision: int, prefix: bool = False) -> pb.Compare:
        """The revision that last changed the key (0: absent)."""
        return pb.Compare(key=_b(key, "key"), prefix=prefix, op=_op(op), mod_revision=int(revision))

    @staticmethod
    def exists(key: Bytes, exists: bool = True, prefix: bool = False) -> pb.Compare:
        """Whether the key exists (with ``prefix``: any key under it)."""
        return pb.Compare(key=_b(key, "key"), prefix=prefix, op=pb.COMPARE_OP_EQUAL, exists=bool(exists))

    @staticmethod
    def absent(key: Bytes, prefix: bool = False) -> pb.Compare:
        """The key does not exist (with ``prefix``: no key under it)."""
        return Compare.exists(key, False, prefix)

    # The Rust names.
    create = create_revision
    mod = mod_revision


class TxnOp:
    """Makes ``oncekv.v1.TxnOp`` messages."""

    @staticmethod
    def put(key: Bytes, value: Bytes, lease: Optional[str] = None) -> pb.TxnOp:
        put = pb.Put(key=_b(key, "key"), value=_b(value, "value"))
        if lease is not None:
            put.lease = lease
        return pb.TxnOp(put=put)

    @staticmethod
    def get(key: Bytes) -> pb.TxnOp:
        return pb.TxnOp(get=pb.Get(key=_b(key, "key")))

    @staticmethod
    def scan(prefix: Bytes = b"", limit: int = 0) -> pb.TxnOp:
        return pb.TxnOp(scan=pb.Scan(prefix=_b(prefix, "prefix"), limit=int(limit)))

    @staticmethod
    def delete(key: Bytes) -> pb.TxnOp:
        return pb.TxnOp(delete=pb.Delete(key=_b(key, "key")))

    @staticmethod
    def delete_prefix(prefix: Bytes) -> pb.TxnOp:
        return pb.TxnOp(delete_prefix=pb.Delete(key=_b(prefix, "prefix")))

    @staticmethod
    def append(key: Bytes, value: Bytes) -> pb.TxnOp:
        return pb.TxnOp(append=pb.Append(key=_b(key, "key"), value=_b(value, "value")))

    @staticmethod
    def incr(key: Bytes, by: int = 1) -> pb.TxnOp:
        return pb.TxnOp(incr=pb.Incr(key=_b(key, "key"), by=int(by)))

    @staticmethod
    def cas(key: Bytes, expected: Optional[Bytes], new: Bytes) -> pb.TxnOp:
        cas = pb.Cas(key=_b(key, "key"), new_value=_b(new, "new value"))
        if expected is not None:
            cas.expected = _b(expected, "expected value")
        return pb.TxnOp(cas=cas)


class Txn:
    """A transaction being built: if every compare holds, the ``success``
    operations run, else the ``failure`` ones; all at one revision, whole
    or not at all (one refused operation undoes it: :class:`Rejected`)."""

    def __init__(
        self,
        compare: Iterable[pb.Compare] = (),
        success: Iterable[pb.TxnOp] = (),
        failure: Iterable[pb.TxnOp] = (),
    ):
        self.compares: List[pb.Compare] = list(compare)
        self.success: List[pb.TxnOp] = list(success)
        self.failure: List[pb.TxnOp] = list(failure)

    def compare(self, *compares: pb.Compare) -> "Txn":
        self.compares.extend(compares)
        return self

    def on_success(self, *ops: pb.TxnOp) -> "Txn":
        self.success.extend(ops)
        return self

    def on_failure(self, *ops: pb.TxnOp) -> "Txn":
        self.failure.extend(ops)
        return self

    def to_proto(self) -> pb.Txn:
        return pb.Txn(compare=self.compares, success=self.success, failure=self.failure)

    def __repr__(self) -> str:
        return f"Txn(compare={len(self.compares)}, success={len(self.success)}, failure={len(self.failure)})"


def txn_command(txn: Union[Txn, pb.Txn]) -> pb.Command:
    """The ``Command`` carrying ``txn`` (a :class:`Txn` or an
    ``oncekv.v1.Txn``)."""
    if isinstance(txn, Txn):
        txn = txn.to_proto()
    if not isinstance(txn, pb.Txn):
        raise TypeError(f"a transaction is a Txn or an oncekv.v1.Txn, not {type(txn).__name__}")
    return pb.Command(txn=txn)
