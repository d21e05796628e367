package redisstore

import "strings"

// slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key,
// or of its hash tag — the part between the first '{' and the next '}',
// when not empty — modulo 16384. It must match Redis exactly, so that one
// script call never carries keys of two slots (CROSSSLOT). go-redis keeps
// its own copy internal.
func slot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
