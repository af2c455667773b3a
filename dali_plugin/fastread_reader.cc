// fastread's native DALI reader: fn.fastread.readers.file.
//
// A CPU operator over the C core's read-ahead reader (fr_reader): native
// worker threads read whole batches of files ahead of the pipeline, and each
// iteration hands DALI one finished batch without copying it: every sample
// is a view of the batch's arena, which returns to the reader's pool when
// DALI drops the last view. No Python runs on this path.
//
// Dense batches (dense=True, the default): the reader lays every batch out
// back to back (fr_batch.dense), so a batch read without incident is one
// contiguous block and DALI gets it as one shared buffer. DALI copies any
// CPU output that is not one block (MakeContiguous before the pipeline's
// outputs); a batch that is not (a file moved to the arena's end by the slow
// path, O_DIRECT's aligned slots) still goes out zero-copy, sample by
// sample, and DALI copies it.
//
// Page-locked arenas (pin_device=N, which fastread.dali.readers.file passes
// in a pipeline with a GPU): the reader's batches live in host memory
// page-locked through CUDA's driver (loaded at run time, device N's primary
// context), and outputs say so, so DALI's copies to the GPU (.gpu(), mixed
// decoders) are DMA from them. Without it they are pageable, and DALI's
// copies of our zero-copy outputs went through staging: on the H100
// machine, 74k img/s to the GPU against 175k for fastread.Reader there.
// If the driver cannot pin them, the reader runs pageable, with a warning.
//
// GPU outputs (device="gpu", fn.fastread.readers.file(device="gpu")): the
// same reader, its arenas page-locked through the pipeline's device, and each
// batch copied into DALI's contiguous GPU outputs on the operator's stream by
// one asynchronous copy of its bytes (dense batches; one per sample
// otherwise) and one of its labels (upload_ring.c). The batch returns to the
// reader's pool only when an event recorded after those copies says they are
// done; a ring bounds the batches in flight. No Python, no host
// synchronisation per batch.
//
// Checkpointing (enable_checkpointing=True, pipe.checkpoint()): the state is
// the stream position after the last batch handed out, and the seed;
// restoring drops the read-ahead and reads on from there.
//
// Samples: `files` (+ `labels`), joined to `file_root` like DALI's `files=`.
// fastread.dali.readers.file lists file_root / file_list trees with
// fastread.index.scan (fn.readers.file's rules, one source of truth) and
// passes the result here as `files` and `labels`.
//
// Packed images (image=, fastread.dali.readers.image): the samples are byte
// ranges of one image (range_offsets / range_lengths, from its index), read
// by the same reader opened with fr_reader_open_ranges; files= only names
// them ("image[name]" in errors and source info). Everything after the open
// (epochs, shards, dense batches, checkpoints, GPU outputs) is the same:
// a batch of ranges is laid out like a batch of files (dense without
// O_DIRECT; aligned slots, so per-sample views, with it).
//
// A version-3 binary index (image_index=, with the layout
// fastread.dali.readers.image found when it opened it): the operator maps
// the index itself (mapped_image_index.h) and reads the ranges in place
// (fr_reader_open_range_columns), labels and names per batch; no argument
// holds a value per sample, so a 10^8-sample image builds a pipeline in the
// time of its index's header.
//
// Epochs follow fn.readers.file: the reader never ends. Without
// pad_last_batch the shard is one endless stream of samples (a batch that
// crosses an epoch's end is filled from the next epoch); with pad_last_batch
// every shard is padded with its last sample to ceil(N / num_shards) samples
// and then to whole batches, so every epoch starts a batch. Without
// stick_to_shard, epoch e reads shard (shard_id + e) % num_shards. Epoch
// boundaries are reported through GetReaderMeta (pipe.reader_meta(name)),
// as DALI's readers do. Shuffling (random_shuffle / shuffle_after_epoch)
// draws one permutation of the whole data set per (seed, epoch), the same on
// every rank, and each rank reads its shard of it, so every epoch holds
// every sample exactly once.
//
// State lives in the operator instance only; there is no global state
// beyond DALI's registration.
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "dali/pipeline/operator/checkpointing/op_checkpoint.h"
#include "dali/pipeline/operator/operator.h"
#include "engine_args_ref.h"
#include "fastread.h"
#include "mapped_file_list.h"
#include "mapped_image_index.h"
#include "plugin_common.h"
#include "stream_operator.h"
#include "upload_ring.h"

namespace fastread_dali {

namespace {

constexpr const char *kOpName = "fastread.readers.file";
constexpr const char *kCheckpointTag = "fastread-stream-v1";

using ReaderPtr = std::unique_ptr<fr_reader, CloseWith<fr_reader_close>>;
using GpuPtr = std::unique_ptr<fr_gpu, CloseWith<fr_gpu_close>>;
// Closing the ring waits for the copies in flight.
using RingPtr = std::unique_ptr<fr_upload_ring, CloseWith<fr_upload_ring_close>>;

// Batches whose copies to the GPU may be in flight at once. The operator's
// stream runs them in order, and one is queued per iteration, so a ring this
// deep only waits when the GPU falls this many iterations behind.
constexpr unsigned kUploadSlots = 8;

// DALI's filesystem::join_path: `dir` prepended to relative paths.
std::string JoinPath(const std::string &dir, const std::string &path) {
  if (dir.empty()) return path;
  if (path.empty()) return dir;
  if (path[0] == '/') return path;
  if (dir.back() == '/') return dir + path;
  return dir + "/" + path;
}

}  // namespace

// One operator for all backends: CPUBackend hands DALI views of the
// reader's arenas; GPUBackend and MixedBackend copy them into DALI's GPU
// outputs, the same code on another of DALI's streams. As a mixed operator
// (device="mixed") the copies run on DALI's mixed stream, so with the
// dynamic executor's default stream policy (one stream per backend) batch
// k+1's copy overlaps the GPU operators working on batch k; as a GPU
// operator they queue on the GPU stream between those operators' kernels.
// On an H200, batches of 256 decoded 160 px images, then DALI's
// random_resized_crop + crop_mirror_normalize: 152k img/s as a mixed
// operator, 142k as a GPU one, 205k for that augmentation alone on a GPU
// external source (docs/results/gpu-h200-20261203b).
template <typename Backend>
class FileReader : public StreamOperator<Backend> {
 public:
  static constexpr bool kGpu = !std::is_same_v<Backend, dali::CPUBackend>;

  explicit FileReader(const dali::OpSpec &spec);
  ~FileReader() override = default;

