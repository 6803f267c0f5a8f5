#!/usr/bin/env python3
"""Generates the gRPC stubs of the oncekv client API into oncekv/_proto/.

    python clients/python/generate.py

Runs grpc_tools.protoc (package grpcio-tools) on the wire contract,
crates/oncekv-proto/proto/oncekv/v1/kv.proto, unchanged. The file is mapped
to the virtual path oncekv/_proto/kv.proto so that the generated modules
import each other as oncekv._proto.kv_pb2; the protobuf package (oncekv.v1)
and service name (oncekv.v1.Kv) are those of the .proto file. The output is
git-ignored: run this again after the .proto file changes.

`pip install` and `pip wheel` run it themselves (setup.py's build hooks,
with grpcio-tools as a build requirement), so a checkout installs with no
step before. From an sdist, which carries the generated modules but not the
.proto file, the modules it carries are kept.
"""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
PROTO_DIR = HERE.parent.parent / "crates" / "oncekv-proto" / "proto" / "oncekv" / "v1"
OUT = HERE / "oncekv" / "_proto"


def generated() -> bool:
    """Whether the generated modules are in oncekv/_proto/."""
    return all((OUT / name).is_file() for name in ("kv_pb2.py", "kv_pb2_grpc.py", "kv_pb2.pyi"))


def main() -> int:
    try:
        from grpc_tools import protoc
    except ImportError:
        print("generate.py needs grpcio-tools: pip install grpcio-tools", file=sys.stderr)
        return 1
    source = PROTO_DIR / "kv.proto"
    if not source.is_file():
        if generated():
            print(f"generate.py: {source} not found; keeping the modules in {OUT}")
            return 0
        print(f"generate.py: {source} not found", file=sys.stderr)
        return 1
    include = str(pathlib.Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-Ioncekv/_proto={PROTO_DIR}",
        f"-I{include}",
        f"--python_out={HERE}",
        f"--pyi_out={HERE}",
        f"--grpc_python_out={HERE}",
        "oncekv/_proto/kv.proto",
    ]
    code = protoc.main(args)
    if code != 0:
        print(f"generate.py: protoc failed ({code})", file=sys.stderr)
        return 1
    if not generated():
        print(f"generate.py: protoc did not write the modules into {OUT}", file=sys.stderr)
        return 1
    print(f"generated {OUT}/kv_pb2.py, kv_pb2_grpc.py from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
