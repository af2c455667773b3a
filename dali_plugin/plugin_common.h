// What fastread's DALI operators share: batch ownership, errno text, and the
// sample stream of DALI's readers (shards, shuffles, padding, epochs that
// roll over) with its checkpoint form.
//
// Header-only, C++17, no state of its own: every function works on what it
// is given, so any thread may call it.
#ifndef FASTREAD_DALI_PLUGIN_COMMON_H
#define FASTREAD_DALI_PLUGIN_COMMON_H

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
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
};

// The order of the whole data set in `epoch`, whatever the shards: scan
// order, the core's permutation, or the whole set through a shuffle buffer
// (fastread.sampling.global_order).
inline std::vector<int64_t> GlobalOrder(const StreamArgs &args, int64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(args.n));
  if (args.shuffle && args.fill > 0) {
    for (int64_t i = 0; i < args.n; i++) order[static_cast<size_t>(i)] = i;
    if (fr_buffer_shuffle(static_cast<uint64_t>(seed), static_cast<uint64_t>(epoch), order.data(),
                          order.size(), static_cast<size_t>(args.fill)) != 0)
      throw std::bad_alloc();
  } else if (args.shuffle) {
    fr_permutation(static_cast<uint64_t>(seed), static_cast<uint64_t>(epoch), order.data(),
                   order.size());
  } else {
    for (int64_t i = 0; i < args.n; i++) order[static_cast<size_t>(i)] = i;
  }
  return order;
}

// Elastic: this rank's slice of every global batch of the padded global
// order, in turn (fastread.sampling.elastic_indices with pad_last_batch).
inline std::vector<int64_t> ElasticOrder(const StreamArgs &args, int64_t seed, int64_t epoch) {
  std::vector<int64_t> order = GlobalOrder(args, seed, epoch);
  const int64_t g = args.global_batch;
  const int64_t local = g / args.num_shards;
  const int64_t batches = (args.n + g - 1) / g;
  if (!order.empty()) order.resize(static_cast<size_t>(batches * g), order.back());
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(batches * local));
  for (int64_t k = 0; k < batches; k++) {
    const auto from = order.begin() + k * g + args.shard_id * local;
    mine.insert(mine.end(), from, from + local);
  }
  return mine;
}

// The samples shard `args.shard_id` reads in `epoch`, in order. Without
// stick_to_shard, epoch e reads shard (shard_id + e) % num_shards, as DALI's
// readers do. Shuffling draws one permutation of the whole data set per
// (seed, epoch), the same on every rank, and each rank reads its shard of
// it, so every epoch holds every sample exactly once. With pad_last_batch
// the shard is padded with its last sample to ceil(n / num_shards) samples,
// then to whole batches (fn.readers.file's padding).
inline std::vector<int64_t> EpochOrder(const StreamArgs &args, int64_t seed, int64_t epoch) {
  if (args.global_batch > 0) return ElasticOrder(args, seed, epoch);
  const int64_t n = args.n;
  const int64_t shard = args.stick ? args.shard_id : (args.shard_id + epoch) % args.num_shards;
  const int64_t start = n * shard / args.num_shards;
  const int64_t end = n * (shard + 1) / args.num_shards;
  std::vector<int64_t> order;
  if (args.shuffle && args.fill > 0) {
    order.reserve(static_cast<size_t>(end - start));
    for (int64_t i = start; i < end; i++) order.push_back(i);
    if (fr_buffer_shuffle(static_cast<uint64_t>(seed), static_cast<uint64_t>(epoch), order.data(),
                          order.size(), static_cast<size_t>(args.fill)) != 0)
      throw std::bad_alloc();
  } else if (args.shuffle) {
    // The core's permutation, which the Python readers draw too: one order
    // for one (seed, epoch) whether or not the plugin reads.
    std::vector<int64_t> perm(static_cast<size_t>(n));
    fr_permutation(static_cast<uint64_t>(seed), static_cast<uint64_t>(epoch), perm.data(),
                   perm.size());
    order.assign(perm.begin() + start, perm.begin() + end);
  } else {
    order.reserve(static_cast<size_t>(end - start));
    for (int64_t i = start; i < end; i++) order.push_back(i);
  }
  if (args.pad && !order.empty()) {
    size_t target = static_cast<size_t>((n + args.num_shards - 1) / args.num_shards);
    size_t b = static_cast<size_t>(args.batch_size);
    target = (target + b - 1) / b * b;
    const int64_t last = order.back();
    order.resize(target, last);
  }
  return order;
}

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
      if (static_cast<size_t>(at_.pos) == order_.size()) {
        order_ = EpochOrder(args_, at_.seed, ++at_.epoch);
        at_.pos = 0;
      }
      idx.push_back(order_[static_cast<size_t>(at_.pos++)]);
    }
    return idx;
  }

  const StreamPos &Position() const { return at_; }

  // Moves to `at`; false if `at` is not a position of this stream (a
  // checkpoint of a reader with other arguments).
  bool Seek(const StreamPos &at) {
    std::vector<int64_t> order = at.epoch >= 0 ? EpochOrder(args_, at.seed, at.epoch)
                                               : std::vector<int64_t>();
    if (at.pos < 0 || static_cast<size_t>(at.pos) > order.size()) return false;
    order_ = std::move(order);
    at_ = at;
    return true;
  }

  const StreamArgs &Args() const { return args_; }

 private:
  StreamArgs args_;
  std::vector<int64_t> order_;
  StreamPos at_;
};

// The arguments that define a stream's samples, as a checkpoint records
// them (DALI's argument names, for messages): a checkpoint restores only
// into a reader whose stream they describe too. Elastic streams record
// what defines the global order (the shard layout is theirs to change).
inline std::vector<std::pair<std::string, int64_t>> StreamFields(const StreamArgs &args) {
  std::vector<std::pair<std::string, int64_t>> f = {{"num_samples", args.n},
                                                    {"random_shuffle", args.shuffle},
                                                    {"initial_fill", args.fill}};
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
  if (name == "initial_fill") return args.shuffle;
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
      if (it == saved.end())
        return "the checkpoint does not record " + mine.first + ": not one of this reader";
      if (it->second != mine.second && FieldMatters(mine.first, args))
        return "the checkpoint was saved by a reader with " + mine.first + "=" +
               std::to_string(it->second) + ", this reader has " + mine.first + "=" +
               std::to_string(mine.second) + ": restore it into a reader of the same arguments";
    }
  }
  *at = p;
  return std::string();
}

}  // namespace fastread_dali

#endif  // FASTREAD_DALI_PLUGIN_COMMON_H