  // GPU outputs are allocated contiguous (RunImpl); CPU ones are views.
  bool HasContiguousOutputs() const override { return kGpu; }
  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override;
  void RunImpl(dali::Workspace &ws) override;
  // Reader metadata and checkpoints (the sample stream's position after the
  // last batch handed to DALI): StreamOperator's.

 private:
  void DropReadAhead() override;
  BatchPtr TakeBatch();
  void MarkDense(fr_batch *batch) const;
  static bool Contiguous(const fr_batch *batch);
  void RunHost(dali::Workspace &ws);
  void RunDevice(dali::Workspace &ws);
  void CheckArrayFile(const fr_batch *b, int i) const;
  void Reap();
  void SetRanges(const dali::OpSpec &spec, const std::string &root,
                 const std::vector<std::string> &files, const std::vector<int> &labels);
  void MapIndex(const dali::OpSpec &spec, const std::string &root,
                const std::vector<std::string> &files, const std::vector<int> &labels);
  void CheckImage() const;
  std::string SampleName(int64_t index) const;
  int32_t Label(int64_t index) const {
    return mapped_   ? mapped_->label(index)
           : listed_ ? listed_->label(index)
                     : labels_[static_cast<size_t>(index)];
  }
  // A sample's array layout (npy_* lists, or a mapped decoded index's shapes).
  const int64_t *ArrayDims(size_t idx) const {
    return mapped_ ? mapped_->dims(static_cast<int64_t>(idx))
                   : array_shape_.data() + idx * static_cast<size_t>(array_ndim_);
  }
  int64_t ArrayOffset(size_t idx) const { return mapped_ ? 0 : array_offset_[idx]; }
  int64_t ArrayBytes(size_t idx) const;
  fr_range Range(int64_t index) const {
    return mapped_ ? fr_range{mapped_->offsets()[index], mapped_->lengths()[index]}
                   : ranges_[static_cast<size_t>(index)];
  }
  [[noreturn]] void FailSample(int64_t index, int64_t neg_errno) const;

