/* fastread's optional Parquet shim (issue 40): a column chunk of BYTE_ARRAY
 * values decoded by Apache Arrow's own C++ Parquet library (the libparquet of
 * the pyarrow wheel it was built against: no decoder of ours), its values
 * given as (offset, length) into the chunk's bytes where Arrow's decoder
 * points into them (uncompressed PLAIN pages: views, nothing copied), else
 * copied into one side buffer (compressed pages, whose page buffer Arrow
 * reuses; dictionary values, which Arrow copies into its decoder).
 *
 * A C API (no C++ types cross it) so that the Cython adapter stays C; every
 * call is thread-safe (a footer is read-only once made) and takes no GIL. */
#ifndef FASTREAD_PQ_NATIVE_H
#define FASTREAD_PQ_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_pqn_footer fr_pqn_footer;

/* The Arrow version the shim was compiled against ("26.0.1"). */
const char *fr_pqn_arrow_version(void);

/* A file's footer: the Thrift FileMetaData bytes (without the trailing
 * length and "PAR1"), parsed by Arrow. 0, or -EINVAL with err set. */
int fr_pqn_footer_open(const uint8_t *bytes, size_t len, fr_pqn_footer **out, char *err,
                       size_t errlen);
void fr_pqn_footer_close(fr_pqn_footer *footer);

/* Leaf column `column` of row group `group` as this shim reads it: 0 where
 * it can (a BYTE_ARRAY leaf, not repeated, not encrypted), with its level
 * count (*values: rows, nulls included) and whether its codec compresses;
 * -EOPNOTSUPP (err says why) or -EINVAL (no such group or column). */
int fr_pqn_chunk_info(const fr_pqn_footer *footer, int group, int column, int64_t *values,
                      int *compressed, char *err, size_t errlen);

/* Decodes the column chunk `chunk` (its `chunk_len` bytes from its first page,
 * as the footer places them) into `rows` entries: begin[i] >= 0, the value's
 * offset in `chunk`; begin[i] < 0, at -(begin[i] + 1) in *side (malloc'd,
 * *side_len bytes, NULL where nothing was copied: free with fr_pqn_free);
 * length[i] == -1, a null (of the leaf or of a struct above it).
 * *copied: the values copied into *side. `side_hint`: bytes to reserve for
 * the side buffer where copying is expected (the chunk's uncompressed size).
 * 0, -EOPNOTSUPP, -ENOMEM, or -EIO (Arrow could not decode it; err says
 * what). */
int fr_pqn_read_chunk(const fr_pqn_footer *footer, int group, int column, const uint8_t *chunk,
                      int64_t chunk_len, int64_t rows, int64_t side_hint, int64_t *begin,
                      int64_t *length, uint8_t **side, int64_t *side_len, int64_t *copied,
                      char *err, size_t errlen);

void fr_pqn_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
