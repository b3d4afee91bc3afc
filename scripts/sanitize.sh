#!/usr/bin/env bash
# The C++ test suites built with AddressSanitizer and UndefinedBehaviorSanitizer
# (in build-sanitize/, beside the Release build) and run: any report fails.
# Usage: scripts/sanitize.sh [SUITE ...]   (default: every C++ suite)
source "$(dirname "$0")/common.sh"
install_missing

suites=("$@")
((${#suites[@]})) || suites=(memonger_tests metamem_tests layer_tests script_tests)

# libtorch is not instrumented: ASan still sees every allocation (it replaces
# malloc) and checks our code's accesses; leak checking is off because
# libtorch keeps its registries until exit.
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMETAMEM_BENCH=OFF -DMETAMEM_PYTHON=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
cmake --build build-sanitize -j "$(nproc)" --target "${suites[@]}"

export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export METAMEM_SCRIPT_MODELS=build-sanitize/tests/script_models
"$VENV/bin/python" tests/script_models.py "$METAMEM_SCRIPT_MODELS"
# Time limits are an optimised build's: the instrumented one is slower.
skipped="Exact.KeepsItsTimeLimitOnAHundredThousandRanges:Exact.StopsAtItsTimeLimitWithTheBestSoFar"
skipped+=":Instances/MiniMallocChallenging.AutoDecidesItWithinItsDefaultTimeLimit/*"
for suite in "${suites[@]}"; do
  echo "== $suite"
  "build-sanitize/tests/$suite" --gtest_filter="-$skipped" --gtest_brief=1 --gtest_print_time=0
done
echo "sanitizers: no report in ${suites[*]}"
