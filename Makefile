# The two commands of the README:
#   make train   installs what is missing, builds, and trains the Fashion-MNIST MLP
#   make test    installs what is missing, builds, and runs every test through CTest
# Everything else is CMake; this file only strings the steps together.

BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
TRAIN_ARGS ?=

.PHONY: all deps configure build test train clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

train: build
	$(BUILD)/bin/train_fashion_mnist $(TRAIN_ARGS)

clean:
	rm -rf $(BUILD)
