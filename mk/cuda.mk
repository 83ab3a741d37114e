# CUDA part of the build: device tests are compiled with every CUDA build (so CI catches their
# breakage) and run only on a GPU host (make test-device / tests/device/run_all.sh).
ifeq ($(HAVE_CUDA),1)
all: $(DEVICE_BINS)
endif

# hal.c reaches the CUDA backend through weak references, which do not pull an archive member
# by themselves: name it so every program linked against libsemflow.a gets the CUDA backend.
ifeq ($(HAVE_CUDA),1)
LDFLAGS += -Wl,--undefined=sf_backend_cuda_new -Wl,--undefined=sf_hal_cuda_available
endif

# bench/device/readbw.cu: the read-only HBM bandwidth beside hal's copy figure (a program of its
# own, built with every CUDA build so that CI compiles it; run on the device)
ifeq ($(HAVE_CUDA),1)
all: $(BUILD)/bench/readbw
$(BUILD)/bench/readbw: bench/device/readbw.cu
	@mkdir -p $(@D)
	@echo "  NVCC    $<"
	$(Q)$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) -o $@ $<
endif
