// fastread's native Cassandra reader: fn.fastread.readers.cassandra.
//
// cassandra-dali-plugin's fn.crs4.cassandra as a fastread operator: the
// samples are rows `(id uuid, label int|blob, data blob)` of one table,
// found by key through the C core's cql engine (csrc/engines/cql: prepared
// SELECTs, many requests in flight per connection, token-aware routing,
// retries within a deadline). The core's key reader (fr_reader_open_keys)
// reads whole batches ahead on native worker threads, each with its own
// connections, so a batch's round trips overlap those of the batches read
// ahead of it: with `workers` x `batch_size` requests in flight the
// network's latency is hidden. No Python runs on this path (the external
// source reader costs one Python call per batch and holds the GIL for it).
//
// Outputs: the data blob (UINT8, [bytes]) and the label: INT32 [1] (the
// row's int column; label_type="none": `labels`, e.g. the metadata table's)
// or, label_type="blob", the label column's bytes (UINT8, CPU only).
// CPU outputs are views of the batch's arena (rows land in it back to back
// in arrival order, so a batch is usually not in sample order and DALI
// copies it once where it needs one block); GPU outputs (device="gpu")
// are DALI's contiguous device buffers, filled by one copy per row on the
// operator's stream from page-locked arenas (upload_ring.c), as
// fastread_reader.cc does for files.
//
// Samples, shards and epochs are those of fastread's other operators
// (plugin_common.h, stream_operator.h): exact shards (no overlap; padding
// only with pad_last_batch), one permutation per (seed, epoch) the same on
// every rank, elastic sharding (global_batch_size), reader_meta, and
// checkpoints of the stream's position (resume reads on from there).
//
// Secrets: the engine's arguments hold the password; fastread.dali passes
// them by reference (engine_args_ref.h), so pipe.serialize() and every
// message hold a token, not the secret. The cql engine's own messages never
// carry it (an authentication failure names the user).
//
// Errors: a missing id or a row the node could not give fails the
// iteration naming TABLE[uuid] and the engine's words for it (read again
// on a context of our own, as fastread.Reader does); a node that cannot be
// reached fails within the engine's deadline_ms.
//
// Thread safety: DALI calls the operator from one thread at a time; the
// reader's workers are the core's (fastread.h); no global state beyond
// DALI's registration and engine_args_ref.h's table.
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dali/pipeline/operator/operator.h"
#include "engine_args_ref.h"
#include "fastread.h"
#include "plugin_common.h"
#include "stream_operator.h"
#include "upload_ring.h"

namespace fastread_dali {

namespace {

constexpr const char *kCqlOpName = "fastread.readers.cassandra";
constexpr const char *kCqlCheckpointTag = "fastread-cassandra-v1";
constexpr size_t kUuidBytes = 16;
constexpr unsigned kCqlUploadSlots = 8;
// Reader threads when workers=0: half the CPUs, 4 to 16 (CassandraSource.
// default_workers, where the measurement is: the threads bound the requests
// in flight, and 16 cores needed 8 to hide a 25 ms round trip).
int DefaultWorkers() {
  const unsigned cpus = std::thread::hardware_concurrency();
  return std::clamp(static_cast<int>(cpus / 2), 4, 16);
}

using CqlReaderPtr = std::unique_ptr<fr_reader, CloseWith<fr_reader_close>>;
using CqlGpuPtr = std::unique_ptr<fr_gpu, CloseWith<fr_gpu_close>>;
using CqlRingPtr = std::unique_ptr<fr_upload_ring, CloseWith<fr_upload_ring_close>>;
using CtxPtr = std::unique_ptr<fr_ctx, CloseWith<fr_ctx_close>>;
using PoolPtr = std::unique_ptr<fr_pool, CloseWith<fr_pool_close>>;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A uuid's text (8-4-4-4-12 hex digits, or 32 without dashes) as its 16
// bytes; false if it is none.
bool ParseUuid(const std::string &s, uint8_t *out) {
  size_t k = 0;
  int hi = -1;
  for (size_t i = 0; i < s.size(); i++) {
    const char c = s[i];
    if (c == '-' && s.size() == 36 && (i == 8 || i == 13 || i == 18 || i == 23)) continue;
    const int d = HexDigit(c);
    if (d < 0 || k == kUuidBytes) return false;
    if (hi < 0) {
      hi = d;
    } else {
      out[k++] = static_cast<uint8_t>(hi << 4 | d);
      hi = -1;
    }
  }
  return k == kUuidBytes && hi < 0 && (s.size() == 36 || s.size() == 32);
}

std::string UuidText(const uint8_t *b) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(36);
  for (size_t i = 0; i < kUuidBytes; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
    s.push_back(kHex[b[i] >> 4]);
    s.push_back(kHex[b[i] & 15]);
  }
  return s;
}

}  // namespace

