// fastread's native WebDataset reader: fn.fastread.readers.webdataset.
//
// A CPU operator with one output per `ext` entry, like fn.readers.webdataset.
// The shards are indexed once in Python (fastread.formats.webdataset: a
// strict tar parser, DALI's grouping of members into samples, its
// missing_component_behavior), which writes the result to a binary index
// file (format below) that this operator reads when it is built. From then
// on no Python runs: native worker threads read batches ahead, each
// component one byte range of its shard, a whole batch's ranges of every
// shard in ONE call (fr_read_file_ranges: psync's pool, descriptors from
// each worker's LRU of at most its share of max_open_files), and DALI gets
// views of the batches' memory. Threads: the workers and their psync
// helpers; descriptors: max_open_files; both whatever the shard count.
//
// Layout and copies: a batch's ranges are read into one pool batch,
// component after component (every `jpg` of the batch, then every `cls`),
// laid back to back in batch order (fr_batch.dense). A batch whose
// samples all lie in one shard in stream order -- every batch of an
// unshuffled stream but those that cross a shard's end -- therefore holds
// each output as one contiguous block, handed to DALI as one shared buffer
// that it does not copy. Other batches (shuffled, or crossing shards) go out
// as per-sample views, which DALI copies once to make them contiguous where
// it needs that.
//
// Samples and epochs are those of fastread's other readers and DALI's
// (plugin_common.h): shard_id / num_shards split the samples into contiguous
// shards, epochs roll over (GetReaderMeta), pad_last_batch and
// stick_to_shard as in fn.readers.file. Shuffling draws one permutation of
// all samples of all shards per epoch (the same on every rank): the index
// makes every sample addressable, so the shuffle can be global. With
// initial_fill=N it is DALI's reader's instead, the shard's samples in order
// through a shuffle buffer of N: each batch then reads a few neighbouring
// shards, where a global shuffle reads nearly every sample from another one
// (one range read per shard touched: ~0.55x fn.readers.webdataset's
// buffered shuffle over 200 shards of 50 samples on 2 cores).
//
// Errors name the shard, the sample's key, the component and its byte
// offset: a shard that shrank since it was indexed fails the batch that
// reads past its end (pipe.run() raises), and a shard whose size changed
// fails the operator's construction.
//
// Checkpointing (enable_checkpointing=True): the state is the stream
// position after the last batch handed out, and the seed.
//
// Thread safety: DALI calls the operator from one thread at a time; the
// workers share only the job queue and the results (one mutex), each owns
// its engine context, and the batch pool is thread-safe. No global state
// beyond DALI's registration.
//
// Index file (little-endian; written by fastread.formats.webdataset
// .WebDataset.write_native_index):
//   char[8]  "FRWDSIX1"
//   u64      shards S, samples N, components K, string bytes B
//   u64[S]   each shard's size in bytes when it was indexed
//   i64[N]   each sample's shard
//   i64[N*K*2] per sample, per component: (offset in the shard, length);
//            offset -1: the sample has no such component
//   B bytes  NUL-terminated strings: S tar paths to read, S shard names
//            (as the user gave them), N sample keys
//   u32      CRC-32 (zlib's) of everything before it, then u32 0
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dali/pipeline/operator/checkpointing/op_checkpoint.h"
#include "dali/pipeline/operator/operator.h"
#include "engine_args_ref.h"
#include "fastread.h"
#include "plugin_common.h"
#include "stream_operator.h"

namespace fastread_dali {

namespace {

constexpr const char *kWdsOpName = "fastread.readers.webdataset";
constexpr const char *kIndexMagic = "FRWDSIX1";
constexpr const char *kCheckpointTag = "fastread-wds-stream-v1";

using CtxPtr = std::unique_ptr<fr_ctx, CloseWith<fr_ctx_close>>;

uint32_t Crc32(const uint8_t *data, size_t n) {
  // zlib's CRC-32 (reflected 0xEDB88320), a byte at a time: the index is
  // read once per build (tens of MB for millions of samples).
  uint32_t table[256];
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    table[i] = c;
  }
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; i++) crc = (crc >> 8) ^ table[(crc ^ data[i]) & 0xffu];
  return ~crc;
}

