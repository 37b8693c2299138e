package store

import "errors"

// InputError is a request that is not valid as written: bad JSON, an
// unknown field, a bad time, op, limit or cost, a missing key. It is the
// caller's fault, never the store's: the decision API answers it with
// 400, drip replay prints it and goes on. Its message is the underlying
// error's.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error (ErrMissingKey, ErrInvalidLimit, ...).
func (e *InputError) Unwrap() error { return e.Err }

// IsInput reports whether err is the caller's fault rather than a failing
// store's: an *InputError, or one of the input errors of this package
// (ErrInvalidLimit, ErrInvalidCost, ErrMissingKey, ErrCostExceedsBurst,
// ErrNoRequests, ErrDuplicateKey, ErrNotColocated, ErrInvalidOp,
// ErrKeyTooLong, ErrInvalidLease).
func IsInput(err error) bool {
	var ie *InputError
	if errors.As(err, &ie) {
		return true
	}
	for _, x := range []error{ErrInvalidLimit, ErrInvalidCost, ErrMissingKey,
		ErrCostExceedsBurst, ErrNoRequests, ErrDuplicateKey, ErrNotColocated, ErrInvalidOp, ErrKeyTooLong, ErrInvalidLease} {
		if errors.Is(err, x) {
			return true
		}
	}
	return false
}
