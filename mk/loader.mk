# Model-loader fuzz targets, run by `make fuzz` (mk/fuzz.mk) after the gateway's: hostile
# .gguf files and safetensors files through the whole load. Seeds: tests/fuzz/make_loader_seeds.py.
LOADER_FUZZ_SRCS := common/sf.c common/env.c hal/dtype.c engine/model.c engine/config.c engine/safetensors.c \
                    engine/gguf.c engine/loader_hf.c engine/loader_gguf.c engine/demo.c engine/dummy.c \
                    engine/progress.c engine/shard.c \
                    $(wildcard engine/tok*.c engine/chat*.c)
LOADER_FUZZ := gguf safetensors
FUZZ_TARGETS += $(LOADER_FUZZ)

$(LOADER_FUZZ:%=$(BUILD)/fuzz/fuzz_%): $(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(LOADER_FUZZ_SRCS) $(wildcard engine/*.h)
	@mkdir -p $(@D)
	@echo "  FUZZ    $@"
	$(Q)$(FUZZ_CC) -std=gnu11 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -I. -D_GNU_SOURCE -o $@ $< $(LOADER_FUZZ_SRCS) -ljansson -lpcre2-8 -lm -lpthread

fuzz: $(LOADER_FUZZ:%=$(BUILD)/fuzz/fuzz_%)