// The samples of the shards, as the index file holds them.
struct WdsIndex {
  std::vector<std::string> tars;    // the plain tar read for each shard
  std::vector<std::string> shards;  // each shard as the user named it
  std::vector<uint64_t> sizes;      // each tar's size when indexed
  std::vector<int64_t> sample_shard;
  std::vector<int64_t> comps;  // N * K * 2: offset (-1: missing), length
  std::vector<std::string> keys;
  size_t k = 0;

  int64_t Offset(int64_t sample, size_t c) const {
    return comps[(static_cast<size_t>(sample) * k + c) * 2];
  }
  int64_t Length(int64_t sample, size_t c) const {
    return comps[(static_cast<size_t>(sample) * k + c) * 2 + 1];
  }
};

// Reads and checks the index file; throws (DALI_FAIL) naming it and what is
// wrong.
WdsIndex LoadIndex(const std::string &path, size_t want_k) {
  auto bad = [&](const std::string &why) {
    DALI_FAIL(dali::make_string(kWdsOpName, ": index file '", path, "': ", why,
                                " (fastread.dali.readers.webdataset writes it when the pipeline "
                                "is defined; define the pipeline again)"));
  };
  std::vector<uint8_t> buf;
  {
    // O_NONBLOCK: a FIFO in its place is refused below (not a regular
    // file), not waited on; reads of a regular file ignore the flag.
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) bad(std::string("cannot open it: ") + ErrnoText(-errno));
    std::unique_ptr<FILE, int (*)(FILE *)> f(fdopen(fd, "rb"), fclose);
    if (!f) {
      const int e = errno;
      ::close(fd);
      bad(std::string("cannot open it: ") + ErrnoText(-e));
    }
    struct stat st;
    if (fstat(fileno(f.get()), &st) != 0) bad(std::string("cannot stat it: ") + ErrnoText(-errno));
    if (!S_ISREG(st.st_mode)) bad("not a regular file");
    buf.resize(static_cast<size_t>(st.st_size));
    if (!buf.empty() && fread(buf.data(), 1, buf.size(), f.get()) != buf.size())
      bad(ferror(f.get()) ? std::string("cannot read it: ") + ErrnoText(-errno)
                          : std::string("it shrank while being read"));
  }
  size_t at = 0;
  auto u64 = [&](const char *what) {
    if (buf.size() - at < 8) bad(std::string("truncated in its ") + what);
    uint64_t v;
    memcpy(&v, buf.data() + at, 8);
    at += 8;
    return v;
  };
  if (buf.size() < 48 || memcmp(buf.data(), kIndexMagic, 8) != 0)
    bad("not a fastread WebDataset index");
  at = 8;
  const uint64_t s = u64("header"), n = u64("header"), k = u64("header"), b = u64("header");
  // Sizes before any allocation: each count is bounded by the file's size.
  const uint64_t fixed = 40 + 8;  // magic and counts, then the CRC and its padding
  if (s == 0 || k == 0 || s > buf.size() / 8 || n > buf.size() / 8 || k > 4096 ||
      b > buf.size() || (n && k > buf.size() / 16 / n))
    bad("its header's counts do not fit its size");
  const uint64_t need = fixed + 8 * s + 8 * n + 16 * n * k + b;
  if (need != buf.size())
    bad(dali::make_string("it is ", buf.size(), " bytes, its header says ", need));
  uint32_t stored;
  memcpy(&stored, buf.data() + buf.size() - 8, 4);
  if (Crc32(buf.data(), buf.size() - 8) != stored) bad("checksum mismatch (corrupt)");
  if (k != want_k)
    bad(dali::make_string("it has ", k, " components per sample, ext= names ", want_k));
  WdsIndex ix;
  ix.k = static_cast<size_t>(k);
  ix.sizes.resize(s);
  memcpy(ix.sizes.data(), buf.data() + at, 8 * s);
  at += 8 * s;
  ix.sample_shard.resize(n);
  memcpy(ix.sample_shard.data(), buf.data() + at, 8 * n);
  at += 8 * n;
  ix.comps.resize(2 * n * k);
  memcpy(ix.comps.data(), buf.data() + at, 16 * n * k);
  at += 16 * n * k;
  const char *str = reinterpret_cast<const char *>(buf.data() + at);
  const char *str_end = str + b;
  auto next_string = [&]() {
    const char *nul = static_cast<const char *>(memchr(str, 0, static_cast<size_t>(str_end - str)));
    if (!nul) bad("its string table is truncated");
    std::string v(str, nul);
    str = nul + 1;
    return v;
  };
  for (uint64_t i = 0; i < s; i++) ix.tars.push_back(next_string());
  for (uint64_t i = 0; i < s; i++) ix.shards.push_back(next_string());
  ix.keys.reserve(n);
  for (uint64_t i = 0; i < n; i++) ix.keys.push_back(next_string());
  if (str != str_end) bad("its string table has bytes past its last key");
  for (uint64_t i = 0; i < n; i++) {
    const int64_t sh = ix.sample_shard[i];
    if (sh < 0 || static_cast<uint64_t>(sh) >= s)
      bad(dali::make_string("sample ", i, " names shard ", sh, " of ", s));
    for (size_t c = 0; c < ix.k; c++) {
      const int64_t off = ix.Offset(static_cast<int64_t>(i), c);
      const int64_t len = ix.Length(static_cast<int64_t>(i), c);
      if (off == -1 && len == 0) continue;
      if (off < 0 || len < 0 || static_cast<uint64_t>(off) > ix.sizes[static_cast<size_t>(sh)] ||
          static_cast<uint64_t>(len) > ix.sizes[static_cast<size_t>(sh)] - static_cast<uint64_t>(off))
        bad(dali::make_string("component ", c, " of sample '", ix.keys[i], "' (", off, ", ", len,
                              ") lies outside shard '", ix.shards[static_cast<size_t>(sh)], "'"));
    }
  }
  return ix;
}

}  // namespace

