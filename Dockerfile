# drip serve in a container: one static binary and the CA certificates
# (for rediss:// and TLS to PostgreSQL), nothing else; it runs as a
# non-root user.
#
#   docker build -t drip .
#   docker run -p 8080:8080 -p 9090:9090 drip
#   docker run drip --store redis://redis:6379 --upstream http://app:8000
#
# deploy/container_test.go builds the same binary (make static) and runs it
# in an empty root holding only what this image holds.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=
RUN make static OUT=/out/drip VERSION=$VERSION

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/drip /drip
# The same binary as /bin/ratelimit, the command Envoy Gateway's rate
# limit Deployment runs: drip serve with envoyproxy/ratelimit's
# environment (docs/envoy.md).
COPY --from=build /out/drip /bin/ratelimit
# drip serve listens on loopback by default; in a container it must listen
# on every interface to be reached. Flags (--listen, --admin-listen) and
# these variables can still be overridden at run time.
ENV DRIP_LISTEN=0.0.0.0:8080 DRIP_ADMIN_LISTEN=0.0.0.0:9090
# 8080: the decision API or gateway; 9090: /metrics, /healthz, /readyz and
# the admin API; 8081: Envoy's rate limit service, when --grpc-listen
# 0.0.0.0:8081 turns it on.
EXPOSE 8080 8081 9090
USER 65532:65532
ENTRYPOINT ["/drip", "serve"]