template <typename Backend>
class CassandraReader : public StreamOperator<Backend> {
 public:
  static constexpr bool kGpu = std::is_same_v<Backend, dali::GPUBackend>;

  explicit CassandraReader(const dali::OpSpec &spec);
  ~CassandraReader() override = default;

  bool HasContiguousOutputs() const override { return kGpu; }
  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override;
  void RunImpl(dali::Workspace &ws) override;

 private:
  void DropReadAhead() override;
  BatchPtr TakeBatch();
  void RunHost(dali::Workspace &ws);
  void RunDevice(dali::Workspace &ws);
  int32_t IntLabel(const fr_batch *b, size_t i) const;
  std::string SampleName(int64_t index) const;
  std::string FailureDetail(int64_t index) const;

  std::string table_;
  std::vector<uint8_t> keys_;     // n x 16 bytes
  std::vector<int32_t> labels_;   // label_type "none": one per id
  std::string label_type_;        // "int", "blob" or "none"
  std::string engine_args_;       // resolved: holds the password, never shown
  int64_t n_ = 0;
  CqlGpuPtr gpu_;
  int device_id_ = -1;
  CqlReaderPtr reader_;
  CqlRingPtr ring_;
  size_t ahead_ = 2;  // batches queued ahead (StreamOperator::QueueAhead)
  bool pinned_ = false;
  BatchPtr current_;
};