class WebDatasetReader : public StreamOperator<dali::CPUBackend> {
 public:
  explicit WebDatasetReader(const dali::OpSpec &spec);
  ~WebDatasetReader() override;

  bool HasContiguousOutputs() const override { return false; }
  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override;
  void RunImpl(dali::Workspace &ws) override;
  // Reader metadata and checkpoints: StreamOperator's.

 private:
  void DropReadAhead() override;
  // Where one component of one sample of a read batch is: bytes
  // [offset, offset + length) of batches[batch]'s arena (batch -1: empty).
  struct Piece {
    int32_t batch = -1;
    uint64_t offset = 0;
    int64_t length = 0;
  };
  // A batch of samples, read: the pool batches holding it (one per shard
  // it touches) and where each component is (K * n pieces, component-major).
  struct ReadBatch {
    std::vector<int64_t> samples;
    std::vector<BatchPtr> batches;
    std::vector<Piece> pieces;
    std::string error;  // non-empty: the batch failed, this says why
  };
  struct Job {
    uint64_t seq;
    uint64_t generation;
    std::vector<int64_t> samples;
  };

  void Work(fr_ctx *ctx);
  void Read(fr_ctx *ctx, ReadBatch &out) const;
  void TopUp();
  std::unique_ptr<ReadBatch> TakeBatch();
  void Output(int c, dali::TensorList<dali::CPUBackend> &out,
              const std::shared_ptr<ReadBatch> &batch) const;

