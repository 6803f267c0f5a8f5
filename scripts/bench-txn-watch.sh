#!/usr/bin/env bash
# Transactions and watches, oncekv beside etcd, on this machine (3-node
# clusters of each on 127.0.0.1, data under target/):
#   - transfer: one unit moved between two random accounts of 1,000. On
#     oncekv one transaction of two INCRs; on etcd (no server-side INCR) a
#     read of both accounts, then a Txn guarded by both keys' mod revisions
#     writing both balances, retried on conflict. Closed loop, plain and
#     session modes (key mode on oncekv only: etcd has no counterpart).
#   - watch: WATCHERS watchers of one prefix over WATCH_CONNECTIONS
#     connections, WRITERS writers putting under it at RATE writes/s in all;
#     delivery latency (write sent -> event seen, per event and watcher)
#     and events delivered per second.
# Every configuration runs on oncekv then on etcd (A B A B ...) for ROUNDS
# rounds; the table gives medians.
#
# Usage: scripts/bench-txn-watch.sh [OUT_FILE]
#   env: ROUNDS=3 DURATION=3s WARMUP=1s WATCH_DURATION=5s
#        WATCHERS=1000 WATCH_CONNECTIONS=10 WRITERS=4 RATE=100
#        BIN=path/to/oncekv  the oncekv of the nodes, beside an
#                            oncekv-bench built with the etcd feature
#                            (default: `cargo xtask build-bench`, then
#                            target/release/oncekv and oncekv-bench)
#        QUICK=1  one round of 1 s, 100 watchers: a smoke test
# Writes a Markdown table to OUT_FILE (default
# target/bench-txn-watch/results.md) and the raw reports beside it
# (results.jsonl). Needs etcd on the PATH and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="$0${1:+ $1}"
for var in QUICK ROUNDS DURATION WARMUP WATCH_DURATION WATCHERS WATCH_CONNECTIONS WRITERS RATE; do
    [[ -n "${!var:-}" ]] && command_line="$var=${!var} $command_line"
done
if [[ "${QUICK:-0}" == 1 ]]; then
    rounds=${ROUNDS:-1}
    duration=${DURATION:-1s}
    warmup=${WARMUP:-0.5s}
    watch_duration=${WATCH_DURATION:-2s}
    watchers=${WATCHERS:-100}
else
    rounds=${ROUNDS:-3}
    duration=${DURATION:-3s}
    warmup=${WARMUP:-1s}
    watch_duration=${WATCH_DURATION:-5s}
    watchers=${WATCHERS:-1000}
fi
watch_connections=${WATCH_CONNECTIONS:-$(((watchers + 99) / 100))}
writers=${WRITERS:-4}
rate=${RATE:-100}
out=${1:-target/bench-txn-watch/results.md}

command -v etcd >/dev/null || { echo "etcd not found: install etcd-server (apt-get install etcd-server)" >&2; exit 1; }
python3 --version >/dev/null
if pgrep -x etcd >/dev/null; then
    echo "warning: an etcd is already running on this machine (PID $(pgrep -x etcd | tr '\n' ' ')); it shares the CPU and disk" >&2
fi
if [[ -n "${BIN:-}" ]]; then
    bin=$(realpath "$BIN")
else
    cargo xtask build-bench
    bin=$PWD/target/release/oncekv
