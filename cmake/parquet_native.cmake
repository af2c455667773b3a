# The optional Parquet shim (parquet_native/, issue 40): a C API over Apache
# Arrow's C++ Parquet library, built against the headers and libraries of the
# pyarrow wheel found at build time, and its Cython adapter
# fastread._parquet_native. formats.Parquet uses it where it imports and the
# running pyarrow is the one it was built against, else pyarrow's Python
# reader (fastread info says which, and why).
#
# FASTREAD_PARQUET_NATIVE: AUTO (build it where pyarrow's headers and its
# libarrow/libparquet are found), ON (fail without them) or OFF. Nothing else
# in the build needs it. Included from the SKBUILD block (Python found).
set(FASTREAD_PARQUET_NATIVE "AUTO" CACHE STRING "Parquet shim over pyarrow's libparquet: AUTO, ON or OFF")
set_property(CACHE FASTREAD_PARQUET_NATIVE PROPERTY STRINGS AUTO ON OFF)
if(NOT FASTREAD_PARQUET_NATIVE MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "fastread: FASTREAD_PARQUET_NATIVE must be AUTO, ON or OFF, got '${FASTREAD_PARQUET_NATIVE}'")
endif()

set(FASTREAD_HAVE_PARQUET_NATIVE OFF)
set(_fr_pqn_why "")
if(FASTREAD_PARQUET_NATIVE STREQUAL "OFF")
  set(_fr_pqn_why "FASTREAD_PARQUET_NATIVE=OFF")
elseif(FASTREAD_SANITIZE OR FASTREAD_TSAN)
  set(_fr_pqn_why "not built under the sanitizers (pyarrow's libraries are not instrumented)")
else()
  set(_fr_pqn_query
      "import pyarrow as p; print(p.__version__); print(p.get_include()); print(p.get_library_dirs()[0])")
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "${_fr_pqn_query}"
                  RESULT_VARIABLE _fr_pqn_rc OUTPUT_VARIABLE _fr_pqn_out
                  ERROR_VARIABLE _fr_pqn_err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _fr_pqn_rc EQUAL 0)
    # Under pip's build isolation: the environment the wheel installs into.
    execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
                            "${Python_EXECUTABLE}" -c "${_fr_pqn_query}"
                    RESULT_VARIABLE _fr_pqn_rc OUTPUT_VARIABLE _fr_pqn_out
                    ERROR_VARIABLE _fr_pqn_err OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
  if(NOT _fr_pqn_rc EQUAL 0)
    set(_fr_pqn_why "pyarrow does not import in the build's Python (${_fr_pqn_err})")
  else()
    string(REPLACE "\n" ";" _fr_pqn_lines "${_fr_pqn_out}")
    list(GET _fr_pqn_lines 0 FASTREAD_PYARROW_VERSION)
    list(GET _fr_pqn_lines 1 _fr_pqn_inc)
    list(GET _fr_pqn_lines 2 _fr_pqn_libdir)
    # The wheel ships only versioned libraries (libarrow.so.2600): found by glob.
    file(GLOB _fr_pqn_arrow "${_fr_pqn_libdir}/libarrow.so.*")
    file(GLOB _fr_pqn_parquet "${_fr_pqn_libdir}/libparquet.so.*")
    list(FILTER _fr_pqn_arrow INCLUDE REGEX "libarrow\\.so\\.[0-9]+$")
    list(FILTER _fr_pqn_parquet INCLUDE REGEX "libparquet\\.so\\.[0-9]+$")
    if(FASTREAD_PYARROW_VERSION VERSION_LESS 25)
      set(_fr_pqn_why "pyarrow ${FASTREAD_PYARROW_VERSION} is older than 25 (the shim uses Arrow 25's PageReader::Open)")
    elseif(NOT EXISTS "${_fr_pqn_inc}/parquet/column_reader.h")
      set(_fr_pqn_why "no parquet/column_reader.h under ${_fr_pqn_inc}")
    elseif(NOT _fr_pqn_arrow OR NOT _fr_pqn_parquet)
      set(_fr_pqn_why "no libarrow.so.N / libparquet.so.N in ${_fr_pqn_libdir}")
    else()
      include(CheckLanguage)
      check_language(CXX)
      if(NOT CMAKE_CXX_COMPILER)
        set(_fr_pqn_why "no C++ compiler")
      endif()
    endif()
  endif()
  if(_fr_pqn_why STREQUAL "")
    enable_language(CXX)
    list(GET _fr_pqn_arrow 0 _fr_pqn_arrow)
    list(GET _fr_pqn_parquet 0 _fr_pqn_parquet)
    set(FASTREAD_HAVE_PARQUET_NATIVE ON)
    add_library(fastread_pq_native STATIC parquet_native/pq_native.cc)
    # Arrow 26's headers need C++20.
    set_target_properties(fastread_pq_native PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON
                          CXX_EXTENSIONS OFF POSITION_INDEPENDENT_CODE ON
                          CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
    # Arrow's headers are third-party: system headers, so warnings speak of ours.
    target_include_directories(fastread_pq_native SYSTEM PRIVATE "${_fr_pqn_inc}")
    target_include_directories(fastread_pq_native PUBLIC parquet_native)
    target_compile_options(fastread_pq_native PRIVATE -Wall -Wextra -Wshadow -Wno-unused-parameter)
    target_link_libraries(fastread_pq_native PUBLIC "${_fr_pqn_parquet}" "${_fr_pqn_arrow}")
    message(STATUS "fastread: Parquet shim ON (pyarrow ${FASTREAD_PYARROW_VERSION}: ${_fr_pqn_libdir})")
  endif()
endif()
if(NOT FASTREAD_HAVE_PARQUET_NATIVE)
  if(FASTREAD_PARQUET_NATIVE STREQUAL "ON")
    message(FATAL_ERROR "fastread: FASTREAD_PARQUET_NATIVE=ON but ${_fr_pqn_why}")
  endif()
  message(STATUS "fastread: Parquet shim OFF (${_fr_pqn_why})")
endif()
