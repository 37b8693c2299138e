module github.com/driplimit/drip/examples/keyfunc/chi

go 1.26.0

replace github.com/driplimit/drip => ../../..

require (
	github.com/driplimit/drip v0.0.0-00010101000000-000000000000
	github.com/go-chi/chi/v5 v5.5.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/golang-jwt/jwt/v5 v5.3.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
)
