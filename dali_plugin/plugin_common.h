// What fastread's DALI operators share: batch ownership, errno text, and the
// sample stream of DALI's readers (shards, shuffles, padding, epochs that
// roll over) with its checkpoint form.
//
// Header-only, C++17, no state of its own: every function works on what it
// is given, so any thread may call it.
#ifndef FASTREAD_DALI_PLUGIN_COMMON_H
#define FASTREAD_DALI_PLUGIN_COMMON_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fastread.h"

namespace fastread_dali {

// A pool batch held by one owner; fr_batch_recycle is thread-safe, so the
// last DALI thread to drop an output may return it.
struct BatchRecycler {
  void operator()(fr_batch *b) const {
    if (b) fr_batch_recycle(b);
  }
};
using BatchPtr = std::unique_ptr<fr_batch, BatchRecycler>;

// The C core's handles, owned: unique_ptr<T, CloseWith<fr_..._close>>
// calls the close function once, on a non-null handle.
template <auto Close>
struct CloseWith {
  template <typename T>
  void operator()(T *handle) const {
    if (handle) Close(handle);
  }
};

inline std::string ErrnoText(int64_t neg_errno) {
  char buf[128];
  int e = static_cast<int>(-neg_errno);
  // GNU strerror_r returns the message (maybe not in buf).
  const char *msg = strerror_r(e, buf, sizeof(buf));
  return std::string(msg ? msg : "unknown error") + " (errno " + std::to_string(e) + ")";
}

// DALI's reader arguments that decide which samples a shard reads, epoch
// after epoch.
struct StreamArgs {
  int64_t n = 0;  // samples in the data set
  int shard_id = 0;
  int num_shards = 1;
  bool shuffle = false;
  bool pad = false;
  bool stick = false;
  int batch_size = 1;
  // With shuffle: 0, one permutation of the whole data set per epoch;
  // N > 0, the shard's samples in order through a shuffle buffer of N
  // (fr_buffer_shuffle, DALI's initial_fill).
  int64_t fill = 0;
  // Elastic sharding (global_batch_size > 0; fastread.sampling.elastic_indices
  // is the reference): the epoch's order of the whole data set, padded to
  // whole global batches, each rank reading its slice of every global batch
  // (batch_size = global_batch / num_shards). Needs pad: epochs roll over,
  // and a partial last global batch would be filled from the next epoch,
  // so the batches would no longer be slices of global batches.
  int64_t global_batch = 0;
  // With shuffle and block > 0: the core's block order (blocks of `block`
  // samples permuted, samples permuted within windows of `window` blocks;
  // fastread.sampling.check_shuffle's "block"); 0, the full order.
  int64_t block = 0;
  int64_t window = 0;
};

using OrderPtr = std::unique_ptr<fr_order, CloseWith<fr_order_close>>;

// The order of the whole data set in `epoch`, whatever the shards, per
// position (fastread.sampling's _GlobalOrder): scan order, the core's order
// (fr_order: full or block; at most 512 KiB whatever n), or, with a shuffle
// buffer, positions [lo, hi) through it (held whole: a buffer's draw is
// sequential).
class GlobalOrder {
 public:
  GlobalOrder() = default;
  GlobalOrder(const StreamArgs &args, int64_t seed, int64_t epoch, int64_t lo, int64_t hi)
      : lo_(lo) {
    const uint64_t s = static_cast<uint64_t>(seed), e = static_cast<uint64_t>(epoch);
    if (args.shuffle && args.fill > 0) {
      buffered_.reserve(static_cast<size_t>(hi - lo));
      for (int64_t i = lo; i < hi; i++) buffered_.push_back(i);
      if (fr_buffer_shuffle(s, e, buffered_.data(), buffered_.size(),
                            static_cast<size_t>(args.fill)) != 0)
        throw std::bad_alloc();
    } else if (args.shuffle) {
      fr_order *o = nullptr;
      const bool block = args.block > 0;
      const int rc = fr_order_open(s, e, static_cast<uint64_t>(args.n),
                                   block ? FR_ORDER_BLOCK : FR_ORDER_FULL,
                                   static_cast<uint64_t>(args.block),
                                   static_cast<uint64_t>(args.window), &o);
      if (rc == -ENOMEM) throw std::bad_alloc();
      if (rc != 0)
        throw std::invalid_argument("fastread: cannot draw the epoch's order: " +
                                    ErrnoText(rc));
      order_.reset(o);
    }
  }

