GO ?= go
PKGS := ./...

.PHONY: build test demo bench lint apicheck docker soak

build:
	$(GO) build -o bin/processor ./cmd/processor

# The race detector is on: every package, the Kafka and crash tests included.
test:
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

demo:
	$(GO) run ./cmd/processor demo

# The chaos run with broker faults mixed in, for SOAK (a Go duration), then a
# read_committed check of every input. Not part of make test.
SOAK ?= 10m
soak:
	SYSTEST_SOAK=$(SOAK) $(GO) test -race -count=1 -timeout 0 -run '^TestSoak$$' -v ./internal/systest/

bench:
	$(GO) test -run '^$$' -bench . -benchtime 3x ./internal/bench/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# Incompatible changes to the exported API since the baseline in .ci/api
# (the API of .ci/api-baseline's commit) that .ci/api-breaks.txt does not
# list (docs/library.md).
apicheck:
	.ci/apicheck

docker:
	docker build -t sluice/processor:dev .
