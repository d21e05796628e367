# Multi-stage: a static binary on a minimal non-root base. The image has no
# shell; probes use `ratelimitd healthcheck`.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /ratelimitd ./cmd/ratelimitd

FROM gcr.io/distroless/static:nonroot
COPY --from=build /ratelimitd /ratelimitd
USER nonroot:nonroot
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=3s CMD ["/ratelimitd", "healthcheck", "--addr=127.0.0.1:8081"]
ENTRYPOINT ["/ratelimitd"]
CMD ["--config=/etc/ratelimitd/rules"]
