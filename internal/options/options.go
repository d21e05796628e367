// Package options is how a component refuses its Options: an error that
// names the field, which a command can then name by its own flag.
package options

import (
	"errors"
	"fmt"
)

// FieldError refuses one field of a package's Options.
type FieldError struct {
	// Pkg and Field name it ("rlqs", "Margin"); Err says why, starting
	// with the value refused.
	Pkg, Field string
	Err        error
}

func (e *FieldError) Error() string { return e.Pkg + ": " + e.Field + " " + e.Err.Error() }

func (e *FieldError) Unwrap() error { return e.Err }

// Errorf returns a FieldError for pkg's field, its reason formatted.
func Errorf(pkg, field, format string, a ...any) error {
	return &FieldError{Pkg: pkg, Field: field, Err: fmt.Errorf(format, a...)}
}

// Rename gives a FieldError among err the name names has for its
// "pkg.Field" (a flag, say) in place of the field's; other errors are
// returned as they are.
func Rename(err error, names map[string]string) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		if n, ok := names[fe.Pkg+"."+fe.Field]; ok {
			return fmt.Errorf("%s %w", n, fe.Err)
		}
	}
	return err
}
