# semflow — one build entry. `make` builds build/semflow; CUDA parts when nvcc is present, BPF
# parts when clang + bpftool + libbpf are present, and says which parts it skipped and why.
#   make            build          make test       CPU tests (unit + integration)
#   make deps       apt packages   make test-device GPU tests (on a GPU host)
#   make serve      demo server    make SAN=1 test  the same tests under ASan + UBSan
#   make fuzz       libFuzzer      V=1             show commands

BUILD ?= build
ifeq ($(SAN),1)
BUILD := build-asan
endif

Q := $(if $(V),,@)
CC ?= gcc
CFLAGS_BASE := -std=gnu11 -g -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-format-truncation \
               -pthread -I. -I$(BUILD) -D_GNU_SOURCE
OPT ?= -O2
ifeq ($(SAN),1)
OPT := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDSAN := -fsanitize=address,undefined
endif
CFLAGS += $(CFLAGS_BASE) $(OPT)
LDFLAGS += $(LDSAN)

# ---- third-party libraries: static where Debian ships .a, so the binary carries them to
# ---- machines (the GPU host) that lack the -dev packages.
STATIC_LIBS := -levent_pthreads -levent -ljansson -lpcre2-8 -lncursesw -ltinfo
LIBS := -lm -ldl -lrt -lpthread

# ---- CUDA ------------------------------------------------------------------------------
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),)
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90
CU_SRCS := $(wildcard kernels/cuda/*.cu)
ifneq ($(NVCC),)
ifneq ($(wildcard $(CUDA_HOME)/include/cublasLt.h),)
HAVE_CUDA := 1
CFLAGS += -DSF_HAVE_CUDA=1 -I$(CUDA_HOME)/include
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -I. -Xcompiler -fPIC,-Wall -lineinfo --expt-relaxed-constexpr
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -lcublasLt -lstdc++
endif
endif

# ---- BPF -------------------------------------------------------------------------------
CLANG ?= $(shell command -v clang 2>/dev/null)
BPFTOOL ?= $(shell command -v bpftool 2>/dev/null || ls /usr/sbin/bpftool 2>/dev/null)
LIBBPF_A := $(wildcard /usr/lib/x86_64-linux-gnu/libbpf.a /usr/lib/libbpf.a)
BPF_SRCS := $(wildcard bpf/*.bpf.c)
ifneq ($(CLANG),)
ifneq ($(BPFTOOL),)
ifneq ($(LIBBPF_A),)
HAVE_BPF := 1
CFLAGS += -DSF_HAVE_BPF=1
STATIC_LIBS += -lbpf -lelf -lz -lzstd
endif
endif
endif

# ---- sources -----------------------------------------------------------------------------
LIB_SRCS := $(wildcard common/*.c hal/*.c engine/*.c kernels/cpu/*.c gateway/*.c bpf/*.c)
LIB_SRCS := $(filter-out %.bpf.c,$(LIB_SRCS))
# cli/*.c are linked into the binary directly (their commands are weak references in semflow.c)
CLI_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard cli/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
# nvcc objects take no sanitizer flags, so the sanitizer build links the plain build's (the
# kernels compiled once a CI run, not twice)
CU_BUILD := $(if $(filter 1,$(SAN)),build,$(BUILD))
ifeq ($(HAVE_CUDA),1)
LIB_OBJS += $(CU_SRCS:%.cu=$(CU_BUILD)/obj/%.cu.o)
endif
BPF_OBJS := $(BPF_SRCS:bpf/%.bpf.c=$(BUILD)/bpf/%.bpf.o)
BPF_SKELS := $(BPF_SRCS:bpf/%.bpf.c=$(BUILD)/bpf/%.skel.h)

UNIT_SRCS := $(wildcard tests/unit/*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
DEVICE_SRCS := $(wildcard tests/device/*.c)
DEVICE_BINS := $(DEVICE_SRCS:tests/device/%.c=$(BUILD)/tests/device/%)

ALL_LIBS = $(CUDA_LIBS) -Wl,-Bstatic $(STATIC_LIBS) -Wl,-Bdynamic $(LIBS)

.PHONY: all deps test test-unit test-integration test-device serve fuzz clean report bench
all: report $(BUILD)/semflow $(UNIT_BINS)

report:
	@echo "semflow build ($(BUILD)):"
	@if [ "$(HAVE_CUDA)" = 1 ]; then echo "  cuda: yes ($(NVCC))"; else echo "  cuda: skipped (no nvcc or cublasLt.h found; CPU backend only)"; fi
	@if [ "$(HAVE_BPF)" = 1 ]; then echo "  bpf:  yes ($(CLANG), $(BPFTOOL))"; else echo "  bpf:  skipped (need clang, bpftool and libbpf.a: make deps)"; fi

$(BUILD)/libsemflow.a: $(LIB_OBJS)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/semflow: $(CLI_OBJS) $(BUILD)/libsemflow.a
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(ALL_LIBS)

$(BUILD)/obj/%.o: %.c | $(BPF_SKELS)
	@mkdir -p $(@D)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(CU_BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(@D)
	@echo "  NVCC    $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $<

# BPF objects and skeletons (generated into the build folder).
$(BUILD)/bpf/vmlinux.h:
	@mkdir -p $(@D)
	$(Q)$(BPFTOOL) btf dump file /sys/kernel/btf/vmlinux format c > $@ || { rm -f $@; exit 1; }

$(BUILD)/bpf/%.bpf.o: bpf/%.bpf.c $(BUILD)/bpf/vmlinux.h $(wildcard bpf/*.h)
	@echo "  BPF     $<"
	$(Q)$(CLANG) -g -O2 -target bpf -D__TARGET_ARCH_x86 -I$(BUILD)/bpf -Ibpf -c $< -o $@

$(BUILD)/bpf/%.skel.h: $(BUILD)/bpf/%.bpf.o
	$(Q)$(BPFTOOL) gen skeleton $< > $@ || { rm -f $@; exit 1; }

$(BUILD)/tests/%: tests/unit/%.c tests/test.h $(BUILD)/libsemflow.a
	@mkdir -p $(@D)
	@echo "  TEST    $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libsemflow.a $(ALL_LIBS)

$(BUILD)/tests/device/%: tests/device/%.c tests/test.h $(BUILD)/libsemflow.a
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libsemflow.a $(ALL_LIBS)

-include $(shell find $(addsuffix /obj,$(sort $(BUILD) $(CU_BUILD))) -name '*.d' 2>/dev/null)
-include $(wildcard mk/*.mk)

# ---- entry points -------------------------------------------------------------------------
deps:
	@sh tools/deps.sh

test: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) sh tests/run.sh

test-device: all $(DEVICE_BINS)
	@BUILD=$(BUILD) sh tests/run.sh --device

serve: deps
	@$(MAKE) --no-print-directory all
	./$(BUILD)/semflow serve --model demo $(ARGS)

clean:
	rm -rf build build-asan
