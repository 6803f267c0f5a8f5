#!/usr/bin/env bash
# A/B comparison of two oncekv builds (or two settings of one build) on the
# write path: durable PUTs of 64-byte values to 8-byte keys, closed loop,
# on a 3-node and a 1-node loopback cluster of each variant, plain and
# session mode, 1 and 64 writers. Both variants' clusters run side by side
# and every configuration is measured on A then B (A B A B ...) for ROUNDS
# rounds, so machine noise hits both; the report gives medians and the
# B/A ratios.
#
# Usage: A_BIN=path B_BIN=path scripts/bench-ab.sh [OUT.md]
#   env: A_ENV / B_ENV   extra environment for the variant's nodes
#                        (e.g. "TOKIO_WORKER_THREADS=1")
#        A_ARGS / B_ARGS extra `oncekv serve` flags of the variant's nodes
#                        (e.g. "--peer-append unary")
#        A_NAME / B_NAME labels (default A, B)
#        BENCH_BIN       the load generator, the same for both variants
#                        (default: oncekv-bench beside A_BIN)
#        ROUNDS=3 DURATION=5s WARMUP=1s NODES="3 1" WRITERS="1 64"
#        MODES="plain session"
#        TARGETS="oncekv"    the load generator's client: oncekv's own, or
#                            etcd (etcd's client against the etcd API the
#                            nodes serve on their client ports; plain mode)
# Nodes keep their data under target/ (the project's disk, not a tmpfs),
# so fsyncs reach a real disk.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${A_BIN:?A_BIN: the oncekv binary of variant A}"
: "${B_BIN:?B_BIN: the oncekv binary of variant B}"
bench_bin=${BENCH_BIN:-$(dirname "$A_BIN")/oncekv-bench}
[ -x "$bench_bin" ] || {
    echo "no load generator at $bench_bin: cargo build --release -p oncekv-bench, or set BENCH_BIN" >&2
    exit 1
}
a_name=${A_NAME:-A}
b_name=${B_NAME:-B}
rounds=${ROUNDS:-3}
duration=${DURATION:-5s}
warmup=${WARMUP:-1s}
node_counts=${NODES:-3 1}
writers=${WRITERS:-1 64}
modes=${MODES:-plain session}
targets=${TARGETS:-oncekv}
out=${1:-}
python3 --version >/dev/null
mkdir -p target
work=$(mktemp -d "$PWD/target/bench-ab.XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The peers share a token (`oncekv serve` requires one of a node of several,
# or TLS). It is passed in the environment, which a binary older than
# --peer-token-file ignores, so both binaries run the same way.
token="$work/peer-token"
(umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' >"$token")

# start VARIANT BIN ENV NODES ARGS: starts a cluster, sets endpoints_VARIANT_NODES.
start() {
    local variant=$1 bin=$2 env=$3 nodes=$4 args=$5 id cluster="" endpoints=""
    local -a client peer
    for id in $(seq "$nodes"); do
        client[$id]="127.0.0.1:$(port)"
        peer[$id]="127.0.0.1:$(port)"
        cluster+="${cluster:+,}$id=${peer[$id]}/${client[$id]}"
        endpoints+="${endpoints:+,}${client[$id]}"
    done
    for id in $(seq "$nodes"); do
        # shellcheck disable=SC2086 # $env and $args are lists of words
        env ONCEKV_PEER_TOKEN_FILE="$token" $env "$bin" serve --id "$id" --data-dir "$work/$variant$nodes/node$id" \
            --listen-client "${client[$id]}" --listen-peer "${peer[$id]}" \
            --initial-cluster "$cluster" $args 2>"$work/$variant$nodes-node$id.log" &
        pids+=($!)
    done
    for _ in $(seq 100); do
        "$bin" status --endpoints "$endpoints" >/dev/null 2>&1 && break
        sleep 0.2
    done
    "$bin" status --endpoints "$endpoints" >/dev/null
    printf -v "endpoints_${variant}_$nodes" '%s' "$endpoints"
}

for nodes in $node_counts; do
    start A "$A_BIN" "${A_ENV:-}" "$nodes" "${A_ARGS:-}"
    start B "$B_BIN" "${B_ENV:-}" "$nodes" "${B_ARGS:-}"
done

results="$work/results.jsonl"
for round in $(seq "$rounds"); do
    for nodes in $node_counts; do
        for concurrency in $writers; do
            for mode in $modes; do
              for target in $targets; do
                [[ "$target" == etcd && "$mode" != plain ]] && continue
                for variant in A B; do
                    endpoints_var="endpoints_${variant}_$nodes"
                    # The client is always the one load generator: only the
                    # servers differ.
                    report=$("$bench_bin" --target "$target" --endpoints "${!endpoints_var}" --workload put \
                        --mode "$mode" --concurrency "$concurrency" --key-bytes 8 --value-bytes 64 \
                        --duration "$duration" --warmup "$warmup" -o json)
                    printf '{"variant":"%s","nodes":%s,"round":%s,"report":%s}\n' \
                        "$variant" "$nodes" "$round" "$report" >>"$results"
                done
              done
            done
        done
    done
    echo "round $round of $rounds done" >&2
done

python3 - "$results" "$a_name" "$b_name" "$rounds" "$duration" "$out" <<'PY'
import json, os, statistics, sys
results, a_name, b_name, rounds, duration, out = sys.argv[1:7]
rows = [json.loads(line) for line in open(results)]
def med(variant, nodes, conc, mode, target, field):
    return statistics.median(
        r["report"][field] for r in rows
        if r["variant"] == variant and r["nodes"] == nodes and r["report"]["target"] == target
        and r["report"]["concurrency"] == conc and r["report"]["mode"] == mode)
load = open("/proc/loadavg").read().split()[:3]
lines = [
    f"A = {a_name}, B = {b_name}; median of {rounds} alternating rounds of {duration};",
    f"{os.cpu_count()} cores, load average at the end {' '.join(load)}.",
    "",
    "| nodes | writers | mode | client | A ops/s | B ops/s | B/A ops | A p50 ms | B p50 ms | B/A p50 | A p99 ms | B p99 ms |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
]
keys = sorted({(r["nodes"], r["report"]["concurrency"], r["report"]["mode"], r["report"]["target"])
               for r in rows}, key=lambda k: (-k[0], k[1], k[2], k[3]))
for nodes, conc, mode, target in keys:
    a_ops, b_ops = (med(v, nodes, conc, mode, target, "throughput_ops") for v in "AB")
    a_p50, b_p50 = (med(v, nodes, conc, mode, target, "p50_ms") for v in "AB")
    a_p99, b_p99 = (med(v, nodes, conc, mode, target, "p99_ms") for v in "AB")
    lines.append(f"| {nodes} | {conc} | {mode} | {target} | {a_ops:.0f} | {b_ops:.0f} | {b_ops / a_ops:.3f} | "
                 f"{a_p50:.3f} | {b_p50:.3f} | {b_p50 / a_p50:.3f} | {a_p99:.2f} | {b_p99:.2f} |")
errors = {}
for r in rows:
    for kind, count in r["report"]["errors"].items():
        key = f'{r["variant"]}:{kind}'
        errors[key] = errors.get(key, 0) + count
lines += ["", f"Errors over all runs: {errors or 'none'}.", ""]
text = "\n".join(lines)
print(text)
if out:
    open(out, "w").write(text)
PY