fi
bench_bin=$(dirname "$bin")/oncekv-bench
mkdir -p target "$(dirname "$out")"
results="${out%.*}.jsonl"
: >"$results"
work=$(mktemp -d "$PWD/target/bench-txn-watch.XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The peers share a token, as `oncekv serve` requires of a node of several.
token="$work/peer-token"
"$bin" certs create-token --out "$token" >/dev/null

start_oncekv() {
    local id cluster="" endpoints=""
    local -a client peer
    for id in 1 2 3; do
        client[$id]="127.0.0.1:$(port)"
        peer[$id]="127.0.0.1:$(port)"
        cluster+="${cluster:+,}$id=${peer[$id]}/${client[$id]}"
        endpoints+="${endpoints:+,}${client[$id]}"
    done
    for id in 1 2 3; do
        "$bin" serve --id "$id" --data-dir "$work/oncekv/node$id" --listen-client "${client[$id]}" \
            --listen-peer "${peer[$id]}" --initial-cluster "$cluster" --peer-token-file "$token" \
            2>"$work/oncekv-node$id.log" &
        pids+=($!)
    done
    for _ in $(seq 100); do
        "$bin" status --endpoints "$endpoints" >/dev/null 2>&1 && break
        sleep 0.2
    done
    "$bin" status --endpoints "$endpoints" >/dev/null
    oncekv_endpoints=$endpoints
}

start_etcd() {
    local id cluster="" endpoints=""
    local -a client peer
    for id in 1 2 3; do
        client[$id]="127.0.0.1:$(port)"
        peer[$id]="127.0.0.1:$(port)"
        cluster+="${cluster:+,}e$id=http://${peer[$id]}"
        endpoints+="${endpoints:+,}${client[$id]}"
    done
    mkdir -p "$work/etcd"
    for id in 1 2 3; do
        etcd --name "e$id" --data-dir "$work/etcd/node$id" \
            --listen-client-urls "http://${client[$id]}" --advertise-client-urls "http://${client[$id]}" \
            --listen-peer-urls "http://${peer[$id]}" --initial-advertise-peer-urls "http://${peer[$id]}" \
            --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token bench-txn-watch \
            2>"$work/etcd-node$id.log" &
        pids+=($!)
    done
    python3 scripts/wait-etcd-healthy.py 30 "${client[@]}"
    etcd_endpoints=$endpoints
}

endpoints_of() { if [[ $1 == oncekv ]]; then echo "$oncekv_endpoints"; else echo "$etcd_endpoints"; fi; }

# run_transfer TARGET MODE CONCURRENCY ROUND
run_transfer() {
    local report
    report=$("$bench_bin" --target "$1" --endpoints "$(endpoints_of "$1")" --workload transfer \
        --mode "$2" --concurrency "$3" --keys 1000 --duration "$duration" --warmup "$warmup" -o json)
    printf '{"round":%s,"report":%s}\n' "$4" "$report" >>"$results"
    python3 -c 'import json, sys
r = json.loads(sys.argv[1])
print("  transfer %-6s %-7s x%-3d %7.0f txn/s  p50 %6.2f ms  p99 %6.2f ms  conflicts %d  errors %s" % (
    r["target"], r["mode"], r["concurrency"], r["throughput_ops"], r["p50_ms"], r["p99_ms"],
    r["rmw_retries"], r["errors"] or "none"))' "$report" >&2
}

# run_watch TARGET ROUND
run_watch() {
    local report
    report=$("$bench_bin" --target "$1" --endpoints "$(endpoints_of "$1")" --workload watch \
        --mode plain --watchers "$watchers" --connections "$watch_connections" \
        --concurrency "$writers" --rate "$rate" --duration "$watch_duration" --warmup "$warmup" -o json)
    printf '{"round":%s,"report":%s}\n' "$2" "$report" >>"$results"
    python3 -c 'import json, sys
r = json.loads(sys.argv[1])
print("  watch    %-6s %d watchers %5.0f writes/s %8.0f events/s  p50 %6.2f ms  p99 %6.2f ms  missing %d  errors %s" % (
    r["target"], r["watchers"], r["writes_per_s"], r["events_per_s"], r["p50_ms"], r["p99_ms"],
    r["events_missing"], r["errors"] or "none"))' "$report" >&2
}

start_oncekv
start_etcd
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$rounds"); do
    for concurrency in 1 32; do
        for mode in plain session; do
            run_transfer oncekv "$mode" "$concurrency" "$round"
            run_transfer etcd "$mode" "$concurrency" "$round"
        done
    done
    run_transfer oncekv key 32 "$round"
    run_watch oncekv "$round"
    run_watch etcd "$round"
    echo "round $round of $rounds done" >&2
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

machine=$(python3 - "$work" <<'PY'
import os, platform, subprocess, sys
def first(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"
model = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        model = line.split(":", 1)[1].strip()
        break
mem_gib = int(open("/proc/meminfo").readline().split()[1]) / 1024 / 1024
fs = first(["stat", "-f", "-c", "%T", sys.argv[1]])
etcd = first(["etcd", "--version"]).splitlines()[0]
print(f"{os.cpu_count()} cores ({model}), {mem_gib:.0f} GiB memory, Linux {platform.release()}; "
      f"data on {fs}; {etcd}; oncekv {first(['git', 'describe', '--always', '--dirty'])}")
PY
)

python3 - "$results" "$out" "$rounds" "$duration" "$watch_duration" "$warmup" "$command_line" "$machine" \
    "$load_before" "$load_after" <<'PY'
import json, statistics, sys
results, out, rounds, duration, watch_duration, warmup, command, machine, load_before, load_after = sys.argv[1:11]
rows = [json.loads(line)["report"] for line in open(results)]

def med(workload, target, field, **match):
    values = [r[field] for r in rows if r["workload"] == workload and r["target"] == target
              and all(r.get(k) == v for k, v in match.items()) and r.get(field) is not None]
    return statistics.median(values) if values else None

def fmt(value, digits=0):
    return "n/a" if value is None else f"{value:,.{digits}f}"

def ratio(a, b):
    return None if a is None or not b else a / b

lines = [
    f"- Machine: {machine}. Load average {load_before} before, {load_after} after.",
    f"- Command: `{command}`; {rounds} round(s), A/B alternating, medians.",
    "",
    f"Transfer ({duration} measured after {warmup}; 1,000 accounts; per transfer: oncekv one Txn of two INCRs,"
    " etcd a read Txn of both accounts then a Txn guarded by both mod revisions, retried on conflict):",
    "",
    "| writers | mode | oncekv txn/s | etcd txn/s | oncekv / etcd | oncekv p50 ms | etcd p50 ms | oncekv p99 ms | etcd p99 ms | etcd conflicts (retries) |",
    "|---|---|---|---|---|---|---|---|---|---|",
]
for conc in (1, 32):
    for mode in ("plain", "session"):
        m = dict(mode=mode, concurrency=conc)
        o, e = med("transfer", "oncekv", "throughput_ops", **m), med("transfer", "etcd", "throughput_ops", **m)
        lines.append(f"| {conc} | {mode} | {fmt(o)} | {fmt(e)} | {fmt(ratio(o, e), 2)} | "
                     f"{fmt(med('transfer', 'oncekv', 'p50_ms', **m), 2)} | {fmt(med('transfer', 'etcd', 'p50_ms', **m), 2)} | "
                     f"{fmt(med('transfer', 'oncekv', 'p99_ms', **m), 2)} | {fmt(med('transfer', 'etcd', 'p99_ms', **m), 2)} | "
                     f"{fmt(med('transfer', 'etcd', 'rmw_retries', **m))} |")
m = dict(mode="key", concurrency=32)
lines.append(f"| 32 | key (oncekv only) | {fmt(med('transfer', 'oncekv', 'throughput_ops', **m))} | - | - | "
             f"{fmt(med('transfer', 'oncekv', 'p50_ms', **m), 2)} | - | {fmt(med('transfer', 'oncekv', 'p99_ms', **m), 2)} | - | - |")
w = [r for r in rows if r["workload"] == "watch"]
if w:
    first = w[0]
    lines += [
        "",
        f"Watch ({first['watchers']} watchers of one prefix over {first['connections']} connections, "
        f"{first['writers']} writers at {first['rate']:g} puts/s asked, plain mode; {watch_duration} measured after {warmup}; "
        "latency = write sent to event seen, per event and watcher):",
        "",
        "| target | writes/s | events/s delivered | missing events | delivery p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | client CPU | machine CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for target in ("oncekv", "etcd"):
        g = lambda f, d=2: fmt(med("watch", target, f), d)
        lines.append(f"| {target} | {g('writes_per_s', 0)} | {g('events_per_s', 0)} | {g('events_missing', 0)} | "
                     f"{g('p50_ms')} | {g('p90_ms')} | {g('p99_ms')} | {g('p999_ms')} | {g('max_ms')} | "
                     f"{g('client_cpu_pct', 0)}% | {g('machine_cpu_pct', 0)}% |")
errors = {}
for r in rows:
    for kind, n in r["errors"].items():
        key = f"{r['target']} {r['workload']} {kind}"
        errors[key] = errors.get(key, 0) + n
lines += ["", f"Errors over all runs: {errors or 'none'}.", ""]
with open(out, "w") as f:
    f.write("\n".join(lines))
print("\n".join(lines))
PY
echo "wrote $out and $results" >&2
