package store

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"
)

// MaxKeyLen is the longest key drip accepts, in bytes. A longer key is
// refused with ErrKeyTooLong, by Prepare (so every take, peek and refund)
// and by every store's Reset, so that no caller can make a store hold huge
// keys. The bound counts the key as the store is given it: with Prefixed,
// the prefix too, and with Sharded the shard's suffix; a store's own
// prefix (redisstore.WithPrefix) is not counted.
//
// drip's own front doors never send a longer key: the middleware and the
// decision API hash rule values over 128 bytes, and they and Envoy's
// service pass every key they build through FitKey. Only a caller who
// chooses keys itself (the library, the decision API's inline "key") can
// meet the error: the decision API answers it with 400.
const MaxKeyLen = 1024

// CheckKey returns ErrMissingKey for an empty key and ErrKeyTooLong for a
// key over MaxKeyLen bytes; nil otherwise. Prepare calls it; a store's
// Reset calls it too.
func CheckKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return badKey(key)
	}
	return nil
}

// badKey is CheckKey's error, apart so that CheckKey inlines.
func badKey(key string) error {
	if key == "" {
		return ErrMissingKey
	}
	return fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(key), MaxKeyLen)
}

// FitKey returns key when it is at most MaxKeyLen/2 bytes long, and else a
// stand-in of fixed length: "sha256:" and the hex SHA-256 of key (71
// bytes), which no two keys share in practice. Front doors that build keys
// from request content use it, so that a long value is limited under a
// key of its own rather than refused. The other half of MaxKeyLen is room
// for what a store wrapper adds (Prefixed's prefix, Sharded's suffix):
// were a front door's key refused there, the store would seem to fail,
// and the rule's on_error (allow, by default) would let a client who
// chose its values' lengths pass unlimited.
func FitKey(key string) string {
	if len(key) <= MaxKeyLen/2 {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ShardKey is the key of shard i of key (Sharded).
func ShardKey(key string, i int) string { return key + "#" + strconv.Itoa(i) }

// WindowStart is the default grid offset of a fixed window for key: a hash
// of the key modulo period, so that windows of different keys are spread
// over the period. The same key always gets the same offset.
func WindowStart(key string, period time.Duration) time.Duration {
	if period <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return time.Duration(h.Sum64() % uint64(period))
}
