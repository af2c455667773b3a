#!/usr/bin/env bash
# The test command: the C core under ASan + UBSan, in the optimised build and
# under ThreadSanitizer (ctest), then the Python suite. Installs everything it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
setup_system
setup_python "dali,test,plot"
setup_cassandra

build=build/sanitize
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
      -DFASTREAD_SANITIZE=ON -DFASTREAD_BUILD_TESTS=ON >/dev/null
cmake --build "$build"
ctest --test-dir "$build" --output-on-failure
# Warnings are errors in an optimised build too, where GCC's flow analysis
# (truncation, maybe-uninitialized) sees what a Debug build does not.
cmake -S . -B build/warnings -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFASTREAD_BUILD_TESTS=ON -DCMAKE_C_FLAGS=-Werror >/dev/null
cmake --build build/warnings
# And the C tests once more in that optimised build, the one users get: the
# sanitizers' allocator never hands a freed block straight back, which hid an
# arena that reused a freed one's address from io_uring's buffer cache.
ctest --test-dir build/warnings --output-on-failure
# And under ThreadSanitizer: the reader's workers, the engines' threads and
# the gather proxy share state across threads; a report fails the test
# (csrc/tests/tsan.supp holds the one suppression, with its reason).
cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFASTREAD_TSAN=ON \
      -DFASTREAD_BUILD_TESTS=ON >/dev/null
cmake --build build/tsan
ctest --test-dir build/tsan --output-on-failure --timeout 900

# Run from outside the checkout so `import fastread` is the installed build.
# The S3 engine, its server and the fixture's client were installed above,
# and Java with Cassandra's jars: their tests fail rather than skip if any
# is missing (tests/conftest.py).
export FASTREAD_TEST_REQUIRE="${FASTREAD_TEST_REQUIRE:-s3,cassandra}"
cd tests && python3 -m pytest -q -ra -p no:cacheprovider .
