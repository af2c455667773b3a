# Writes the bytes of INPUT as a C array `fr_xc_fatbin` (+ fr_xc_fatbin_len)
# to OUTPUT. Run with cmake -P at build time (see xnvme_cuda.cmake).
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" nhex)
math(EXPR nbytes "${nhex} / 2")
if(nbytes EQUAL 0)
  message(FATAL_ERROR "xnvme_cuda_embed: ${INPUT} is empty")
endif()
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" body "${body}")
file(WRITE "${OUTPUT}"
  "/* Generated from ${INPUT} by cmake/xnvme_cuda_embed.cmake: do not edit. */\n"
  "#include <stddef.h>\n"
  "/* 8-byte aligned: cuModuleLoadData reads the fatbin header in place. */\n"
  "_Alignas(8) const unsigned char fr_xc_fatbin[] = {\n${body}\n};\n"
  "const size_t fr_xc_fatbin_len = ${nbytes};\n")
