package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// badURLs do not parse, each with the secret SECRETPW somewhere in it.
var badURLs = []string{
	"redis://user:SECRETPW@host:notaport",
	"redis://user:SECRETPW@host:6379:6380",
	"redis://:SECRETPW@[::1:6379",
	"redis://user:SECRETPW@host:6379/notadb",
	"redis://user:SECRETPW@host:6379/0?dial_timeout=forever",
	"redis://user:SECRET%50W@host:x",
	"redis://user:SECRETPW@h1:26379?master_name=m&addr=h2:x&sentinel_password=SECRETPW",
	"redis://user:SECRETPW@h1:x?addr=h2:7001",
	"rediss://SECRETPW@host:x",
	"redis://u:SECRETPW@host:6379?password=SECRETPW&db=x",
	"redis://u:SECRETPW\"@host:x",
	"redis://u:SECRETPW @host:x",
	"http://u:SECRETPW@host",
}

// TestURLErrorsHideSecrets: whatever is wrong with the URL, the error
// names the problem and never the password, in every mode.
func TestURLErrorsHideSecrets(t *testing.T) {
	for _, u := range badURLs {
		for _, mode := range []string{"", redisstore.ModeSingle, redisstore.ModeSentinel, redisstore.ModeCluster} {
			s, err := redisstore.New(redisstore.Options{URL: u, Mode: mode})
			if err == nil {
				s.Close()
				continue // some URLs are fine for some modes
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("New(%q, mode %q) error holds the secret: %v", u, mode, err)
			}
			if !strings.Contains(err.Error(), "URL") {
				t.Errorf("New(%q, mode %q) error does not name the URL: %v", u, mode, err)
			}
		}
	}
}

func TestRedact(t *testing.T) {
	tests := []struct{ give, want string }{
		{"redis://u:pw@h:1", "redis://u:xxxxx@h:1"},
		{"--redis-url=redis://:pw@h:1/0", "--redis-url=redis://:xxxxx@h:1/0"},
		{`parse "redis://u:p@ss@h:x": invalid port`, `parse "redis://u:xxxxx@h:x": invalid port`},
		{"redis://token@h", "redis://xxxxx@h"},
		{"redis://h1:26379?master_name=m&sentinel_password=sp&addr=h2", "redis://h1:26379?master_name=m&sentinel_password=xxxxx&addr=h2"},
		{"redis://h:1", "redis://h:1"},
		{"no url here: pw", "no url here: pw"},
		{"redis://u:p%40w@h p@w", "redis://u:xxxxx@h xxxxx"},
	}
	for _, tt := range tests {
		if got := redisstore.Redact(tt.give); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

// TestPasswordOption: Options.Password authenticates where the URL has
// none, and wins over a wrong one in the URL.
func TestPasswordOption(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := srv.Client().ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	check := limit.Check{Key: "k", Limit: 5, WindowUS: 60e6, Hits: 1}
	for _, tt := range []struct {
		url, password string
		ok            bool
	}{
		{srv.URL(), "", false},
		{srv.URL(), "s3cret", true},
		{"redis://:wrong@" + srv.Addr(), "s3cret", true},
	} {
		s, err := redisstore.New(redisstore.Options{URL: tt.url, Password: tt.password, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Evaluate(ctx, []limit.Check{check})
		s.Close()
		if (err == nil) != tt.ok {
			t.Errorf("URL %s, password %q: %v", tt.url, tt.password, err)
		}
	}
}
