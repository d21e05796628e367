#!/usr/bin/env bash
# Runs the whole test suite. Installs redis-server from Debian's packages
# when it is missing; the tests start (and stop) their own redis-server
# processes on free loopback ports and never touch any other Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null 2>&1; then
	echo "test.sh: installing redis-server" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
	# The package may start a service of its own; tests never use it.
fi
export RATELIMITD_REDIS_SERVER="$(command -v redis-server)"
export RATELIMITD_REQUIRE_REDIS=1
test -z "$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
go vet ./...
go test -race -count=1 ./...
# The race detector multiplies memory and time: the tests of resource
# bounds and of recovery within 20 ms assert them only in this second
# run, without it, one package at a time.
go test -p 1 -count=1 -run 'TestBombsBounded|TestHotReloadBombs|TestCheckConfigBombs|TestSlowReaderBounded|TestPausedRedisBounded|TestShortStallsKeepLimiting' \
	./config ./cmd/ratelimitd ./internal/redisstore ./internal/service
