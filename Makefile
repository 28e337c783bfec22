# symmgen: everything builds and runs from here.
#
#   make            build build/bin/symmgen, build/bin/symmrun, build/lib/libsymm.{a,so}
#   make run        generate specs/default.lua and NVRTC-compile every variant
#                   (plus a GPU self-check where GPUs are present)
#   make test       CPU tests (Criterion), the Python package's (pytest, no torch), then
#                   the installed library as a user builds against it
#                   (scripts/test-install.sh); SAN=1 builds the Criterion tests with
#                   ASan+UBSan; QUICK=1 NVRTC-compiles one variant of each kind of
#                   kernel instead of every variant of every spec (CI runs it all);
#                   FUZZ_SECONDS=N runs the spec fuzzer N seconds (default 3, SAN=1: 30)
#   make test-gpu   GPU tests and examples/c through symmrun, then the PyTorch package's
#                   under torchrun where python3 has torch (each prints "skipped: no GPU"
#                   without one); MPS=1: ranks sharing a GPU run at once under CUDA MPS
#   make bench      benchmarks (GPU host)
#   make install PREFIX=/usr/local
#
# BUILD=dir puts every output under dir (default build, or build-san with SAN=1).

CUDA_HOME ?= /usr/local/cuda
PREFIX    ?= /usr/local
SAN       ?= 0
QUICK     ?= 0
ifeq ($(SAN),1)
BUILD     ?= build-san
else
BUILD     ?= build
endif
SPEC      ?= specs/default.lua
# Seconds of the spec fuzzer (tests/cpu/test_spec_fuzz.c) in make test:
# a short pass, a longer one under the sanitizers.
ifeq ($(SAN),1)
FUZZ_SECONDS ?= 30
else
FUZZ_SECONDS ?= 3
endif
# make test-gpu checks every spec (scripts/test-gpu.sh) unless SPEC is given.
GPU_SPEC  := $(if $(filter file,$(origin SPEC)),,$(SPEC))
VERSION   := $(shell cat VERSION 2>/dev/null || echo 0.0.0)

CC        ?= gcc
WARN      := -Wall -Wextra -Werror
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -O2 -g $(WARN) -fPIC -MMD -MP \
               -DSYMM_VERSION='"$(VERSION)"'
SANFLAGS  :=
ifeq ($(SAN),1)
SANFLAGS  := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
CFLAGS    := $(CFLAGS_BASE) $(SANFLAGS) $(EXTRA_CFLAGS)
LDFLAGS_ALL := $(SANFLAGS)

