# bpf.mk — extra rules for the eBPF part: keep the generated skeletons, build the fake libcuda
# the uprobe tests attach to, and bundle the dashboard page (web/) when npm is available.

.SECONDARY: $(BPF_OBJS) $(BPF_SKELS)

# A shared object exporting libcuda's copy entry points with their real signatures
# (memcpy-backed); named like the driver so discovery code paths treat it the same.
FAKECUDA := $(BUILD)/tests/fixtures/libcuda.so.1
$(FAKECUDA): tests/fixtures/fakecuda.c
	@mkdir -p $(@D)
	@echo "  SO      $@"
	$(Q)$(CC) -std=gnu11 -O1 -g -Wall -Wextra -Wno-unused-parameter -fPIC -shared -o $@ $<
all: $(FAKECUDA)

# ---- the dashboard page: uPlot from npm (web/package-lock.json), bundled into a C header ----
NPM ?= $(shell command -v npm 2>/dev/null)
WEB_PAGE := $(BUILD)/web/dashboard_page.h
ifneq ($(NPM),)
web/node_modules/.package-lock.json: web/package.json web/package-lock.json
	@echo "  NPM     web/ (uPlot; playwright-core for the browser test)"
	$(Q)cd web && $(NPM) ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 || \
	    echo "  dashboard: npm ci in web/ failed (offline?): the page is not bundled, /dashboard answers 503"
$(WEB_PAGE): web/node_modules/.package-lock.json
else
$(info   dashboard: skipped (npm not found; make deps installs it): /dashboard answers 503)
endif
$(WEB_PAGE): web/index.html web/dashboard.js web/dashboard.css web/embed.py
	@mkdir -p $(@D)
	$(Q)python3 web/embed.py web $@
$(BUILD)/obj/gateway/dashboard.o: $(WEB_PAGE)

# ---- benchmark: what the monitor costs (root); built with everything (the device script runs it) ----
.PHONY: bench-bpf
bench-bpf: $(BUILD)/bench/bpf_bench $(FAKECUDA)
all: $(BUILD)/bench/bpf_bench $(BUILD)/bench/fakecuda.so
# bpf_bench's own copy of the fake libcuda, beside it (a device run carries build/bench)
$(BUILD)/bench/fakecuda.so: $(FAKECUDA)
	@mkdir -p $(@D)
	$(Q)cp $< $@
$(BUILD)/bench/bpf_bench: bench/bpf_bench.c $(BUILD)/libsemflow.a
	@mkdir -p $(@D)
	@echo "  BENCH   $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libsemflow.a $(ALL_LIBS)

# ---- the contention experiment's neighbour (bench/contention/run.sh): a pinned H2D stream ----
ifeq ($(HAVE_CUDA),1)
H2D_HOG := $(BUILD)/bench/h2d_hog
$(H2D_HOG): bench/contention/h2d_hog.c
	@mkdir -p $(@D)
	@echo "  CC      $@"
	$(Q)$(CC) -std=gnu11 -O2 -Wall -Wextra -I$(CUDA_HOME)/include -o $@ $< \
	    -L$(CUDA_HOME)/lib64 -lcudart_static -lpthread -ldl -lrt
all: $(H2D_HOG)
endif
