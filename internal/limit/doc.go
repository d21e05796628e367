// Package limit defines the algorithms both stores implement, the counter
// key encoding, and the types a store decides on. The Lua script of
// redisstore and the Go of memstore must agree with [Decide]; tests feed
// both the same traffic and compare.
package limit
