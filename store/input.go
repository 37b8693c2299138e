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

// IsInput reports whether err is the caller's fault, not a failing
// store's. That is an *InputError or one of this package's input errors,
// such as ErrInvalidLimit or ErrKeyTooLong.
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

// AnsweredError is an error the store answered about one call's items.
// Its script or statement failed on their values, while the store
// worked. The request passed every check, so the caller is not at fault.
// It says nothing about the store's health either. The circuit breaker
// does not count it, and the decision API answers it with 500 for that
// request alone. Stores wrap such errors in it; its message is the
// underlying error's.
type AnsweredError struct{ Err error }

func (e *AnsweredError) Error() string { return e.Err.Error() }

// Unwrap returns the store's error.
func (e *AnsweredError) Unwrap() error { return e.Err }

// IsAnswered reports whether err is (or wraps) an AnsweredError.
func IsAnswered(err error) bool {
	var ae *AnsweredError
	return errors.As(err, &ae)
}
