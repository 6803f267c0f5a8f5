#!/usr/bin/env bash
# Runs the Python client's tests against real oncekv nodes (what
# `cargo xtask verify` runs after the Rust tests):
#   1. a virtual environment in <target>/python-venv, made if missing;
#   2. the package and its test extras installed from PyPI (again only when
#      pyproject.toml changed);
#   3. the gRPC stubs generated from crates/oncekv-proto/proto;
#   4. the oncekv binary: ONCEKV_BIN, else <target>/debug/oncekv, built
#      with `cargo build -p oncekv --locked` only if missing;
#   5. pytest; any failure, error or skipped test fails the script;
#   6. the package as users get it: a wheel built by pip from this folder
#      (setup.py generates the stubs, grpcio-tools a build requirement),
#      installed in a fresh virtual environment, imported from elsewhere.
# <target> is CARGO_TARGET_DIR, else <repo>/target. Extra arguments go to
# pytest (for example -k leader).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
venv="$target/python-venv"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "==> python: creating $venv"
    "$python" -m venv "$venv"
fi
stamp="$venv/.oncekv-installed"
wanted="$(sha256sum "$here/pyproject.toml" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ]; then
    echo "==> python: installing the package with its test extras"
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$here[test]" \
        > "$venv/pip-install.log" 2>&1; then
        cat "$venv/pip-install.log"
        echo "==> python: pip install failed" >&2
        exit 1
    fi
    echo "$wanted" > "$stamp"
fi
"$venv/bin/python" "$here/generate.py"

if [ -n "${ONCEKV_BIN:-}" ]; then
    bin="$ONCEKV_BIN"
    if [ ! -x "$bin" ]; then
        echo "==> python: ONCEKV_BIN=$bin is not an executable" >&2
        exit 1
    fi
else
    bin="$target/debug/oncekv"
    if [ ! -x "$bin" ]; then
        echo "==> python: $bin missing, building it"
        (cd "$repo" && CARGO_TARGET_DIR="$target" cargo build -p oncekv --locked)
    fi
fi

echo "==> python: pytest against $bin"
cd "$here"
ONCEKV_BIN="$bin" ONCEKV_NO_SKIP=1 "$venv/bin/python" -m pytest tests -p no:cacheprovider -ra "$@"

echo "==> python: a wheel from pip, installed in a fresh virtual environment"
wheel="$(mktemp -d)"
trap 'rm -rf "$wheel"' EXIT
"$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
    -w "$wheel/dist" "$here" > "$wheel/build.log" 2>&1 || {
    cat "$wheel/build.log"
    echo "==> python: pip wheel failed" >&2
    exit 1
}
"$python" -m venv "$wheel/venv"
"$wheel/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel"/dist/*.whl \
    > "$wheel/install.log" 2>&1 || {
    cat "$wheel/install.log"
    echo "==> python: installing the wheel failed" >&2
    exit 1
}
(cd "$wheel" && "$wheel/venv/bin/python" -c '
import oncekv, oncekv._proto.kv_pb2_grpc as stubs
assert "site-packages" in oncekv.__file__, oncekv.__file__
assert hasattr(stubs, "KvStub")
print("==> python: the wheel imports:", oncekv.__file__)
')
