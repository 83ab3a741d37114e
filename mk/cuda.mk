# CUDA part of the build: device tests are compiled with every CUDA build (so CI catches their
# breakage) and run only on a GPU host (make test-device / tests/device/run_all.sh).
ifeq ($(HAVE_CUDA),1)
all: $(DEVICE_BINS)
endif
