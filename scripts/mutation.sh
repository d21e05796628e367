#!/usr/bin/env bash
# Mutation testing of the packages that hold the decision logic, with
# Gremlins (github.com/go-gremlins/gremlins, pinned below): it changes the
# code one operator at a time (a < into <=, a + into -, a condition
# negated, ...) where the tests cover it, runs those tests, and lists the
# mutants no test noticed (LIVED). Reported, not gating CI: read the LIVED
# lines, and for each either write the test that kills it or say why the
# change is harmless. Slow: about a minute for internal/limit, over 15 for
# internal/service (each mutant runs the package's tests, Redis included);
# takes package paths, default the list below. Needs redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
# go-control-plane's generated vtprotobuf code encodes responses only in
# builds with this tag (internal/server/encode_vtprotobuf.go).
export GOFLAGS="-tags=vtprotobuf${GOFLAGS:+ $GOFLAGS}"
GREMLINS=github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0
export RATELIMITD_REDIS_SERVER="${RATELIMITD_REDIS_SERVER:-$(command -v redis-server || true)}"
pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
	pkgs=(./internal/limit ./internal/service ./internal/memstore ./internal/overlimitcache ./config)
fi
for p in "${pkgs[@]}"; do
	echo "== $p"
	# One worker: the tests start redis-server and time things; parallel
	# mutants on two cores would turn timeouts into false kills.
	go run "$GREMLINS" unleash "$p" --workers 1 --output-statuses lt || true
done
