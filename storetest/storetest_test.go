package storetest_test

import (
	"testing"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

func TestMemstore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) drip.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}