template <typename Backend>
CassandraReader<Backend>::CassandraReader(const dali::OpSpec &spec)
    : StreamOperator<Backend>(spec, kCqlOpName, kCqlCheckpointTag) {
  table_ = spec.GetArgument<std::string>("table");
  label_type_ = spec.GetArgument<std::string>("label_type");
  DALI_ENFORCE(label_type_ == "int" || label_type_ == "blob" || label_type_ == "none",
               dali::make_string(kCqlOpName, ": label_type must be 'int', 'blob' or 'none', "
                                 "got '", label_type_, "'"));
  DALI_ENFORCE(!kGpu || label_type_ != "blob",
               dali::make_string(kCqlOpName, "(device='gpu'): label_type='blob' gives labels "
                                 "of any length; read them on the CPU"));
  const auto uuids = spec.GetRepeatedArgument<std::string>("uuids");
  DALI_ENFORCE(!uuids.empty(), dali::make_string(kCqlOpName, ": table '", table_,
                                                 "': no ids (give uuids=)"));
  keys_.resize(uuids.size() * kUuidBytes);
  for (size_t i = 0; i < uuids.size(); i++)
    DALI_ENFORCE(ParseUuid(uuids[i], keys_.data() + i * kUuidBytes),
                 dali::make_string(kCqlOpName, ": uuids[", i, "] ('", uuids[i].substr(0, 60),
                                   "') is not a uuid"));
  n_ = static_cast<int64_t>(uuids.size());
  const auto labels = spec.GetRepeatedArgument<int>("labels");
  DALI_ENFORCE(labels.empty() || labels.size() == uuids.size(),
               dali::make_string(kCqlOpName, ": ", labels.size(), " labels for ", uuids.size(),
                                 " ids (one label per id, or none)"));
  DALI_ENFORCE(labels.empty() || label_type_ == "none",
               dali::make_string(kCqlOpName, ": labels= are for label_type='none' (with '",
                                 label_type_, "' the rows give them)"));
  labels_.assign(uuids.size(), 0);
  std::copy(labels.begin(), labels.end(), labels_.begin());

  this->StartStream(spec, n_, spec.GetArgument<bool>("random_shuffle"), 0);

  const int depth = spec.GetArgument<int>("prefetch_queue_depth");
  DALI_ENFORCE(depth >= 1, dali::make_string(kCqlOpName, ": prefetch_queue_depth must be >= 1, "
                                             "got ", depth));
  int workers = spec.GetArgument<int>("workers");
  DALI_ENFORCE(workers >= 0 && workers <= 64,
               dali::make_string(kCqlOpName, ": workers must be in 0..64 (0: automatic), got ",
                                 workers));
  if (workers == 0) {
    // Workers mostly wait on the network, one batch in flight each: enough
    // of them keep the node busy across a batch's round trip and its slowest
    // rows (DefaultWorkers).
    workers = DefaultWorkers();
  }

  // engine_args are the cql engine's (CassandraSource.engine_args): hosts,
  // port, table, columns, credentials; label= follows label_type.
  engine_args_ = ResolveEngineArgs(spec.GetArgument<std::string>("engine_args"), kCqlOpName);
  fr_config cfg;
  fr_config_init(&cfg);
  cfg.engine = "cql";
  cfg.engine_args = engine_args_.c_str();
  int pin_device = spec.GetArgument<int>("pin_device");
  DALI_ENFORCE(pin_device >= -1,
               dali::make_string(kCqlOpName, ": pin_device must be >= -1, got ", pin_device));
  if constexpr (kGpu) {
    device_id_ = spec.GetArgument<int>("device_id");
    fr_gpu *gpu = nullptr;
    char gerr[FR_ERRLEN] = "";
    const int grc = fr_gpu_open(device_id_, &gpu, gerr, sizeof(gerr));
    DALI_ENFORCE(grc == 0, dali::make_string(kCqlOpName, "(device='gpu'): cannot use CUDA "
                                             "device ", device_id_, ": ", gerr));
    gpu_.reset(gpu);
    pin_device = device_id_;
    cfg.gpu = gpu_.get();
  }
  cfg.device_id = pin_device;
  cfg.pin_memory = pin_device >= 0;
  cfg.device_output = 0;
  const unsigned prefetch = static_cast<unsigned>(std::max(depth, 2));
  fr_reader *rd = nullptr;
  char err[FR_ERRLEN] = "";
  auto open_reader = [&]() {
    return fr_reader_open_keys(&cfg, keys_.data(), kUuidBytes, static_cast<size_t>(n_),
                               prefetch, static_cast<unsigned>(workers), &rd, err, sizeof(err));
  };
  int rc = open_reader();
  if (rc != 0 && pin_device >= 0 && !kGpu) {
    // No driver: pageable arenas read the same rows (DALI stages its copies).
    cfg.device_id = -1;
    cfg.pin_memory = 0;
    err[0] = 0;
    rc = open_reader();
  }
  pinned_ = rc == 0 && cfg.pin_memory;
  // The engine's message names the host, the table or the user, never the
  // password (test_cassandra_dali.py checks).
  DALI_ENFORCE(rc == 0, dali::make_string(kCqlOpName, ": table '", table_, "': ",
                                          err[0] ? err : ErrnoText(rc)));
  reader_.reset(rd);
  if constexpr (kGpu) {
    fr_upload_ring *ring = nullptr;
    rc = fr_upload_ring_open(gpu_.get(), kCqlUploadSlots, &ring, err, sizeof(err));
    DALI_ENFORCE(rc == 0, dali::make_string(kCqlOpName, "(device='gpu'): ", err));
    ring_.reset(ring);
  }
  // Rows back to back (dense): the GPU copy then needs one call per run of
  // rows in order, and CPU views need no alignment padding.
  fr_reader_set_dense(reader_.get(), 1);
  // Every worker busy and `prefetch` finished batches waiting.
  ahead_ = prefetch + static_cast<size_t>(workers);
}

