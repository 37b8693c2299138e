# The two commands of README.md, and a few more.
.PHONY: serve test vet bench fuzz

serve:
	go run ./cmd/drip serve

# All tests, with the race detector. Integration tests start their own
# PostgreSQL and Redis servers (see internal/testserver).
test:
	go vet ./...
	go test -race -count=1 -timeout 10m ./...

bench:
	cd bench && go test -run '^$$' -bench . -benchmem ./...

fuzz:
	go test -run '^$$' -fuzz FuzzEval -fuzztime 30s .
