# stack.sh, sourced by the benchmark scripts: stack_start RULES [ratelimitd
# arguments...] builds ratelimitd and ratelimitd-bench into $TMP, starts
# its own redis-server on a free port ($RPORT) and ratelimitd on RULES
# with it ($GRPC, $HTTP), and stops both and removes $TMP when the
# script exits.
TMP=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
stack_start() {
	local rules=$1
	shift
	RPORT=$(free_port); GRPC=$(free_port); HTTP=$(free_port)
	go build -o "$TMP/ratelimitd" ./cmd/ratelimitd
	go build -o "$TMP/bench" ./cmd/ratelimitd-bench
	redis-server --bind 127.0.0.1 --port "$RPORT" --save '' --appendonly no --dir "$TMP" --daemonize no --logfile "$TMP/redis.log" &
	RPID=$!
	"$TMP/ratelimitd" --config "$rules" --redis-url "redis://127.0.0.1:$RPORT" \
		--grpc-addr "127.0.0.1:$GRPC" --http-addr "127.0.0.1:$HTTP" --log-level warn "$@" &
	SPID=$!
	trap 'kill $SPID $RPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
	sleep 1.5
}