template <typename Backend>
std::string CassandraReader<Backend>::SampleName(int64_t index) const {
  return table_ + "[" + UuidText(keys_.data() + static_cast<size_t>(index) * kUuidBytes) + "]";
}

template <typename Backend>
std::string CassandraReader<Backend>::FailureDetail(int64_t index) const {
  // The reader's batches carry an errno per row; the engine's words (not
  // found, the node's error, a timeout naming the host) come from reading
  // the row again on a context of our own. "" if it reads now.
  fr_config cfg;
  fr_config_init(&cfg);
  cfg.engine = "cql";
  cfg.engine_args = engine_args_.c_str();
  fr_ctx *raw = nullptr;
  char err[FR_ERRLEN] = "";
  if (fr_ctx_open(&cfg, &raw, err, sizeof(err)) != 0) return err;
  CtxPtr ctx(raw);
  PoolPtr pool(fr_pool_new());
  if (!pool) return "";
  BatchPtr batch(fr_pool_get(pool.get()));
  if (!batch) return "";
  const int rc = fr_read_keys(ctx.get(), keys_.data() + static_cast<size_t>(index) * kUuidBytes,
                              kUuidBytes, 1, batch.get());
  if (rc < 0) return ErrnoText(rc);
  if (batch->samples[0].length >= 0) return "";
  char msg[FR_ERRLEN] = "";
  if (fr_ctx_sample_error(ctx.get(), 0, msg, sizeof(msg)) > 0) return msg;
  return ErrnoText(batch->samples[0].length);
}

template <typename Backend>
BatchPtr CassandraReader<Backend>::TakeBatch() {
  this->QueueAhead(reader_.get(), ahead_);
  BatchPtr batch = this->TakeQueued(reader_.get(), "table '" + table_ + "'");
  for (size_t i = 0; i < batch->count; i++) {
    if (batch->samples[i].length >= 0) continue;
    const std::string detail = FailureDetail(batch->indices[i]);
    DALI_FAIL(dali::make_string(kCqlOpName, ": cannot read ", SampleName(batch->indices[i]), ": ",
                                detail.empty() ? ErrnoText(batch->samples[i].length) : detail));
  }
  if (label_type_ != "none") {
    DALI_ENFORCE(batch->label_count == batch->count,
                 dali::make_string(kCqlOpName, ": table '", table_, "': the engine read no "
                                   "labels (label_type='", label_type_, "')"));
  }
  return batch;
}

