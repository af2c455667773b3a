# Writes OUTPUT: a C file defining `const char SYMBOL[]`, the bytes of INPUT
# followed by a NUL (so text files come out as C strings). Run with
#   cmake -DINPUT=... -DOUTPUT=... -DSYMBOL=... [-DINLINE=a.h,b.h] -P embed.cmake
# INLINE: headers beside INPUT whose `#include "NAME"` lines in INPUT are
# replaced by their text, so a header split in parts embeds as one text (NVRTC
# gets it as a single named header); with TEXT_OUTPUT, that text is also
# written there (the one header installed for users' own kernels).
if(DEFINED INLINE AND NOT INLINE STREQUAL "")
  file(READ "${INPUT}" text)
  get_filename_component(dir "${INPUT}" DIRECTORY)
  string(REPLACE "," ";" parts "${INLINE}")
  foreach(part IN LISTS parts)
    file(READ "${dir}/${part}" part_text)
    string(FIND "${text}" "#include \"${part}\"\n" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "embed.cmake: ${INPUT} has no line #include \"${part}\"")
    endif()
    string(REPLACE "#include \"${part}\"\n" "${part_text}" text "${text}")
  endforeach()
  file(WRITE "${OUTPUT}.inlined" "${text}")
  file(READ "${OUTPUT}.inlined" hex HEX)
  if(DEFINED TEXT_OUTPUT)
    file(RENAME "${OUTPUT}.inlined" "${TEXT_OUTPUT}")
  else()
    file(REMOVE "${OUTPUT}.inlined")
  endif()
else()
  file(READ "${INPUT}" hex HEX)
endif()
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp" "/* Generated from ${INPUT} by cmake/embed.cmake; do not edit. */\nextern const char ${SYMBOL}[];\nconst char ${SYMBOL}[] = {\n${bytes}0x00};\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