  WdsIndex index_;
  // index_.tars as the C strings fr_read_file_ranges takes: one table for
  // the operator's life, so each context's descriptor LRU lasts across
  // batches (a new table pointer would empty it).
  std::vector<const char *> tar_paths_;
  std::vector<std::string> ext_;
  std::string engine_;
  bool pinned_ = false;

  std::unique_ptr<fr_pool, CloseWith<fr_pool_close>> pool_;
  std::vector<CtxPtr> ctxs_;
  std::vector<std::thread> workers_;
  size_t ahead_ = 2;

  // Shared with the workers, under mu_.
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Job> jobs_;
  std::map<uint64_t, std::unique_ptr<ReadBatch>> done_;
  uint64_t generation_ = 0;  // bumped when the read-ahead is dropped (RestoreState)
  bool stop_ = false;

  // The consumer's side (DALI's thread only).
  uint64_t next_seq_ = 0;   // the next job's number
  uint64_t take_seq_ = 0;   // the job TakeBatch hands out next
  std::unique_ptr<ReadBatch> current_;
};

WebDatasetReader::WebDatasetReader(const dali::OpSpec &spec)
    : StreamOperator<dali::CPUBackend>(spec, kWdsOpName, kCheckpointTag) {
  ext_ = spec.GetRepeatedArgument<std::string>("ext");
  DALI_ENFORCE(!ext_.empty(), dali::make_string(kWdsOpName, ": ext must name at least one "
                                                "component"));
  const std::string index_path = spec.GetArgument<std::string>("index");
  DALI_ENFORCE(!index_path.empty(),
               dali::make_string(kWdsOpName, ": no index: fastread.dali.readers.webdataset "
                                 "indexes the shards and passes index="));
  index_ = LoadIndex(index_path, ext_.size());
  for (const std::string &t : index_.tars) tar_paths_.push_back(t.c_str());
  // The ranges are where the members were when the shards were indexed: a
  // shard of another size is another shard.
  for (size_t s = 0; s < index_.tars.size(); s++) {
    // An s3:// shard was sized when fastread indexed it (it read the whole
    // object); there is no local file to stat, and a ranged GET past the end
    // of an object that shrank since fails its batch.
    if (index_.tars[s].rfind("s3://", 0) == 0) continue;
    struct stat st;
    DALI_ENFORCE(stat(index_.tars[s].c_str(), &st) == 0,
                 dali::make_string(kWdsOpName, ": shard '", index_.shards[s], "': cannot stat '",
                                   index_.tars[s], "': ", ErrnoText(-errno)));
    DALI_ENFORCE(static_cast<uint64_t>(st.st_size) == index_.sizes[s],
                 dali::make_string(kWdsOpName, ": shard '", index_.shards[s], "' is ",
                                   st.st_size, " bytes but was ", index_.sizes[s],
                                   " when indexed: it changed; define the pipeline again"));
  }

  const int64_t fill = spec.GetArgument<int64_t>("initial_fill");
  DALI_ENFORCE(fill >= 0, dali::make_string(kWdsOpName, ": initial_fill must be >= 0, got ",
                                            fill));
  StartStream(spec, static_cast<int64_t>(index_.sample_shard.size()),
              spec.GetArgument<bool>("random_shuffle"), fill);

  const int depth = spec.GetArgument<int>("prefetch_queue_depth");
  DALI_ENFORCE(depth >= 1, dali::make_string(kWdsOpName, ": prefetch_queue_depth must be >= 1, "
                                             "got ", depth));
  int workers = spec.GetArgument<int>("workers");
  DALI_ENFORCE(workers >= 0 && workers <= 64,
               dali::make_string(kWdsOpName, ": workers must be in 0..64 (0: automatic), got ",
                                 workers));
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  if (workers == 0) workers = static_cast<int>(std::min(8u, std::max(1u, cpus / 2)));
  const int queue_depth = spec.GetArgument<int>("queue_depth");
  const int threads = spec.GetArgument<int>("threads");
  DALI_ENFORCE(queue_depth >= 0,
               dali::make_string(kWdsOpName, ": queue_depth must be >= 0, got ", queue_depth));
  DALI_ENFORCE(threads >= -1,
               dali::make_string(kWdsOpName, ": threads must be >= -1, got ", threads));

  // "auto" goes to the core as it is, which picks the engine (fr_engine_auto).
  engine_ = spec.GetArgument<std::string>("engine");
  // Ranges of many shards are read by psync (fr_read_file_ranges): an
  // io_uring context would read them through a psync side beside idle rings.
  if (engine_ == "auto" || engine_ == "io_uring") engine_ = "psync";
  const int max_open = spec.GetArgument<int>("max_open_files");
  DALI_ENFORCE(max_open >= 0, dali::make_string(kWdsOpName, ": max_open_files must be >= 0 "
                                                "(0: the core's default), got ", max_open));
  fr_config cfg;
  fr_config_init(&cfg);
  cfg.engine = engine_.c_str();
  if (queue_depth > 0) cfg.queue_depth = static_cast<unsigned>(queue_depth);
  // As fn.fastread.readers.file: inside DALI the rings share the cores with
  // DALI's own threads, one ring per two cores.
  cfg.threads = threads >= 0 ? static_cast<unsigned>(threads)
                             : std::max(1u, std::min(cfg.threads, cpus / 2));
  if (!spec.GetArgument<bool>("register_buffers")) cfg.register_buffers = 0;
  if (!spec.GetArgument<bool>("register_files")) cfg.register_files = 0;
  const std::string engine_args = fastread_dali::ResolveEngineArgs(
      spec.GetArgument<std::string>("engine_args"), kWdsOpName);
  cfg.engine_args = engine_args.c_str();
  cfg.device_id = -1;  // host reads; the pool is page-locked below if asked
  // Each worker's context keeps its share of the descriptors open.
  const unsigned total_open = max_open > 0 ? static_cast<unsigned>(max_open) : FR_MAX_OPEN_FILES;
  cfg.max_open_files = std::max(1u, total_open / static_cast<unsigned>(workers));

  pool_.reset(fr_pool_new());
  DALI_ENFORCE(pool_ != nullptr, dali::make_string(kWdsOpName, ": out of memory"));
  const int pin_device = spec.GetArgument<int>("pin_device");
  DALI_ENFORCE(pin_device >= -1,
               dali::make_string(kWdsOpName, ": pin_device must be >= -1, got ", pin_device));
  if (pin_device >= 0) {
    // Page-locked arenas: DALI's copies of the outputs to the GPU (mixed
    // decoders, .gpu()) are DMA from them. Pageable where it cannot.
    fr_gpu *gpu = nullptr;
    char err[FR_ERRLEN] = "";
    if (fr_gpu_open(pin_device, &gpu, err, sizeof(err)) == 0) {
      fr_pool_set_gpu(pool_.get(), gpu, 1);
      fr_gpu_close(gpu);  // the pool holds its own reference
      pinned_ = true;
    } else {
      std::cerr << "fastread: " << kWdsOpName << ": cannot page-lock its buffers on device "
                << pin_device << " (" << err << "); reading into pageable memory\n";
    }
  }
  for (int w = 0; w < workers; w++) {
    fr_ctx *ctx = nullptr;
    char err[FR_ERRLEN] = "";
    int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
    DALI_ENFORCE(rc == 0, dali::make_string(kWdsOpName, ": cannot open engine '", engine_, "': ",
                                            err[0] ? err : ErrnoText(rc)));
    ctxs_.emplace_back(ctx);
  }
  // What the contexts read with ("auto" resolved), for messages.
  if (!ctxs_.empty()) engine_ = fr_ctx_engine(ctxs_.front().get());
  // Keep every worker busy and `prefetch` finished batches waiting.
  ahead_ = static_cast<size_t>(std::max(depth, 2) + workers);
  for (auto &ctx : ctxs_) workers_.emplace_back([this, c = ctx.get()] { Work(c); });
}