  // The data set: files, or (image_ set) byte ranges of one image, whose
  // paths_ are then only names ("image[name]") for errors and source info.
  std::vector<std::string> paths_;
  std::string image_;
  std::vector<fr_range> ranges_;
  std::vector<int32_t> labels_;
  // image_index=: the mapped index instead of paths_, ranges_ and labels_.
  std::unique_ptr<MappedImageIndex> mapped_;
  // file_index=: the mapped listing instead of paths_ and labels_.
  std::unique_ptr<MappedFileList> listed_;
  int64_t n_ = 0;
  // Arrays (npy_ndim >= 0): each file holds one array of `array_dtype_`
  // whose data starts `array_offset_` bytes in and runs to the file's end;
  // the headers were parsed once by fastread.npy.NpyIndex when the pipeline
  // was defined, so no header is parsed per batch.
  int array_ndim_ = -1;
  dali::DALIDataType array_dtype_ = DALI_NO_TYPE;
  std::vector<int64_t> array_offset_;
  std::vector<int64_t> array_bytes_;
  std::vector<int64_t> array_shape_;  // n_ x array_ndim_
  int64_t array_item_ = 0;            // bytes an element
  // Every array is its whole sample (no header before it): a dense batch of
  // them is one block, shared with DALI as it lies.
  bool arrays_whole_ = false;
  // GPU outputs: the device (also the reader's, for page-locking) and the
  // ring of batches whose copies are in flight. Declared so that the ring is
  // closed (its copies waited for) before the reader, and the device last.
  GpuPtr gpu_;
  int device_id_ = -1;
  // The native reader, and how many batches it reads ahead
  // (StreamOperator::QueueAhead).
  ReaderPtr reader_;
  RingPtr ring_;
  size_t ahead_ = 2;
  std::string engine_;
  bool dense_ = true;
  bool pinned_ = false;  // the arenas are page-locked (pin_device)
  BatchPtr current_;
};

template <typename Backend>
FileReader<Backend>::FileReader(const dali::OpSpec &spec)
    : StreamOperator<Backend>(spec, kOpName, kCheckpointTag) {
  const std::string root = spec.GetArgument<std::string>("file_root");
  auto files = spec.GetRepeatedArgument<std::string>("files");
  auto labels = spec.GetRepeatedArgument<int>("labels");
  std::string file_list = spec.GetArgument<std::string>("file_list");
  DALI_ENFORCE(file_list.empty(),
               dali::make_string(kOpName, ": file_list='", file_list,
                                 "' is listed by fastread.dali.readers.file (fastread.index.scan); "
                                 "the native operator takes the result as files= and labels="));
  image_ = spec.GetArgument<std::string>("image");
  const std::string image_index = spec.GetArgument<std::string>("image_index");
  DALI_ENFORCE(image_index.empty() || !image_.empty(),
               dali::make_string(kOpName, ": image_index='", image_index,
                                 "' is the index of a packed image: give image= too"));
  const std::string file_index = spec.GetArgument<std::string>("file_index");
  if (!file_index.empty()) {
    DALI_ENFORCE(image_.empty() && image_index.empty() && root.empty() && files.empty() &&
                     labels.empty(),
                 dali::make_string(kOpName, ": file_index='", file_index,
                                   "' lists the files (full paths) and their labels: no "
                                   "image=, image_index=, file_root=, files= or labels= too"));
    listed_ = std::make_unique<MappedFileList>(
        kOpName, file_index, spec.GetArgument<std::string>("index_head"),
        spec.GetArgument<int64_t>("index_count"), spec.GetArgument<int64_t>("index_dirs"),
        spec.GetArgument<int64_t>("index_bytes"));
  } else if (!image_index.empty()) {
    MapIndex(spec, root, files, labels);
  } else if (!image_.empty()) {
    SetRanges(spec, root, files, labels);
  } else {
    DALI_ENFORCE(spec.GetRepeatedArgument<int64_t>("range_offsets").empty() &&
                     spec.GetRepeatedArgument<int64_t>("range_lengths").empty(),
                 dali::make_string(kOpName, ": range_offsets / range_lengths are byte ranges "
                                            "of an image: give image= too"));
    DALI_ENFORCE(!files.empty(),
                 dali::make_string(kOpName, ": no samples: give files= (and labels=); "
                                   "fastread.dali.readers.file lists file_root='", root,
                                   "' with fastread.index.scan and passes them"));
    DALI_ENFORCE(labels.empty() || labels.size() == files.size(),
                 dali::make_string(kOpName, ": ", labels.size(), " labels for ", files.size(),
                                   " files (one label per file, or none)"));
    paths_.reserve(files.size());
    labels_.reserve(files.size());
    for (size_t i = 0; i < files.size(); i++) {
      paths_.push_back(JoinPath(root, files[i]));
      labels_.push_back(labels.empty() ? static_cast<int32_t>(i) : labels[i]);
    }
  }
  n_ = mapped_   ? mapped_->count()
       : listed_ ? listed_->count()
                 : static_cast<int64_t>(paths_.size());

  // With image=, each range holding one array (a decoded packed image's
  // pixels, fastread pack --decode): npy_data_offsets are then all 0.
  array_ndim_ = spec.GetArgument<int>("npy_ndim");
  if (array_ndim_ >= 0 && mapped_) {
    // A decoded pack's binary index: the shapes are its column, read per
    // batch (ArrayBytes checks each); every range is one whole array.
    array_dtype_ = spec.GetArgument<dali::DALIDataType>("npy_dtype");
    DALI_ENFORCE(array_ndim_ == 3 && mapped_->has_shapes() &&
                     spec.GetRepeatedArgument<int64_t>("npy_data_offsets").empty() &&
                     spec.GetRepeatedArgument<int64_t>("npy_shapes").empty(),
                 dali::make_string(kOpName, ": with image_index=, npy_ndim=3 reads the index's "
                                            "shapes column (a decoded pack's; give it in "
                                            "index_columns), no npy_data_offsets / npy_shapes"));
    DALI_ENFORCE(array_dtype_ != DALI_NO_TYPE && dali::TypeTable::GetTypeInfo(array_dtype_).size() > 0,
                 dali::make_string(kOpName, ": npy_dtype must be a fixed-size type, got ",
                                   array_dtype_));
    array_item_ = static_cast<int64_t>(dali::TypeTable::GetTypeInfo(array_dtype_).size());
    arrays_whole_ = true;
  } else if (array_ndim_ >= 0) {
    array_dtype_ = spec.GetArgument<dali::DALIDataType>("npy_dtype");
    array_offset_ = spec.GetRepeatedArgument<int64_t>("npy_data_offsets");
    array_shape_ = spec.GetRepeatedArgument<int64_t>("npy_shapes");
    DALI_ENFORCE(array_dtype_ != DALI_NO_TYPE && dali::TypeTable::GetTypeInfo(array_dtype_).size() > 0,
                 dali::make_string(kOpName, ": npy_dtype must be a fixed-size type, got ",
                                   array_dtype_));
    DALI_ENFORCE(array_offset_.size() == files.size() &&
                     array_shape_.size() == files.size() * static_cast<size_t>(array_ndim_),
                 dali::make_string(kOpName, ": npy_data_offsets (", array_offset_.size(),
                                   ") and npy_shapes (", array_shape_.size(), ") must give one "
                                   "offset and npy_ndim=", array_ndim_, " dimensions per file (",
                                   files.size(), " files)"));
    const int64_t item = static_cast<int64_t>(dali::TypeTable::GetTypeInfo(array_dtype_).size());
    array_item_ = item;
    array_bytes_.resize(files.size());
    for (size_t i = 0; i < files.size(); i++) {
      int64_t elems = 1;
      for (int d = 0; d < array_ndim_; d++) {
        const int64_t extent = array_shape_[i * static_cast<size_t>(array_ndim_) + d];
        DALI_ENFORCE(extent >= 0 && array_offset_[i] >= 0,
                     dali::make_string(kOpName, ": '", paths_[i], "': negative offset or extent"));
        elems *= extent;
      }
      array_bytes_[i] = elems * item;
    }
    arrays_whole_ = std::all_of(array_offset_.begin(), array_offset_.end(),
                                [](int64_t o) { return o == 0; });
  } else {
    DALI_ENFORCE(spec.GetRepeatedArgument<int64_t>("npy_data_offsets").empty(),
                 dali::make_string(kOpName, ": npy_data_offsets needs npy_ndim >= 0"));
  }

  // The sample stream (DALI's reader arguments: shards, shuffle, padding).
  this->StartStream(spec, n_,
                    spec.GetArgument<bool>("random_shuffle") ||
                        spec.GetArgument<bool>("shuffle_after_epoch"),
                    0);

  int depth = spec.GetArgument<int>("prefetch_queue_depth");
  DALI_ENFORCE(depth >= 1,
               dali::make_string(kOpName, ": prefetch_queue_depth must be >= 1, got ", depth));
  int workers = spec.GetArgument<int>("workers");
  DALI_ENFORCE(workers >= 0 && workers <= 64,
               dali::make_string(kOpName, ": workers must be in 0..64 (0: automatic), got ",
                                 workers));
  if (workers == 0) {
    unsigned cpus = std::thread::hardware_concurrency();
    workers = static_cast<int>(std::min(8u, std::max(1u, cpus / 2)));
  }
  int queue_depth = spec.GetArgument<int>("queue_depth");
  int threads = spec.GetArgument<int>("threads");
  DALI_ENFORCE(queue_depth >= 0,
               dali::make_string(kOpName, ": queue_depth must be >= 0, got ", queue_depth));
  DALI_ENFORCE(threads >= -1,
               dali::make_string(kOpName, ": threads must be >= -1, got ", threads));

  // "auto" goes to the core as it is: it picks the engine (fr_engine_auto)
  // and, on io_uring, sends each batch to io_uring or psync (fr_auto_rule).
  engine_ = spec.GetArgument<std::string>("engine");
  fr_config cfg;
  fr_config_init(&cfg);
  cfg.engine = engine_.c_str();
  if (queue_depth > 0) cfg.queue_depth = static_cast<unsigned>(queue_depth);
  if (threads >= 0) {
    cfg.threads = static_cast<unsigned>(threads);
  } else {
    // Inside DALI the rings share the cores with DALI's own thread pool:
    // one ring per two cores, at most the core's default (measured on a
    // 2-core VM: 1 ring used ~20% less CPU per image than 4).
    unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    cfg.threads = std::max(1u, std::min(cfg.threads, cpus / 2));
  }
  cfg.o_direct = spec.GetArgument<bool>("o_direct") ? 1 : 0;
  if (!spec.GetArgument<bool>("register_buffers")) cfg.register_buffers = 0;
  if (!spec.GetArgument<bool>("register_files")) cfg.register_files = 0;
  int alignment = spec.GetArgument<int>("direct_alignment");
  DALI_ENFORCE(alignment > 0 && (alignment & (alignment - 1)) == 0,
               dali::make_string(kOpName, ": direct_alignment must be a power of two, got ",
                                 alignment));
  cfg.direct_alignment = static_cast<unsigned>(alignment);
  if (cfg.o_direct) {
    // fr_reader_open_ranges refuses these too, by number; here by name.
    for (size_t i = 0; i < ranges_.size(); i++)
      DALI_ENFORCE(ranges_[i].offset % static_cast<uint64_t>(alignment) == 0,
                   dali::make_string(kOpName, ": o_direct=True needs range offsets that are "
                                     "multiples of direct_alignment=", alignment, "; sample ",
                                     paths_[i], " starts at ", ranges_[i].offset));
  }
  const std::string engine_args = fastread_dali::ResolveEngineArgs(
      spec.GetArgument<std::string>("engine_args"), kOpName);
  cfg.engine_args = engine_args.c_str();
  // Host output. pin_device >= 0: arenas page-locked through that device's
  // primary context (device_output stays off: DALI makes its own copies).
  // GPU output: page-locked through the pipeline's device, which the
  // operator's copies go to (the core's dlopen'ed driver: no CUDA runtime is
  // linked, and the stream DALI gives RunImpl is a driver stream too).
  int pin_device = spec.GetArgument<int>("pin_device");
  DALI_ENFORCE(pin_device >= -1,
               dali::make_string(kOpName, ": pin_device must be >= -1, got ", pin_device));
  if constexpr (kGpu) {
    device_id_ = spec.GetArgument<int>("device_id");
    DALI_ENFORCE(pin_device == -1 || pin_device == device_id_,
                 dali::make_string(kOpName, "(device='gpu'): pin_device=", pin_device,
                                   " is not the pipeline's device ", device_id_,
                                   " (the outputs' device; leave pin_device out)"));
    fr_gpu *gpu = nullptr;
    char gerr[FR_ERRLEN] = "";
    int grc = fr_gpu_open(device_id_, &gpu, gerr, sizeof(gerr));
    DALI_ENFORCE(grc == 0, dali::make_string(kOpName, "(device='gpu'): cannot use CUDA device ",
                                             device_id_, ": ", gerr));
    gpu_.reset(gpu);
    pin_device = device_id_;
    cfg.gpu = gpu_.get();
  }
  cfg.device_id = pin_device;
  cfg.pin_memory = pin_device >= 0;
  cfg.device_output = 0;

  std::vector<const char *> cpaths(paths_.size());
  for (size_t i = 0; i < paths_.size(); i++) cpaths[i] = paths_[i].c_str();
  unsigned prefetch = static_cast<unsigned>(std::max(depth, 2));
  fr_reader *rd = nullptr;
  char err[FR_ERRLEN] = "";
  // An image's samples are its ranges (fr_read_ranges: one open of the
  // image per worker, O_DIRECT where asked and the offsets allow); paths_
  // then only name them.
  auto open_reader = [&]() {
    if (mapped_)  // borrowed: the mapping outlives the reader (declared before it)
      return fr_reader_open_range_columns(&cfg, image_.c_str(), mapped_->offsets(),
                                          mapped_->lengths(), static_cast<size_t>(n_),
                                          prefetch, static_cast<unsigned>(workers), &rd, err,
                                          sizeof(err));
    if (listed_)  // borrowed too: declared before reader_, so it outlives it
      return fr_reader_open_tree(&cfg, listed_->dirs_blob(), listed_->dir_offsets(),
                                 listed_->dirs(), listed_->dir_ids(), listed_->names_blob(),
                                 listed_->name_offsets(), static_cast<size_t>(n_), prefetch,
                                 static_cast<unsigned>(workers), &rd, err, sizeof(err));
    if (!image_.empty())
      return fr_reader_open_ranges(&cfg, image_.c_str(), ranges_.data(), ranges_.size(),
                                   prefetch, static_cast<unsigned>(workers), &rd, err,
                                   sizeof(err));
    return fr_reader_open(&cfg, cpaths.data(), cpaths.size(), prefetch,
                          static_cast<unsigned>(workers), &rd, err, sizeof(err));
  };
  int rc = open_reader();
  if (rc != 0 && pin_device >= 0) {
    // No driver or no such device: pageable arenas still read correctly
    // (and GPU outputs are still copied from them, through the driver's
    // staging, at a lower speed).
    std::cerr << "fastread: " << kOpName << ": cannot page-lock its buffers on device "
              << pin_device << " (" << err << "); reading into pageable memory\n";
    cfg.device_id = -1;
    cfg.pin_memory = 0;
    cfg.gpu = nullptr;
    err[0] = 0;
    rc = open_reader();
  }
  pinned_ = rc == 0 && cfg.pin_memory;
  DALI_ENFORCE(rc == 0, dali::make_string(kOpName, ": cannot open a reader with engine '",
                                          engine_, "'",
                                          listed_ ? " over file_index='" + listed_->path() + "'"
                                                  : std::string(),
                                          ": ", err[0] ? err : ErrnoText(rc)));
  reader_.reset(rd);
  engine_ = fr_reader_engine(rd);  // what it reads with ("auto" resolved), for messages
  if constexpr (kGpu) {
    fr_upload_ring *ring = nullptr;
    rc = fr_upload_ring_open(gpu_.get(), kUploadSlots, &ring, err, sizeof(err));
    DALI_ENFORCE(rc == 0, dali::make_string(kOpName, "(device='gpu'): ", err));
    ring_.reset(ring);
  }
  // Keep every worker busy and `prefetch` finished batches waiting.
  ahead_ = prefetch + static_cast<size_t>(workers);

  // A batch's layout is its own (fr_batch.dense, kept when the pool hands it
  // out again): mark the batches the reader will read into before it reads
  // any. It needs about `ahead_` plus those DALI still holds; more only if
  // outputs are kept longer (TakeBatch marks those as they come).
  // .npy arrays sit between their headers: a batch of them is never one
  // block; whole arrays (an image's ranges) are.
  dense_ = spec.GetArgument<bool>("dense") && (array_ndim_ < 0 || arrays_whole_);
  if (dense_) {
    fr_pool *pool = fr_reader_pool(reader_.get());
    std::vector<BatchPtr> seeded;
    // GPU outputs: also the batches the upload ring may hold.
    const size_t marked = ahead_ + 4 + (kGpu ? kUploadSlots : 0);
    for (size_t i = 0; i < marked; i++) {
      BatchPtr b(fr_pool_get(pool));
      DALI_ENFORCE(b != nullptr, dali::make_string(kOpName, ": out of memory"));
      MarkDense(b.get());
      seeded.push_back(std::move(b));
    }
  }  // back to the pool, marked
}

template <typename Backend>
void FileReader<Backend>::SetRanges(const dali::OpSpec &spec, const std::string &root,
                                    const std::vector<std::string> &files,
                                    const std::vector<int> &labels) {
  const auto offsets = spec.GetRepeatedArgument<int64_t>("range_offsets");
  const auto lengths = spec.GetRepeatedArgument<int64_t>("range_lengths");
  const std::string what = dali::make_string(kOpName, ": image='", image_, "': ");
  DALI_ENFORCE(root.empty(), dali::make_string(what, "file_root='", root, "' is for files; an "
                                               "image's samples are its ranges (give image= "
                                               "as a full path)"));
  DALI_ENFORCE(!offsets.empty(),
               dali::make_string(what, "no samples: give range_offsets= and range_lengths= "
                                       "(one of each per sample; fastread.dali.readers.image "
                                       "passes them from the image's index)"));
  const size_t n = offsets.size();
  DALI_ENFORCE(lengths.size() == n,
               dali::make_string(what, lengths.size(), " range_lengths for ", n,
                                 " range_offsets (one of each per sample)"));
  DALI_ENFORCE(files.empty() || files.size() == n,
               dali::make_string(what, files.size(), " names (files=) for ", n,
                                 " ranges (one per sample, or none)"));
  DALI_ENFORCE(labels.empty() || labels.size() == n,
               dali::make_string(what, labels.size(), " labels for ", n,
                                 " ranges (one per sample, or none)"));
  paths_.reserve(n);
  labels_.reserve(n);
  ranges_.reserve(n);
  for (size_t i = 0; i < n; i++) {
    paths_.push_back(image_ + "[" + (files.empty() ? std::to_string(i) : files[i]) + "]");
    labels_.push_back(labels.empty() ? static_cast<int32_t>(i) : labels[i]);
    DALI_ENFORCE(offsets[i] >= 0 && lengths[i] >= 0 && offsets[i] <= INT64_MAX - lengths[i],
                 dali::make_string(kOpName, ": sample ", paths_.back(), " (", i,
                                   "): range_offsets ", offsets[i], ", range_lengths ",
                                   lengths[i], " is not a byte range (negative or overflowing)"));
    ranges_.push_back(fr_range{static_cast<uint64_t>(offsets[i]),
                               static_cast<uint64_t>(lengths[i])});
  }
  CheckImage();
}

template <typename Backend>
void FileReader<Backend>::MapIndex(const dali::OpSpec &spec, const std::string &root,
                                   const std::vector<std::string> &files,
                                   const std::vector<int> &labels) {
  const std::string what = dali::make_string(kOpName, ": image='", image_, "': ");
  DALI_ENFORCE(root.empty(), dali::make_string(what, "file_root='", root, "' is for files"));
  DALI_ENFORCE(files.empty() && labels.empty() &&
                   spec.GetRepeatedArgument<int64_t>("range_offsets").empty() &&
                   spec.GetRepeatedArgument<int64_t>("range_lengths").empty(),
               dali::make_string(what, "image_index= gives the samples' ranges, names and "
                                       "labels: no files=, labels= or range_* too"));
  mapped_ = std::make_unique<MappedImageIndex>(
      kOpName, spec.GetArgument<std::string>("image_index"),
      spec.GetArgument<std::string>("index_head"), spec.GetArgument<int64_t>("index_count"),
      spec.GetRepeatedArgument<int64_t>("index_columns"),
      spec.GetArgument<int64_t>("index_names_bytes"), spec.GetArgument<int64_t>("index_bytes"));
  CheckImage();
}

// The image is there, is one, and (a regular file) holds every range: said
// when the pipeline is built rather than at the first batch that reads past
// its end. An image truncated later fails that batch (FailSample).
template <typename Backend>
void FileReader<Backend>::CheckImage() const {
  // An object in S3 is no local file to stat: fastread.PackedImage checked it
  // already (its header block and its last byte, by ranged GETs, when the
  // pipeline was defined), and one truncated since fails its batch with
  // ENODATA (FailSample) as a local image does.
  if (image_.rfind("s3://", 0) == 0) return;
  // O_NONBLOCK: a FIFO named as the image is refused below, not waited on.
  int fd = open(image_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  DALI_ENFORCE(fd >= 0, dali::make_string(kOpName, ": cannot open image '", image_, "': ",
                                          ErrnoText(-errno)));
  struct stat st;
  const int stat_errno = fstat(fd, &st) == 0 ? 0 : errno;
  if (close(fd) != 0 && stat_errno == 0) {
    DALI_FAIL(dali::make_string(kOpName, ": image '", image_, "': close: ", ErrnoText(-errno)));
  }
  DALI_ENFORCE(stat_errno == 0, dali::make_string(kOpName, ": cannot stat image '", image_,
                                                  "': ", ErrnoText(-stat_errno)));
  DALI_ENFORCE(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode),
               dali::make_string(kOpName, ": image '", image_,
                                 "' is neither a regular file nor a block device"));
  if (!S_ISREG(st.st_mode)) return;  // a device's size is not st_size
  // A mapped index's ranges are not walked (O(N) page-ins at open):
  // fastread.PackedImage checked them where it verified the index, and a
  // range past the end fails its batch (FailSample).
  if (mapped_) return;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  for (size_t i = 0; i < ranges_.size(); i++) {
    DALI_ENFORCE(ranges_[i].offset + ranges_[i].length <= size,
                 dali::make_string(kOpName, ": sample ", paths_[i], " (bytes ", ranges_[i].offset,
                                   "..", ranges_[i].offset + ranges_[i].length,
                                   ") lies past the end of image '", image_, "' (", size,
                                   " bytes): the image is truncated or the ranges are another "
                                   "image's"));
  }
}

template <typename Backend>
std::string FileReader<Backend>::SampleName(int64_t index) const {
  // The reader's copy of a file's path is paths_[index]; an image's sample
  // is named by paths_ alone (fr_reader_path gives the image for all), or
  // by the mapped index's name, made when asked.
  if (mapped_) return image_ + "[" + mapped_->name(index) + "]";
  if (listed_) return listed_->name(index);
  return paths_[static_cast<size_t>(index)];
}

template <typename Backend>
void FileReader<Backend>::FailSample(int64_t index, int64_t neg_errno) const {
  if (!image_.empty() && neg_errno == -ENODATA) {
    const fr_range r = Range(index);
    DALI_FAIL(dali::make_string(kOpName, ": cannot read sample ", SampleName(index), " (bytes ",
                                r.offset, "..", r.offset + r.length, "): image '", image_,
                                "' ends inside it (truncated since the pipeline was built?)"));
  }
  DALI_FAIL(dali::make_string(kOpName, ": cannot read '", SampleName(index), "': ",
                              ErrnoText(neg_errno)));
}

template <typename Backend>
void FileReader<Backend>::MarkDense(fr_batch *batch) const {
  // The batch is ours alone here (not being read); the pool's lock orders
  // this store before the worker that takes it next.
  batch->dense = dense_ ? 1 : 0;
}

template <typename Backend>
bool FileReader<Backend>::Contiguous(const fr_batch *batch) {
  uint64_t end = batch->count ? batch->samples[0].offset : 0;
  for (size_t i = 0; i < batch->count; i++) {
    const fr_sample &s = batch->samples[i];
    if (s.length < 0 || s.offset != end) return false;
    end += static_cast<uint64_t>(s.length);
  }
  return true;
}

template <typename Backend>
BatchPtr FileReader<Backend>::TakeBatch() {
  this->QueueAhead(reader_.get(), ahead_);
  BatchPtr batch = this->TakeQueued(reader_.get(), "engine '" + engine_ + "'");
  MarkDense(batch.get());
  if (batch->dense_spill && image_.empty()) {
    // A file took the slow path in a dense batch: its growth check byte may
    // sit on the next sample's first byte (fastread.h). Rare; read them all.
    // (Range reads ask for no growth check byte and never set it.)
    for (size_t i = 0; i < batch->count; i++) {
      // A tree reader (file_index=) stores no whole paths: its name is made.
      const char *path = fr_reader_path(reader_.get(), static_cast<size_t>(batch->indices[i]));
      const std::string made = path || !listed_ ? std::string() : SampleName(batch->indices[i]);
      if (path || listed_) fr_batch_reread_first_byte(batch.get(), i, path ? path : made.c_str());
    }
  }
  for (size_t i = 0; i < batch->count; i++) {
    const fr_sample &s = batch->samples[i];
    if (s.length < 0) FailSample(batch->indices[i], s.length);
  }
  return batch;
}

template <typename Backend>
bool FileReader<Backend>::SetupImpl(std::vector<dali::OutputDesc> &output_desc,
                                     const dali::Workspace &ws) {
  // The outputs are not allocated by DALI: RunImpl hands it the batch's own
  // memory (CPU), or allocates them contiguous and copies into them (GPU),
  // so there is nothing to describe up front.
  if constexpr (kGpu) Reap();  // batches whose copies are done go back to the pool
  current_.reset();
  current_ = TakeBatch();  // throws, naming the path, on a failed sample
  return false;
}

template <typename Backend>
void FileReader<Backend>::Reap() {
  int rc = fr_upload_ring_reap(ring_.get());
  if (rc < 0) {
    char cuda[FR_ERRLEN];
    fr_gpu_last_error(gpu_.get(), cuda, sizeof(cuda));
    DALI_FAIL(dali::make_string(kOpName, "(device='gpu'): a copy to GPU ", device_id_,
                                " failed: ", cuda));
  }
}

template <typename Backend>
void FileReader<Backend>::RunImpl(dali::Workspace &ws) {
  DALI_ENFORCE(current_ != nullptr, dali::make_string(kOpName, ": Run without a batch"));
  if constexpr (kGpu)
    RunDevice(ws);
  else
    RunHost(ws);
}

template <typename Backend>
void FileReader<Backend>::RunDevice(dali::Workspace &ws) {
  // DALI allocates the outputs contiguous, in stream order on ws.stream();
  // the ring queues the copies on that stream, so whatever DALI runs next on
  // it sees them done, and it keeps the batch until an event says so.
  fr_batch *b = current_.get();
  const int n = static_cast<int>(b->count);
  auto &data = ws.Output<dali::GPUBackend>(0);
  auto &labels = ws.Output<dali::GPUBackend>(1);
  dali::TensorListShape<> shape(n, array_ndim_ >= 0 ? array_ndim_ : 1);
  for (int i = 0; i < n; i++) {
    if (array_ndim_ < 0) {
      shape.set_tensor_shape(i, dali::TensorShape<>{b->samples[i].length});
      continue;
    }
    // Arrays: each sample narrowed to its file's data part (the batch is
    // ours until the ring recycles it), so the ring copies one range each.
    CheckArrayFile(b, i);
    const size_t idx = static_cast<size_t>(b->indices[i]);
    const int64_t *dims = ArrayDims(idx);
    shape.set_tensor_shape(i, dali::TensorShape<>(dims, dims + array_ndim_));
    b->samples[i].offset += static_cast<uint64_t>(ArrayOffset(idx));
    b->samples[i].length = ArrayBytes(idx);
  }
  data.Resize(shape, array_ndim_ >= 0 ? array_dtype_ : DALI_UINT8,
              dali::BatchContiguity::Contiguous);
  labels.Resize(dali::uniform_list_shape<1>(n, {1}), DALI_INT32, dali::BatchContiguity::Contiguous);
  std::vector<int32_t> host_labels(static_cast<size_t>(n));
  for (int i = 0; i < n; i++)
    host_labels[static_cast<size_t>(i)] = Label(b->indices[i]);
  uint64_t data_dst = 0;
  if (shape.num_elements() > 0) {
    auto *base = static_cast<uint8_t *>(contiguous_raw_mutable_data(data));
    // The ring writes sample i right after sample i-1: DALI's contiguous
    // layout, checked rather than assumed.
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
      DALI_ENFORCE(data.raw_tensor(i) == base + offset || b->samples[i].length == 0,
                   dali::make_string(kOpName, "(device='gpu'): DALI laid out its contiguous "
                                              "output with gaps (sample ", i, ")"));
      offset += static_cast<uint64_t>(b->samples[i].length);
    }
    data_dst = reinterpret_cast<uintptr_t>(base);
  }
  uint64_t labels_dst = n ? reinterpret_cast<uintptr_t>(contiguous_raw_mutable_data(labels)) : 0;
  for (int i = 0; i < n; i++) data.SetSourceInfo(i, SampleName(b->indices[i]));
  char err[FR_ERRLEN] = "";
  // The ring owns the batch from here, on failure too.
  int rc = fr_upload_ring_push(ring_.get(), current_.release(), data_dst,
                               n ? host_labels.data() : nullptr, labels_dst,
                               reinterpret_cast<fr_CUstream>(ws.stream()), err, sizeof(err));
  DALI_ENFORCE(rc == 0, dali::make_string(kOpName, "(device='gpu'): ", err));
}

