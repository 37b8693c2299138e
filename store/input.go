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

// AnsweredError is an error the store answered about one call's items:
// its script or statement failed on their values (a Lua error, an
// arithmetic or constraint error in SQL) while the store itself worked.
// Unlike an InputError, the request passed every check drip makes, so
// the fault is drip's or the store's, not the caller's; unlike a failing
// store, it says nothing about the store's health. The engine's circuit
// breaker does not count it (the store answered), and the decision API
// answers it with 500 for that request alone. Stores wrap such errors in
// it (drip's own do); its message is the underlying error's.
type AnsweredError struct{ Err error }

func (e *AnsweredError) Error() string { return e.Err.Error() }

// Unwrap returns the store's error.
func (e *AnsweredError) Unwrap() error { return e.Err }

// IsAnswered reports whether err is (or wraps) an AnsweredError.
func IsAnswered(err error) bool {
	var ae *AnsweredError
	return errors.As(err, &ae)
}
