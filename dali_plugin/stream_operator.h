// What fastread's DALI reader operators (fastread_reader.cc, fastread_cassandra.cc,
// fastread_webdataset.cc) share as DALI readers: the sample stream built
// from DALI's reader arguments (plugin_common.h's SampleStream), the reader
// metadata DALI's iterators ask for (pipe.reader_meta(name)), and
// checkpoints of the stream's position (pipe.checkpoint(),
// Pipeline(checkpoint=...)).
//
// An operator derives from StreamOperator<Backend>, starts its stream in
// its constructor (StartStream), takes each batch's samples from
// SubmitNext when it queues a read and calls Taken when it hands the
// oldest queued batch to DALI, and drops what it read ahead when a
// checkpoint is restored (DropReadAhead). The checkpoint is the stream's
// position after the last batch taken, with the seed.
#ifndef FASTREAD_DALI_STREAM_OPERATOR_H
#define FASTREAD_DALI_STREAM_OPERATOR_H

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "dali/pipeline/operator/checkpointing/op_checkpoint.h"
#include "dali/pipeline/operator/operator.h"
#include "plugin_common.h"

namespace fastread_dali {

template <typename Backend>
class StreamOperator : public dali::Operator<Backend> {
 public:
  // Epochs of the shard as DALI's readers report them (pad_last_batch:
  // every shard padded to ceil(n / num_shards)).
  dali::ReaderMeta GetReaderMeta() const override {
    const StreamArgs &args = stream_.Args();
    dali::ReaderMeta meta;
    meta.epoch_size = args.n;
    meta.epoch_size_padded =
        args.global_batch > 0
            ? (args.n + args.global_batch - 1) / args.global_batch * args.global_batch
        : args.pad ? (args.n + args.num_shards - 1) / args.num_shards * args.num_shards
                   : args.n;
    meta.number_of_shards = args.num_shards;
    meta.shard_id = args.shard_id;
    meta.pad_last_batch = args.pad;
    meta.stick_to_shard = args.stick;
    return meta;
  }

  void SaveState(dali::OpCheckpoint &cpt, dali::AccessOrder order) override {
    DALI_ENFORCE(checkpointing_, dali::make_string(op_name_, ": cannot save a checkpoint: the "
                                                   "pipeline was built without checkpointing"));
    cpt.MutableCheckpointState() = taken_;
  }

  void RestoreState(const dali::OpCheckpoint &cpt) override {
    DALI_ENFORCE(checkpointing_, dali::make_string(op_name_, ": cannot restore a checkpoint: the "
                                                   "pipeline was built without checkpointing"));
    const StreamPos &at = cpt.CheckpointState<StreamPos>();
    // Drop the read-ahead of the old position; the next batches come from `at`.
    DropReadAhead();
    submitted_.clear();
    // Only a checkpoint from before the arguments were recorded gets here
    // unchecked (ParseStreamPos): its position must at least exist.
    DALI_ENFORCE(stream_.Seek(at),
                 dali::make_string(op_name_, ": a checkpoint at sample ", at.pos, " of epoch ",
                                   at.epoch, ", past the end of this reader's epoch: it was "
                                   "saved by a reader of other arguments"));
    taken_ = at;
  }

  std::string SerializeCheckpoint(const dali::OpCheckpoint &cpt) const override {
    return SerializeStreamPos(tag_, cpt.CheckpointState<StreamPos>(), stream_.Args());
  }

  void DeserializeCheckpoint(dali::OpCheckpoint &cpt, const std::string &data) const override {
    StreamPos at;
    const std::string why = ParseStreamPos(tag_, data, &at, stream_.Args());
    DALI_ENFORCE(why.empty(), dali::make_string(op_name_, ": ", why, ": '", data, "'"));
    cpt.MutableCheckpointState() = at;
  }

 protected:
  // `op_name` names the operator in messages; `checkpoint_tag` marks its
  // checkpoints' text (a checkpoint of one operator is refused by another).
  StreamOperator(const dali::OpSpec &spec, const char *op_name, const char *checkpoint_tag)
      : dali::Operator<Backend>(spec), op_name_(op_name), tag_(checkpoint_tag) {}

