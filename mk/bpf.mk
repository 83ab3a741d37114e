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