LUA_INC   := $(shell pkg-config --cflags lua5.4 2>/dev/null || echo -I/usr/include/lua5.4)
LUA_A     := $(firstword $(wildcard /usr/lib/*/liblua5.4.a /usr/lib/liblua5.4.a) liblua5.4.a)
CRIT_CFLAGS := $(shell pkg-config --cflags criterion 2>/dev/null)
CRIT_LIBS := $(shell pkg-config --libs criterion 2>/dev/null || echo -lcriterion)
CUDA_INC  := -I$(CUDA_HOME)/include
NVRTC_LIBS := -L$(CUDA_HOME)/lib64 -lnvrtc -Wl,-rpath,$(CUDA_HOME)/lib64
CUDA_STUB_LIBS := -L$(CUDA_HOME)/lib64/stubs -lcuda

# --- runtime: libsymm ------------------------------------------------------
RT_SRCS   := $(filter-out runtime/symmrun.c,$(wildcard runtime/*.c))
RT_OBJS   := $(RT_SRCS:%.c=$(BUILD)/obj/%.o)
RT_INC    := -Iruntime/include -Iruntime $(CUDA_INC)
RT_LIBS   := -ldl -lpthread -lm
LIBSYMM_A := $(BUILD)/lib/libsymm.a
LIBSYMM_SO := $(BUILD)/lib/libsymm.so
SYMMRUN   := $(BUILD)/bin/symmrun

# --- generator: symmgen -----------------------------------------------------
GEN_SRCS  := $(wildcard generator/*.c)
# symmgen hashes what it writes with the runtime's SHA-256 and reads an
# existing manifest.json with the runtime's JSON reader (one implementation
# each, compiled into both).
GEN_OBJS  := $(GEN_SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/templates_embed.o $(BUILD)/obj/runtime/sha256.o \
             $(BUILD)/obj/runtime/json.o
GEN_LIB_OBJS := $(filter-out $(BUILD)/obj/generator/main.o,$(GEN_OBJS))
GEN_INC   := -Igenerator -Iruntime/include $(LUA_INC) $(CUDA_INC)
LIBSG_A   := $(BUILD)/lib/libsg.a
SYMMGEN   := $(BUILD)/bin/symmgen
TEMPLATES := $(sort $(wildcard templates/*.in templates/cu/*.in))
GEN_LIBS  := $(LUA_A) $(NVRTC_LIBS) -lm -ldl

# --- tests -------------------------------------------------------------------
CPU_TEST_SRCS := $(wildcard tests/cpu/test_*.c)
CPU_TESTS := $(CPU_TEST_SRCS:tests/cpu/%.c=$(BUILD)/tests/%)
GPU_TEST_SRCS := $(wildcard tests/gpu/test_*.c)
GPU_TESTS := $(GPU_TEST_SRCS:tests/gpu/%.c=$(BUILD)/tests-gpu/%)
GPU_CHECK := $(BUILD)/tests-gpu/check
TEST_SUPPORT_SRCS := $(wildcard tests/support/*.c)
TEST_SUPPORT_OBJS := $(TEST_SUPPORT_SRCS:%.c=$(BUILD)/obj/%.o)
TEST_INC  := -Itests/support -Igenerator -Iruntime/include -Iruntime $(LUA_INC) $(CUDA_INC) $(CRIT_CFLAGS)

# examples/c, built as a user builds it: against an installed copy of the
# library (here BUILD/prefix), through pkg-config.
EXAMPLE_PREFIX := $(abspath $(BUILD))/prefix
EXAMPLE   := $(BUILD)/examples/c/moe_example

BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)

.PHONY: all deps test-deps run test test-gpu bench install clean check-cuda gpu-build example
.DEFAULT_GOAL := all
# Keep the objects of test binaries (intermediate files of pattern rules) so
# that a second `make test` rebuilds nothing.
.SECONDARY:

all: $(SYMMGEN) $(SYMMRUN) $(LIBSYMM_A) $(LIBSYMM_SO)

deps:
	@scripts/deps.sh

test-deps:
	@scripts/deps.sh clang

check-cuda:
	@test -f $(CUDA_HOME)/include/nvrtc.h || { echo "error: CUDA toolkit not found in $(CUDA_HOME) (set CUDA_HOME=...)" >&2; exit 1; }

$(BUILD)/obj/runtime/%.o: runtime/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(RT_INC) -c $< -o $@

$(BUILD)/obj/generator/%.o: generator/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(GEN_INC) -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(TEST_INC) -c $< -o $@

$(BUILD)/obj/bench/%.o: bench/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(TEST_INC) -c $< -o $@

$(BUILD)/tools/embed: scripts/embed.c
	@mkdir -p $(@D)
	$(CC) -std=c11 -O1 $(WARN) $< -o $@

$(BUILD)/gen/templates_embed.c: $(BUILD)/tools/embed $(TEMPLATES)
	@mkdir -p $(@D)
	$(BUILD)/tools/embed $@.tmp sg_embedded_templates $(TEMPLATES) && mv $@.tmp $@

$(BUILD)/obj/templates_embed.o: $(BUILD)/gen/templates_embed.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Wno-overlength-strings -c $< -o $@

$(LIBSYMM_A): $(RT_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(LIBSYMM_SO): $(RT_OBJS)
	@mkdir -p $(@D)
	$(CC) -shared $(LDFLAGS_ALL) -Wl,-soname,libsymm.so.0 -o $@ $^ $(RT_LIBS)

$(LIBSG_A): $(GEN_LIB_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(SYMMRUN): $(BUILD)/obj/runtime/symmrun.o $(LIBSYMM_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(RT_LIBS)

$(SYMMGEN): $(GEN_OBJS) | check-cuda
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(GEN_LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/cpu/%.o $(TEST_SUPPORT_OBJS) $(LIBSG_A) $(LIBSYMM_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(CRIT_LIBS) $(GEN_LIBS) $(RT_LIBS)

$(BUILD)/tests-gpu/%: $(BUILD)/obj/tests/gpu/%.o $(TEST_SUPPORT_OBJS) $(LIBSYMM_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(CRIT_LIBS) $(CUDA_STUB_LIBS) $(RT_LIBS)

$(GPU_CHECK): $(BUILD)/obj/tests/gpu/check.o $(LIBSYMM_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(CUDA_STUB_LIBS) $(RT_LIBS)

# --as-needed: a bench program that calls no driver function itself (moe_bench
# opens the driver through libsymm) does not need libcuda.so.1 to start, so
# `moe_bench --plan` runs on machines without a GPU driver (make test), also
# where the sanitizers' link flags would keep the library otherwise.
$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIBSYMM_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ -Wl,--as-needed $(CUDA_STUB_LIBS) $(RT_LIBS)

example: $(EXAMPLE)

$(EXAMPLE): $(SYMMGEN) $(LIBSYMM_A) $(LIBSYMM_SO) examples/c/moe_example.c examples/c/example.lua examples/c/Makefile
	@$(MAKE) --no-print-directory install PREFIX=$(EXAMPLE_PREFIX) >/dev/null
	@PKG_CONFIG_PATH=$(EXAMPLE_PREFIX)/lib/pkgconfig $(MAKE) --no-print-directory -C examples/c \
	    BUILD=$(abspath $(BUILD))/examples/c SYMMGEN=$(EXAMPLE_PREFIX)/bin/symmgen \
	    CFLAGS="-std=c11 -O2 -g $(WARN) $(SANFLAGS)" LDFLAGS="$(SANFLAGS)"

# ---------------------------------------------------------------------------
run: deps
	@$(MAKE) --no-print-directory all
	$(SYMMGEN) --compile $(SPEC)
	@scripts/selfcheck.sh $(BUILD)

test: test-deps
	@$(MAKE) --no-print-directory all $(CPU_TESTS) $(BUILD)/bench/moe_bench
	@SYMM_BUILD_DIR=$(abspath $(BUILD)) SYMM_FUZZ_SECONDS=$(FUZZ_SECONDS) SYMM_TEST_QUICK=$(QUICK) \
	 scripts/run-tests.sh $(CPU_TESTS); rc=$$?; \
	 SYMM_BUILD_DIR=$(BUILD) SYMM_SANFLAGS="$(SANFLAGS)" scripts/test-install.sh && exit $$rc
ifneq ($(SAN),1)
	@SYMM_BUILD_DIR=$(abspath $(BUILD)) scripts/test-python.sh
endif

test-gpu:
	@$(MAKE) --no-print-directory all $(GPU_TESTS) $(GPU_CHECK) $(EXAMPLE)
	@SYMM_BUILD_DIR=$(abspath $(BUILD)) SPEC=$(GPU_SPEC) SYMM_TEST_MPS=$(MPS) scripts/test-gpu.sh $(GPU_TESTS)
	@SYMM_BUILD_DIR=$(abspath $(BUILD)) SYMM_TEST_MPS=$(MPS) scripts/test-python-gpu.sh

bench:
	@$(MAKE) --no-print-directory all $(BENCH_BINS)
	@SYMM_BUILD_DIR=$(abspath $(BUILD)) scripts/bench.sh

# Everything a GPU host runs, built here (the GPU machines have no Lua or Criterion).
# BUILD/COMMIT: the commit these binaries come from (+dirty for a changed
# tree), which scripts/device-run.sh names in the bench's RESULTS entry: the
# device's copy of the checkout may report another commit.
gpu-build: all $(GPU_TESTS) $(GPU_CHECK) $(BENCH_BINS) $(EXAMPLE)
	@c=$$(git rev-parse --short HEAD 2>/dev/null) || c=; \
	if [ -n "$$c" ]; then git diff --quiet HEAD -- 2>/dev/null || c="$$c+dirty"; echo "$$c" > $(BUILD)/COMMIT; \
	else rm -f $(BUILD)/COMMIT; fi

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/symm $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(SYMMGEN) $(SYMMRUN) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIBSYMM_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIBSYMM_SO) $(DESTDIR)$(PREFIX)/lib/libsymm.so.0
	ln -sf libsymm.so.0 $(DESTDIR)$(PREFIX)/lib/libsymm.so
	install -m 644 runtime/include/*.h $(DESTDIR)$(PREFIX)/include/symm/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' -e 's|@CUDA_HOME@|$(CUDA_HOME)|g' \
	    scripts/symm.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/symm.pc

clean:
	rm -rf $(BUILD) out

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