  // The stream of `n` samples from DALI's reader arguments in `spec`
  // (shard_id, num_shards, pad_last_batch, stick_to_shard, seed,
  // checkpointing), checked, naming the argument. `shuffle`: the operator's
  // shuffle arguments; `fill`: its shuffle buffer (StreamArgs::fill).
  void StartStream(const dali::OpSpec &spec, int64_t n, bool shuffle, int64_t fill) {
    StreamArgs args;
    args.n = n;
    args.shard_id = spec.GetArgument<int>("shard_id");
    args.num_shards = spec.GetArgument<int>("num_shards");
    DALI_ENFORCE(args.num_shards >= 1, dali::make_string(op_name_, ": num_shards must be >= 1, "
                                                         "got ", args.num_shards));
    DALI_ENFORCE(args.shard_id >= 0 && args.shard_id < args.num_shards,
                 dali::make_string(op_name_, ": shard_id must be in [0, ", args.num_shards,
                                   "), got ", args.shard_id));
    DALI_ENFORCE(args.num_shards <= n,
                 dali::make_string(op_name_, ": the number of samples (", n,
                                   ") must be at least num_shards (", args.num_shards, ")"));
    args.shuffle = shuffle;
    args.pad = spec.GetArgument<bool>("pad_last_batch");
    args.stick = spec.GetArgument<bool>("stick_to_shard");
    args.batch_size = this->max_batch_size_;
    args.fill = fill;
    // random_shuffle with shuffle_block > 0: the core's block order.
    args.block = spec.GetArgument<int64_t>("shuffle_block");
    args.window = spec.GetArgument<int64_t>("shuffle_window");
    DALI_ENFORCE(args.block >= 0 && args.window >= 0,
                 dali::make_string(op_name_, ": shuffle_block and shuffle_window must be >= 0, "
                                   "got ", args.block, " and ", args.window));
    if (args.block > 0) {
      DALI_ENFORCE(shuffle, dali::make_string(op_name_, ": shuffle_block applies only with "
                                              "random_shuffle"));
      DALI_ENFORCE(fill == 0, dali::make_string(op_name_, ": shuffle_block and initial_fill "
                                                "exclude each other"));
      DALI_ENFORCE(args.window >= 1, dali::make_string(op_name_, ": shuffle_window must be >= 1 "
                                                       "with shuffle_block, got ", args.window));
    } else {
      args.window = 0;
    }
    args.global_batch = spec.GetArgument<int64_t>("global_batch_size");
    if (args.global_batch != 0) {
      DALI_ENFORCE(args.global_batch > 0,
                   dali::make_string(op_name_, ": global_batch_size must be >= 0 (0: per-shard "
                                     "order), got ", args.global_batch));
      DALI_ENFORCE(args.global_batch % args.num_shards == 0,
                   dali::make_string(op_name_, ": global_batch_size=", args.global_batch,
                                     " is not divisible by num_shards=", args.num_shards,
                                     ": every rank reads an equal slice of each global batch"));
      DALI_ENFORCE(args.batch_size == args.global_batch / args.num_shards,
                   dali::make_string(op_name_, ": the pipeline's batch_size (", args.batch_size,
                                     ") must be global_batch_size=", args.global_batch,
                                     " / num_shards=", args.num_shards, " = ",
                                     args.global_batch / args.num_shards));
      DALI_ENFORCE(args.pad, dali::make_string(op_name_, ": global_batch_size needs "
                                               "pad_last_batch=True (epochs roll over: a partial "
                                               "last global batch would be filled from the next "
                                               "epoch)"));
      DALI_ENFORCE(args.stick, dali::make_string(op_name_, ": global_batch_size needs "
                                                 "stick_to_shard=True (each epoch's global order "
                                                 "is new; no rank moves between shards)"));
    }
    int64_t seed = spec.GetArgument<int64_t>("seed");
    DALI_ENFORCE(seed >= -1, dali::make_string(op_name_, ": seed must be >= -1, got ", seed));
    if (seed < 0) seed = 0;  // -1: 0, so every rank draws the same permutation
    stream_ = SampleStream(args, seed);
    checkpointing_ = spec.GetArgument<bool>("checkpointing");
    taken_ = stream_.Position();
    submitted_.clear();
  }

  // The next batch's samples, for a read queued now; its stream position
  // is kept until the batch is taken.
  std::vector<int64_t> SubmitNext() {
    std::vector<int64_t> idx = stream_.NextBatch();
    submitted_.push_back(stream_.Position());
    return idx;
  }

  // The oldest queued batch goes to DALI: a checkpoint now resumes after it.
  void Taken() {
    taken_ = submitted_.front();
    submitted_.pop_front();
  }

  // Batches queued (SubmitNext) and not yet taken.
  size_t Queued() const { return submitted_.size(); }

  // For an operator over one fr_reader (fastread_reader.cc,
  // fastread_cassandra.cc): queues reads of the stream's next batches until
  // `ahead` are queued.
  void QueueAhead(fr_reader *rd, size_t ahead) {
    while (Queued() < ahead) {
      std::vector<int64_t> idx = SubmitNext();
      const int rc = fr_reader_submit(rd, idx.data(), idx.size());
      DALI_ENFORCE(rc == 0, dali::make_string(op_name_, ": cannot queue a batch: ",
                                              ErrnoText(rc)));
    }
  }
  // Then the oldest queued batch, taken (Taken) and checked as a whole;
  // `what` (e.g. "engine 'psync'", "table 'ks.t'") says whose read failed.
  // Its samples' failures are the operator's to report.
  BatchPtr TakeQueued(fr_reader *rd, const std::string &what) {
    fr_batch *raw = nullptr;
    const int rc = fr_reader_next(rd, &raw);
    DALI_ENFORCE(rc == 0, dali::make_string(op_name_, ": ", what, ": reader failed: ",
                                            ErrnoText(rc)));
    Taken();
    BatchPtr batch(raw);
    DALI_ENFORCE(batch->status == 0, dali::make_string(op_name_, ": ", what, ": a batch failed: ",
                                                       ErrnoText(batch->status)));
    return batch;
  }
  // Drops what the reader queued (DropReadAhead of such an operator).
  void DropQueued(fr_reader *rd) { fr_reader_reset(rd); }

  // Drops every batch read or being read ahead (RestoreState, before the
  // stream moves to the checkpoint's position).
  virtual void DropReadAhead() = 0;

  const char *const op_name_;
  SampleStream stream_;

 private:
  const char *const tag_;
  bool checkpointing_ = false;
  // The stream position after each queued batch not yet taken, and after
  // the batch last taken (what a checkpoint holds).
  std::deque<StreamPos> submitted_;
  StreamPos taken_;
};

}  // namespace fastread_dali

#endif  // FASTREAD_DALI_STREAM_OPERATOR_H
