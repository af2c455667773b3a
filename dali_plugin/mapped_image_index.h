// A packed image's version-3 binary index (src/fastread/image_index.py),
// memory-mapped by the operator itself: fn.fastread.readers.file(image=,
// image_index=) reads a 10^8-sample image with no per-sample argument list.
//
// fastread.dali.readers.image has opened and checked the index when the
// pipeline was defined (fastread.PackedImage: header line, meta CRC-32,
// layout, columns' CRCs below image_index.VERIFY_BELOW) and passes what it
// found: the index's exact header line, the sample count and where each
// column lies in the file. The header line holds the meta's CRC-32, which
// covers the layout, so an index replaced since is refused here, by name,
// rather than read with another's layout; no JSON is parsed in C++.
//
// The columns are views of the read-only mapping (MADV_RANDOM: a shuffled
// batch touches one page of each column per sample): the offsets and
// lengths go to fr_reader_open_range_columns borrowed, labels and names are
// read per sample when a batch is handed out. Opening costs O(1) whatever
// the sample count; a value that is not a byte range of the image is that
// sample's error when it is read (fr_read_ranges), as with Python's reader.
//
// Thread-safety: immutable after construction; any thread may read it.
#ifndef FASTREAD_DALI_MAPPED_IMAGE_INDEX_H
#define FASTREAD_DALI_MAPPED_IMAGE_INDEX_H

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dali/core/error_handling.h"
#include "dali/core/format.h"
#include "plugin_common.h"

namespace fastread_dali {

// Maps `path` read-only, refused (DALI_ENFORCE, messages prefixed by
// `where`) unless it is a regular file of exactly `index_bytes` bytes whose
// first head.size() bytes are `head`: the index the pipeline was defined
// with, not one rewritten since. Returns the mapping (munmap it).
inline void *MapIndexFile(const std::string &where, const std::string &path,
                          const std::string &head, int64_t index_bytes) {
  void *map = nullptr;
  // O_NONBLOCK: a FIFO named as the index is refused by fstat, not waited on.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  DALI_ENFORCE(fd >= 0, dali::make_string(where, "cannot open: ", ErrnoText(-errno)));
  struct stat st;
  int failed = fstat(fd, &st) == 0 ? 0 : errno;
  std::string line(head.size(), '\0');
  if (!failed && S_ISREG(st.st_mode) && st.st_size == index_bytes) {
    ssize_t got = pread(fd, &line[0], line.size(), 0);
    if (got < 0) failed = errno;
    else line.resize(static_cast<size_t>(got));
    if (!failed && line == head) {
      map = mmap(nullptr, static_cast<size_t>(index_bytes), PROT_READ, MAP_SHARED, fd, 0);
      if (map == MAP_FAILED) {
        failed = errno;
        map = nullptr;
      }
    }
  }
  // The mapping holds the file: the descriptor is not needed past here.
  if (close(fd) != 0 && !failed) failed = errno;
  DALI_ENFORCE(!failed, dali::make_string(where, "cannot read: ", ErrnoText(-failed)));
  DALI_ENFORCE(S_ISREG(st.st_mode), dali::make_string(where, "not a regular file"));
  DALI_ENFORCE(st.st_size == index_bytes && line == head,
               dali::make_string(where, "is not the index the pipeline was defined with (",
                                 st.st_size, " bytes, ", index_bytes, " expected, or another "
                                 "header line): rewritten since? define the pipeline again"));
  return map;
}

class MappedImageIndex {
 public:
  // The columns' file offsets in `columns`, in this order; kShapes (int64,
  // count x 3: a decoded pack's) is optional.
  enum Column { kOffsets, kLengths, kLabels, kNameOffsets, kNames, kShapes, kColumns };

