// api/trainer_live.h: what a training run reports about itself while it trains, beside its losses
// (api/trainer.cc writes them into metrics.jsonl and the log; `aspen monitor` reads them): each device's load
// (NOTE [device load]) and the moves of layers between pipeline stages (parallel.balance: dynamic).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "api/trainer_feed.h"
#include "api/training_model.h"
#include "core/status.h"
#include "train/report.h"

namespace aspen::api {

// The last run()'s per-device shares ("busy.<device>", "wait.", "comm.", "gbps."; under MPI every process's
// devices as "p<k>/<device>"). Collective under MPI: every process calls it after each run(). Empty for one
// device.
Result<std::vector<std::pair<std::string, double>>> device_load(const TrainingModel& model);

// NOTE [data per replica]: what each replica of the job drew for training in this invocation ("data.r<k>",
// examples) and how many draws of the last call gave a replica an (epoch, example) another replica also drew
// ("data.duplicates": 0 unless the data were sharded wrong). A replica fed in several processes (pipeline
// stages or tensor shards there) draws the same examples in each: those are one replica's copies, counted once.
// Collective under MPI (two all-gathers: every process calls it after each call); one process: `feed`'s own.
// Empty with one replica.
Result<std::vector<std::pair<std::string, double>>> data_consumed(const TrainFeed& feed, parallel::Communicator* job);
// The same from every process's lists (`drawn`: (example key, global replica) pairs).
std::vector<std::pair<std::string, double>> data_line(const std::vector<int64_t>& replicas,
                                                      const std::vector<int64_t>& examples,
                                                      std::vector<std::pair<int64_t, int64_t>> drawn);

// The stage moves, failed moves and measured gains the last run() brought (from `logged` and `failures` on,
// which it advances), as log lines through `progress` and lines of `metrics` (null: none).
Status log_stage_moves(const TrainingModel& model, size_t& logged, size_t& failures, train::MetricsLog* metrics,
                       train::Progress& progress);

}  // namespace aspen::api
