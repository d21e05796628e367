package incumbentstats

import (
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/DataDog/datadog-go/v5/statsd"
)

// Mogrifier renames a stat for DogStatsD into a name and tags, as the
// incumbent's DOG_STATSD_MOGRIFIER_<X>_{PATTERN,NAME,TAGS} do: $0, $1, ...
// in Name and the tag values stand for Pattern's match and groups.
type Mogrifier struct {
	Pattern *regexp.Regexp
	Name    string
	Tags    map[string]string
}

var groupRef = regexp.MustCompile(`\$\d+`)

func expand(tmpl string, groups []string) string {
	return groupRef.ReplaceAllStringFunc(tmpl, func(ref string) string {
		if i, err := strconv.Atoi(ref[1:]); err == nil && i < len(groups) {
			return groups[i]
		}
		return ""
	})
}

// dogSink sends to a DogStatsD agent with DataDog's client: gostats' tags
// (.__k=v) become DogStatsD tags, then the first matching mogrifier
// renames the stat (in the order given; the incumbent tries its
// mogrifiers in random order).
type dogSink struct {
	client     *statsd.Client
	mogrifiers []Mogrifier
	mu         sync.RWMutex
	names      map[string]dogName // bounded by the store's names
}

type dogName struct {
	name string
	tags []string
}

func (s *Stats) newDogStatsd(host string, port int) (*dogSink, error) {
	c, err := statsd.New(host+":"+strconv.Itoa(port), statsd.WithoutClientSideAggregation(), statsd.WithoutTelemetry(),
		statsd.WithErrorHandler(func(err error) { s.sinkError("dogstatsd", err.Error()) }))
	if err != nil {
		return nil, fmt.Errorf("dogstatsd: %w", err)
	}
	return &dogSink{client: c, mogrifiers: s.opts.Mogrifiers, names: map[string]dogName{}}, nil
}

// resolve is name's DogStatsD name and tags, worked out once.
func (d *dogSink) resolve(name string) dogName {
	d.mu.RLock()
	n, ok := d.names[name]
	d.mu.RUnlock()
	if ok {
		return n
	}
	base, labels := splitTags(name)
	n.name = base
	for k, v := range labels {
		n.tags = append(n.tags, k+":"+v)
	}
	for _, m := range d.mogrifiers {
		groups := m.Pattern.FindStringSubmatch(base)
		if groups == nil {
			continue
		}
		n.name = expand(m.Name, groups)
		for k, v := range m.Tags {
			n.tags = append(n.tags, k+":"+expand(v, groups))
		}
		break
	}
	d.mu.Lock()
	d.names[name] = n
	d.mu.Unlock()
	return n
}

func (d *dogSink) FlushCounter(name string, v uint64) {
	n := d.resolve(name)
	_ = d.client.Count(n.name, int64(v), n.tags, 1)
}

func (d *dogSink) FlushGauge(name string, v uint64) {
	n := d.resolve(name)
	_ = d.client.Gauge(n.name, float64(v), n.tags, 1)
}

func (d *dogSink) FlushTimer(name string, ms float64) {
	n := d.resolve(name)
	_ = d.client.Timing(n.name, time.Duration(ms*float64(time.Millisecond)), n.tags, 1)
}

func (d *dogSink) Flush() { _ = d.client.Flush() }

func (d *dogSink) close() { _ = d.client.Close() }
