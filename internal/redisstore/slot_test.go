package redisstore

import "testing"

func TestSlot(t *testing.T) {
	// Values from CLUSTER KEYSLOT.
	tests := []struct {
		give string
		want int
	}{
		{"123456789", 12739}, // the CRC16/XMODEM check value 0x31C3
		{"foo", 12182},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", 8363}, // an empty tag is no tag
		{"foo{{bar}}zap", 4015},
		{"", 0},
	}
	for _, tt := range tests {
		if got := slot(tt.give); got != tt.want {
			t.Errorf("slot(%q) = %d, want %d", tt.give, got, tt.want)
		}
	}
}

func TestRefusedWhole(t *testing.T) {
	for msg, want := range map[string]bool{
		"NOPERM this user has no permissions to access one of the keys used as arguments": true,
		"NOPERM this user has no permissions to run the 'evalsha' command":                false,
		"WRONGTYPE Operation against a key holding the wrong kind of value":               false,
	} {
		if got := refusedWhole(scriptError(msg)); got != want {
			t.Errorf("refusedWhole(%q) = %v, want %v", msg, got, want)
		}
	}
}
