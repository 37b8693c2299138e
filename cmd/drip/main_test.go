package main

import (
	"testing"

	"github.com/driplimit/drip/internal/testserver"
)

// TestMain stops the PostgreSQL and Redis servers the replay tests share.
func TestMain(m *testing.M) { testserver.Main(m) }
