// Package config holds the rules format: the envoyproxy/ratelimit YAML
// (one domain per file), parsed strictly, validated as a whole, and compiled
// into an immutable [Snapshot] whose [Domain.Match] walks descriptor entries
// without allocating.
//
// Parse errors name the file, the line and the problem, and every problem of
// a load is reported at once (joined with [errors.Join]).
package config