WebDatasetReader::~WebDatasetReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    jobs_.clear();
  }
  work_cv_.notify_all();
  for (auto &t : workers_) t.join();
  done_.clear();
  current_.reset();
  ctxs_.clear();
  // pool_ closes last: batches DALI still holds keep it alive until dropped.
}

void WebDatasetReader::Work(fr_ctx *ctx) {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    auto out = std::make_unique<ReadBatch>();
    out->samples = std::move(job.samples);
    try {
      Read(ctx, *out);
    } catch (const std::exception &e) {  // std::bad_alloc from the vectors
      out->error = dali::make_string(kWdsOpName, ": ", e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      if (job.generation != generation_) continue;  // read-ahead that was dropped
      done_[job.seq] = std::move(out);
    }
    done_cv_.notify_all();
  }
}

void WebDatasetReader::Read(fr_ctx *ctx, ReadBatch &out) const {
  const size_t n = out.samples.size();
  const size_t k = index_.k;
  out.pieces.assign(k * n, Piece());
  // Every range of the batch, of every shard, in one call into one pool
  // batch (fr_read_file_ranges sorts them by shard and offset to read, and
  // lays them out in the order given: component-major, batch order).
  BatchPtr batch(fr_pool_get(pool_.get()));
  if (!batch) {
    out.error = dali::make_string(kWdsOpName, ": out of memory");
    return;
  }
  batch->dense = 1;  // ours alone until handed out; see fastread.h
  if (fr_batch_prepare(batch.get(), k * n) != 0) {
    out.error = dali::make_string(kWdsOpName, ": out of memory");
    return;
  }
  std::vector<fr_file_range> jobs;
  std::vector<size_t> where;  // the piece each range fills
  jobs.reserve(k * n);
  where.reserve(k * n);
  for (size_t c = 0; c < k; c++) {
    for (size_t i = 0; i < n; i++) {
      const int64_t sample = out.samples[i];
      const int64_t off = index_.Offset(sample, c);
      const int64_t len = index_.Length(sample, c);
      if (off < 0 || len == 0) continue;
      fr_file_range job{};
      job.file = static_cast<uint32_t>(index_.sample_shard[static_cast<size_t>(sample)]);
      job.offset = static_cast<uint64_t>(off);
      job.length = static_cast<uint64_t>(len);
      jobs.push_back(job);
      where.push_back(c * n + i);
    }
  }
  if (!jobs.empty()) {
    int rc = fr_read_file_ranges(ctx, tar_paths_.data(), tar_paths_.size(), jobs.data(),
                                 jobs.size(), batch.get());
    if (rc == 0 && batch->status != 0) rc = batch->status;
    if (rc != 0) {
      out.error = dali::make_string(kWdsOpName, ": cannot read a batch of ", n,
                                    " samples (engine '", engine_, "'): ", ErrnoText(rc));
      return;
    }
  }
  for (size_t r = 0; r < jobs.size(); r++) {
    const fr_sample &s = batch->samples[r];
    const size_t piece = where[r];
    const size_t c = piece / n;
    const int64_t sample = out.samples[piece % n];
    if (s.length != static_cast<int64_t>(jobs[r].length)) {
      std::string what = s.length == -ENODATA
                             ? std::string("the shard ends before it (truncated since it "
                                           "was indexed?)")
                         : s.length < 0 ? ErrnoText(s.length)
                                        : dali::make_string("read ", s.length, " bytes");
      out.error = dali::make_string(
          kWdsOpName, ": shard '", index_.shards[jobs[r].file], "' at byte ", jobs[r].offset,
          ": cannot read component '", ext_[c], "' of sample '",
          index_.keys[static_cast<size_t>(sample)], "' (", jobs[r].length, " bytes): ", what);
      return;
    }
    out.pieces[piece] = Piece{0, s.offset, s.length};
  }
  out.batches.push_back(std::move(batch));
}

