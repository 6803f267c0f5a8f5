#!/usr/bin/env bash
# Runs the Python client's tests against real oncekv nodes (what
# `cargo xtask verify` runs after the Rust tests), on the package as users
# get it:
#   1. a virtual environment in <target>/python-venv, made if missing, with
#      the package's dependencies and test extras from PyPI (installed again
#      only when pyproject.toml changed);
#   2. a wheel built by pip from this folder (setup.py generates the gRPC
#      stubs from crates/oncekv-proto/proto, grpcio-tools a build
#      requirement), installed into that environment in place of any
#      earlier one;
#   3. the oncekv binary: ONCEKV_BIN, else <target>/debug/oncekv, built
#      with `cargo build -p oncekv --locked` only if missing;
#   4. pytest on a copy of tests/ outside the source tree, so that `import
#      oncekv` is the installed wheel; any failure, error or skipped test
#      fails the script;
#   5. the wheel installed in a fresh virtual environment and imported
#      from elsewhere.
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
    echo "==> python: installing the package's dependencies and test extras"
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here[test]" \
        > "$venv/pip-install.log" 2>&1; then
        cat "$venv/pip-install.log"
        echo "==> python: pip install failed" >&2
        exit 1
    fi
    echo "$wanted" > "$stamp"
fi

echo "==> python: a wheel from pip"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
    -w "$scratch/dist" "$here" > "$scratch/build.log" 2>&1 || {
    cat "$scratch/build.log"
    echo "==> python: pip wheel failed" >&2
    exit 1
}
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --force-reinstall "$scratch"/dist/*.whl > "$scratch/install.log" 2>&1 || {
    cat "$scratch/install.log"
    echo "==> python: installing the wheel failed" >&2
    exit 1
}

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

echo "==> python: pytest against $bin, on the installed wheel"
cp -r "$here/tests" "$scratch/tests"
(cd "$scratch" && "$venv/bin/python" -c '
import oncekv
assert "site-packages" in oncekv.__file__, oncekv.__file__
')
(cd "$scratch" && ONCEKV_BIN="$bin" ONCEKV_NO_SKIP=1 "$venv/bin/python" -m pytest tests \
    -p no:cacheprovider -ra --rootdir "$scratch" "$@")

echo "==> python: the wheel in a fresh virtual environment"
"$python" -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$scratch"/dist/*.whl \
    > "$scratch/fresh-install.log" 2>&1 || {
    cat "$scratch/fresh-install.log"
    echo "==> python: installing the wheel failed" >&2
    exit 1
}
(cd "$scratch" && "$scratch/venv/bin/python" -c '
import oncekv, oncekv._proto.kv_pb2_grpc as stubs
assert "site-packages" in oncekv.__file__, oncekv.__file__
assert hasattr(stubs, "KvStub")
print("==> python: the wheel imports:", oncekv.__file__)
')
