# tierfs — see README.md.
GO      ?= go
BIN     := bin/tierfs
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: build install test fuzz e2e bench bench-local bench-scan bench-scale bench-xfer bench-tier bench-kafka bench-cm bench-peer lint demo deps clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/tierfs

# The binary, and the helper mount(8) runs for -t tierfs (/etc/fstab).
install: build
	install -m 0755 $(BIN) /usr/local/bin/tierfs
	ln -sf /usr/local/bin/tierfs /sbin/mount.tierfs

# Unit tests and real-mount tests (the mount tests need root and /dev/fuse);
# scripts/test runs the Kafka end-to-end cases in two go test runs at once.
test: build
	$(GO) vet ./...
	FUZZTIME=30000x scripts/fuzz
	scripts/test

# Every fuzz target for FUZZTIME each (default 5s; e.g. make fuzz FUZZTIME=10m).
# make test runs a count (30000x), not a duration: a duration can end in the
# middle of minimising an input and fail with "context deadline exceeded".
fuzz:
	scripts/fuzz

# End-to-end tests over real mounts (the Kafka and S3 suites join here as they land).
e2e: build
	$(GO) test -count=1 -timeout 30m ./e2e/...

# Every benchmark, side by side with its peers, into BENCHMARKS.md and the
# chart docs/benchmarks.png (about an hour; QUICK=1: under 5 minutes).
bench:
	QUICK=$(QUICK) scripts/bench

# Transfers against versitygw on loopback: raw aws-sdk-go-v2 limits, then Uploader, Downloader, Reader.
bench-xfer:
	$(GO) run ./bench/xfer -size $(or $(SIZE),1GiB) -runs 3

# Reads of an evicted segment through the mount vs raw GETs, s3fs and rclone; first byte; ls -l of 10,000 segments;
# then 1, 8, 40 and 200 readers of distinct evicted segments and 8 of one, beside rclone and s3fs (peak RSS, waits, GETs per chunk).
bench-tier: build
	$(GO) run ./bench/tier -tierfs $(BIN) -size $(or $(SIZE),1GiB) -runs 3
	$(GO) run ./bench/tierload -tierfs $(BIN) -segments 200 -size 32MiB -runs 3

# A real Kafka broker: produce on a plain dir vs tierfs vs tierfs tiering vs Kafka's own tiered storage (KIP-405,
# Kafka 4.3.0 with LocalTieredStorage); consume from 0, local vs evicted vs from Kafka's remote storage; CPU and store bytes;
# then its start-up with 10,000 segments (200 partitions), plain vs tierfs vs tierfs with every rolled segment evicted;
# then a consumer catching up from 0 on 40 evicted partitions: tierfs's peak RSS against its --cache-bytes.
bench-kafka: build
	$(GO) run ./bench/kafka -tierfs $(BIN) -records $(or $(RECORDS),400000) -runs $(or $(RUNS),5)
	$(GO) run ./bench/kafkastart -tierfs $(BIN) -partitions $(or $(PARTITIONS),200) -segments $(or $(SEGMENTS),50) -runs $(or $(RUNS),5)
	$(GO) run ./bench/kafkacatchup -tierfs $(BIN) -partitions 40 -mib 40 -budgets 64MiB,256MiB -runs 3

# Change management's cost: files and Kafka-roll patterns, with and without --cm.
bench-cm: build
	$(GO) run ./bench/cm -tierfs $(BIN) -runs $(or $(RUNS),5)

# tierfs pull of a partition on loopback (sendfile, TLS) next to tar | nc and an rsync daemon.
bench-peer: build
	$(GO) run ./bench/peer -tierfs $(BIN) -size $(or $(SIZE),2GiB) -runs 3

# Segment scan speed (headers, CRC32C, chunker) next to cat, 1 GiB from page cache.
# Many partitions of tiny segments (issue 23's targets), into BENCHMARKS.md
# beside the others' last results (QUICK=1: 2,000 segments).
bench-scale:
	ONLY=scale QUICK=$(QUICK) scripts/bench

bench-scan:
	$(GO) run ./bench/segscan -size $(or $(SIZE),1GiB) -runs 5

# fio and metadata benchmark: native vs tierfs (passthrough / FUSE I/O) vs mergerfs.
bench-local: build
	scripts/bench-local $(if $(QUICK),--quick,)

lint:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }
	$(GO) vet ./...

# Installs what the tests and benchmarks need on a fresh Debian machine.
deps:
	scripts/install-deps

demo: build
	scripts/demo

clean:
	rm -rf bin
