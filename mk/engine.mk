# engine.mk — the scheduler's host-cost benchmark (no model): make bench-sched
.PHONY: bench-sched
bench-sched: $(BUILD)/bench/sched_bench
	./$(BUILD)/bench/sched_bench

$(BUILD)/bench/sched_bench: bench/sched_bench.c $(BUILD)/libsemflow.a
	@mkdir -p $(@D)
	@echo "  CC      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libsemflow.a $(ALL_LIBS)
