package main

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/driplimit/drip/internal/redact"
)

// Protocols of the OTLP exporter (OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	protoGRPC = "grpc"
	protoHTTP = "http/protobuf"
)

// traceSettings is what the OTEL_* environment asks of drip serve's
// tracing.
type traceSettings struct {
	On       bool
	Protocol string // protoGRPC or protoHTTP, when On
}

// traceEnv reads the OTEL_* variables that turn tracing on and pick the
// exporter's protocol. Tracing is off unless OTEL_TRACES_EXPORTER is
// "otlp" or an OTLP endpoint is set; OTEL_SDK_DISABLED=true and
// OTEL_TRACES_EXPORTER=none turn it off whatever else is set. The
// exporter and the SDK read the rest themselves (endpoint, headers,
// timeout, sampler, service name).
func traceEnv(getenv func(string) string) (traceSettings, error) {
	get := func(k string) string { return strings.TrimSpace(getenv(k)) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return traceSettings{}, nil
	}
	var on bool
	if exp := get("OTEL_TRACES_EXPORTER"); exp != "" {
		for _, x := range strings.Split(exp, ",") {
			switch x = strings.ToLower(strings.TrimSpace(x)); x {
			case "none":
				return traceSettings{}, nil
			case "otlp":
				on = true
			default:
				return traceSettings{}, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: drip exports traces with otlp only (or none)", exp)
			}
		}
	} else {
		on = get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	}
	if !on {
		return traceSettings{}, nil
	}
	name, proto := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		name, proto = "OTEL_EXPORTER_OTLP_PROTOCOL", get("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto {
	case "", protoHTTP:
		proto = protoHTTP
	case protoGRPC:
	default:
		return traceSettings{}, fmt.Errorf("%s=%q: want grpc or http/protobuf", name, proto)
	}
	return traceSettings{On: true, Protocol: proto}, nil
}

// startTracing returns the tracer provider the environment asks for, nil
// when tracing is off; drip serve shuts it down (flushing the spans
// still batched) on its way out. The service name is "drip"
// unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say otherwise.
// Export failures are logged to log.
func startTracing(ctx context.Context, getenv func(string) string, log *slog.Logger) (*sdktrace.TracerProvider, error) {
	ts, err := traceEnv(getenv)
	if err != nil || !ts.On {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	if ts.Protocol == protoGRPC {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", redact.Error(err)) // the endpoint's URL may hold a password
	}
	info, _ := debug.ReadBuildInfo()
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "drip"), attribute.String("service.version", strings.TrimPrefix(versionLine(info, version), "drip "))),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: after, so they win
		resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("drip serve: tracing", "err", redact.Error(err))
	}))
	// The sampler comes from OTEL_TRACES_SAMPLER and _ARG (the SDK reads
	// them; by default it follows the caller's sampled flag and samples
	// every new trace), the batching from OTEL_BSP_*.
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
