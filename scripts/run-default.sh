#!/usr/bin/env bash
# Installs what is missing, builds, and profiles the default model: one
# training step of GPT-2 124M, batch 8, sequence 1024, on a fake CUDA device.
source "$(dirname "$0")/common.sh"
install_missing
build
build/examples/metamem profile --model gpt2 --batch 8 --seq 1024 --device cuda "$@"
