# The native DALI reader plugin (dali_plugin/): libfastread_dali.so, a C++17
# DALI operator library over fastread_core, loaded by fastread.dali with
# nvidia.dali.plugin_manager.load_library.
#
# FASTREAD_DALI_PLUGIN: AUTO (build it when nvidia.dali is importable at build
# time), ON (fail without DALI) or OFF. DALI's headers and flags come from
# nvidia.dali.sysconfig, asked of FASTREAD_DALI_PYTHON (default: the build's
# Python). Under pip's build isolation the build's Python cannot import the
# environment's DALI, so the probe is retried with the isolation's
# PYTHONPATH / PYTHONNOUSERSITE unset: the environment the wheel installs
# into. The C core and the wheel take no DALI dependency when it is absent.
# Not built with FASTREAD_SANITIZE (an ASan-linked plugin cannot be loaded
# into a Python that was not started under ASan).
set(FASTREAD_DALI_PLUGIN "AUTO" CACHE STRING "native DALI reader plugin: AUTO, ON or OFF")
set_property(CACHE FASTREAD_DALI_PLUGIN PROPERTY STRINGS AUTO ON OFF)
set(FASTREAD_DALI_PYTHON "" CACHE FILEPATH "Python whose nvidia.dali the plugin is built against")
if(NOT FASTREAD_DALI_PLUGIN MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "fastread: FASTREAD_DALI_PLUGIN must be AUTO, ON or OFF, got '${FASTREAD_DALI_PLUGIN}'")
endif()

# The plugin's sources: one file per operator (add new operators here).
set(FASTREAD_DALI_PLUGIN_SOURCES dali_plugin/fastread_reader.cc dali_plugin/fastread_webdataset.cc
    dali_plugin/fastread_cassandra.cc dali_plugin/reader_schemas.cc)

# The GPU outputs' upload ring (dali_plugin/upload_ring.c): C11 over the core's
# dlopen'ed CUDA driver, no DALI, so it is built and tested (on the mock
# driver, under the sanitizers) whether or not the plugin is.
add_library(fastread_upload_ring OBJECT EXCLUDE_FROM_ALL dali_plugin/upload_ring.c)
target_compile_options(fastread_upload_ring PRIVATE ${FASTREAD_WARNINGS})
target_link_libraries(fastread_upload_ring PUBLIC fastread_core)
target_include_directories(fastread_upload_ring PUBLIC dali_plugin)
if(FASTREAD_BUILD_TESTS)
  add_executable(test_upload_ring dali_plugin/tests/test_upload_ring.c csrc/tests/harness.c)
  target_compile_options(test_upload_ring PRIVATE ${FASTREAD_WARNINGS})
  target_include_directories(test_upload_ring PRIVATE csrc/tests)
  target_link_libraries(test_upload_ring PRIVATE fastread_upload_ring fastread_core)
  add_dependencies(test_upload_ring mock_cuda mock_cufile)
  add_test(NAME test_upload_ring COMMAND test_upload_ring)
  set_tests_properties(test_upload_ring PROPERTIES SKIP_RETURN_CODE 77
                       ENVIRONMENT "LD_LIBRARY_PATH=${FASTREAD_MOCK_LIBRARY_PATH}")
endif()

set(FASTREAD_HAVE_DALI_PLUGIN OFF)
if(FASTREAD_DALI_PLUGIN STREQUAL "OFF")
  message(STATUS "fastread: DALI plugin OFF (FASTREAD_DALI_PLUGIN=OFF)")
elseif(FASTREAD_SANITIZE AND FASTREAD_DALI_PLUGIN STREQUAL "AUTO")
  message(STATUS "fastread: DALI plugin OFF (not built under FASTREAD_SANITIZE)")
