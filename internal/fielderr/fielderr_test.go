package fielderr

import (
	"errors"
	"fmt"
	"testing"
)

func TestRename(t *testing.T) {
	err := Errorf("rlqs", "Margin", "%v: want at most 1m", "2m0s")
	if got := err.Error(); got != "rlqs: Margin 2m0s: want at most 1m" {
		t.Errorf("Error() = %q", got)
	}
	names := map[string]string{"rlqs.Margin": "--rlqs-margin"}
	if got := Rename(fmt.Errorf("wrapped: %w", err), names).Error(); got != "--rlqs-margin 2m0s: want at most 1m" {
		t.Errorf("renamed: %q", got)
	}
	if got := Rename(Errorf("rlqs", "Other", "x"), names).Error(); got != "rlqs: Other x" {
		t.Errorf("a field without a name: %q", got)
	}
	plain := errors.New("plain")
	if Rename(plain, names) != plain {
		t.Error("a plain error changed")
	}
}