template <typename Backend>
int32_t CassandraReader<Backend>::IntLabel(const fr_batch *b, size_t i) const {
  if (label_type_ == "none") return labels_[static_cast<size_t>(b->indices[i])];
  const fr_sample &l = b->labels[i];
  if (l.length < 0) return -1;  // null in the row, as fastread.Reader gives it
  DALI_ENFORCE(l.length == 4, dali::make_string(kCqlOpName, ": ", SampleName(b->indices[i]),
                                                ": its label has ", l.length, " bytes, not 4 "
                                                "(an int; label_type='blob' reads any)"));
  const uint8_t *p = b->label_bytes + l.offset;  // CQL ints are big-endian
  return static_cast<int32_t>((uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
                              (uint32_t{p[2]} << 8) | uint32_t{p[3]});
}

template <typename Backend>
bool CassandraReader<Backend>::SetupImpl(std::vector<dali::OutputDesc> &output_desc,
                                         const dali::Workspace &ws) {
  // Outputs are the batch's own memory (CPU) or allocated in RunImpl (GPU).
  if constexpr (kGpu) {
    const int rc = fr_upload_ring_reap(ring_.get());
    if (rc < 0) {
      char cuda[FR_ERRLEN];
      fr_gpu_last_error(gpu_.get(), cuda, sizeof(cuda));
      DALI_FAIL(dali::make_string(kCqlOpName, "(device='gpu'): a copy to GPU ", device_id_,
                                  " failed: ", cuda));
    }
  }
  current_.reset();
  current_ = TakeBatch();
  return false;
}

template <typename Backend>
void CassandraReader<Backend>::RunImpl(dali::Workspace &ws) {
  DALI_ENFORCE(current_ != nullptr, dali::make_string(kCqlOpName, ": Run without a batch"));
  if constexpr (kGpu)
    RunDevice(ws);
  else
    RunHost(ws);
}

template <typename Backend>
void CassandraReader<Backend>::RunHost(dali::Workspace &ws) {
  // Zero-copy: every row a view of the batch's arena, which goes back to
  // the pool when DALI drops the last view (fr_batch_recycle is
  // thread-safe).
  std::shared_ptr<fr_batch> batch(current_.release(), BatchRecycler());
  const fr_batch *b = batch.get();
  const int n = static_cast<int>(b->count);
  auto &data = ws.Output<dali::CPUBackend>(0);
  auto &labels = ws.Output<dali::CPUBackend>(1);
  if (label_type_ == "blob") {
    // Copied: the label bytes live in the batch's own small buffer.
    dali::TensorListShape<> shape(n, 1);
    for (int i = 0; i < n; i++)
      shape.set_tensor_shape(i, dali::TensorShape<>{std::max<int64_t>(b->labels[i].length, 0)});
    labels.Resize(shape, DALI_UINT8);
    for (int i = 0; i < n; i++)
      if (b->labels[i].length > 0)
        memcpy(labels.raw_mutable_tensor(i), b->label_bytes + b->labels[i].offset,
               static_cast<size_t>(b->labels[i].length));
  } else {
    labels.Resize(dali::uniform_list_shape<1>(n, {1}), DALI_INT32);
    for (int i = 0; i < n; i++)
      labels.mutable_tensor<int32_t>(i)[0] = IntLabel(b, static_cast<size_t>(i));
  }
  data.Reset();
  data.set_pinned(pinned_);
  data.SetContiguity(dali::BatchContiguity::Noncontiguous);
  data.set_type(DALI_UINT8);
  data.set_sample_dim(1);
  data.SetSize(n);
  for (int i = 0; i < n; i++) {
    const fr_sample &s = b->samples[i];
    std::shared_ptr<void> bytes(batch, b->arena.base + s.offset);
    data.SetSample(i, std::move(bytes), static_cast<size_t>(s.length), pinned_,
                   dali::TensorShape<>{s.length}, DALI_UINT8, data.device_id(),
                   dali::AccessOrder::host());
  }
  for (int i = 0; i < n; i++) data.SetSourceInfo(i, SampleName(b->indices[i]));
}

template <typename Backend>
void CassandraReader<Backend>::RunDevice(dali::Workspace &ws) {
  // DALI allocates contiguous outputs in stream order; the ring queues the
  // copies on ws.stream() and keeps the batch until they are done.
  fr_batch *b = current_.get();
  const int n = static_cast<int>(b->count);
  auto &data = ws.Output<dali::GPUBackend>(0);
  auto &labels = ws.Output<dali::GPUBackend>(1);
  dali::TensorListShape<> shape(n, 1);
  for (int i = 0; i < n; i++) shape.set_tensor_shape(i, dali::TensorShape<>{b->samples[i].length});
  data.Resize(shape, DALI_UINT8, dali::BatchContiguity::Contiguous);
  labels.Resize(dali::uniform_list_shape<1>(n, {1}), DALI_INT32, dali::BatchContiguity::Contiguous);
  std::vector<int32_t> host_labels(static_cast<size_t>(n));
  for (int i = 0; i < n; i++) host_labels[static_cast<size_t>(i)] = IntLabel(b, static_cast<size_t>(i));
  uint64_t data_dst = 0;
  if (shape.num_elements() > 0) {
    auto *base = static_cast<uint8_t *>(contiguous_raw_mutable_data(data));
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
      DALI_ENFORCE(data.raw_tensor(i) == base + offset || b->samples[i].length == 0,
                   dali::make_string(kCqlOpName, "(device='gpu'): DALI laid out its contiguous "
                                                 "output with gaps (sample ", i, ")"));
      offset += static_cast<uint64_t>(b->samples[i].length);
    }
    data_dst = reinterpret_cast<uintptr_t>(base);
  }
  const uint64_t labels_dst =
      n ? reinterpret_cast<uintptr_t>(contiguous_raw_mutable_data(labels)) : 0;
  for (int i = 0; i < n; i++) data.SetSourceInfo(i, SampleName(b->indices[i]));
  char err[FR_ERRLEN] = "";
  const int rc = fr_upload_ring_push(ring_.get(), current_.release(), data_dst,
                                     n ? host_labels.data() : nullptr, labels_dst,
                                     reinterpret_cast<fr_CUstream>(ws.stream()), err, sizeof(err));
  DALI_ENFORCE(rc == 0, dali::make_string(kCqlOpName, "(device='gpu'): ", err));
}

