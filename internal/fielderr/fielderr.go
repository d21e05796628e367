// Package fielderr is how a component refuses its Options: an error that
// names the field, which a command can then name by its own flag.
package fielderr

import (
	"errors"
	"fmt"
)

// Error refuses one field of a package's Options.
type Error struct {
	// Pkg and Field name it ("rlqs", "Margin"); Err says why, starting
	// with the value refused.
	Pkg, Field string
	Err        error
}

func (e *Error) Error() string { return e.Pkg + ": " + e.Field + " " + e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns a Error for pkg's field, its reason formatted.
func Errorf(pkg, field, format string, a ...any) error {
	return &Error{Pkg: pkg, Field: field, Err: fmt.Errorf(format, a...)}
}

// Rename gives a Error among err the name names has for its
// "pkg.Field" (a flag, say) in place of the field's; other errors are
// returned as they are.
func Rename(err error, names map[string]string) error {
	var fe *Error
	if errors.As(err, &fe) {
		if n, ok := names[fe.Pkg+"."+fe.Field]; ok {
			return fmt.Errorf("%s %w", n, fe.Err)
		}
	}
	return err
}
