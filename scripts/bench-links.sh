#!/usr/bin/env bash
# oncekv against etcd across hosts with delayed links: for each one-way
# delay (default 0.5ms 2ms 10ms), a network of six hosts (network
# namespaces on a private bridge, `oncekv netns`) whose every peer link
# passes through a proxy that delays it by that much each way; oncekv's
# 3 nodes on hosts 1-3 and etcd's 3 nodes on hosts 4-6, behind the same
# proxies, both running. The load generator (`oncekv-bench`, etcd through
# the etcd-client crate) runs in the clients' namespace, beside the hosts
# (clients reach the nodes directly, unshaped): one writer (sequential
# durable PUTs: p50 against the floor, one round trip between hosts plus
# one fsync, 2 x delay + fdatasync) and 64 writers (throughput), on oncekv
# then etcd, alternately (A B A B), for ROUNDS rounds; medians.
#
# Usage: sudo scripts/bench-links.sh [OUT_FILE]
#   env: DELAYS="0.5ms 2ms 10ms" ROUNDS=3 DURATION=5s WARMUP=1s
#        JITTER=0s LOSS=0   every link's jitter and loss besides the delay
#        BIN=... BENCH_BIN=...   binaries to use instead of building the
#        release ones (`cargo xtask build-bench`); BENCH_BIN needs the
#        feature `etcd`
# Writes OUT_FILE (default target/bench-links.md), a markdown table.
# Needs root, iproute2, python3 and etcd (Debian's etcd-server). Removes
# its namespaces, processes and data on exit, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ "$(id -u)" == 0 ]] || { echo "bench-links.sh needs root (network namespaces)" >&2; exit 1; }
command -v etcd >/dev/null || { echo "etcd not found: sudo apt-get install etcd-server" >&2; exit 1; }
python3 --version >/dev/null
command_line="$0${1:+ $1}"
for var in DELAYS ROUNDS DURATION WARMUP JITTER LOSS; do
    [[ -n "${!var:-}" ]] && command_line="$var=${!var} $command_line"
done
delays=${DELAYS:-0.5ms 2ms 10ms}
rounds=${ROUNDS:-3}
duration=${DURATION:-5s}
warmup=${WARMUP:-1s}
jitter=${JITTER:-0s}
loss=${LOSS:-0}
out=${1:-target/bench-links.md}

if [[ -z "${BIN:-}" || -z "${BENCH_BIN:-}" ]]; then
    cargo xtask build-bench
fi
bin=${BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/oncekv}
bench_bin=${BENCH_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/oncekv-bench}
mkdir -p target "$(dirname "$out")"
# On the project's disk (not a tmpfs /tmp), so fsyncs reach a real disk.
work=$(mktemp -d "$PWD/target/bench-links.XXXXXX")
net_pid=""
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
    if [[ -n "$net_pid" ]]; then
        # `oncekv netns` removes its namespaces and whatever runs in them.
        kill "$net_pid" 2>/dev/null || true
        wait "$net_pid" 2>/dev/null || true
        net_pid=""
    fi
    # Should it have died first: its namespaces, by the tag it printed.
    if [[ -n "${client_namespace:-}" ]]; then
        local ns
        for ns in $(ip netns list | awk '{print $1}' | grep "^${client_namespace%-cl}-" || true); do
            ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
            ip netns delete "$ns" 2>/dev/null || true
        done
    fi
}
trap 'cleanup; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# The peers of oncekv share a token, as `oncekv serve` requires.
token="$work/peer-token"
"$bin" certs create-token --out "$token" >/dev/null

echo "== fdatasync of 64 bytes on the data disk" >&2
fsync_ms=$(python3 - "$work" <<'PY'
import os, statistics, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
samples = []
for i in range(220):
    started = time.perf_counter()
    os.write(fd, b"x" * 64)
    os.fdatasync(fd)
    if i >= 20:
        samples.append(time.perf_counter() - started)
os.close(fd)
os.unlink(path)
print(f"{statistics.median(samples) * 1000:.3f}")
PY
)
echo "median $fsync_ms ms" >&2

