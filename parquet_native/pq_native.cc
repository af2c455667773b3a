// fastread's optional Parquet shim over Arrow's C++ Parquet library: see
// pq_native.h. Decoding is Arrow's: SerializedPageReader (page headers,
// decompression) under TypedColumnReader<ByteArrayType> (levels, PLAIN,
// dictionary and delta decoding). What is ours is only where each value's
// bytes are: for an uncompressed page Arrow's page buffer is a zero-copy
// slice of the BufferReader over the chunk (BufferReader::DoRead slices;
// SerializedPageReader::DecompressIfNeeded returns it as is without a codec)
// and PLAIN ByteArrays point into it, so a value inside the chunk is given
// as its offset; anything else (a decompressed page, reused at the next
// page; dictionary values, copied by Arrow's decoder) is copied out before
// the next ReadBatch can invalidate it.
#include "pq_native.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <vector>

#include <sys/mman.h>

#include <arrow/buffer.h>
#include <arrow/io/memory.h>
#include <arrow/memory_pool.h>
#include <arrow/util/config.h>
#include <parquet/column_page.h>
#include <parquet/column_reader.h>
#include <parquet/exception.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>
#include <parquet/schema.h>

struct fr_pqn_footer {
  std::shared_ptr<parquet::FileMetaData> meta;
};

namespace {

void say(char *err, size_t errlen, const char *what) {
  if (err && errlen) std::snprintf(err, errlen, "%s", what);
}

// The C API's one exception boundary: body()'s result, or -ENOMEM for
// std::bad_alloc and `failed` for any other exception, its what() in err.
template <class Body>
int guarded(char *err, size_t errlen, int failed, Body &&body) {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    say(err, errlen, "out of memory");
    return -ENOMEM;
  } catch (const std::exception &e) {
    say(err, errlen, e.what());
    return failed;
  }
}

// Arrow's jemalloc pool where the wheel has it (what the Python path decodes
// into: docs/parquet.md), else its default pool: the page reader's
// decompression buffer and the dictionary decoder's copy come from it.
arrow::MemoryPool *decode_pool() {
  arrow::MemoryPool *pool = nullptr;
  if (arrow::jemalloc_memory_pool(&pool).ok() && pool) return pool;
  return arrow::default_memory_pool();
}

// The values copied out of pages that are not the chunk's bytes: one
// malloc'd buffer, grown by doubling, its new pages faulted in with one
// madvise (a value is written into it next; one fault per 4 KiB page
// otherwise: docs/parquet.md, "the pre-faulting").
struct Side {
  uint8_t *p = nullptr;
  int64_t len = 0, cap = 0;

  ~Side() { std::free(p); }

  bool append(const uint8_t *src, int64_t n, int64_t hint) {
    if (len + n > cap) {
      int64_t want = std::max<int64_t>({hint, 2 * cap, len + n, 4096});
      auto *q = static_cast<uint8_t *>(std::realloc(p, static_cast<size_t>(want)));
      if (!q) return false;
#ifdef MADV_POPULATE_WRITE
      uintptr_t lo = (reinterpret_cast<uintptr_t>(q) + static_cast<uintptr_t>(len) + 4095) &
                     ~static_cast<uintptr_t>(4095);
      uintptr_t hi = (reinterpret_cast<uintptr_t>(q) + static_cast<uintptr_t>(want)) &
                     ~static_cast<uintptr_t>(4095);
      if (hi > lo) (void)madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_POPULATE_WRITE);
#endif
      p = q;
      cap = want;
    }
    if (n) std::memcpy(p + len, src, static_cast<size_t>(n));
    len += n;
    return true;
  }

  uint8_t *release() {
    uint8_t *q = p;
    p = nullptr;
    return q;
  }
};

// The chunk's ColumnChunkMetaData and ColumnDescriptor, or an error code.
int column_of(const fr_pqn_footer *f, int group, int column,
              std::unique_ptr<parquet::ColumnChunkMetaData> *chunk,
              const parquet::ColumnDescriptor **descr, char *err, size_t errlen) {
  if (!f || !f->meta || group < 0 || group >= f->meta->num_row_groups() || column < 0 ||
      column >= f->meta->num_columns()) {
    say(err, errlen, "no such row group or column in the footer");
    return -EINVAL;
  }
  const parquet::ColumnDescriptor *d = f->meta->schema()->Column(column);
  if (d->physical_type() != parquet::Type::BYTE_ARRAY) {
    say(err, errlen, "not a BYTE_ARRAY column");
    return -EOPNOTSUPP;
  }
  if (d->max_repetition_level() != 0) {
    say(err, errlen, "a repeated column (lists are read by Arrow's table reader)");
    return -EOPNOTSUPP;
  }
  auto c = f->meta->RowGroup(group)->ColumnChunk(column);
  if (c->crypto_metadata()) {
    say(err, errlen, "an encrypted column chunk");
    return -EOPNOTSUPP;
  }
  *chunk = std::move(c);
  *descr = d;
  return 0;
}

}  // namespace

