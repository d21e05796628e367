package service

import (
	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/record"
)

// record tells every recorder of a descriptor's decision, once.
func (s *Service) record(d record.Decision) {
	for _, r := range s.recorders {
		r.Record(d)
	}
}

// event tells every recorder of a request-level event, once.
func (s *Service) event(e record.Event) {
	for _, r := range s.recorders {
		r.Event(e)
	}
}

// useRules tells the recorders that count under the rules in force of
// snap, before the requests that use it.
func (s *Service) useRules(snap *config.Snapshot) {
	for _, r := range s.recorders {
		if u, ok := r.(record.RulesUser); ok {
			u.UseRules(snap)
		}
	}
}