# in_client CMD...: runs CMD in the clients' namespace.
in_client() { ip netns exec "$client_namespace" "$@"; }

# start_network DELAY: six hosts whose links delay DELAY each way.
start_network() {
    local env="$work/net-$1.env"
    "$bin" netns --hosts 6 --link-delay "$1" --link-jitter "$jitter" --link-loss "$loss" \
        --seed 1 >"$env" 2>"$work/net-$1.log" &
    net_pid=$!
    for _ in $(seq 100); do
        grep -q '^# ready' "$env" && break
        kill -0 "$net_pid" 2>/dev/null || { cat "$work/net-$1.log" >&2; exit 1; }
        sleep 0.1
    done
    grep -q '^# ready' "$env" || { echo "the network did not come up" >&2; exit 1; }
    # shellcheck disable=SC1090
    . "$env"
}

# host VAR H: the value of VAR_H (host_namespace, host_ip, peer_proxy).
host() { local name="$1_$2"; printf '%s' "${!name}"; }

# start_oncekv DIR: oncekv on hosts 1-3; sets endpoints_oncekv.
start_oncekv() {
    local dir=$1 id cluster="" endpoints=""
    for id in 1 2 3; do
        cluster+="${cluster:+,}$id=$(host peer_proxy $id)/$(host host_ip $id):7379"
        endpoints+="${endpoints:+,}$(host host_ip $id):7379"
    done
    for id in 1 2 3; do
        ip netns exec "$(host host_namespace $id)" "$bin" serve --id "$id" --data-dir "$dir/oncekv$id" \
            --listen-client "$(host host_ip $id):7379" --listen-peer "$(host host_ip $id):7380" \
            --advertise-peer "$(host peer_proxy $id)" --initial-cluster "$cluster" \
            --peer-token-file "$token" 2>"$dir/oncekv$id.log" &
        pids+=($!)
    done
    for _ in $(seq 150); do
        in_client "$bin" status --endpoints "$endpoints" >/dev/null 2>&1 && break
        sleep 0.2
    done
    in_client "$bin" status --endpoints "$endpoints" >/dev/null
    endpoints_oncekv=$endpoints
}

# start_etcd DIR: etcd on hosts 4-6; sets endpoints_etcd.
start_etcd() {
    local dir=$1 id cluster="" endpoints="" clients=()
    for id in 4 5 6; do
        cluster+="${cluster:+,}etcd$id=http://$(host peer_proxy $id)"
        endpoints+="${endpoints:+,}$(host host_ip $id):2379"
        clients+=("$(host host_ip $id):2379")
    done
    for id in 4 5 6; do
        ip netns exec "$(host host_namespace $id)" etcd --name "etcd$id" --data-dir "$dir/etcd$id" \
            --listen-client-urls "http://$(host host_ip $id):2379" \
            --advertise-client-urls "http://$(host host_ip $id):2379" \
            --listen-peer-urls "http://$(host host_ip $id):7380" \
            --initial-advertise-peer-urls "http://$(host peer_proxy $id)" \
            --initial-cluster "$cluster" --initial-cluster-state new \
            --initial-cluster-token "bench-links" 2>"$dir/etcd$id.log" &
        pids+=($!)
    done
    in_client python3 scripts/wait-etcd-healthy.py 60 "${clients[@]}"
    endpoints_etcd=$endpoints
}

results="$work/results.jsonl"
# measure DELAY TARGET ENDPOINTS WRITERS ROUND
measure() {
    local report
    report=$(in_client "$bench_bin" --target "$2" --endpoints "$3" --workload put --mode plain \
        --concurrency "$4" --key-bytes 8 --value-bytes 64 --duration "$duration" --warmup "$warmup" -o json)
    printf '{"delay":"%s","target":"%s","writers":%s,"round":%s,"report":%s}\n' \
        "$1" "$2" "$4" "$5" "$report" >>"$results"
    python3 -c 'import json, sys; r = json.loads(sys.argv[1])
print("  %-6s %-6s x%-3s %9.0f ops/s  p50 %7.2f ms  p99 %7.2f ms" % (sys.argv[2], sys.argv[3], sys.argv[4],
      r["throughput_ops"], r["p50_ms"], r["p99_ms"]))' "$report" "$1" "$2" "$4" >&2
}

