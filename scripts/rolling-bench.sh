#!/usr/bin/env bash
# A rolling update from envoyproxy/ratelimit to ratelimitd on one Redis
# (docs/BENCHMARKS.md, "A rolling update"): starts its own redis-server on
# a free port and ratelimitd (with any arguments given, e.g.
# --carry-incumbent-counts), and runs ratelimitd-bench -rolling: 100
# requests a second on one key of 3,000 a minute, each sent to an
# emulated incumbent pod (its INCRBY and EXPIRE) or to ratelimitd, the
# traffic moving over at once or over a minute, from 25 s into a minute. Prints what both admitted
# in each minute, and stops what it started.
# Usage: scripts/rolling-bench.sh [ratelimitd arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
# go-control-plane's generated vtprotobuf code encodes responses only in
# builds with this tag (internal/server/encode_vtprotobuf.go).
export GOFLAGS="-tags=vtprotobuf${GOFLAGS:+ $GOFLAGS}"
. scripts/stack.sh
printf 'domain: rolling\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3000}\n' > "$TMP/rules.yaml"
stack_start "$TMP/rules.yaml" "$@"
for shift in 0s 60s; do
	echo "== the traffic moved over $shift (0s: at once), from 25 s into a minute"
	"$TMP/bench" -addr "127.0.0.1:$GRPC" -redis "127.0.0.1:$RPORT" -rolling -rolling-limit 3000 -rolling-at 20s \
		-rolling-shift "$shift" -rate 100 -c 16 -duration 130s
done
