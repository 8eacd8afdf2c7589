# The two commands of the README, and a few more for developers.
.PHONY: run test setup build bench lint

# Sets up, builds (release) and serves the example models and pipeline.
run:
	scripts/run

# Sets up and runs every test.
test:
	scripts/test

setup:
	scripts/setup

build: setup
	cargo build --release

lint:
	cargo clippy --workspace --all-targets -- -D warnings