for delay in $delays; do
    echo "== one-way delay $delay on every peer link" >&2
    start_network "$delay"
    mkdir -p "$work/$delay"
    start_oncekv "$work/$delay"
    start_etcd "$work/$delay"
    for round in $(seq "$rounds"); do
        for writers in 1 64; do
            measure "$delay" oncekv "$endpoints_oncekv" "$writers" "$round"
            measure "$delay" etcd "$endpoints_etcd" "$writers" "$round"
        done
        echo "round $round of $rounds done ($delay)" >&2
    done
    cleanup
done

python3 - "$results" "$out" "$fsync_ms" "$rounds" "$duration" "$warmup" "$jitter" "$loss" "$command_line" <<'PY'
import json, re, statistics, sys
results, out, fsync_ms, rounds, duration, warmup, jitter, loss, command = sys.argv[1:10]
rows = [json.loads(line) for line in open(results)]
fsync = float(fsync_ms)

def ms(text):
    number, unit = re.fullmatch(r"([0-9.]+)\s*(us|µs|ms|s)", text).groups()
    return float(number) * {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}[unit]

def med(delay, target, writers, field):
    values = [r["report"][field] for r in rows if r["delay"] == delay and r["target"] == target
              and r["writers"] == writers and r["report"][field] is not None]
    return statistics.median(values) if values else None

def fmt(value, digits=2):
    return "n/a" if value is None else f"{value:,.{digits}f}"

def ratio(a, b):
    return None if a is None or not b else a / b

lines = [
    "# oncekv and etcd across hosts with delayed links",
    "",
    "Three nodes of each, every node a host of its own (a network namespace on a private",
    "bridge), every peer link through a proxy that delays it by the one-way delay below",
    f"each way (jitter {jitter}, loss {loss}%), oncekv and etcd behind the same proxies;",
    "the load generator (`oncekv-bench`, etcd through the `etcd-client` crate) in the",
    "clients' namespace, reaching the nodes directly. Durable PUTs of 64-byte values to",
    "8-byte keys, plain (at-least-once on both), closed loop; oncekv then etcd, alternately,",
    f"{rounds} round(s) of {duration} after a {warmup} warm-up; medians over the rounds.",
    "The floor of a sequential write is one round trip between hosts (leader to a follower",
    f"and back: 2 x the delay) plus one fdatasync (median {fsync:.3f} ms on the data disk).",
    "",
    f"Command: `{command}`",
    "",
    "| one-way delay | floor ms | oncekv p50 ms (1 writer) | etcd p50 ms (1 writer) | oncekv / floor | etcd / floor | oncekv ops/s (64 writers) | etcd ops/s (64 writers) | oncekv / etcd |",
    "|---|---|---|---|---|---|---|---|---|",
]
delays = list(dict.fromkeys(r["delay"] for r in rows))
for delay in delays:
    floor = 2 * ms(delay) + fsync
    o_p50, e_p50 = med(delay, "oncekv", 1, "p50_ms"), med(delay, "etcd", 1, "p50_ms")
    o_ops, e_ops = med(delay, "oncekv", 64, "throughput_ops"), med(delay, "etcd", 64, "throughput_ops")
    lines.append(f"| {delay} | {floor:.3f} | {fmt(o_p50)} | {fmt(e_p50)} | {fmt(ratio(o_p50, floor))} | "
                 f"{fmt(ratio(e_p50, floor))} | {fmt(o_ops, 0)} | {fmt(e_ops, 0)} | {fmt(ratio(o_ops, e_ops))} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "written: $out" >&2
