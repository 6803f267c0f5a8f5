#!/usr/bin/env bash
# Makes sure the pinned Rust toolchain (rust-toolchain.toml) with rustfmt and
# clippy is present; installs it with rustup only if it is missing. Also
# installs Debian's fiu-utils, when it can, so that `oncekv verify` can make
# disk syncs fail, etcd-server, so that `oncekv-bench --target etcd` and the
# etcd API are tested against a real etcd, and etcd-client, whose etcdctl
# runs the same commands against both; and aetcd's own integration tests in
# target/aetcd-suite (see below), which crates/oncekv/tests/etcd_aetcd.rs
# runs against both. Without one of them, the test that needs it is
# skipped with a `skipped: ...` line, and `cargo xtask verify` lists it at
# the end; with CI=true (as in CI, .ci/run) it fails instead, saying what is
# missing (oncekv_harness::testing::missing_dependency). The full-disk test
# needs root too, which this script cannot grant: run the tests as root.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages the tests use, installed when missing (as root, with apt):
# the package lists are fetched once first, so a fresh machine finds them.
missing=()
command -v fiu-run >/dev/null 2>&1 || missing+=(fiu-utils)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v zsh >/dev/null 2>&1 || missing+=(zsh)
command -v fish >/dev/null 2>&1 || missing+=(fish)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -q >/dev/null 2>&1 || echo "setup: apt-get update failed" >&2
    for package in "${missing[@]}"; do
        apt-get install -y -q "$package" >/dev/null 2>&1 \
            || echo "setup: $package not installed; the tests that need it will say so" >&2
    done
fi
# aetcd 1.0.0's own integration tests, run against a real etcd and an
# oncekv node by crates/oncekv/tests/etcd_aetcd.rs: a virtual environment
# in target/aetcd-suite/venv with aetcd and the test extras its
# pyproject.toml pins (pytest, pytest-asyncio, pytest-mock, pytest-cov),
# both from PyPI, and beside it the sdist's tests/ and the pyproject.toml
# that configures pytest for them. Made once (the `ready` file records
# it), and again if its Python can no longer import them; a failed step
# fails this script, saying which, and is redone from the start next time.
aetcd_version=1.0.0
suite=target/aetcd-suite
if [ "$(cat "$suite/ready" 2>/dev/null || true)" != "aetcd==$aetcd_version" ] \
    || ! "$suite/venv/bin/python" -c 'import aetcd, pytest' >/dev/null 2>&1; then
    rm -rf "$suite"
    mkdir -p "$suite/sdist"
    log="$suite/install.log"
    if ! python3 -m venv "$suite/venv" >"$log" 2>&1; then
        cat "$log" >&2
        echo "setup: python3 -m venv $suite/venv failed (Debian's python3-venv provides it)" >&2
        exit 1
    fi
    if ! "$suite/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "aetcd[test]==$aetcd_version" >>"$log" 2>&1 \
        || ! "$suite/venv/bin/python" -m pip download --quiet --disable-pip-version-check \
            --no-deps --no-binary :all: --dest "$suite/sdist" "aetcd==$aetcd_version" \
            >>"$log" 2>&1; then
        tail -n 20 "$log" >&2
        echo "setup: could not fetch aetcd==$aetcd_version and its test extras from PyPI" \
            "(is PyPI reachable?); the full log is $log" >&2
        exit 1
    fi
    tar -xzf "$suite/sdist/aetcd-$aetcd_version.tar.gz" -C "$suite" --strip-components=1 \
        "aetcd-$aetcd_version/tests" "aetcd-$aetcd_version/pyproject.toml"
    echo "aetcd==$aetcd_version" >"$suite/ready"
fi
toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if rustup run "$toolchain" cargo clippy --version >/dev/null 2>&1 \
    && rustup run "$toolchain" cargo fmt --version >/dev/null 2>&1; then
    exit 0
fi
if ! command -v rustup >/dev/null 2>&1; then
    echo "setup: rustup is required to install Rust $toolchain" >&2
    exit 1
fi
rustup toolchain install "$toolchain" --profile minimal --component rustfmt,clippy
