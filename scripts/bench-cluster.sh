#!/usr/bin/env bash
# Durable write throughput and latency of a 3-node loopback cluster, plain
# vs. exactly-once sessions, at 1 and 64 concurrent writers. Modes run
# alternately (A B A B ...) for ROUNDS rounds so machine noise hits both;
# the report gives medians and the session/plain ratio.
#
# Usage: scripts/bench-cluster.sh [OUTPUT.md]   (env: ROUNDS=3 DURATION=5s)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/benchmarks-cluster.md}
rounds=${ROUNDS:-3}
duration=${DURATION:-5s}
cargo build --release -q -p oncekv -p oncekv-bench
bin=target/release/oncekv
bench_bin=target/release/oncekv-bench
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The peers share a token, as `oncekv serve` requires of a node of several.
token="$work/peer-token"
"$bin" certs create-token --out "$token" >/dev/null
declare -a client peer
for id in 1 2 3; do client[$id]="127.0.0.1:$(port)"; peer[$id]="127.0.0.1:$(port)"; done
cluster="1=${peer[1]}/${client[1]},2=${peer[2]}/${client[2]},3=${peer[3]}/${client[3]}"
for id in 1 2 3; do
    "$bin" serve --id "$id" --data-dir "$work/node$id" --listen-client "${client[$id]}" \
        --listen-peer "${peer[$id]}" --initial-cluster "$cluster" --peer-token-file "$token" \
        2>"$work/node$id.log" &
    pids+=($!)
done
endpoints="${client[1]},${client[2]},${client[3]}"
for _ in $(seq 50); do "$bin" status --endpoints "$endpoints" >/dev/null 2>&1 && break; sleep 0.2; done
results="$work/results.jsonl"
for round in $(seq "$rounds"); do
    for concurrency in 1 64; do
        for mode in plain session; do
            "$bench_bin" --endpoints "$endpoints" --workload put --mode "$mode" \
                --concurrency "$concurrency" --duration "$duration" --warmup 1s -o json >>"$results"
        done
    done
    echo "round $round done" >&2
done
python3 - "$results" "$out" "$rounds" "$duration" <<'PY'
import json, statistics, sys, platform, os
results, out, rounds, duration = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [json.loads(line) for line in open(results)]
def med(mode, conc, field):
    return statistics.median(r[field] for r in rows if r["mode"] == mode and r["concurrency"] == conc)
lines = [
    "# Cluster write benchmark",
    "",
    f"3 nodes on loopback, fsync on every append batch, PUT of 64-byte values to 1,000 keys,",
    f"closed loop; median of {rounds} alternating rounds of {duration} each (after 1 s warm-up).",
    f"Machine: {os.cpu_count()} cores, {platform.machine()}. Reproduce: `scripts/bench-cluster.sh`.",
    "",
    "| writers | mode | ops/s | p50 ms | p99 ms | session / plain ops/s |",
    "|---|---|---|---|---|---|",
]
for conc in (1, 64):
    plain = med("plain", conc, "throughput_ops")
    for mode in ("plain", "session"):
        ops = med(mode, conc, "throughput_ops")
        ratio = f"{ops / plain:.3f}" if mode == "session" else ""
        lines.append(f"| {conc} | {mode} | {ops:.0f} | {med(mode, conc, 'p50_ms'):.2f} | {med(mode, conc, 'p99_ms'):.2f} | {ratio} |")
errors = {}
for r in rows:
    for kind, count in r["errors"].items():
        errors[kind] = errors.get(kind, 0) + count
lines += ["", f"Errors over all runs: {errors or 'none'}.", ""]
open(out, "w").write("\n".join(lines))
print("\n".join(lines))
PY
