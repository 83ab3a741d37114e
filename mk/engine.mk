# engine.mk — the scheduler's host-cost benchmark (no model): make bench-sched
.PHONY: bench-sched
bench-sched: $(BUILD)/bench/sched_bench
	./$(BUILD)/bench/sched_bench

$(BUILD)/bench/sched_bench: bench/sched_bench.c $(BUILD)/libsemflow.a
	@mkdir -p $(@D)
	@echo "  CC      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libsemflow.a $(ALL_LIBS)

# host_bench: GGUF block formats into bf16 and JSON output's token mask, per core: make bench-host
.PHONY: bench-host
bench-host: $(BUILD)/bench/host_bench
	./$(BUILD)/bench/host_bench

$(BUILD)/bench/host_bench: bench/host_bench.c tests/lib/quant_ref.h $(BUILD)/libsemflow.a
	@mkdir -p $(@D)
	@echo "  CC      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libsemflow.a $(ALL_LIBS)
