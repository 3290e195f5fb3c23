# areal-rs: the two commands of the README, and the checks CI runs.
#
#   make train   build (release) and run `areal train` on the built-in default config
#   make test    the test-suite, as CI runs it
#
# Builds go to $CARGO_TARGET_DIR when set (CI points it at a cache outside the clone).

CARGO ?= cargo
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)

.PHONY: setup train test lint cuda-check python-wasi openai-venv reward-components bench-backends fuzz

# Everything `areal train` needs is built from the package registries by cargo itself. Code
# rewards also need the WASI interpreter: `make python-wasi` (apt, Debian's source package).
setup:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust 1.95 with rustup" >&2; exit 1; }
	$(CARGO) build --release --locked -p areal

train: setup
	$(TARGET_DIR)/release/areal train

# burn is ~30x slower without optimisation, so tests run in release. The code-grading tests
# need the WASI interpreter, built first (once; ~5 min).
test: python-wasi reward-components openai-venv
	$(CARGO) test --workspace --release --locked
	$(MAKE) lint cuda-check

lint: reward-components
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --all --manifest-path rewards/components/Cargo.toml -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --locked
	CARGO_TARGET_DIR=$(abspath $(TARGET_DIR))/components $(CARGO) clippy --locked \
		--target wasm32-wasip2 --manifest-path rewards/components/Cargo.toml -- -D warnings
	.ci/module-cycles sdk/src sdk/*/src core/*/src plugins/*/src plugins/examples/*/src rewards/*/src

# burn's CUDA backend cannot be linked without internet at build time (cubecl-llvm downloads
# LLVM); DOCS_RS=1 skips that download so the code behind the `cuda` feature is type-checked.
cuda-check:
	DOCS_RS=1 CARGO_TARGET_DIR=$(TARGET_DIR)/cuda-check $(CARGO) check --locked -p areal --features cuda

# OpenAI's Python client in a scratch venv (.cache/openai), for the agent programs of the proxy's
# tests and examples (a few seconds, from PyPI).
openai-venv:
	core/serve/scripts/setup-openai.sh

# The sandbox's guest interpreter (CPython 3.11 for wasm32-wasip1), built from Debian's source
# package with Debian's clang-16 into .cache/python-wasi, numpy linked in, sympy and mpmath beside
# it (~6 min; installs the toolchain with apt, the packages from PyPI pinned by sha256).
python-wasi:
	rewards/sandbox/scripts/build-python-wasi.sh

# Reward plugins and tools written in Rust and built as WebAssembly components
# (rewards/components: the chain-sum example, the hostile component of the sandbox's tests and
# the tally tool) into .cache/components.
# Installs the wasm32-wasip2 target with rustup the first time.
COMPONENTS := chain-sum hostile tally
reward-components:
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
	CARGO_TARGET_DIR=$(abspath $(TARGET_DIR))/components $(CARGO) build --release --locked \
		--target wasm32-wasip2 --manifest-path rewards/components/Cargo.toml
	@mkdir -p .cache/components
	@for c in $(COMPONENTS); do \
		cp $(abspath $(TARGET_DIR))/components/wasm32-wasip2/release/areal_component_$$(echo $$c | tr - _).wasm \
			.cache/components/$$c.wasm || exit 1; \
	done
	@ls -l .cache/components/*.wasm

# The CPU-backend table of docs/benchmarks.md (flex, ndarray, ndarray on Debian's OpenBLAS;
# installs libopenblas-dev with apt; each backend builds burn again, ~5 min each).
bench-backends:
	plugins/gen-burn/scripts/bench-backends.sh

# Coverage-guided fuzzing of what reads untrusted input (tests/fuzz: the record decoder, the
# expected-output and return-value parsers, the maths verifier, the weight-part decoder, the
# SGLang/vLLM answer readers, a checkpoint's state.json), FUZZ_SECONDS each (default 600).
# Installs cargo-fuzz; CI runs the bounded property tests of the same code instead.
FUZZ_SECONDS ?= 600
fuzz:
	for t in record expected_output math weight_parts inference_answers state_json; do \
		tests/fuzz/run.sh $$t $(FUZZ_SECONDS) || exit 1; \
	done
