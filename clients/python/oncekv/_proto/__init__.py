"""The generated gRPC stubs of ``oncekv.v1`` (``kv_pb2``, ``kv_pb2_grpc``).

They are generated from ``crates/oncekv-proto/proto/oncekv/v1/kv.proto`` by
``clients/python/generate.py`` and not kept in git.
"""

try:
    from oncekv._proto import kv_pb2, kv_pb2_grpc  # noqa: F401
except ImportError as error:  # pragma: no cover - a setup problem
    raise ImportError(
        "the oncekv gRPC stubs are missing: run `python clients/python/generate.py` "
        "(needs grpcio-tools) before using or installing the package"
    ) from error
