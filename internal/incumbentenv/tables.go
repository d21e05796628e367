package incumbentenv

// Settings are the incumbent's variables and what becomes of each. Those
// read together (Redis address, runtime directory, listen addresses,
// stats sinks, tracing) are handled in Envoyproxy; docs/migrating.md
// lists them all.
var Settings = []Setting{
	{Name: "LOCAL_CACHE_SIZE_IN_BYTES", Flag: "local-cache-size"},
	{Name: "CACHE_KEY_PREFIX", Flag: "key-prefix"},
	{Name: "SHADOW_MODE", Flag: "shadow-mode"},
	{Name: "MERGE_DOMAIN_CONFIG", Flag: "merge-domains"},
	{Name: "NEAR_LIMIT_RATIO", Flag: "near-limit-ratio"},
	{Name: "LOG_FORMAT", Flag: "log-format"},
	{Name: "GRPC_SERVER_TLS_CERT", Flag: "grpc-tls-cert"},
	{Name: "GRPC_SERVER_TLS_KEY", Flag: "grpc-tls-key"},
	{Name: "GRPC_CLIENT_TLS_CACERT", Flag: "grpc-client-ca"},
	{Name: "REDIS_TLS_CACERT", Flag: "redis-tls-ca"},
	{Name: "REDIS_TLS_CLIENT_CERT", Flag: "redis-tls-cert"},
	{Name: "REDIS_TLS_CLIENT_KEY", Flag: "redis-tls-key"},
	{Name: "BACKEND_TYPE", OK: []string{"redis"}, Refuse: "ratelimitd keeps counters in Redis (or in process); there is no memcache backend"},
	{Name: "CONFIG_TYPE", OK: []string{"FILE", "GRPC_XDS_SOTW"}, Refuse: "want FILE or GRPC_XDS_SOTW"},
	{Name: "REDIS_SENTINEL_AUTH", Refuse: "sentinels that require a password are not supported"},
	{Name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", OK: []string{"false"}, Refuse: "ratelimitd always verifies Redis's certificate name"},
	{Name: "GRPC_CLIENT_TLS_SAN", Refuse: "client certificates are verified against --grpc-client-ca, not a SAN"},
	{Name: "GRPC_UDS", Refuse: "gRPC on a unix socket is not supported"},
	{Name: "QUOTA_MODE", OK: []string{"false"}, Refuse: "global quota mode is not supported; set quota_mode on the rules"},
	{Name: "LIMIT_LIMIT_HEADER", Flag: "response-header-limit"},
	{Name: "LIMIT_REMAINING_HEADER", Flag: "response-header-remaining"},
	{Name: "LIMIT_RESET_HEADER", Flag: "response-header-reset"},
	{Name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Ignore: "a rejected request never consumes, always; a usage charge (hits stated at stream end, rejected_hits: usage) is recorded whatever the answer"},
	{Name: "EXPIRATION_JITTER_MAX_SECONDS", Ignore: "keys expire at their window's end, set in the same script"},
	{Name: "RESPONSE_DYNAMIC_METADATA", Flag: "response-dynamic-metadata"},
	// Either value is honoured by what is always watched: a swap of
	// the RUNTIME_ROOT symlink (true's reload) and every change in the
	// config directory (false's).
	{Name: "RUNTIME_WATCH_ROOT", OK: []string{"true", "false", "1", "0", "t", "f"}, Refuse: "want true or false"},
	{Name: "RUNTIME_IGNOREDOTFILES", Ignore: "dot files are always skipped"},
	{Name: "EXTRA_TAGS", Flag: "statsd-tags"},
	{Name: "STATS_FLUSH_INTERVAL", Flag: "stats-flush-interval"},
	{Name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", OK: []string{"false"}, Refuse: "the response time histogram is in seconds (the mapping's scale: 0.001), as the incumbent's default"},
	{Name: "GRPC_SERVER_TLS_CA_CERT", Ignore: "not a variable envoyproxy/ratelimit reads (it verifies clients with GRPC_CLIENT_TLS_CACERT), so not one ratelimitd reads either"},
	{Name: "REDIS_POOL_SIZE", Ignore: "one batching connection per Redis serves every request (--redis-dispatchers)"},
	{Name: "REDIS_PIPELINE_WINDOW", Ignore: "requests are batched with no added wait"},
	{Name: "REDIS_PIPELINE_LIMIT", Ignore: "requests are batched with no added wait"},
	{Name: "REDIS_TIMEOUT", Flag: "redis-timeout"},
	{Name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", Ignore: "calls are bounded by --redis-timeout"},
	{Name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Ignore: "health stays SERVING and Redis failures answer by failure_mode"},
	{Name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Ignore: "the service serves only once it has valid rules, unless --xds-start-without-rules"},
	{Name: "GRPC_MAX_CONNECTION_AGE", Ignore: "fixed at 24h"},
	{Name: "GRPC_MAX_CONNECTION_AGE_GRACE", Ignore: "fixed at 1h"},
	{Name: "TRACING_SERVICE_NAME", Flag: "tracing-service-name"},
	{Name: "TRACING_SERVICE_NAMESPACE", Flag: "tracing-service-namespace"},
	{Name: "TRACING_SERVICE_INSTANCE_ID", Flag: "tracing-service-instance-id"},
	{Name: "TRACING_SAMPLING_RATE", Flag: "tracing-sampling-rate"},
	{Name: "TRACING_EXPORTER_PROTOCOL", Flag: "tracing-protocol"},
}

// XDS are the incumbent's xDS variables, read when
// CONFIG_TYPE=GRPC_XDS_SOTW, with the flags they set.
var XDS = []Setting{
	{Name: "CONFIG_GRPC_XDS_NODE_ID", Flag: "xds-node-id"},
	{Name: "CONFIG_GRPC_XDS_NODE_METADATA", Flag: "xds-node-metadata"},
	{Name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Flag: "xds-headers"},
	{Name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", Flag: "xds-tls"},
	{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Flag: "xds-tls-cert"},
	{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Flag: "xds-tls-key"},
	{Name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Flag: "xds-tls-ca"},
	{Name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", Flag: "xds-tls-server-name"},
	{Name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Flag: "xds-max-message-size"},
	{Name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Flag: "xds-backoff-initial"},
	{Name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", Flag: "xds-backoff-max"},
	{Name: "FORCE_START_WITHOUT_INITIAL_CONFIG", Flag: "xds-start-without-rules"},
	{Name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Ignore: "the wait is always jittered within its second half"},
	{Name: "XDS_CLIENT_BACKOFF_JITTER", Ignore: "the wait is always jittered within its second half"},
	{Name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Ignore: "reconnects follow --xds-backoff-initial and --xds-backoff-max"},
}
