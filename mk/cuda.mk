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
