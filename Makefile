# fetchq — build, test, demo.
#   make          release libfetchq.so (+ header, pkg-config file) into build/
#   make test     every suite: swift test, the C harness, pytest, the examples
#   make demo     the demo search server and example, end to end
SHELL := /bin/bash
.DEFAULT_GOAL := all

PREFIX ?= /usr/local
VERSION_MAJOR := $(shell sed -n 's/^\#define FQ_VERSION_MAJOR \([0-9]*\)/\1/p' include/fetchq.h)
VERSION_MINOR := $(shell sed -n 's/^\#define FQ_VERSION_MINOR \([0-9]*\)/\1/p' include/fetchq.h)
VERSION_PATCH := $(shell sed -n 's/^\#define FQ_VERSION_PATCH \([0-9]*\)/\1/p' include/fetchq.h)
VERSION := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)
SONAME := libfetchq.so.$(VERSION_MAJOR)

SWIFT ?= swift
CC ?= cc
BUILD := $(CURDIR)/build
# -enforce-exclusivity=unchecked: the shipped library skips Swift's runtime
# exclusivity checks (swift_beginAccess was ~6 % of the P1 profile). Debug
# builds, which run the test suites, keep them. A flag here rather than an
# unsafeFlags setting in Package.swift, which would stop other packages from
# depending on this one.
SWIFT_RELEASE_FLAGS := -c release -Xswiftc -static-stdlib -Xswiftc -enforce-exclusivity=unchecked \
	-Xlinker --version-script=$(CURDIR)/tools/fetchq.map -Xlinker -soname=$(SONAME) \
	-Xlinker -z -Xlinker nodelete
CFLAGS_TEST := -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -I$(BUILD)/include
LDFLAGS_TEST := -L$(BUILD)/lib -lfetchq -ljansson -lpthread -Wl,-rpath,$(BUILD)/lib

APT_PACKAGES := libjansson-dev libcurl4-openssl-dev libsqlite3-dev pkg-config python3-pip python3-pytest openssl nginx-light
.PHONY: all deps lib test test-swift test-c test-exports test-python test-examples test-install test-docs test-cli test-stress-short stress bench test-tsan check-sanitizers fuzz test-fuzz-regressions demo install uninstall clean

all: lib

# Installs the system packages a fresh machine lacks (Debian/Ubuntu).
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

lib: deps
	$(SWIFT) build $(SWIFT_RELEASE_FLAGS) --product fetchq
	$(SWIFT) build $(SWIFT_RELEASE_FLAGS) --product fetchq-cli
	@mkdir -p $(BUILD)/bin
	cp .build/release/fetchq-cli $(BUILD)/bin/.fetchq.tmp && mv -f $(BUILD)/bin/.fetchq.tmp $(BUILD)/bin/fetchq
	@mkdir -p $(BUILD)/lib/pkgconfig $(BUILD)/include
	@# A new file, renamed into place: processes using the old one keep it.
	cp .build/release/libfetchq.so $(BUILD)/lib/.libfetchq.so.tmp
	mv -f $(BUILD)/lib/.libfetchq.so.tmp $(BUILD)/lib/libfetchq.so.$(VERSION)
	ln -sf libfetchq.so.$(VERSION) $(BUILD)/lib/$(SONAME)
	ln -sf $(SONAME) $(BUILD)/lib/libfetchq.so
	cp include/fetchq.h $(BUILD)/include/.fetchq.h.tmp && mv -f $(BUILD)/include/.fetchq.h.tmp $(BUILD)/include/fetchq.h
	@sed -e 's|@PREFIX@|$(BUILD)|' -e 's|@VERSION@|$(VERSION)|' tools/fetchq.pc.in > $(BUILD)/lib/pkgconfig/fetchq.pc
	@if ldd $(BUILD)/lib/libfetchq.so | grep -i swift; then echo "error: libfetchq.so links a Swift runtime library" >&2; exit 1; fi

# Every suite; each prints its own summary. Runs them all even if one fails,
# then fails if any did.
TEST_SUITES := test-exports test-c test-stress-short test-swift test-tsan test-fuzz-regressions test-support \
	test-install test-docs test-cli $(if $(wildcard bindings/python/tests),test-python) \
	$(if $(wildcard tools/run-examples.sh),test-examples)
test: lib
	@failed=""; for t in $(TEST_SUITES); do \
		echo "==> make $$t"; $(MAKE) --no-print-directory $$t || failed="$$failed $$t"; \
	done; \
	if [ -n "$$failed" ]; then echo "FAILED:$$failed"; exit 1; fi; echo "all test suites passed"

# The shared test server's own tests.
test-support:
	python3 -B -m pytest -q -p no:cacheprovider Tests/support/test_testserver.py Tests/support/test_bench_report.py