template <typename Backend>
void FileReader<Backend>::RunHost(dali::Workspace &ws) {
  // Zero-copy output: every sample is a view into the batch's arena, and the
  // arena goes back to the reader's pool when DALI drops the last of them
  // (fr_batch_recycle is thread-safe, so any DALI thread may do it). Copying
  // the batch into a fresh contiguous output cost a memcpy of every byte
  // plus the page faults of new output memory: about a third of the time
  // on a 2-core machine (perf).
  std::shared_ptr<fr_batch> batch(current_.release(), BatchRecycler());
  const fr_batch *b = batch.get();
  const int n = static_cast<int>(b->count);
  auto &data = ws.Output<dali::CPUBackend>(0);
  auto &labels = ws.Output<dali::CPUBackend>(1);
  labels.Resize(dali::uniform_list_shape<1>(n, {1}), DALI_INT32);
  for (int i = 0; i < n; i++) {
    labels.mutable_tensor<int32_t>(i)[0] = Label(b->indices[i]);
    if (array_ndim_ >= 0) CheckArrayFile(b, i);
  }

  data.Reset();
  // Say whether the arenas are page-locked (pin_device), even in a pipeline
  // with a GPU, whose CPU outputs DALI would otherwise take for pinned
  // memory and copy to the device as such.
  data.set_pinned(pinned_);
  if (array_ndim_ >= 0 && arrays_whole_ && Contiguous(b) && n > 0) {
    // Whole arrays back to back (a dense batch of an image's ranges): the
    // batch as one buffer of the arrays' shapes, passed on without a copy.
    dali::TensorListShape<> shape(n, array_ndim_);
    for (int i = 0; i < n; i++) {
      const int64_t *dims = ArrayDims(static_cast<size_t>(b->indices[i]));
      shape.set_tensor_shape(i, dali::TensorShape<>(dims, dims + array_ndim_));
    }
    size_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += static_cast<size_t>(b->samples[i].length);
    data.SetContiguity(dali::BatchContiguity::Contiguous);
    data.ShareData(std::shared_ptr<void>(batch, b->arena.base + b->samples[0].offset), bytes,
                   pinned_, shape, array_dtype_, data.device_id(), dali::AccessOrder::host());
  } else if (array_ndim_ >= 0) {
    // Arrays: each sample a view of its file's data part (past the header).
    data.SetContiguity(dali::BatchContiguity::Noncontiguous);
    data.set_type(array_dtype_);
    data.set_sample_dim(array_ndim_);
    data.SetSize(n);
    for (int i = 0; i < n; i++) {
      const size_t idx = static_cast<size_t>(b->indices[i]);
      const int64_t *dims = ArrayDims(idx);
      std::shared_ptr<void> view(batch, b->arena.base + b->samples[i].offset + ArrayOffset(idx));
      data.SetSample(i, std::move(view), static_cast<size_t>(ArrayBytes(idx)), pinned_,
                     dali::TensorShape<>(dims, dims + array_ndim_), array_dtype_,
                     data.device_id(), dali::AccessOrder::host());
    }
  } else if (Contiguous(b)) {
    // One block: the whole batch as one buffer, which DALI passes on
    // without copying it (perf: the copy was a quarter of the CPU time).
    dali::TensorListShape<> shape(n, 1);
    for (int i = 0; i < n; i++) shape.set_tensor_shape(i, dali::TensorShape<>{b->samples[i].length});
    const uint64_t first = b->samples[0].offset;
    const size_t bytes = static_cast<size_t>(shape.num_elements());
    data.SetContiguity(dali::BatchContiguity::Contiguous);
    data.ShareData(std::shared_ptr<void>(batch, b->arena.base + first), bytes, pinned_, shape,
                   DALI_UINT8, data.device_id(), dali::AccessOrder::host());
  } else {
    data.SetContiguity(dali::BatchContiguity::Noncontiguous);
    data.set_type(DALI_UINT8);
    data.set_sample_dim(1);
    data.SetSize(n);
    for (int i = 0; i < n; i++) {
      const fr_sample &s = b->samples[i];
      // A view that keeps the whole batch alive (shared_ptr's aliasing form).
      std::shared_ptr<void> bytes(batch, b->arena.base + s.offset);
      data.SetSample(i, std::move(bytes), static_cast<size_t>(s.length), pinned_,
                     dali::TensorShape<>{s.length}, DALI_UINT8, data.device_id(),
                     dali::AccessOrder::host());
    }
  }
  for (int i = 0; i < n; i++) {
    // As fn.readers.file: decoders name the file (the image's sample) in
    // their errors.
    data.SetSourceInfo(i, SampleName(b->indices[i]));
  }
}