  int64_t At(int64_t pos) const {
    if (order_) return fr_order_at(order_.get(), static_cast<uint64_t>(pos));
    if (!buffered_.empty()) return buffered_[static_cast<size_t>(pos - lo_)];
    return pos;
  }

 private:
  int64_t lo_ = 0;
  OrderPtr order_;
  std::vector<int64_t> buffered_;
};

// The samples shard `args.shard_id` reads in `epoch`, in order, per
// position (fastread.sampling.EpochOrder). Without stick_to_shard, epoch e
// reads shard (shard_id + e) % num_shards, as DALI's readers do. Shuffling
// draws one order of the whole data set per (seed, epoch), the same on
// every rank, and each rank reads its shard of it, so every epoch holds
// every sample exactly once. With pad_last_batch the shard is padded with
// its last sample to ceil(n / num_shards) samples, then to whole batches
// (fn.readers.file's padding). Elastic: this rank's slice of every global
// batch of the global order padded to whole global batches, in turn
// (fastread.sampling.elastic_indices with pad_last_batch).
class EpochView {
 public:
  EpochView() = default;
  EpochView(const StreamArgs &args, int64_t seed, int64_t epoch) : args_(args) {
    const int64_t n = args.n;
    if (args.global_batch > 0) {
      const int64_t g = args.global_batch;
      len_ = (n + g - 1) / g * (g / args.num_shards);
      order_ = GlobalOrder(args, seed, epoch, 0, n);
      return;
    }
    const int64_t shard = args.stick ? args.shard_id : (args.shard_id + epoch) % args.num_shards;
    start_ = n * shard / args.num_shards;
    end_ = n * (shard + 1) / args.num_shards;
    len_ = end_ - start_;
    if (args.pad && len_ > 0) {
      int64_t target = (n + args.num_shards - 1) / args.num_shards;
      const int64_t b = args.batch_size;
      target = (target + b - 1) / b * b;
      len_ = std::max(len_, target);
    }
    order_ = GlobalOrder(args, seed, epoch, start_, end_);
  }

  int64_t size() const { return len_; }

  int64_t At(int64_t p) const {
    if (args_.global_batch > 0) {
      const int64_t g = args_.global_batch, local = g / args_.num_shards;
      const int64_t pos = p / local * g + args_.shard_id * local + p % local;
      return order_.At(std::min(pos, args_.n - 1));  // padding: the order's last sample
    }
    return order_.At(start_ + std::min(p, end_ - start_ - 1));
  }

 private:
  StreamArgs args_;
  int64_t start_ = 0, end_ = 0, len_ = 0;
  GlobalOrder order_;
};

// A position in the sample stream: the next sample is order(epoch)[pos]
// (epoch -1: before the first epoch), with the shuffle seed. What a
// checkpoint holds.
struct StreamPos {
  int64_t epoch = -1;
  int64_t pos = 0;
  int64_t seed = 0;
};

// The sample stream of one shard: the next batch's indices, epoch after
// epoch, never ending (a batch that crosses an epoch's end is filled from
// the next epoch, as in DALI's readers). Used by one thread.
class SampleStream {
 public:
  SampleStream() = default;
  SampleStream(const StreamArgs &args, int64_t seed) : args_(args) { at_.seed = seed; }

