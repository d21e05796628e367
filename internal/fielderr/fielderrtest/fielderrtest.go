// Package fielderrtest checks a component's Options.Validate.
package fielderrtest

import (
	"errors"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"
)

// Refusal is options Validate must refuse, naming Field.
type Refusal[O any] struct {
	Field   string
	Options O
}

// Check fails t unless the zero Options are valid and each refusal is
// refused by its field's name.
func Check[O interface{ Validate() error }](t *testing.T, refusals []Refusal[O]) {
	t.Helper()
	var zero O
	if err := zero.Validate(); err != nil {
		t.Errorf("zero options: %v", err)
	}
	for _, r := range refusals {
		var fe *fielderr.Error
		if err := r.Options.Validate(); !errors.As(err, &fe) || fe.Field != r.Field {
			t.Errorf("%+v: %v, want a refusal of %s", r.Options, err, r.Field)
		}
	}
}
