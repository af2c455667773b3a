# --- which xNVMe interface the engines are compiled against ---------------------
# Included from CMakeLists.txt once pkg-config found xnvme (XNVME_*). xNVMe's
# main line still calls itself 0.7.5, yet its struct xnvme_opts (returned by
# value from xnvme_opts_default) is larger than the 0.7.5 release's: a build
# against one must not run on the other. Its headers tell them apart: main
# declares xnvme_libconf_get(), 0.7.5 an array xnvme_libconf[].
# FASTREAD_XNVME_API_MAIN (0 or 1) goes to the engines, which compare it with
# the library loaded at run time (fr_xnvme_probe).
unset(FASTREAD_XNVME_LIBCONF_H CACHE)
find_file(FASTREAD_XNVME_LIBCONF_H libxnvme_libconf.h
          HINTS ${XNVME_INCLUDE_DIRS} ${XNVME_INCLUDEDIR} PATH_SUFFIXES include)
set(_fr_xnvme_api_main 0)
if(FASTREAD_XNVME_LIBCONF_H)
  file(STRINGS ${FASTREAD_XNVME_LIBCONF_H} _fr_xnvme_libconf_get REGEX "xnvme_libconf_get")
  if(_fr_xnvme_libconf_get)
    set(_fr_xnvme_api_main 1)
  endif()
else()
  message(WARNING "fastread: libxnvme_libconf.h not found beside xNVMe's headers; "
                  "assuming the 0.7.5 release interface")
endif()
target_compile_definitions(fastread_core PUBLIC FASTREAD_XNVME_API_MAIN=${_fr_xnvme_api_main})
unset(FASTREAD_XNVME_LIBCONF_H CACHE)