# The binding: `pip install ./bindings/python` (with the library copied into
# the package), the installed package must find its own copy, then pytest.
test-python: lib
	cp $(BUILD)/lib/libfetchq.so.$(VERSION) bindings/python/fetchq/.libfetchq.tmp
	mv -f bindings/python/fetchq/.libfetchq.tmp bindings/python/fetchq/$(SONAME)
	python3 -m pip install -q --force-reinstall --no-deps ./bindings/python \
		|| python3 -m pip install -q --force-reinstall --no-deps --break-system-packages ./bindings/python
	rm -rf bindings/python/build bindings/python/*.egg-info
	cd /tmp && env -u FETCHQ_LIBRARY python3 -B -c 'import fetchq, sys; p = fetchq.library_path(); print("installed fetchq loads", p); sys.exit("site-packages" not in p)'
	cd bindings/python && FETCHQ_LIBRARY=$(BUILD)/lib/$(SONAME) python3 -B -m pytest -q -p no:cacheprovider tests

# The CLI against the test server (Ctrl-C, progress bar under a pty, ...).
test-cli: lib
	FETCHQ_CLI=$(BUILD)/bin/fetchq python3 -B -m pytest -q -p no:cacheprovider Tests/cli/test_cli.py

test-examples: lib
	bash tools/run-examples.sh

test-swift: deps
	$(SWIFT) test

$(BUILD)/tests/c_harness: lib $(wildcard Tests/c/*.c Tests/c/*.h)
	@mkdir -p $(BUILD)/tests
	$(CC) $(CFLAGS_TEST) Tests/c/*.c $(LDFLAGS_TEST) -o $@

test-c: $(BUILD)/tests/c_harness
	$(BUILD)/tests/c_harness

test-exports: lib
	bash Tests/c/check_exports.sh $(BUILD)/lib/libfetchq.so include/fetchq.h
	@mkdir -p $(BUILD)/tests
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE Tests/c/unload/unload.c -ljansson -lpthread -ldl \
		-o $(BUILD)/tests/unload
	$(BUILD)/tests/unload $(BUILD)/lib/libfetchq.so.0

# 1 000 000 mixed operations (block, async, requests, searches; cancels,
# groups, dependencies, suspends, failures, timeouts, retries): every op gets
# exactly one plausible callback, the stats add up, memory returns. The short
# run (50 000 ops) is part of make test.
$(BUILD)/tools/stress: lib tools/stress.c
	@mkdir -p $(BUILD)/tools
	$(CC) $(CFLAGS_TEST) -O2 tools/stress.c $(LDFLAGS_TEST) -o $@

stress: $(BUILD)/tools/stress
	bash tools/stress.sh

test-stress-short: $(BUILD)/tools/stress
	FQ_STRESS_TIMEOUT=120 bash tools/stress.sh --ops 50000

# ThreadSanitizer over every Swift test (about 75 s); the full set of
# sanitizer runs (ASan/LSan for Swift and the C harness, valgrind) is
# make check-sanitizers.
test-tsan: deps
	bash tools/check-sanitizers.sh swift-tsan

check-sanitizers: lib
	bash tools/check-sanitizers.sh

# libFuzzer targets (fuzz/): FUZZ_SECONDS each (default 60). Their crash
# inputs, seeds and the JSONTestSuite are replayed by make test.
fuzz: deps
	bash fuzz/run.sh fuzz

test-fuzz-regressions: deps
	bash fuzz/run.sh replay

# Benchmarks against the anchors; installs nginx, wrk, aiohttp and httpx if
# missing; writes BENCHMARKS.md. Not part of `make test`. PAIRS=5 for more rounds.
bench: lib
	bash bench/run.sh

# Every code block in README.md and docs/*.md is compiled or run.
test-docs: lib
	python3 -B tools/check-docs.py

# Installs the versioned library (soname libfetchq.so.MAJOR and the usual
# links), the header, fetchq.pc and, when built, the CLI.
LIBDIR := $(DESTDIR)$(PREFIX)/lib
# Installs what `make` built (it builds nothing, and installs no packages:
# `make` as yourself, then `sudo make install`); refreshes the loader's
# cache when installing as root into the real tree.
install:
	@test -f $(BUILD)/lib/libfetchq.so.$(VERSION) || \
		{ echo "make install: nothing built yet: run 'make' first (as yourself), then 'make install'" >&2; exit 1; }
	install -d $(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 0755 $(BUILD)/lib/libfetchq.so.$(VERSION) $(LIBDIR)/
	ln -sf libfetchq.so.$(VERSION) $(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(LIBDIR)/libfetchq.so
	install -m 0644 include/fetchq.h $(DESTDIR)$(PREFIX)/include/fetchq.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' tools/fetchq.pc.in > $(LIBDIR)/pkgconfig/fetchq.pc
	@if [ -x $(BUILD)/bin/fetchq ]; then install -d $(DESTDIR)$(PREFIX)/bin && install -m 0755 $(BUILD)/bin/fetchq $(DESTDIR)$(PREFIX)/bin/fetchq; fi
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi

uninstall:
	rm -f $(LIBDIR)/libfetchq.so.$(VERSION) $(LIBDIR)/$(SONAME) $(LIBDIR)/libfetchq.so \
		$(LIBDIR)/pkgconfig/fetchq.pc $(DESTDIR)$(PREFIX)/include/fetchq.h $(DESTDIR)$(PREFIX)/bin/fetchq

# Installs into a temporary DESTDIR, builds the C examples with nothing but
# pkg-config, runs one, uninstalls, and checks nothing is left.
test-install: lib
	bash tools/test-install.sh

# The main job: a local demo search server, searches on a queue, results.
demo: lib
	bash tools/demo.sh

clean:
	rm -rf $(BUILD) .build
