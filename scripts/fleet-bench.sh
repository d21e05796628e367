#!/usr/bin/env bash
# Leased budgets, measured (docs/BENCHMARKS.md, "Leases"): starts its own
# redis-server on a free port and N ratelimitd instances sharing it, then
# with cmd/ratelimitd-bench:
#  1. the steady state on one hot key, one instance, closed loop: the key
#     without lease, then three rounds of the no-op server and the key with
#     lease, interleaved (the host's load moves single runs by a third);
#  2. a per-second rule (1000/s) offered 1.5x and 3x, split evenly or with
#     one instance taking half, on 4 and 10 instances, 5 windows each;
#  3. Redis stopped (SIGSTOP) 70 ms every 400 ms for 6 s under 3000
#     req/s of open loop on one instance: the hot key with and without
#     lease, and the answers given by failure policy (fail_open) meanwhile;
#  4. a per-minute rule (60000/min) offered 1.5x, 4 instances, even and
#     skewed, 2 windows each (skip with QUICK=1).
# Each run reports per window what the fleet admitted against the limit,
# and Redis round trips, Redis CPU and service CPU per decision.
# Usage: scripts/fleet-bench.sh [ratelimitd arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
# go-control-plane's generated vtprotobuf code encodes responses only in
# builds with this tag (internal/server/encode_vtprotobuf.go).
export GOFLAGS="-tags=vtprotobuf${GOFLAGS:+ $GOFLAGS}"
TMP=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
go build -o "$TMP/ratelimitd" ./cmd/ratelimitd
go build -o "$TMP/bench" ./cmd/ratelimitd-bench
RPORT=$(free_port)
redis-server --bind 127.0.0.1 --port "$RPORT" --save '' --appendonly no --dir "$TMP" --daemonize no --logfile "$TMP/redis.log" &
RPID=$!
PIDS+=($RPID)
NOOP=$(free_port)
"$TMP/bench" -noop "127.0.0.1:$NOOP" 2>/dev/null &
NPID=$!
PIDS+=($NPID)
ADDRS=(); SPIDS=(); HTTPS=()
# The fleet answers with --decision-metadata: its reset_us places each
# answer in its window exactly. The steady state is measured on an
# instance without it, as deployed.
for i in $(seq 1 11); do
	G=$(free_port); H=$(free_port)
	META=--decision-metadata
	[ "$i" = 11 ] && META=--decision-metadata=false
	"$TMP/ratelimitd" --config deploy/bench/rules.yaml --redis-url "redis://127.0.0.1:$RPORT" \
		--grpc-addr "127.0.0.1:$G" --http-addr "127.0.0.1:$H" --local-cache-size 16MiB --log-level warn $META "$@" &
	PIDS+=($!); SPIDS+=($!); ADDRS+=("127.0.0.1:$G"); HTTPS+=("127.0.0.1:$H")
done
sleep 2
join() { local IFS=,; echo "$*"; }
R="127.0.0.1:$RPORT"

echo "== 1. steady state, one instance, closed loop, 64 callers, one key"
echo "-- exact_hot (no lease)"; "$TMP/bench" -duration 8s -addr "${ADDRS[10]}" -pid "${SPIDS[10]}" -redis "$R" -dkey exact_hot -keys 1
for round in 1 2 3; do
	echo "-- round $round: no-op server"; "$TMP/bench" -duration 8s -addr "127.0.0.1:$NOOP" -pid $NPID -keys 1
	echo "-- round $round: lease_hot"; "$TMP/bench" -duration 8s -addr "${ADDRS[10]}" -pid "${SPIDS[10]}" -redis "$R" -dkey lease_hot -keys 1
done

echo "== 2. per-second rule, 1000/s"
for n in 4 10; do
	for split in even skewed; do
		for mult in 1.5 3; do
			rate=$(python3 -c "print(int($mult*1000))")
			echo "-- $n instances, $split, ${mult}x"
			"$TMP/bench" -fleet "$(join "${ADDRS[@]:0:$n}")" -pids "$(join "${SPIDS[@]:0:$n}")" -redis "$R" \
				-split "$split" -key lease_s -window 1s -limit 1000 -windows 5 -rate "$rate" -conns 1
		done
	done
done
echo "== 3. Redis stopped 70 ms every 400 ms, one instance, open loop at 3000/s"
fail_open() { curl -s "http://${HTTPS[10]}/metrics" | awk '/^ratelimitd_decisions_total/ && /outcome="fail_open"/ {n += $2} END {print n + 0}'; }
for key in exact_hot lease_hot; do
	before=$(fail_open)
	( for _ in $(seq 1 15); do sleep 0.33; kill -STOP $RPID; sleep 0.07; kill -CONT $RPID; done ) &
	STALLS=$!
	echo "-- $key"
	"$TMP/bench" -duration 6s -warmup 1s -mode open -rate 3000 -addr "${ADDRS[10]}" -pid "${SPIDS[10]}" -dkey "$key" -keys 1
	wait $STALLS
	kill -CONT $RPID
	echo "answered by failure policy (fail_open): $(( $(fail_open) - before ))"
done
if [ -z "${QUICK:-}" ]; then
	echo "== 4. per-minute rule, 60000/min"
	for split in even skewed; do
		echo "-- 4 instances, $split, 1.5x"
		"$TMP/bench" -fleet "$(join "${ADDRS[@]:0:4}")" -pids "$(join "${SPIDS[@]:0:4}")" -redis "$R" \
			-split "$split" -key lease_m -window 1m -limit 60000 -windows 2 -rate 1500 -conns 1
	done
fi