  std::vector<int64_t> NextBatch() {
    std::vector<int64_t> idx;
    idx.reserve(static_cast<size_t>(args_.batch_size));
    while (idx.size() < static_cast<size_t>(args_.batch_size)) {
      if (at_.pos == order_.size()) {
        order_ = EpochView(args_, at_.seed, ++at_.epoch);
        at_.pos = 0;
      }
      idx.push_back(order_.At(at_.pos++));
    }
    return idx;
  }

  const StreamPos &Position() const { return at_; }

  // Moves to `at`; false if `at` is not a position of this stream (a
  // checkpoint of a reader with other arguments).
  bool Seek(const StreamPos &at) {
    EpochView order = at.epoch >= 0 ? EpochView(args_, at.seed, at.epoch) : EpochView();
    if (at.pos < 0 || at.pos > order.size()) return false;
    order_ = std::move(order);
    at_ = at;
    return true;
  }

  const StreamArgs &Args() const { return args_; }

 private:
  StreamArgs args_;
  EpochView order_;  // the epoch being read, per position: no N-element array
  StreamPos at_;
};

// The version of the order a checkpoint's position counts in (its field
// "order"): 2, fr_order; before (no field), a Fisher-Yates table at every
// size, the same order up to FR_ORDER_TABLE_MAX samples.
constexpr int64_t kOrderVersion = 2;

// Fields a checkpoint may lack (written before they were recorded), with
// the value they then had.
inline bool FieldDefault(const std::string &name, int64_t *value) {
  if (name == "shuffle_block" || name == "shuffle_window") *value = 0;
  else if (name == "order") *value = 1;
  else return false;
  return true;
}

// The arguments that define a stream's samples, as a checkpoint records
// them (DALI's argument names, for messages): a checkpoint restores only
// into a reader whose stream they describe too. Elastic streams record
// what defines the global order (the shard layout is theirs to change).
inline std::vector<std::pair<std::string, int64_t>> StreamFields(const StreamArgs &args) {
  std::vector<std::pair<std::string, int64_t>> f = {{"num_samples", args.n},
                                                    {"random_shuffle", args.shuffle},
                                                    {"initial_fill", args.fill},
                                                    {"shuffle_block", args.block},
                                                    {"shuffle_window", args.window},
                                                    {"order", kOrderVersion}};
  if (args.global_batch > 0) return f;
  f.insert(f.end(), {{"num_shards", args.num_shards},
                     {"shard_id", args.shard_id},
                     {"stick_to_shard", args.stick},
                     {"pad_last_batch", args.pad},
                     {"batch_size", args.batch_size}});
  return f;
}

// Whether field `name` changes this stream's samples (both sides agree on
// the fields checked before it, in StreamFields' order): the shuffle
// buffer only with shuffle, the rotation only over several shards, the
// batch size only through padding to whole batches.
inline bool FieldMatters(const std::string &name, const StreamArgs &args) {
  if (name == "initial_fill" || name == "shuffle_block" || name == "shuffle_window")
    return args.shuffle;
  // Orders of version 1 and 2 differ only where fr_order's network draws.
  if (name == "order") return args.shuffle && args.fill == 0 && args.n > FR_ORDER_TABLE_MAX;
  if (name == "stick_to_shard") return args.num_shards > 1;
  if (name == "batch_size") return args.pad;
  return true;
}

// A checkpoint's text form: "<tag> <epoch> <pos> <seed>" followed by
// StreamFields as name=value. Elastic streams (args.global_batch > 0) write
// "<tag>:elastic <epoch> <samples> <seed> <global_batch>" and theirs
// instead: <samples> counts samples of the epoch's global order consumed by
// all ranks (pos / batch_size global batches of global_batch), which a
// reader of another number of shards resumes.
inline std::string SerializeStreamPos(const char *tag, const StreamPos &at,
                                      const StreamArgs &args) {
  std::string out;
  if (args.global_batch > 0) {
    const int64_t samples = at.pos / args.batch_size * args.global_batch;
    out = std::string(tag) + ":elastic " + std::to_string(at.epoch) + " " +
          std::to_string(samples) + " " + std::to_string(at.seed) + " " +
          std::to_string(args.global_batch);
  } else {
    out = std::string(tag) + " " + std::to_string(at.epoch) + " " + std::to_string(at.pos) + " " +
          std::to_string(at.seed);
  }
  for (const auto &f : StreamFields(args)) out += " " + f.first + "=" + std::to_string(f.second);
  return out;
}

// Reads `data` into `at` (converted to this shard's position) and returns
// "", or returns why it is not a checkpoint of this stream (then `at` is
// unchanged): an elastic stream takes only elastic checkpoints of its
// global batch (at a global batch boundary), the others only plain ones;
// either only of the same StreamFields where they matter. Checkpoints
// written before the fields were recorded (none after the position) are
// taken as they are: their position is checked against the epoch's length
// only (SampleStream::Seek).
inline std::string ParseStreamPos(const char *tag, const std::string &data, StreamPos *at,
                                  const StreamArgs &args) {
  std::istringstream in(data);
  std::string got;
  StreamPos p;
  in >> got >> p.epoch >> p.pos >> p.seed;
  if (in.fail() || p.epoch < -1 || p.pos < 0 || p.seed < 0)
    return "not a checkpoint of this reader";
  if (args.global_batch > 0) {
    int64_t g = 0;
    in >> g;
    if (in.fail() || got != std::string(tag) + ":elastic")
      return "not a checkpoint of an elastic reader with global_batch_size=" +
             std::to_string(args.global_batch);
    if (g != args.global_batch || p.pos % g != 0)
      return "not a checkpoint of an elastic reader with global_batch_size=" +
             std::to_string(args.global_batch) + " (it was saved with global_batch_size=" +
             std::to_string(g) + ")";
    p.pos = p.pos / g * args.batch_size;
  } else if (got != tag) {
    return got == std::string(tag) + ":elastic"
               ? "a checkpoint of an elastic reader (global_batch_size=...) does not restore "
                 "this per-shard reader: give it the same global_batch_size"
               : "not a checkpoint of this reader";
  }
  // name=value fields: every one this stream has must be there and agree.
  std::vector<std::pair<std::string, int64_t>> saved;
  std::string field;
  while (in >> field) {
    const size_t eq = field.find('=');
    char *end = nullptr;
    const long long v = eq == std::string::npos ? 0 : strtoll(field.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || eq == 0 || end == field.c_str() + eq + 1 || *end != '\0')
      return "not a checkpoint of this reader (field '" + field + "')";
    saved.emplace_back(field.substr(0, eq), static_cast<int64_t>(v));
  }
  if (!saved.empty()) {
    for (const auto &mine : StreamFields(args)) {
      const auto it = std::find_if(saved.begin(), saved.end(),
                                   [&](const auto &f) { return f.first == mine.first; });
      int64_t value = 0;
      if (it != saved.end())
        value = it->second;
      else if (!FieldDefault(mine.first, &value))
        return "the checkpoint does not record " + mine.first + ": not one of this reader";
      if (value != mine.second && FieldMatters(mine.first, args)) {
        if (mine.first == "order")
          return "the checkpoint was saved by an earlier fastread, whose shuffled order of " +
                 std::to_string(args.n) + " samples (more than " +
                 std::to_string(FR_ORDER_TABLE_MAX) + ") this version no longer draws: "
                 "resuming it would read other samples";
        return "the checkpoint was saved by a reader with " + mine.first + "=" +
               std::to_string(value) + ", this reader has " + mine.first + "=" +
               std::to_string(mine.second) + ": restore it into a reader of the same arguments";
      }
    }
  }
  *at = p;
  return std::string();
}

}  // namespace fastread_dali

#endif  // FASTREAD_DALI_PLUGIN_COMMON_H