void WebDatasetReader::TopUp() {
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (Queued() < ahead_) {
      jobs_.push_back(Job{next_seq_++, generation_, SubmitNext()});
      queued = true;
    }
  }
  if (queued) work_cv_.notify_all();
}

std::unique_ptr<WebDatasetReader::ReadBatch> WebDatasetReader::TakeBatch() {
  TopUp();
  std::unique_ptr<ReadBatch> batch;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return done_.count(take_seq_) != 0; });
    auto it = done_.find(take_seq_);
    batch = std::move(it->second);
    done_.erase(it);
  }
  take_seq_++;
  Taken();
  if (!batch->error.empty()) DALI_FAIL(batch->error);
  return batch;
}

bool WebDatasetReader::SetupImpl(std::vector<dali::OutputDesc> &output_desc,
                                 const dali::Workspace &ws) {
  // The outputs are the batches' own memory (RunImpl): nothing to allocate.
  current_.reset();
  current_ = TakeBatch();  // throws, naming the shard and offset, on a failed read
  return false;
}

void WebDatasetReader::Output(int c, dali::TensorList<dali::CPUBackend> &out,
                              const std::shared_ptr<ReadBatch> &batch) const {
  const ReadBatch &rb = *batch;
  const int n = static_cast<int>(rb.samples.size());
  const Piece *pieces = rb.pieces.data() + static_cast<size_t>(c) * static_cast<size_t>(n);
  // One block: every non-empty piece in one pool batch, back to back in
  // batch order (see the top of the file).
  int32_t block = -1;
  uint64_t first = 0, end = 0;
  bool contiguous = true;
  for (int i = 0; i < n && contiguous; i++) {
    const Piece &p = pieces[i];
    if (p.length == 0) continue;
    if (block < 0) {
      block = p.batch;
      first = end = p.offset;
    }
    contiguous = p.batch == block && p.offset == end;
    end += static_cast<uint64_t>(p.length);
  }
  dali::TensorListShape<> shape(n, 1);
  for (int i = 0; i < n; i++) shape.set_tensor_shape(i, dali::TensorShape<>{pieces[i].length});
  out.Reset();
  out.set_pinned(pinned_);
  if (block < 0) {  // every sample of this output is empty
    out.Resize(shape, DALI_UINT8);
  } else if (contiguous) {
    const fr_batch *b = rb.batches[static_cast<size_t>(block)].get();
    out.SetContiguity(dali::BatchContiguity::Contiguous);
    out.ShareData(std::shared_ptr<void>(batch, b->arena.base + first),
                  static_cast<size_t>(end - first), pinned_, shape, DALI_UINT8, out.device_id(),
                  dali::AccessOrder::host());
  } else {
    out.SetContiguity(dali::BatchContiguity::Noncontiguous);
    out.set_type(DALI_UINT8);
    out.set_sample_dim(1);
    out.SetSize(n);
    // Empty samples point at the first byte of a batch that has some: DALI
    // wants a pointer, and reads none of it.
    const uint8_t *any = rb.batches[static_cast<size_t>(block)]->arena.base + first;
    for (int i = 0; i < n; i++) {
      const Piece &p = pieces[i];
      const uint8_t *at =
          p.length ? rb.batches[static_cast<size_t>(p.batch)]->arena.base + p.offset : any;
      // A view that keeps the whole read batch alive (shared_ptr's aliasing form).
      out.SetSample(i, std::shared_ptr<void>(batch, const_cast<uint8_t *>(at)),
                    static_cast<size_t>(p.length), pinned_, dali::TensorShape<>{p.length},
                    DALI_UINT8, out.device_id(), dali::AccessOrder::host());
    }
  }
  for (int i = 0; i < n; i++) {
    // As fn.readers.webdataset: decoders name the sample in their errors.
    const int64_t sample = rb.samples[static_cast<size_t>(i)];
    const std::string &shard =
        index_.shards[static_cast<size_t>(index_.sample_shard[static_cast<size_t>(sample)])];
    out.SetSourceInfo(i, shard + "[" + index_.keys[static_cast<size_t>(sample)] + "]");
  }
}

