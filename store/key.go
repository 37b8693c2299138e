package store

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"
)

// MaxKeyLen is the longest key drip accepts, in bytes. Prepare and every
// store's Reset refuse a longer key with ErrKeyTooLong. The bound counts
// the key as the store gets it, with Prefixed's prefix and Sharded's
// suffix. A store's own prefix (redisstore.WithPrefix) is not counted.
//
// drip's front doors never send a longer key: they hash rule values over
// 128 bytes and pass every key through FitKey. Only a caller that
// chooses keys can meet the error: the library, or the decision API's
// inline "key" (a 400).
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

// FitKey returns key when it is at most MaxKeyLen/2 bytes long. A longer
// key becomes "sha256:" and its hex SHA-256 (71 bytes). Front doors use
// it on keys built from request content: a long value gets a key of its
// own instead of a refusal. The other half of MaxKeyLen is room for what
// wrappers add (Prefixed, Sharded). A key refused there would look like a
// failing store, and on_error allow would let its client pass.
func FitKey(key string) string {
	if len(key) <= MaxKeyLen/2 {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ShardKey is the key of shard i of key (Sharded).
func ShardKey(key string, i int) string { return key + "#" + strconv.Itoa(i) }

// WindowStart returns the default grid offset of a fixed window for key:
// a hash of the key modulo period. Windows of different keys spread over
// the period; a key always gets the same offset.
func WindowStart(key string, period time.Duration) time.Duration {
	if period <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return time.Duration(h.Sum64() % uint64(period))
}
