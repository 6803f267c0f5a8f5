#!/usr/bin/env bash
# Runs `oncekv verify` for seeds FIRST..FIRST+COUNT-1 with every fault kind,
# DURATION each, and prints a markdown table of the summaries (one row per
# seed) followed by the totals. Histories and HTML reports stay under OUT.
#
#   scripts/verify-sweep.sh [COUNT=20] [DURATION=60s] [FIRST=1] [OUT=target/verify-sweep]
#
# VERIFY_ARGS adds flags to every run, e.g. VERIFY_ARGS="--api etcd".
#
# Exits non-zero if any seed did not pass.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-20}
duration=${2:-60s}
first=${3:-1}
out=${4:-target/verify-sweep}
cargo build --release -q -p oncekv
bin=target/release/oncekv
mkdir -p "$out"
echo "| seed | verdict | ops | ok | unknown | failed | retried | dropped after commit | replayed | leader changes | expiries | faults | nodes stopped on sync failure |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
failures=0
for seed in $(seq "$first" $((first + count - 1))); do
    set +e
    # shellcheck disable=SC2086 # VERIFY_ARGS is a list of flags
    "$bin" verify --nodes 3 --clients 8 --duration "$duration" --seed "$seed" ${VERIFY_ARGS:-} \
        --out "$out/seed-$seed" -o json > "$out/seed-$seed.json" 2> "$out/seed-$seed.err"
    code=$?
    set -e
    [ "$code" = 0 ] || failures=$((failures + 1))
    python3 - "$out/seed-$seed.json" "$seed" "$code" <<'EOF'
import json, sys
path, seed, code = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    s = json.load(open(path))
except Exception as error:
    print(f"| {seed} | ERROR (exit {code}: {error}) |" + " |" * 11)
    sys.exit(0)
c = s["coverage"]
o = c.get("by_outcome", {})
faults = sum(c.get("faults", {}).values())
print(f"| {seed} | {s['verdict']} | {c['operations']} | {o.get('ok', 0) + o.get('rejected', 0)} | "
      f"{o.get('unknown', 0)} | {o.get('failed', 0)} | {c['retried_operations']} | "
      f"{c['replies_dropped_after_commit']} | {c['replayed']} | {c['leader_changes']} | "
      f"{c['session_expiries']} | {faults} | {s.get('stopped_on_sync_failure', 0)} |")
EOF
done
echo
echo "seeds: $count, duration: $duration each, not passed: $failures"
[ "$failures" = 0 ]
