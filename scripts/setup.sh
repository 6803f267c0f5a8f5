#!/usr/bin/env bash
# Makes sure the pinned Rust toolchain (rust-toolchain.toml) with rustfmt and
# clippy is present; installs it with rustup only if it is missing. Also
# installs Debian's fiu-utils, when it can, so that `oncekv verify` can make
# disk syncs fail (without it, that fault kind is skipped with a message),
# and etcd-server, so that `oncekv bench --target etcd` is tested against a
# real etcd (without it, that test is skipped with a message).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v fiu-run >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ]; then
    apt-get install -y -q fiu-utils >/dev/null 2>&1 \
        || echo "setup: fiu-utils not installed; the fsync fault will be skipped" >&2
fi
if ! command -v etcd >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ]; then
    apt-get install -y -q etcd-server >/dev/null 2>&1 \
        || echo "setup: etcd-server not installed; the bench test against etcd will be skipped" >&2
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
