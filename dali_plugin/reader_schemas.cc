// The arguments every fastread reader operator takes alike, once: the
// operators' schemas name these as parents (DALI's own readers share
// LoaderBase the same way), so one text documents them and one default
// holds for all. Each operator still reads them from its OpSpec.
#include <cstdint>
#include <string>

#include "dali/pipeline/operator/op_schema.h"

// Sharding, padding, elastic batches and the block shuffle
// (fastread_reader.cc, fastread_webdataset.cc, fastread_cassandra.cc).
DALI_SCHEMA(fastread__ShardedReaderBase)
    .DocStr("Sharding and shuffling arguments of fastread's reader operators.")
    .MakeDocHidden()
    .AddOptionalArg("shard_id", "Index of this shard.", 0)
    .AddOptionalArg("num_shards", "Number of shards the samples are split into.", 1)
    .AddOptionalArg("pad_last_batch",
                    "Pad every shard with its last sample to equal shards and whole batches.",
                    false)
    .AddOptionalArg("stick_to_shard", "Read the same shard every epoch.", false)
    .AddOptionalArg<int64_t>("global_batch_size",
                             "Elastic sharding (0: off): each epoch's order of the whole data "
                             "set, cut into global batches of this size, every rank reading its "
                             "slice (batch_size = global_batch_size / num_shards); checkpoints "
                             "then resume at another num_shards. Needs pad_last_batch and "
                             "stick_to_shard.",
                             int64_t{0})  // not a bare 0: that would pick the no-default overload
    .AddOptionalArg<int64_t>("shuffle_block",
                             "With random_shuffle: 0, a full shuffle (fr_order's); N > 0, the "
                             "block order: blocks of N consecutive samples permuted, samples "
                             "permuted within windows of shuffle_window blocks (runs of "
                             "neighbouring samples: fastread.sampling.check_shuffle).",
                             int64_t{0})
    .AddOptionalArg<int64_t>("shuffle_window",
                             "Blocks of a window with shuffle_block (>= 1 there).", int64_t{0});

// The file engines' options (fastread_reader.cc, fastread_webdataset.cc).
DALI_SCHEMA(fastread__EngineReaderBase)
    .DocStr("Engine options of fastread's file reader operators.")
    .MakeDocHidden()
    .AddOptionalArg("workers", "Reader threads, each with its own engine context (0: auto).", 0)
    .AddOptionalArg("register_buffers", "io_uring: register arenas (where the kernel allows).",
                    true)
    .AddOptionalArg("register_files", "io_uring: direct descriptors (where the kernel allows).",
                    true)
    .AddOptionalArg("engine_args", "Engine-specific key=value,... options.", std::string());
