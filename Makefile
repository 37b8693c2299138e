# The two commands of README.md, and a few more.
.PHONY: serve test testdeps vet bench fuzz static

serve:
	go run ./cmd/drip serve

# All tests, with the race detector. Integration tests start their own
# PostgreSQL and Redis servers (see internal/testkit/testserver).
#
# go vet type-checks with the build flags of the static binary (STATIC_ENV,
# STATIC_FLAGS: drip has no cgo code and no build tags, so it checks the
# same files). The packages it compiles on the way are then the ones
# deploy's container test links with make static: one build of the whole
# dependency tree instead of two. On a cold build cache, that build inside
# the test took 548 s of the package's 600 s timeout on a loaded 2-core
# machine. Measured times are in BENCHMARKS.md ("The test suite").
#
# The tests that count allocations (testing.AllocsPerRun) skip under the
# race detector, whose sync.Pool drops items: they run once more without
# it, with the vet's build flags, so that their packages come from the
# build vet just made. So do the long simulations of adaptive rules,
# which are five times the CPU under it (engine's simWithoutRace says
# which part of them still runs under it).
#
# Packages run two at once (go test's default on two cores). Four at once
# was a fifth faster beside two busy loops, but the load it adds made a
# reply from PostgreSQL come back after its caller had given up, in a
# test that holds errored requests to taking nothing (BENCHMARKS.md,
# "Four packages at once").
test: testdeps
	$(STATIC_ENV) go vet $(STATIC_FLAGS) ./...
	$(STATIC_ENV) go test $(STATIC_FLAGS) -count=1 -run 'Allocate|AdaptiveOverloadGoals|AdaptiveConverges|AdaptiveRecovers' ./engine/ ./server/ ./server/envoy/
	go test -race -count=1 -timeout 10m ./...

bench:
	cd bench && go test -run '^$$' -bench . -benchmem ./...
	cd bench/global && go test -run '^$$' -bench . -benchmem ./...

fuzz:
	go test -run '^$$' -fuzz FuzzEval -fuzztime 30s .

# testdeps says which test servers are missing. Their tests then skip, and
# their packages still say "ok" (under CI=true they fail instead).
testdeps:
	@command -v redis-server >/dev/null || echo "make test: redis-server not found: the Redis tests will be SKIPPED (apt-get install redis-server)"
	@command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || echo "make test: pgbouncer not found: the PgBouncer tests will be SKIPPED (apt-get install pgbouncer)"
	@command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || echo "make test: nginx not found: the forward auth tests through nginx will be SKIPPED (apt-get install nginx)"
	@command -v caddy >/dev/null || echo "make test: caddy not found: the forward auth tests through Caddy will be SKIPPED (apt-get install caddy)"
	@[ -n "$$PG_BINDIR" ] || command -v initdb >/dev/null || command -v pg_config >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || echo "make test: initdb not found: the PostgreSQL tests will be SKIPPED (apt-get install postgresql, or set PG_BINDIR)"
	@if [ "$$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then echo "make test: running as root without a postgres user: PostgreSQL refuses to run as root, so its tests will be SKIPPED (create the user: useradd --system --no-create-home postgres)"; fi

# static builds the binary of the container image (Dockerfile), the one
# place its flags live: no cgo (it runs on an image with no C library),
# no local paths in it, no symbol tables. deploy/container_test.go builds
# it the same way and runs it in an empty root. OUT names the file;
# VERSION, when set, is what "drip version" prints.
OUT ?= drip
VERSION ?=
STATIC_ENV = CGO_ENABLED=0
STATIC_FLAGS = -trimpath
static:
	$(STATIC_ENV) go build $(STATIC_FLAGS) -ldflags '-s -w -X main.version=$(VERSION)' -o $(OUT) ./cmd/drip