extern "C" {

const char *fr_pqn_arrow_version(void) { return ARROW_VERSION_STRING; }

int fr_pqn_footer_open(const uint8_t *bytes, size_t len, fr_pqn_footer **out, char *err,
                       size_t errlen) {
  *out = nullptr;
  return guarded(err, errlen, -EINVAL, [&]() -> int {
    auto f = std::make_unique<fr_pqn_footer>();
    if (len > UINT32_MAX) {
      say(err, errlen, "footer too large");
      return -EINVAL;
    }
#if ARROW_VERSION_MAJOR >= 26
    f->meta = parquet::FileMetaData::Make(bytes, static_cast<int64_t>(len),
                                          parquet::ReaderProperties(decode_pool()));
#else
    uint32_t n = static_cast<uint32_t>(len);
    f->meta = parquet::FileMetaData::Make(bytes, &n, parquet::ReaderProperties(decode_pool()));
#endif
    *out = f.release();
    return 0;
  });
}

void fr_pqn_footer_close(fr_pqn_footer *footer) { delete footer; }

int fr_pqn_chunk_info(const fr_pqn_footer *footer, int group, int column, int64_t *values,
                      int *compressed, char *err, size_t errlen) {
  return guarded(err, errlen, -EINVAL, [&]() -> int {
    std::unique_ptr<parquet::ColumnChunkMetaData> chunk;
    const parquet::ColumnDescriptor *descr = nullptr;
    int rc = column_of(footer, group, column, &chunk, &descr, err, errlen);
    if (rc) return rc;
    *values = chunk->num_values();
    *compressed = chunk->compression() != arrow::Compression::UNCOMPRESSED;
    return 0;
  });
}

int fr_pqn_read_chunk(const fr_pqn_footer *footer, int group, int column, const uint8_t *chunk,
                      int64_t chunk_len, int64_t rows, int64_t side_hint, int64_t *begin,
                      int64_t *length, uint8_t **side, int64_t *side_len, int64_t *copied,
                      char *err, size_t errlen) {
  *side = nullptr;
  *side_len = 0;
  *copied = 0;
  return guarded(err, errlen, -EIO, [&]() -> int {
    std::unique_ptr<parquet::ColumnChunkMetaData> meta;
    const parquet::ColumnDescriptor *descr = nullptr;
    int rc = column_of(footer, group, column, &meta, &descr, err, errlen);
    if (rc) return rc;
    if (meta->num_values() != rows) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "the column chunk has %lld values for %lld rows",
                    static_cast<long long>(meta->num_values()), static_cast<long long>(rows));
      say(err, errlen, msg);
      return -EIO;
    }
    arrow::MemoryPool *pool = decode_pool();
    // Not owned: the caller keeps the chunk's bytes alive while its views are.
    auto buf = std::make_shared<arrow::Buffer>(chunk, chunk_len);
    auto stream = std::make_shared<arrow::io::BufferReader>(buf);
    parquet::ReaderProperties props(pool);
    auto pager = parquet::PageReader::Open(stream, meta->num_values(), meta->compression(), props,
                                           *descr);
    auto reader = parquet::ColumnReader::Make(descr, std::move(pager), pool);
    auto *typed = static_cast<parquet::ByteArrayReader *>(reader.get());
    const int16_t max_def = descr->max_definition_level();
    const int64_t step = 4096;
    std::vector<int16_t> defs(max_def > 0 ? step : 0);
    std::vector<parquet::ByteArray> vals(step);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(chunk);
    const uintptr_t hi = lo + static_cast<uintptr_t>(chunk_len);
    Side out;
    int64_t row = 0, n_copied = 0;
    while (row < rows && typed->HasNext()) {
      int64_t got = 0;
      int64_t levels = typed->ReadBatch(std::min(step, rows - row),
                                        max_def > 0 ? defs.data() : nullptr, nullptr,
                                        vals.data(), &got);
      if (levels <= 0) break;
      int64_t v = 0;
      for (int64_t k = 0; k < levels; ++k, ++row) {
        if (max_def > 0 && defs[static_cast<size_t>(k)] < max_def) {
          begin[row] = 0;
          length[row] = -1;
          continue;
        }
        if (v >= got) throw parquet::ParquetException("fewer values than defined levels");
        const parquet::ByteArray &b = vals[static_cast<size_t>(v++)];
        const uintptr_t p = reinterpret_cast<uintptr_t>(b.ptr);
        if (p >= lo && p <= hi && b.len <= hi - p) {
          begin[row] = static_cast<int64_t>(p - lo);
        } else {
          begin[row] = -(out.len + 1);
          if (!out.append(b.ptr, b.len, side_hint)) {
            say(err, errlen, "out of memory");
            return -ENOMEM;
          }
          ++n_copied;
        }
        length[row] = b.len;
      }
    }
    if (row != rows) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "the column chunk's pages end after %lld of %lld rows",
                    static_cast<long long>(row), static_cast<long long>(rows));
      say(err, errlen, msg);
      return -EIO;
    }
    *side_len = out.len;
    *side = out.release();
    *copied = n_copied;
    return 0;
  });
}

void fr_pqn_free(void *p) { std::free(p); }

}  // extern "C"
