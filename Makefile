# pagedattn: `make demo` and `make test` work on a fresh machine (they install what is missing).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build test demo bench clean models

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
