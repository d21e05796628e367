#!/usr/bin/env bash
# The token budget's figures on the traffic Envoy AI Gateway and Envoy
# Gateway really send (docs/BENCHMARKS.md, "Token budgets on real
# traffic"): starts its own redis-server on a free port and ratelimitd
# with the default settings plus --redis-timeout 1s (and any arguments
# given), runs each scenario of cmd/ratelimitd-bench -budget on a fresh
# counter, prints each report, and stops what it started.
# Usage: scripts/budget-bench.sh [ratelimitd arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
# go-control-plane's generated vtprotobuf code encodes responses only in
# builds with this tag (internal/server/encode_vtprotobuf.go).
export GOFLAGS="-tags=vtprotobuf${GOFLAGS:+ $GOFLAGS}"
. scripts/stack.sh
stack_start deploy/bench/rules.yaml --redis-timeout 1s "$@"
run() { echo "== $1"; shift; "$TMP/bench" -addr "127.0.0.1:$GRPC" -budget "$@"; }
run "three uncharged checks: 10,000 budget, check, charge 2,500, three checks never charged" -budget-key budget_10k -budget-limit 10000 -sequence uncharged -duration 400s
run "check, charge 600,000 of 1,000,000, check" -sequence large
run "AI Gateway's five budgets, cached 0 on 90 % of streams, 8 streams" -kinds -budget-key kind_total -budget-limit 100000000 -streams 8 -duration 20s
# Failing streams, as Envoy sends them and with the request's id paired
# (-pair, the budget_pair rule), each retried every 50 ms and as OpenAI's
# SDK retries (-retry-policy sdk); SCALE=10 makes the streams ten times
# longer (and the run too).
SCALE=${SCALE:-1}
for n in 8 64; do
	for shape in none zero; do
		for pair in "" "-pair -budget-key budget_pair"; do
			for retry in fixed sdk; do
				# shellcheck disable=SC2086 # $pair is two options or none
				run "$n streams, 10 % fail ($shape stream-end call), ${pair:+paired, }retry $retry, streams x$SCALE" -streams "$n" -fail-rate 0.1 -fail-shape "$shape" $pair -retry-policy "$retry" \
					-stream-min "$((20 * SCALE))ms" -stream-max "$((200 * SCALE))ms" -duration "$((8 * SCALE))s"
			done
		done
	done
done
run "flood: 4 streams on a 10,000,000 budget, one more sharer sends 5,000 uncharged checks" -budget-key budget_10m -budget-limit 10000000 -streams 4 -flood 5000 -flood-at 2s -duration 30s
run "fresh 100,000 budget, 64 streams" -budget-key budget_100k -budget-limit 100000 -streams 64 -duration 8s
run "QuotaPolicy's shape: 16 streams x 50 requests, 10,000 budget" -quota -budget-key budget_10k -budget-limit 10000 -streams 16 -requests 50 -tokens-min 50 -tokens-max 250 -duration 60s
for n in 64 256; do
	run "$n streams, all charging" -streams "$n" -duration 8s
done
