# --- the cql engine (Cassandra's native protocol), always built ----------------
# Plain TCP needs nothing beyond libc. TLS (engine_args ssl=1) goes through
# the system's OpenSSL where pkg-config finds it (Debian: libssl-dev);
# without it ssl=1 is refused saying why, and `fastread info` says so too.
target_sources(fastread_core PRIVATE
  csrc/engines/cql/cql.c
  csrc/engines/cql/cql_config.c
  csrc/engines/cql/cql_conn.c
  csrc/engines/cql/cql_proto.c)
set(FASTREAD_CQL_TLS "AUTO" CACHE STRING "TLS for the cql engine (OpenSSL): AUTO, ON or OFF")
set_property(CACHE FASTREAD_CQL_TLS PROPERTY STRINGS AUTO ON OFF)
set(FASTREAD_HAVE_OPENSSL OFF)
if(NOT FASTREAD_CQL_TLS STREQUAL "OFF")
  if(PkgConfig_FOUND)
    pkg_check_modules(OPENSSL IMPORTED_TARGET openssl>=1.1.1)
  endif()
  if(OPENSSL_FOUND)
    set(FASTREAD_HAVE_OPENSSL ON)
    # Only the cql sources see the define: nothing else includes OpenSSL.
    set_source_files_properties(csrc/engines/cql/cql_conn.c csrc/engines/cql/cql.c
      PROPERTIES COMPILE_DEFINITIONS FASTREAD_HAVE_OPENSSL=1)
    target_link_libraries(fastread_core PUBLIC PkgConfig::OPENSSL)
    message(STATUS "fastread: cql engine ON, with TLS (OpenSSL ${OPENSSL_VERSION})")
  elseif(FASTREAD_CQL_TLS STREQUAL "ON")
    message(FATAL_ERROR "fastread: FASTREAD_CQL_TLS=ON but OpenSSL >= 1.1.1 was not found by "
                        "pkg-config (install libssl-dev)")
  else()
    message(STATUS "fastread: cql engine ON, without TLS (OpenSSL not found by pkg-config)")
  endif()
else()
  message(STATUS "fastread: cql engine ON, without TLS (FASTREAD_CQL_TLS=OFF)")
endif()

# The libFuzzer target over the protocol's parsers (csrc/tests/fuzz/fuzz_cql.c):
# only with clang (-DCMAKE_C_COMPILER=clang -DFASTREAD_FUZZ=ON); elsewhere
# test_cql_proto runs the same body on a bounded seeded corpus.
option(FASTREAD_FUZZ "build the libFuzzer targets (clang only)" OFF)
if(FASTREAD_FUZZ)
  if(CMAKE_C_COMPILER_ID MATCHES "Clang")
    add_executable(fuzz_cql csrc/tests/fuzz/fuzz_cql.c csrc/engines/cql/cql_proto.c)
    target_include_directories(fuzz_cql PRIVATE csrc csrc/include)
    target_compile_options(fuzz_cql PRIVATE -fsanitize=fuzzer,address,undefined -g)
    target_link_options(fuzz_cql PRIVATE -fsanitize=fuzzer,address,undefined)
    message(STATUS "fastread: libFuzzer target fuzz_cql ON")
    # The tar walker and WebDataset grouping (csrc/tests/fuzz/fuzz_tar.c).
    add_executable(fuzz_tar csrc/tests/fuzz/fuzz_tar.c csrc/formats/tar_index.c
                   csrc/formats/wds_group.c csrc/formats/wds2idx.c csrc/core/base.c)
    target_include_directories(fuzz_tar PRIVATE csrc csrc/include csrc/tests/fuzz)
    target_compile_options(fuzz_tar PRIVATE -fsanitize=fuzzer,address,undefined -g)
    target_link_options(fuzz_tar PRIVATE -fsanitize=fuzzer,address,undefined -pthread)
    message(STATUS "fastread: libFuzzer target fuzz_tar ON")
    # DALI wds2idx index files (csrc/tests/fuzz/fuzz_wds2idx.c).
    add_executable(fuzz_wds2idx csrc/tests/fuzz/fuzz_wds2idx.c csrc/formats/tar_index.c
                   csrc/formats/wds2idx.c csrc/core/base.c)
    target_include_directories(fuzz_wds2idx PRIVATE csrc csrc/include csrc/tests/fuzz)
    target_compile_options(fuzz_wds2idx PRIVATE -fsanitize=fuzzer,address,undefined -g)
    target_link_options(fuzz_wds2idx PRIVATE -fsanitize=fuzzer,address,undefined -pthread)
    # Squirrel's MessagePack walk (csrc/tests/fuzz/fuzz_squirrel.c).
    add_executable(fuzz_squirrel csrc/tests/fuzz/fuzz_squirrel.c csrc/formats/squirrel_walk.c
                   csrc/core/base.c)
    target_include_directories(fuzz_squirrel PRIVATE csrc csrc/include csrc/tests/fuzz)
    target_compile_options(fuzz_squirrel PRIVATE -fsanitize=fuzzer,address,undefined -g)
    target_link_options(fuzz_squirrel PRIVATE -fsanitize=fuzzer,address,undefined -pthread)
  else()
    message(STATUS "fastread: FASTREAD_FUZZ needs clang (libFuzzer); ${CMAKE_C_COMPILER_ID} "
                   "builds none (test_cql_proto runs the same parsers on a seeded corpus)")
  endif()
endif()