template <typename Backend>
int64_t FileReader<Backend>::ArrayBytes(size_t idx) const {
  if (!mapped_) return array_bytes_[idx];
  // The mapped shapes were not walked at open: -1 for extents that are not
  // an array's (CheckArrayFile then fails the sample, naming it).
  const int64_t *dims = ArrayDims(idx);
  int64_t bytes = array_item_;
  for (int d = 0; d < array_ndim_; d++) {
    if (dims[d] < 0 || (dims[d] > 0 && bytes > INT64_MAX / dims[d])) return -1;
    bytes *= dims[d];
  }
  return bytes;
}

template <typename Backend>
void FileReader<Backend>::CheckArrayFile(const fr_batch *b, int i) const {
  const size_t idx = static_cast<size_t>(b->indices[i]);
  const int64_t expected = ArrayOffset(idx) + ArrayBytes(idx);
  if (b->samples[i].length != expected) {
    DALI_ENFORCE(image_.empty(),
                 dali::make_string(kOpName, ": sample ", SampleName(b->indices[i]), " is ",
                                   b->samples[i].length, " bytes, its shape in ",
                                   mapped_ ? "the index" : "npy_shapes", " needs ",
                                   expected < 0 ? std::string("no valid size (a negative or "
                                                              "overflowing extent)")
                                                : std::to_string(expected)));
    const char *path = fr_reader_path(reader_.get(), idx);
    DALI_FAIL(dali::make_string(kOpName, ": '", path ? path : "?", "' is ", b->samples[i].length,
                                " bytes now, ", expected,
                                " when its header was read: the file changed"));
  }
}

