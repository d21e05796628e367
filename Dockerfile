# Multi-stage: a static binary on a minimal non-root base. The image has no
# shell; probes use `ratelimitd healthcheck`.
#
# The binary is also /bin/ratelimit, where envoyproxy/ratelimit's images
# keep theirs: run under that name (Envoy Gateway's Deployment runs
# /bin/ratelimit with no arguments), it reads the incumbent's environment
# (--env-compat=envoyproxy), so swapping the image is the whole change.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -tags vtprotobuf -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ratelimitd ./cmd/ratelimitd \
	&& mkdir -p /out/bin && ln -s /ratelimitd /out/bin/ratelimit

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/ /
USER nonroot:nonroot
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=3s CMD ["/ratelimitd", "healthcheck", "--addr=127.0.0.1:8081"]
ENTRYPOINT ["/ratelimitd"]
CMD ["--config=/etc/ratelimitd/rules"]
