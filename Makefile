# The two commands of the README:
#   make train   installs what is missing, builds the library and the trainer, and trains
#                the Fashion-MNIST MLP
#   make test    installs what is missing, builds, and runs every test through CTest;
#                then the CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#                (test-sanitize) and a bounded libFuzzer run of each reader of untrusted
#                bytes (IDX, safetensors, the TCPStore's messages) and of random
#                tensor-op programs (test-fuzz)
# Everything else is CMake; this file only strings the steps together.

BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
TRAIN_ARGS ?=
# The sanitizer and fuzz builds live beside the main one, each in a directory of its own.
ASAN_BUILD   ?= build-asan
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 20

.PHONY: all deps configure build build-train test test-unit test-sanitize test-fuzz train train-gpt parity-docs clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# What `make train` needs and nothing more: the library and the trainer (no tests, no
# benchmarks, no other programs).
build-train: configure
	cmake --build $(BUILD) -j$(JOBS) --target train_fashion_mnist

test: test-unit
	@$(MAKE) --no-print-directory test-sanitize
	@$(MAKE) --no-print-directory test-fuzz
	@echo "== make test passed; the three stages (skipped tests: why, and in which layers):"
	@scripts/test-summary.sh "main suite:$(BUILD)" "sanitizers:$(ASAN_BUILD)" "fuzzing:$(FUZZ_BUILD)"

test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -O ctest-output.log

# The CPU tests built with ASan + UBSan at -O1 -g, as the sanitizers recommend; the first
# report fails its test. Samples, benchmarks and the install check add build time, not
# coverage, so they are left out.
test-sanitize: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
	      -DMINIGRAD_SANITIZE=ON -DMINIGRAD_CUDA=OFF -DMINIGRAD_BUILD_SAMPLES=OFF
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	      ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(JOBS) -LE install -O ctest-output.log

# libFuzzer (clang) on the IDX reader, the safetensors loader, the TCPStore's message
# parser and random programs of tensor ops, FUZZ_SECONDS each,
# from the seeds in tests/fuzz/corpus/; a crash is saved in $(FUZZ_BUILD)/tests/fuzz/.
test-fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
	      -DCMAKE_CXX_FLAGS=-O1 -DMINIGRAD_FUZZ=ON -DMINIGRAD_FUZZ_SECONDS=$(FUZZ_SECONDS) \
	      -DMINIGRAD_CUDA=OFF -DMINIGRAD_GLOO=OFF -DMINIGRAD_BUILD_TESTS=OFF \
	      -DMINIGRAD_BUILD_SAMPLES=OFF
	cmake --build $(FUZZ_BUILD) -j$(JOBS)
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j$(JOBS) -L fuzz -O ctest-output.log

# docs/parity.md from a run of the parity table (every row, then every fault on every row);
# tests/repo checks that the page lists the table's rows.
parity-docs: configure
	cmake --build $(BUILD) -j$(JOBS) --target test_parity
	$(BUILD)/bin/test_parity "[write-docs]"

train: build-train
	$(BUILD)/bin/train_fashion_mnist $(TRAIN_ARGS)

# The character-level GPT on Debian's fortunes (docs/gpt.md).
train-gpt: configure
	cmake --build $(BUILD) -j$(JOBS) --target train_gpt
	$(BUILD)/bin/train_gpt $(TRAIN_ARGS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