void WebDatasetReader::RunImpl(dali::Workspace &ws) {
  DALI_ENFORCE(current_ != nullptr, dali::make_string(kWdsOpName, ": Run without a batch"));
  // Zero-copy outputs: views of the read batch, whose pool batches go back
  // to the pool when DALI drops the last view (fr_batch_recycle is
  // thread-safe, so any DALI thread may do it).
  std::shared_ptr<ReadBatch> batch(current_.release());
  for (int c = 0; c < static_cast<int>(ext_.size()); c++)
    Output(c, ws.Output<dali::CPUBackend>(c), batch);
}

void WebDatasetReader::DropReadAhead() {
  current_.reset();
  {
    // Queued jobs now; what the workers are reading is discarded when they
    // finish it.
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.clear();
    done_.clear();
    generation_++;
  }
  take_seq_ = next_seq_;
}

}  // namespace fastread_dali

DALI_REGISTER_OPERATOR(fastread__readers__Webdataset, ::fastread_dali::WebDatasetReader,
                       ::dali::CPU);

DALI_SCHEMA(fastread__readers__Webdataset)
    .DocStr(R"(Reads WebDataset tar shards with fastread's native engines (io_uring,
psync): one uint8 output per ``ext`` entry, like ``fn.readers.webdataset``.

