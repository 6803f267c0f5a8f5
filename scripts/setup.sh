#!/usr/bin/env bash
# Makes sure the pinned Rust toolchain (rust-toolchain.toml) with rustfmt and
# clippy is present; installs it with rustup only if it is missing. Also
# installs Debian's fiu-utils, when it can, so that `oncekv verify` can make
# disk syncs fail, etcd-server, so that `oncekv bench --target etcd` and the
# etcd API are tested against a real etcd, and etcd-client, whose etcdctl
# runs the same commands against both. Without one of them, the test that needs it is
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
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -q >/dev/null 2>&1 || echo "setup: apt-get update failed" >&2
    for package in "${missing[@]}"; do
        apt-get install -y -q "$package" >/dev/null 2>&1 \
            || echo "setup: $package not installed; the tests that need it will say so" >&2
    done
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