template <typename Backend>
void FileReader<Backend>::DropReadAhead() {
  current_.reset();
  this->DropQueued(reader_.get());
}

}  // namespace fastread_dali

DALI_REGISTER_OPERATOR(fastread__readers__File, ::fastread_dali::FileReader<::dali::CPUBackend>,
                       ::dali::CPU);
DALI_REGISTER_OPERATOR(fastread__readers__File, ::fastread_dali::FileReader<::dali::GPUBackend>,
                       ::dali::GPU);
DALI_REGISTER_OPERATOR(fastread__readers__File, ::fastread_dali::FileReader<::dali::MixedBackend>,
                       ::dali::Mixed);

DALI_SCHEMA(fastread__readers__File)
    .DocStr(R"(Reads files with fastread's native engines (io_uring, psync); outputs the
files' bytes (uint8) and their labels (int32, shape [1]), like ``fn.readers.file``.
With ``device="gpu"`` both outputs are in the pipeline's GPU memory: each batch is
read into page-locked memory and copied there with one copy of its bytes;
``device="mixed"`` does the same on DALI's mixed stream, so that the copies overlap
the GPU operators after it.

Samples are ``files`` (joined to ``file_root``) with ``labels``;
``fastread.dali.readers.file`` lists ``file_root`` / ``file_list`` with
fastread.index.scan (fn.readers.file's rules) and passes them here. With
``image``, the samples are byte ranges of a packed image instead
(``fastread.dali.readers.image`` passes its index). Epochs roll
over as in DALI's readers (see ``pipe.reader_meta(name)``).)")
    .NumInput(0)
    .NumOutput(2)
    .MakeStateful()
    .AddParent("fastread__ShardedReaderBase")
    .AddParent("fastread__EngineReaderBase")
    .AddOptionalArg("file_root", "Directory that relative ``files`` are joined to.",
                    std::string())
    .AddOptionalArg("files", "Paths of the samples.", std::vector<std::string>())
    .AddOptionalArg("labels", "One label per file (default: each file's position).",
                    std::vector<int>())
    .AddOptionalArg("image",
                    "A packed image (fastread pack) or block device whose byte ranges are the "
                    "samples (range_offsets / range_lengths), instead of files; files= then "
                    "names the samples (errors, source info).",
                    std::string())
    .AddOptionalArg("range_offsets", "With image: where each sample starts, in bytes.",
                    std::vector<int64_t>())
    .AddOptionalArg("range_lengths", "With image: each sample's length in bytes.",
                    std::vector<int64_t>())
    .AddOptionalArg("image_index",
                    "With image: its version-3 binary index, mapped by the operator (the "
                    "samples' ranges, labels and names; instead of files=, labels=, range_*). "
                    "fastread.dali.readers.image passes it with the index_* layout it found.",
                    std::string())
    .AddOptionalArg("index_head", "With image_index or file_index: its header line, as read.",
                    std::string())
    .AddOptionalArg<int64_t>("index_count", "With image_index or file_index: its samples.", 0)
    .AddOptionalArg("index_columns",
                    "With image_index: the file offsets of its offsets, lengths, labels, "
                    "name_offsets and names columns.",
                    std::vector<int64_t>())
    .AddOptionalArg<int64_t>("index_names_bytes", "With image_index: its names' bytes.", 0)
    .AddOptionalArg<int64_t>("index_bytes", "With image_index or file_index: the file's size.",
                             0)
    .AddOptionalArg("file_index",
                    "A binary listing of the files (full paths) and their labels, mapped by "
                    "the operator instead of files= and labels= (dali_plugin/mapped_file_list.h); "
                    "fastread.dali.readers.file writes it for long lists and passes index_head, "
                    "index_count, index_dirs and index_bytes.",
                    std::string())
    .AddOptionalArg<int64_t>("index_dirs", "With file_index: its directories.", 0)
    .AddOptionalArg("file_list",
                    "Not listed natively: fastread.dali.readers.file turns it into files=.",
                    std::string())
    .AddOptionalArg("random_shuffle",
                    "One permutation of the whole data set per epoch (same on every rank).",
                    false)
    .AddOptionalArg("shuffle_after_epoch", "Same as random_shuffle here.", false)
    .AddOptionalArg<int64_t>("seed",
                             "Shuffle seed. Give the same one on every rank: without it DALI "
                             "draws one per pipeline, and ranks' shards would not partition "
                             "the epoch (fastread.dali.readers.file passes -1, meaning 0).",
                             -1)
    .AddOptionalArg("prefetch_queue_depth", "Batches read ahead (at least 2 are).", 1)
    .AddOptionalArg("engine", "fastread engine: auto, io_uring, psync, ...", std::string("auto"))
    .AddOptionalArg("queue_depth", "io_uring: files in flight per ring (0: default).", 0)
    .AddOptionalArg("threads", "psync threads / io_uring rings per worker (-1: one per two CPUs, at most 4).", -1)
    .AddOptionalArg("o_direct", "Open files with O_DIRECT.", false)
    .AddOptionalArg("dense",
                    "Lay each batch out back to back and hand it to DALI as one buffer, "
                    "which DALI does not copy (not with o_direct, which needs aligned slots).",
                    true)
    .AddOptionalArg("direct_alignment", "O_DIRECT alignment in bytes.", 4096)
    .AddOptionalArg("pin_device",
                    "Page-lock the reader's buffers through this CUDA device's primary context, "
                    "so that DALI's copies of the outputs to the GPU are DMA from them (-1: "
                    "pageable; fastread.dali.readers.file passes the pipeline's device_id). "
                    "Falls back to pageable memory, with a warning, where it cannot.",
                    -1)
    .AddOptionalArg("npy_ndim",
                    "Arrays instead of bytes (fastread.dali.readers.numpy): every file holds "
                    "one C-ordered array of npy_ndim dimensions (-1: files as bytes).", -1)
    .AddOptionalTypeArg("npy_dtype", "The arrays' element type.", DALI_NO_TYPE)
    .AddOptionalArg("npy_data_offsets",
                    "Per file: where its array's data starts (after the .npy header).",
                    std::vector<int64_t>())
    .AddOptionalArg("npy_shapes", "Per file: its array's npy_ndim extents, flattened.",
                    std::vector<int64_t>());

// The one definition of engine_args_ref.h's registration (a token of
// fastread.dali's making; 0, or -EINVAL / -ENOMEM).
extern "C" __attribute__((visibility("default"))) int fastread_dali_register_engine_args(
    const char *token, const char *args) {
  if (!token || !*token || !args) return -EINVAL;
  try {
    fastread_dali::EngineArgsTable &t = fastread_dali::engine_args_table();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.args[token] = args;
  } catch (const std::bad_alloc &) {
    return -ENOMEM;
  }
  return 0;
}
