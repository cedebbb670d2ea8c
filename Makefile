# pagedattn: `make demo` and `make test` work on a fresh machine (they install what is missing).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build test demo bench clean models sanitize tsan fuzz

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	@bash scripts/setup.sh
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	@bash scripts/setup.sh
	cmake --build $(BUILD) -j $(JOBS)

models: 
	@bash scripts/fetch-default-model.sh

# The tests that need the default model skip (and say so) when it cannot be fetched (offline).
test: build
	@bash scripts/fetch-default-model.sh || echo "make test: the default model could not be fetched; the tests that need it will skip"
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build models
	@bash scripts/demo.sh $(BUILD)

bench: build
	$(BUILD)/pagedattn bench attention --device cpu

clean:
	rm -rf $(BUILD)

# Instrumented builds, each in a folder of its own (cmake/sanitizers.cmake, tests/fuzz/).
# make sanitize: AddressSanitizer + UndefinedBehaviorSanitizer over the CPU test suite; a subset
# with SANITIZE_TARGETS (what to build) and SANITIZE_CTEST (ctest's selection), as .ci/run does.
SANITIZE_BUILD ?= $(BUILD)-sanitize
SANITIZE_TARGETS ?=
SANITIZE_CTEST ?=
TSAN_BUILD ?= $(BUILD)-tsan
FUZZ_BUILD ?= $(BUILD)-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= gguf safetensors hf_config tokenizer_json tokenizer chat_template request
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

sanitize:
	@bash scripts/setup.sh
	cmake -S . -B $(SANITIZE_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGEDATTN_CUDA=OFF \
	  -DPAGEDATTN_SANITIZE=address,undefined -DPAGEDATTN_PYTHON=OFF $(CMAKE_FLAGS)
	cmake --build $(SANITIZE_BUILD) -j $(JOBS) $(if $(SANITIZE_TARGETS),--target $(SANITIZE_TARGETS))
	cd $(SANITIZE_BUILD) && $(SAN_ENV) ctest --output-on-failure -j $(JOBS) $(SANITIZE_CTEST)

# ThreadSanitizer on the engine and server tests (not in CI; EngineLlama runs the default model,
# minutes under TSan, so it is left out). Suppressions: tests/tsan.supp.
tsan:
	@bash scripts/setup.sh
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGEDATTN_CUDA=OFF \
	  -DPAGEDATTN_SANITIZE=thread -DPAGEDATTN_PYTHON=OFF $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target test_engine test_server
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp \
	  ctest --output-on-failure -j $(JOBS) -L 'engine|server' -E 'server_openai_client|server_curl|EngineLlama'

# Each libFuzzer target for FUZZ_SECONDS (clang; new inputs kept in $(FUZZ_BUILD)/work/).
fuzz:
	@bash scripts/setup.sh
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DPAGEDATTN_CUDA=OFF -DPAGEDATTN_FUZZ=ON -DPAGEDATTN_SANITIZE=address,undefined -DPAGEDATTN_PYTHON=OFF $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	@for t in $(FUZZ_TARGETS); do \
	  echo "== fuzz_$$t ($(FUZZ_SECONDS) s)"; \
	  bash tests/fuzz/run_fuzz.sh $(FUZZ_BUILD)/tests/fuzz/fuzz_$$t tests/fuzz/corpus/$$t \
	    $(FUZZ_BUILD)/work/$$t $(FUZZ_SECONDS) || exit 1; \
	done