template <typename Backend>
void CassandraReader<Backend>::DropReadAhead() {
  current_.reset();
  this->DropQueued(reader_.get());
}

}  // namespace fastread_dali

DALI_REGISTER_OPERATOR(fastread__readers__Cassandra,
                       ::fastread_dali::CassandraReader<::dali::CPUBackend>, ::dali::CPU);
DALI_REGISTER_OPERATOR(fastread__readers__Cassandra,
                       ::fastread_dali::CassandraReader<::dali::GPUBackend>, ::dali::GPU);

DALI_SCHEMA(fastread__readers__Cassandra)
    .DocStr(R"(Reads rows of a Cassandra table by id with fastread's cql engine; outputs
each row's data blob (uint8) and its label (int32, shape [1]; or the label
column's bytes with ``label_type="blob"``), like cassandra-dali-plugin's
``fn.crs4.cassandra``. Epochs roll over as in DALI's readers; shards are exact.
With ``device="gpu"`` both outputs are in the pipeline's GPU memory.
``fastread.dali.readers.cassandra`` builds it (and passes credentials by
reference, never in the pipeline's arguments).)")
    .NumInput(0)
    .NumOutput(2)
    .MakeStateful()
    .AddParent("fastread__ShardedReaderBase")
    .AddArg("table", "KEYSPACE.TABLE, as the engine's table= (names samples in messages).",
            DALI_STRING)
    .AddOptionalArg("uuids", "The rows' ids (uuid text), one per sample.",
                    std::vector<std::string>())
    .AddOptionalArg("labels", "label_type='none': one label per id (default 0).",
                    std::vector<int>())
    .AddOptionalArg("label_type", "'int' (the label column, int32), 'blob' (its bytes) or 'none'.",
                    std::string("int"))
    .AddOptionalArg("engine_args",
                    "The cql engine's key=value,... options (CassandraSource.engine_args), "
                    "or a reference to them (fastread_engine_args_ref=...).",
                    std::string())
    .AddOptionalArg("random_shuffle",
                    "One permutation of all ids per epoch (the same on every rank).", false)
    .AddOptionalArg<int64_t>("seed", "Shuffle seed; the same on every rank (-1: 0).", -1)
    .AddOptionalArg("prefetch_queue_depth", "Batches read ahead (at least 2 are).", 2)
    .AddOptionalArg("workers",
                    "Reader threads, each with its own connections and one batch in flight "
                    "(0: half the CPUs, 4 to 16).",
                    0)
    .AddOptionalArg("pin_device",
                    "Page-lock the batches through this CUDA device (-1: pageable).", -1);
