# --- the s3 engine (object storage over HTTP), through the system's libcurl ----
# Optional like io_uring: FASTREAD_S3=AUTO builds it where pkg-config finds
# libcurl (Debian: libcurl4-openssl-dev), ON makes its absence an error, OFF
# leaves it out. Without it engines() and `fastread info` say why.
set(FASTREAD_S3 "AUTO" CACHE STRING "s3 engine (libcurl): AUTO, ON or OFF")
set_property(CACHE FASTREAD_S3 PROPERTY STRINGS AUTO ON OFF)
if(NOT FASTREAD_S3 MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "fastread: FASTREAD_S3 must be AUTO, ON or OFF, got '${FASTREAD_S3}'")
endif()
set(FASTREAD_HAVE_S3 OFF)
if(NOT FASTREAD_S3 STREQUAL "OFF")
  if(PkgConfig_FOUND)
    # 7.84: CURLOPT_AWS_SIGV4 (7.75) and a thread-safe curl_global_init.
    pkg_check_modules(CURL IMPORTED_TARGET libcurl>=7.84)
  endif()
  if(CURL_FOUND)
    set(FASTREAD_HAVE_S3 ON)
    target_sources(fastread_core PRIVATE
      csrc/engines/s3/s3.c
      csrc/engines/s3/s3_client.c
      csrc/engines/s3/s3_config.c
      csrc/engines/s3/s3_http.c
      csrc/engines/s3/s3_jobs.c
      csrc/engines/s3/s3_list.c)
    target_compile_definitions(fastread_core PUBLIC FASTREAD_HAVE_S3=1)
    target_link_libraries(fastread_core PUBLIC PkgConfig::CURL)
    message(STATUS "fastread: s3 engine ON (libcurl ${CURL_VERSION})")
    # Listings parsed in C (s3_list.c) where libexpat is (libexpat1-dev);
    # without it fr_s3_list says so and fastread.s3 parses them in Python.
    # FASTREAD_EXPAT=OFF leaves libexpat out (the Python parser's build).
    set(FASTREAD_EXPAT "AUTO" CACHE STRING "S3 listings parsed in C (libexpat): AUTO or OFF")
    set(EXPAT_FOUND OFF)
    if(NOT FASTREAD_EXPAT STREQUAL "OFF")
      pkg_check_modules(EXPAT IMPORTED_TARGET expat)
    endif()
    if(EXPAT_FOUND)
      target_compile_definitions(fastread_core PRIVATE FASTREAD_HAVE_EXPAT=1)
      target_link_libraries(fastread_core PUBLIC PkgConfig::EXPAT)
      message(STATUS "fastread: S3 listings parsed in C (expat ${EXPAT_VERSION})")
    else()
      message(STATUS "fastread: S3 listings parsed in Python (libexpat not found by pkg-config)")
    endif()
  elseif(FASTREAD_S3 STREQUAL "ON")
    message(FATAL_ERROR "fastread: FASTREAD_S3=ON but libcurl >= 7.84 was not found by "
                        "pkg-config (install libcurl4-openssl-dev, or set PKG_CONFIG_PATH; or "
                        "set FASTREAD_S3=OFF)")
  else()
    message(STATUS "fastread: s3 engine OFF (libcurl >= 7.84 not found by pkg-config)")
  endif()
else()
  message(STATUS "fastread: s3 engine OFF (FASTREAD_S3=OFF)")
endif()
