# make fuzz — libFuzzer targets (clang) for hostile input to the gateway's parsers:
# request body -> parameters, the X-Semantic-Intent parser, the tenants file, guided_regex patterns, GBNF grammars. Each runs for
# FUZZ_TIME seconds (default 60) from the seeds in tests/fuzz/seeds/<target>; findings are
# written to $(BUILD)/fuzz/ and fail the run.
FUZZ_CC ?= clang
FUZZ_TIME ?= 60
FUZZ_TARGETS := params intent tenants regex gbnf
FUZZ_LIB_SRCS := gateway/params.c gateway/intent.c gateway/tenants.c common/sf.c common/env.c engine/json_mask.c engine/regex.c engine/gbnf.c \
                 engine/tokenizer.c engine/chat.c $(wildcard engine/tok_*.c)
FUZZ_BINS := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB_SRCS) $(wildcard gateway/*.h)
	@mkdir -p $(@D)
	@echo "  FUZZ    $@"
	$(Q)$(FUZZ_CC) -std=gnu11 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -I. -D_GNU_SOURCE -o $@ $< $(FUZZ_LIB_SRCS) -ljansson -lpcre2-8 -lm -lpthread

fuzz: $(FUZZ_BINS)
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p $(BUILD)/fuzz/corpus-$$t; \
		echo "== fuzz_$$t ($(FUZZ_TIME) s)"; \
		$(BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_TIME) -max_len=8192 -timeout=10 -rss_limit_mb=1024 \
			-artifact_prefix=$(BUILD)/fuzz/crash-$$t- -print_final_stats=1 \
			$(BUILD)/fuzz/corpus-$$t tests/fuzz/seeds/$$t 2>$(BUILD)/fuzz/fuzz_$$t.log \
			|| { tail -40 $(BUILD)/fuzz/fuzz_$$t.log; exit 1; }; \
		grep -E '^stat::number_of_executed_units|^stat::peak_rss' $(BUILD)/fuzz/fuzz_$$t.log; \
	done