The shards are indexed by ``fastread.dali.readers.webdataset``, which passes
the index file here as ``index``. Epochs roll over as in DALI's readers (see
``pipe.reader_meta(name)``); shuffling is one permutation of all samples per
epoch.)")
    .NumInput(0)
    .OutputFn([](const dali::OpSpec &spec) {
      return static_cast<int>(spec.GetRepeatedArgument<std::string>("ext").size());
    })
    .MakeStateful()
    .AddParent("fastread__ShardedReaderBase")
    .AddParent("fastread__EngineReaderBase")
    .AddArg("index", "The index file written by fastread.dali.readers.webdataset.",
            DALI_STRING)
    .AddArg("ext", "The components, one output each (as indexed).", DALI_STRING_VEC)
    .AddOptionalArg("random_shuffle",
                    "One permutation of all samples per epoch (same on every rank).", false)
    .AddOptionalArg<int64_t>("initial_fill",
                             "With random_shuffle: 0, a global permutation; N, the shard's "
                             "samples in order through a shuffle buffer of N (as DALI's reader).",
                             int64_t{0})
    .AddOptionalArg<int64_t>("seed",
                             "Shuffle seed; give the same one on every rank (-1 means 0).", -1)
    .AddOptionalArg("prefetch_queue_depth", "Batches read ahead (at least 2 are).", 1)
    .AddOptionalArg("engine", "fastread engine: auto, io_uring, psync (auto and io_uring read "
                    "ranges of many shards with psync).", std::string("auto"))
    .AddOptionalArg("max_open_files",
                    "Shard descriptors kept open at most (an LRU shared out among the workers; "
                    "0: the core's default).", 0)
    .AddOptionalArg("queue_depth", "io_uring: reads in flight per ring (0: default).", 0)
    .AddOptionalArg("threads",
                    "psync threads / io_uring rings per worker (-1: one per two CPUs).", -1)
    .AddOptionalArg("pin_device",
                    "Page-lock the read buffers through this CUDA device's primary context "
                    "(-1: pageable; fastread.dali.readers.webdataset passes the pipeline's "
                    "device_id). Falls back to pageable memory, with a warning.",
                    -1);
