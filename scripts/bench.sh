#!/usr/bin/env bash
# Reproduces docs/BENCHMARKS.md on this machine: starts its own
# redis-server on a free port, the no-op server and ratelimitd, runs the
# scenarios with cmd/ratelimitd-bench, prints each report, and stops what
# it started. Usage: [OPEN_RATE="r1 r2"] scripts/bench.sh [duration,
# default 10s] [ratelimitd arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
# go-control-plane's generated vtprotobuf code encodes responses only in
# builds with this tag (internal/server/encode_vtprotobuf.go).
export GOFLAGS="-tags=vtprotobuf${GOFLAGS:+ $GOFLAGS}"
DUR=${1:-10s}
TMP=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RPORT=$(free_port); NOOP=$(free_port); GRPC=$(free_port); HTTP=$(free_port)
go build -o "$TMP/ratelimitd" ./cmd/ratelimitd
go build -o "$TMP/bench" ./cmd/ratelimitd-bench
redis-server --bind 127.0.0.1 --port "$RPORT" --save '' --appendonly no --dir "$TMP" --daemonize no --logfile "$TMP/redis.log" &
RPID=$!
"$TMP/bench" -noop "127.0.0.1:$NOOP" 2>/dev/null &
NPID=$!
"$TMP/ratelimitd" --config deploy/bench/rules.yaml --redis-url "redis://127.0.0.1:$RPORT" \
	--grpc-addr "127.0.0.1:$GRPC" --http-addr "127.0.0.1:$HTTP" --local-cache-size 16MiB --log-level warn "${@:2}" &
SPID=$!
trap 'kill $SPID $NPID $RPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
sleep 1.5
run() { echo "== $1"; shift; "$TMP/bench" -duration "$DUR" "$@"; }
run "no-op server, closed loop, 64 callers" -addr "127.0.0.1:$NOOP" -pid $NPID
run "A: 1 descriptor, 10000 keys, closed loop, 64 callers" -addr "127.0.0.1:$GRPC" -redis "127.0.0.1:$RPORT" -pid $SPID -metrics "http://127.0.0.1:$HTTP/metrics"
# A again, each request stating its one hit (hits_addend 1, request- and
# descriptor-level): the same plain request, so the same answers and cost.
for h in request descriptor; do
	run "A: hits_addend 1 stated ($h-level)" -addr "127.0.0.1:$GRPC" -hits "$h" -redis "127.0.0.1:$RPORT" -pid $SPID -metrics "http://127.0.0.1:$HTTP/metrics"
done
run "B: 3 descriptors, closed loop, 64 callers" -addr "127.0.0.1:$GRPC" -descriptors 3 -redis "127.0.0.1:$RPORT" -pid $SPID -metrics "http://127.0.0.1:$HTTP/metrics"
run "C: every key over limit, local cache on" -addr "127.0.0.1:$GRPC" -over -redis "127.0.0.1:$RPORT" -pid $SPID -metrics "http://127.0.0.1:$HTTP/metrics"
# D: token budgets (deploy/bench/rules.yaml's budget, 1,000,000 an hour):
# streams of 1,000-4,000 tokens over 20-200 ms, each a check (hits_addend
# 0) then a charge of its tokens; what is let through over the budget,
# and the refusals the budget would have covered.
for n in 8 64 256; do
	run "D: token budget, $n streams" -addr "127.0.0.1:$GRPC" -budget -streams "$n" -duration 8s
done
run "D: token budget, 64 streams, 4 of them 20x longer and larger" -addr "127.0.0.1:$GRPC" -budget -streams 64 -skewed 4 -duration 8s
run "D: token budget, 1 stream, 100,000 budget" -addr "127.0.0.1:$GRPC" -budget -budget-key budget_100k -budget-limit 100000 -streams 1 -duration 8s
# OPEN_RATE="2000 7000": for each rate, the no-op server and then A in
# open loop at that rate.
for rate in ${OPEN_RATE:-}; do
	run "no-op server, open loop at $rate/s" -addr "127.0.0.1:$NOOP" -mode open -rate "$rate" -pid $NPID
	run "A, open loop at $rate/s" -addr "127.0.0.1:$GRPC" -mode open -rate "$rate" -redis "127.0.0.1:$RPORT" -pid $SPID -metrics "http://127.0.0.1:$HTTP/metrics"
done