else()
  set(_fr_dali_py "${FASTREAD_DALI_PYTHON}")
  if(NOT _fr_dali_py)
    if(Python_EXECUTABLE)
      set(_fr_dali_py "${Python_EXECUTABLE}")
    else()
      find_package(Python COMPONENTS Interpreter QUIET)
      set(_fr_dali_py "${Python_EXECUTABLE}")
    endif()
  endif()
  set(_fr_dali_query
      "import nvidia.dali as d, nvidia.dali.sysconfig as s; print(d.__version__); print(s.get_include_dir()); print(s.get_lib_dir()); print(' '.join(s.get_compile_flags())); print(' '.join(s.get_link_flags())); print(next((l.split()[-1] for l in open('/proc/self/maps') if '/libstdc++.so' in l), ''))")
  set(_fr_dali_rc 1)
  if(_fr_dali_py)
    execute_process(COMMAND "${_fr_dali_py}" -c "${_fr_dali_query}"
                    RESULT_VARIABLE _fr_dali_rc OUTPUT_VARIABLE _fr_dali_out
                    ERROR_VARIABLE _fr_dali_err OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _fr_dali_rc EQUAL 0)
      execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
                              "${_fr_dali_py}" -c "${_fr_dali_query}"
                      RESULT_VARIABLE _fr_dali_rc OUTPUT_VARIABLE _fr_dali_out
                      ERROR_VARIABLE _fr_dali_err2 OUTPUT_STRIP_TRAILING_WHITESPACE)
    endif()
  endif()
  if(_fr_dali_rc EQUAL 0)
    string(REPLACE "\n" ";" _fr_dali_lines "${_fr_dali_out}")
    list(LENGTH _fr_dali_lines _fr_n)
    if(_fr_n LESS 5)
      set(_fr_dali_rc 1)
      set(_fr_dali_err "unexpected nvidia.dali.sysconfig output: ${_fr_dali_out}")
    endif()
  endif()
  if(_fr_dali_rc EQUAL 0)
    # DALI's headers include cuda_runtime.h (declarations only: nothing of
    # CUDA is linked), which includes crt/host_config.h and, in CUDA 13,
    # CCCL's <cuda/std/...>: the toolkit's headers, or the wheels' (CUDA 12:
    # nvidia/cuda_runtime/include; CUDA 13, torch's own: nvidia/cu13/include,
    # with the nvidia-cuda-crt and nvidia-cuda-cccl wheels for crt/ and cccl/,
    # which scripts/setup.sh installs where they are missing).
    list(GET _fr_dali_lines 1 _fr_dali_inc)
    get_filename_component(_fr_nvidia_dir "${_fr_dali_inc}/../.." ABSOLUTE)
    find_path(FASTREAD_CUDA_RUNTIME_INCLUDE NAMES cuda_runtime.h crt/host_config.h
              HINTS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda "${_fr_nvidia_dir}/cuda_runtime"
                    "${_fr_nvidia_dir}/cu13" "${_fr_nvidia_dir}/cu12"
              PATH_SUFFIXES include)
    set(FASTREAD_CUDA_HEADER_DIRS "")
    if(NOT FASTREAD_CUDA_RUNTIME_INCLUDE)
      set(_fr_dali_rc 1)
      set(_fr_dali_err "DALI's headers need cuda_runtime.h: install the CUDA toolkit's headers "
                       "(set CUDA_HOME) or the CUDA runtime wheel with nvidia-cuda-crt and "
                       "nvidia-cuda-cccl")
    elseif(NOT EXISTS "${FASTREAD_CUDA_RUNTIME_INCLUDE}/crt/host_config.h")
      # The runtime wheel alone has cuda_runtime.h but not what it includes:
      # the plugin would fail to compile, not be left out with a reason.
      set(_fr_dali_rc 1)
      set(_fr_dali_err "${FASTREAD_CUDA_RUNTIME_INCLUDE}/cuda_runtime.h has no crt/host_config.h "
                       "beside it: install the nvidia-cuda-crt wheel of that CUDA version (or the "
                       "toolkit's headers, CUDA_HOME)")
    else()
      list(APPEND FASTREAD_CUDA_HEADER_DIRS "${FASTREAD_CUDA_RUNTIME_INCLUDE}")
      if(EXISTS "${FASTREAD_CUDA_RUNTIME_INCLUDE}/cccl")
        list(APPEND FASTREAD_CUDA_HEADER_DIRS "${FASTREAD_CUDA_RUNTIME_INCLUDE}/cccl")
      endif()
    endif()
  endif()
  if(_fr_dali_rc EQUAL 0)
    list(GET _fr_dali_lines 0 FASTREAD_DALI_VERSION)
    list(GET _fr_dali_lines 1 _fr_dali_inc)
    list(GET _fr_dali_lines 2 _fr_dali_libdir)
    list(GET _fr_dali_lines 3 _fr_dali_cflags)
    separate_arguments(_fr_dali_cflags UNIX_COMMAND "${_fr_dali_cflags}")
    enable_language(CXX)
    set(FASTREAD_HAVE_DALI_PLUGIN ON)
    add_library(fastread_dali SHARED ${FASTREAD_DALI_PLUGIN_SOURCES})
    set_target_properties(fastread_dali PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                          CXX_EXTENSIONS OFF CXX_VISIBILITY_PRESET hidden
                          VISIBILITY_INLINES_HIDDEN ON)
    # DALI's headers are third-party: included as system headers so
    # -Wall -Wextra speak about our code only.
    target_include_directories(fastread_dali SYSTEM PRIVATE "${_fr_dali_inc}"
                               ${FASTREAD_CUDA_HEADER_DIRS})
    list(FILTER _fr_dali_cflags EXCLUDE REGEX "^-I")
    # -Wno-free-nonheap-object: GCC 12 misfires inside DALI's inline
    # SmallVector/TensorShape code instantiated here (op_spec.h, tensor_shape_print.h).
    target_compile_options(fastread_dali PRIVATE ${_fr_dali_cflags} -Wall -Wextra
                           -Wno-unused-parameter -Wno-free-nonheap-object)
    target_compile_definitions(fastread_dali PRIVATE
                               FASTREAD_DALI_BUILD_VERSION="${FASTREAD_DALI_VERSION}")
    find_library(FASTREAD_LIBDALI dali PATHS "${_fr_dali_libdir}" NO_DEFAULT_PATH)
    if(NOT FASTREAD_LIBDALI)
      message(FATAL_ERROR "fastread: no libdali.so in ${_fr_dali_libdir} (nvidia.dali.sysconfig.get_lib_dir())")
    endif()
    target_link_libraries(fastread_dali PRIVATE fastread_upload_ring fastread_core "${FASTREAD_LIBDALI}")
    # One C++ runtime in the process: the plugin links the libstdc++ that
    # DALI was loaded with (as the probe's /proc/self/maps names it), ahead of
    # the compiler's own. A toolchain whose -lstdc++ is a static archive (the
    # GPU machine's CXX=/opt/gcc/bin/g++) otherwise copies iostreams and
    # locales into the plugin, and the first make_string of a number, or a
    # checkpoint parsed with an istringstream, crashed inside that second copy.
    set(_fr_dali_libstdcxx "")
    if(_fr_n GREATER 5)
      list(GET _fr_dali_lines 5 _fr_dali_libstdcxx)
    endif()
    if(_fr_dali_libstdcxx AND EXISTS "${_fr_dali_libstdcxx}")
      target_link_libraries(fastread_dali PRIVATE "${_fr_dali_libstdcxx}")
    endif()
    # libdali.so is found next to the nvidia.dali package that loads the
    # plugin (already in the process when load_library runs); no rpath into
    # the build machine's site-packages.
    target_link_options(fastread_dali PRIVATE -Wl,--no-undefined -Wl,--as-needed)
    # The DALI version the plugin was built against, for the loader's checks.
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/fastread_dali.version "${FASTREAD_DALI_VERSION}\n")
    if(SKBUILD)
      install(TARGETS fastread_dali LIBRARY DESTINATION fastread)
      install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fastread_dali.version DESTINATION fastread)
    endif()
    message(STATUS "fastread: DALI plugin ON (DALI ${FASTREAD_DALI_VERSION} at ${_fr_dali_inc})")
  elseif(FASTREAD_DALI_PLUGIN STREQUAL "ON")
    message(FATAL_ERROR "fastread: FASTREAD_DALI_PLUGIN=ON but nvidia.dali is not importable by "
                        "'${_fr_dali_py}' (set FASTREAD_DALI_PYTHON, or install nvidia-dali): "
                        "${_fr_dali_err}")
  else()
    message(STATUS "fastread: DALI plugin OFF (nvidia.dali not importable by '${_fr_dali_py}', "
                   "or no CUDA headers: ${_fr_dali_err})")
  endif()
endif()
