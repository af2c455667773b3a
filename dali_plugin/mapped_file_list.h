// A file list's binary listing (src/fastread/dali/_listing.py), memory-mapped
// by the operator itself: fn.fastread.readers.file(file_index=) reads a
// 10^7-file tree with no argument of N strings and N labels.
//
// fastread.dali.readers.file writes the listing once (a node-local cache
// entry named by a hash of its contents) and passes its exact header line,
// the file and directory counts and its size; the header line holds that
// hash, so a listing replaced since is refused here, by name. The columns
// are a PathTable's (directory prefixes + dir ids + names, core/path_table.c)
// and the labels, in this order, each 8-aligned after the 64-byte header:
//   dir_offsets  uint64 x (dirs + 1)   into the dirs blob
//   name_offsets uint64 x (count + 1)  into the names blob
//   dir_ids      uint32 x count
//   labels       int32  x count
//   dirs, names  bytes (dir_offsets[dirs], name_offsets[count] of them)
// The views go to fr_reader_open_tree borrowed (it checks the offsets and
// ids in one walk, in C); labels are read per sample as batches go out.
//
// Thread-safety: immutable after construction; any thread may read it.
#ifndef FASTREAD_DALI_MAPPED_FILE_LIST_H
#define FASTREAD_DALI_MAPPED_FILE_LIST_H

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "dali/core/error_handling.h"
#include "dali/core/format.h"
#include "mapped_image_index.h"

namespace fastread_dali {

class MappedFileList {
 public:
  static constexpr uint64_t kHeadBytes = 64;

  MappedFileList(const std::string &what, const std::string &path, const std::string &head,
                 int64_t count, int64_t dirs, int64_t bytes)
      : path_(path), count_(count), dirs_(dirs) {
    const std::string where = dali::make_string(what, ": file_index='", path, "': ");
    DALI_ENFORCE(count > 0 && dirs > 0 && bytes > 0 && head.size() <= kHeadBytes &&
                     count < (INT64_MAX >> 5) && dirs < (INT64_MAX >> 4),
                 dali::make_string(where, "index_count, index_dirs, index_head and "
                                          "index_bytes describe no listing "
                                          "(fastread.dali.readers.file passes them)"));
    map_ = MapIndexFile(where, path, head, bytes);
    size_ = static_cast<size_t>(bytes);
    const uint64_t n = static_cast<uint64_t>(count), d = static_cast<uint64_t>(dirs);
    auto up8 = [](uint64_t v) { return (v + 7) & ~uint64_t{7}; };
    const uint64_t at_dir_off = kHeadBytes, at_name_off = at_dir_off + 8 * (d + 1);
    const uint64_t at_ids = at_name_off + 8 * (n + 1), at_labels = up8(at_ids + 4 * n);
    const uint64_t at_dirs = up8(at_labels + 4 * n);
    const uint8_t *base = static_cast<const uint8_t *>(map_);
    if (at_dirs <= size_) {
      dir_offsets_ = reinterpret_cast<const uint64_t *>(base + at_dir_off);
      name_offsets_ = reinterpret_cast<const uint64_t *>(base + at_name_off);
      dir_ids_ = reinterpret_cast<const uint32_t *>(base + at_ids);
      labels_ = base + at_labels;
      dirs_blob_ = reinterpret_cast<const char *>(base + at_dirs);
      dirs_bytes_ = dir_offsets_[d];
      names_blob_ = dirs_blob_ + dirs_bytes_;
      names_bytes_ = name_offsets_[n];
    }
    // The blobs end the file exactly: a listing cut short, or longer, is not one.
    const bool fits = at_dirs <= size_ && dirs_bytes_ <= size_ - at_dirs &&
                      names_bytes_ == size_ - at_dirs - dirs_bytes_;
    if (!fits) {
      munmap(map_, size_);
      map_ = nullptr;
      DALI_FAIL(dali::make_string(where, "its columns (", count, " files in ", dirs,
                                  " directories) do not fill its ", bytes,
                                  " bytes: damaged; remove it and define the pipeline again"));
    }
  }

  ~MappedFileList() {
    if (map_) munmap(map_, size_);
  }
  MappedFileList(const MappedFileList &) = delete;
  MappedFileList &operator=(const MappedFileList &) = delete;

  int64_t count() const { return count_; }
  size_t dirs() const { return static_cast<size_t>(dirs_); }
  const char *dirs_blob() const { return dirs_blob_; }
  const uint64_t *dir_offsets() const { return dir_offsets_; }
  const uint32_t *dir_ids() const { return dir_ids_; }
  const char *names_blob() const { return names_blob_; }
  const uint64_t *name_offsets() const { return name_offsets_; }
  int32_t label(int64_t i) const {
    int32_t v;
    memcpy(&v, labels_ + 4 * static_cast<size_t>(i), sizeof(v));
    return v;
  }
  // File i's path (for errors and source info), or "#i" where the listing's
  // offsets are damaged (fr_reader_open_tree refuses such a listing anyway).
  std::string name(int64_t i) const {
    const uint64_t a = name_offsets_[i], b = name_offsets_[i + 1];
    const uint32_t d = dir_ids_[i];
    if (b < a || b > names_bytes_ || d >= static_cast<uint64_t>(dirs_) ||
        dir_offsets_[d + 1] < dir_offsets_[d] || dir_offsets_[d + 1] > dirs_bytes_)
      return "#" + std::to_string(i);
    return std::string(dirs_blob_ + dir_offsets_[d], dir_offsets_[d + 1] - dir_offsets_[d]) +
           std::string(names_blob_ + a, b - a);
  }
  const std::string &path() const { return path_; }

 private:
  std::string path_;
  int64_t count_ = 0, dirs_ = 0;
  void *map_ = nullptr;
  size_t size_ = 0;
  const uint64_t *dir_offsets_ = nullptr, *name_offsets_ = nullptr;
  const uint32_t *dir_ids_ = nullptr;
  const uint8_t *labels_ = nullptr;
  const char *dirs_blob_ = nullptr, *names_blob_ = nullptr;
  uint64_t dirs_bytes_ = 0, names_bytes_ = 0;
};

}  // namespace fastread_dali

#endif  // FASTREAD_DALI_MAPPED_FILE_LIST_H