  // `what` prefixes every message (the operator's name). `head`: the index's
  // first line, newline included, as fastread read it; `names_bytes`: the
  // names blob's size; `index_bytes`: the file's size.
  MappedImageIndex(const std::string &what, const std::string &path, const std::string &head,
                   int64_t count, const std::vector<int64_t> &columns, int64_t names_bytes,
                   int64_t index_bytes)
      : path_(path), count_(count) {
    const std::string where = dali::make_string(what, ": image_index='", path, "': ");
    DALI_ENFORCE(count >= 0 && names_bytes >= 0 && index_bytes > 0 &&
                     (columns.size() == static_cast<size_t>(kShapes) ||
                      columns.size() == static_cast<size_t>(kColumns)),
                 dali::make_string(where, "index_count, index_columns (", columns.size(),
                                   " given, ", static_cast<int>(kShapes), " or ",
                                   static_cast<int>(kColumns),
                                   " wanted), index_names_bytes and index_bytes describe no "
                                   "index (fastread.dali.readers.image passes them)"));
    map_ = MapIndexFile(where, path, head, index_bytes);
    size_ = static_cast<size_t>(index_bytes);
    // Advice only: a kernel that ignores it still reads correctly.
    (void)madvise(map_, size_, MADV_RANDOM);
    const uint64_t n = static_cast<uint64_t>(count);
    const uint64_t sizes[kColumns] = {n * 8, n * 8, n * 4, (n + 1) * 8,
                                      static_cast<uint64_t>(names_bytes), n * 24};
    static const char *const kNamesOf[kColumns] = {"offsets", "lengths", "labels",
                                                   "name_offsets", "names", "shapes"};
    for (int c = 0; c < static_cast<int>(columns.size()); c++) {
      const int64_t at = columns[static_cast<size_t>(c)];
      // 8-aligned (the writer aligns to 64): the views are aligned loads.
      DALI_ENFORCE(at >= 0 && at % 8 == 0 && n < (UINT64_MAX - 8) / 24 &&
                       static_cast<uint64_t>(at) <= size_ &&
                       sizes[c] <= size_ - static_cast<uint64_t>(at),
                   dali::make_string(where, "column ", kNamesOf[c], " (at ", at, ", ", sizes[c],
                                     " bytes) lies outside the ", size_, "-byte index"));
      col_[c] = static_cast<const uint8_t *>(map_) + at;
    }
    names_bytes_ = static_cast<uint64_t>(names_bytes);
  }

  ~MappedImageIndex() {
    if (map_) munmap(map_, size_);
  }
  MappedImageIndex(const MappedImageIndex &) = delete;
  MappedImageIndex &operator=(const MappedImageIndex &) = delete;

  int64_t count() const { return count_; }
  // The columns as fr_reader_open_range_columns borrows them (int64 in the
  // file, never negative in an intact index; a damaged value is its
  // sample's read error).
  const uint64_t *offsets() const { return reinterpret_cast<const uint64_t *>(col_[kOffsets]); }
  const uint64_t *lengths() const { return reinterpret_cast<const uint64_t *>(col_[kLengths]); }
  int32_t label(int64_t i) const {
    int32_t v;
    memcpy(&v, col_[kLabels] + 4 * static_cast<size_t>(i), sizeof(v));
    return v;
  }
  // Sample i's name (its path under the packed root), or "#i" where the
  // name offsets are damaged: names only label errors and source info.
  std::string name(int64_t i) const {
    const int64_t *no = reinterpret_cast<const int64_t *>(col_[kNameOffsets]);
    const int64_t a = no[i], b = no[i + 1];
    if (a < 0 || b < a || static_cast<uint64_t>(b) > names_bytes_)
      return "#" + std::to_string(i);
    return std::string(reinterpret_cast<const char *>(col_[kNames]) + a,
                       static_cast<size_t>(b - a));
  }
  const std::string &path() const { return path_; }
  bool has_shapes() const { return col_[kShapes] != nullptr; }
  // Sample i's 3 extents (a decoded pack's HWC), where has_shapes().
  const int64_t *dims(int64_t i) const {
    return reinterpret_cast<const int64_t *>(col_[kShapes]) + 3 * static_cast<size_t>(i);
  }

 private:
  std::string path_;
  int64_t count_ = 0;
  void *map_ = nullptr;
  size_t size_ = 0;
  uint64_t names_bytes_ = 0;
  const uint8_t *col_[kColumns] = {};
};

}  // namespace fastread_dali

#endif  // FASTREAD_DALI_MAPPED_IMAGE_INDEX_H
