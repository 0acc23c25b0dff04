// tools/train_command.cc: `aspen train`, the training job (api/trainer.h).
//
//   aspen train CONFIG.yaml [--resume | --resume-from CHECKPOINT | --overwrite] [--replicas N] [--stages N]
//                           [--balance estimated|measured|dynamic] [--tensor-parallel N] [--steps N] [--seed S]
//                           [--set KEY=VALUE]...
//   aspen train --demo [--steps N] [--run-dir DIR] [--threads N] [--replicas N] [--stages N]
//                      [--tensor-parallel N] [--set KEY=VALUE]...
//   mpirun -np P aspen train ...   (data parallel over P processes)
//
// --replicas N trains N data-parallel replicas (batch.replicas): devices of
// this process, or under mpirun N / P in each process. The demo keeps its
// global batch of 16 and gives each replica 16 / N examples; under mpirun it
// uses one replica per process unless told otherwise. Under mpirun only
// process 0 prints and writes files.
//
// A run directory that holds a run is refused unless --resume (continue it),
// --resume-from (continue from a given checkpoint, e.g. the one before a
// damaged latest) or --overwrite (delete it and start again); the demo
// replaces its own earlier run and says so. Ctrl-C or SIGTERM (also under
// mpirun, which relays Ctrl-C as SIGTERM: NOTE [launcher stop]) finishes the
// step in flight, writes a checkpoint, prints the command that resumes and
// exits 130 (143 for SIGTERM); a second signal exits at once.
//
// --demo needs no files: it writes a byte-level tokenizer and a two-digit
// addition corpus (train/demo.h) into the run directory, trains a small
// GPT-2 from scratch on it, then asks the trained model the 1,000 held-out
// problems it never saw and prints its accuracy and some of its answers.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "api/trainer.h"
#include "parallel/mesh.h"
#include "parallel/job.h"
#include "models/generate.h"
#include "api/run_profile.h"
#include "profile/profile_dir.h"
#include "tools/commands.h"
#include "train/config.h"
#include "train/demo.h"
#include "train/plan.h"

namespace aspen::tools {

namespace {

struct TrainArgs {
  std::string config, resume_from;
  bool demo = false, resume = false, overwrite = false;
  bool print_plan = false;  // print one step's per-device instruction lists (train/plan.h) and stop
  int64_t steps = 0;  // 0: the config's (the demo's default)
  int64_t seed = -1;  // -1: the config's
  int threads = -1;   // -1: the config's; 0: the free cores
  int64_t replicas = 0;  // 0: the config's (the demo: one per process)
  int64_t stages = 0, tensor_parallel = 0;  // 0: the config's
  std::string balance;  // "": the config's parallel.balance
  std::string run_dir;
  std::vector<std::string> overrides;
  std::string profile;  // "": $ASPEN_PROFILE, else none
  int64_t profile_steps = 10;
  int64_t profile_every = 1;
};

// The demo's config: a 4-layer GPT-2 (about 0.8M parameters plus embeddings)
// on 64-token windows of the addition corpus.
train::TrainConfig demo_config(const std::string& run_dir) {
  train::TrainConfig c;
  c.name = "demo";
  c.model.family = "gpt2";
  c.model.n_layer = 4, c.model.n_head = 4, c.model.d_model = 128, c.model.n_positions = 64;
  c.data.train = run_dir + "/data";
  c.data.tokenizer = run_dir + "/tokenizer";
  c.data.seq = 64;
  c.data.packing = true;  // each problem alone, at positions 0.. (NOTE [demo recipe] in train/demo.h)
  c.data.val_fraction = 0.02;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 3e-3;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.clip_grad_norm = 1.0;
  c.schedule.name = "cosine";
  c.schedule.warmup_steps = 100;
  c.schedule.min_lr_ratio = 0.1;
  c.batch.micro = 16;
  c.train.steps = 2000;
  c.checkpoint.interval = 500;
  c.eval.interval = 250;
  c.eval.batches = 8;
  c.log.run_dir = run_dir;
  c.log.interval = 10;
  return c;
}

// Greedy answers of the trained model to the held-out problems.
Status report_addition(const std::string& model_dir, const train::AdditionTask& task, int threads) {
  constexpr int64_t kBatch = 100;
  models::GeneratorOptions go;
  go.max_batch = kBatch;
  go.max_prompt = 6;   // "99+99="
  go.max_length = 12;  // + "198" + eos, with room
  go.threads = threads;
  ASPEN_ASSIGN_OR_RETURN(auto gen, models::Generator::open(model_dir, go));
  models::SamplingOptions so;
  so.max_new_tokens = 4;
  so.temperature = 0.0f;
  so.stop_tokens = {train::kByteEosId};
  int64_t right = 0;
  std::vector<std::string> shown;
  for (size_t first = 0; first < task.test.size(); first += kBatch) {
    const size_t n = std::min<size_t>(kBatch, task.test.size() - first);
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < n; ++i) {
      const std::string p = train::addition_prompt(task.test[first + i].first, task.test[first + i].second);
      prompts.emplace_back(p.begin(), p.end());
    }
    ASPEN_ASSIGN_OR_RETURN(auto outs, gen->generate(prompts, so));
    for (size_t i = 0; i < n; ++i) {
      const auto [a, b] = task.test[first + i];
      std::string answer;
      for (int32_t id : outs[i])
        if (id != train::kByteEosId && id < 256) answer += char(id);
      const bool ok = answer == train::addition_answer(a, b);
      right += ok;
      if (shown.size() < 12)
        shown.push_back(train::addition_prompt(a, b) + answer + (ok ? "   right" : "   wrong (" +
                                                                     train::addition_answer(a, b) + ")"));
    }
  }
  std::cout << "held-out problems (never seen in training), greedy answers:\n";
  for (const std::string& s : shown) std::cout << "  " << s << "\n";
  std::cout << std::fixed << std::setprecision(1) << "held-out accuracy: "
            << 100.0 * double(right) / double(task.test.size()) << "% (" << right << " of " << task.test.size()
            << ")\n";
  return Status();
}

// Ctrl-C and SIGTERM: the first asks the trainer to stop after the step in
// flight (it checkpoints); the second ends the process at once.
std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};  // the first stop signal (the exit code is 128 + it)
const char* g_activity = nullptr;  // under mpirun: what the process last waited for (parallel::job::activity)

void say(const char* text) { (void)!::write(2, text, strlen(text)); }

void on_stop_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  if (g_stop.exchange(true)) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);  // the second: die as the signal would have killed us
    return;
  }
  if (sig == SIGTERM && g_activity) {
    // NOTE [launcher stop]: mpirun puts each rank in a process group of its own, so a terminal's Ctrl-C
    // reaches mpirun alone, which relays it to every rank as SIGTERM (and SIGKILL about a second later,
    // its odls_base_sigkill_timeout). The same SIGTERM ends the job when a rank has died. Either way this
    // rank stops after the step in flight, and the job writes its checkpoint if the launcher waits long
    // enough (checkpoint.minutes bounds what is lost when it does not).
    say("\naspen: SIGTERM from the MPI launcher (Ctrl-C on mpirun, or another rank ended): stopping after the "
        "current step to write a checkpoint");
    if (*g_activity) {
      say(" (this process last waited ");
      say(g_activity);
      say(")");
    }
    say("\n");
    return;
  }
  say("\naspen: stopping after the current step to write a checkpoint (Ctrl-C again to quit at once)\n");
}

// Under mpirun SIGTERM is how the launcher relays Ctrl-C (NOTE [launcher stop]): it asks for the same
// agreed stop and checkpoint as SIGINT does.
void install_stop_handlers(bool mpi) {
  if (mpi) g_activity = parallel::job::activity();
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

// The command that continues this run: the same flags, --resume instead of
// --overwrite or --resume-from.
std::string resume_command(const TrainArgs& a) {
  auto quoted = [](const std::string& s) {
    if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+") ==
                          std::string::npos)
      return s;
    std::string q = "'";
    for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
  };
  std::string cmd = "aspen train " + (a.demo ? std::string("--demo") : quoted(a.config));
  if (!a.run_dir.empty()) cmd += " --run-dir " + quoted(a.run_dir);
  if (a.steps > 0) cmd += " --steps " + std::to_string(a.steps);
  if (a.seed >= 0) cmd += " --seed " + std::to_string(a.seed);
  if (a.threads >= 0) cmd += " --threads " + std::to_string(a.threads);
  if (a.replicas > 0) cmd += " --replicas " + std::to_string(a.replicas);
  if (a.stages > 0) cmd += " --stages " + std::to_string(a.stages);
  if (a.tensor_parallel > 0) cmd += " --tensor-parallel " + std::to_string(a.tensor_parallel);
  if (!a.balance.empty()) cmd += " --balance " + a.balance;
  for (const std::string& o : a.overrides) cmd += " --set " + quoted(o);
  return cmd + " --resume";
}

// Under mpirun: every process waits here until all have arrived (process 0
// has written what the others read).
Status barrier(bool mpi) {
  if (!mpi) return Status();
  ASPEN_ASSIGN_OR_RETURN(auto world, parallel::job::world("a barrier of the job"));
  float one = 1.0f;
  return world->all_reduce(std::span<float>(&one, 1));
}

int train_job(const TrainArgs& a, bool mpi, int processes, bool writer) {
  std::ostream null_stream(nullptr);
  std::ostream& say = writer ? std::cout : null_stream;
  train::TrainConfig c;
  train::AdditionTask task;
  api::TrainerOptions to;
  if (a.demo) {
    const std::string dir = a.run_dir.empty() ? "runs/demo" : a.run_dir;
    c = demo_config(dir);
    task = train::make_addition_task(a.seed >= 0 ? uint64_t(a.seed) : c.train.seed);  // --seed draws the split too
    if (writer) {  // the lock before the corpus: a second demo in this directory must not rewrite it under us
      auto lock = api::lock_run_directory(dir);
      if (!lock.is_ok()) return report(lock.status());
      to.run_lock = *lock;
    }
    to.overwrite = true;  // the demo replaces its own earlier run (the trainer says so)
    if (!a.resume && writer) {
      say << "demo: two-digit addition; writing the tokenizer and corpus into " << dir << "\n";
      if (Status s = train::write_byte_tokenizer(c.data.tokenizer); !s.is_ok()) return report(s);
      auto idx = train::write_addition_shards(task, 8, c.data.train, c.data.tokenizer);
      if (!idx.is_ok()) return report(idx.status());
      say << "corpus: " << task.train.size() << " training problems x 8 shuffled passes = " << idx->total_tokens
          << " tokens; " << task.test.size() << " problems held out\n";
    }
    if (Status s = barrier(mpi); !s.is_ok()) return report(s);
    // By default every process is a replica, or with stages or shards (one
    // per process) the model spans the processes.
    const int64_t replicas =
        a.replicas > 0 ? a.replicas : parallel::default_replicas(int(a.stages), int(a.tensor_parallel), int(processes));
    if (c.batch.micro % replicas != 0) {
      return report(Status::invalid_argument("--replicas", "a divisor of the demo's global batch (16)",
                                             std::to_string(replicas)));
    }
    c.batch.micro /= replicas;  // the same global batch, shared out
    c.batch.replicas = replicas;
  } else {
    auto loaded = train::load_train_config(a.config);
    if (!loaded.is_ok()) return report(loaded.status());
    c = std::move(loaded).value();
    if (!a.run_dir.empty()) c.log.run_dir = a.run_dir;
  }
  if (a.steps > 0) {
    c.train.steps = a.steps;
    if (a.demo) {  // a shorter demo keeps its proportions
      c.checkpoint.interval = 0;
      c.eval.interval = std::max<int64_t>(1, a.steps / 4);
      c.schedule.warmup_steps = std::min<int64_t>(c.schedule.warmup_steps, a.steps / 10);
    }
  }
  if (a.threads >= 0) c.train.threads = a.threads;
  if (a.seed >= 0) c.train.seed = uint64_t(a.seed);
  if (a.replicas > 0 && !a.demo) c.batch.replicas = a.replicas;
  if (a.stages > 0) c.parallel.pipeline_stages = a.stages;
  if (!a.balance.empty()) c.parallel.balance = a.balance;
  if (a.tensor_parallel > 0) c.parallel.tensor_parallel = a.tensor_parallel;
  for (const std::string& o : a.overrides)
    if (Status s = train::apply_override(c, o); !s.is_ok()) return report(s);
  if (a.demo && c.log.run_dir != (a.run_dir.empty() ? "runs/demo" : a.run_dir)) {
    std::cerr << "aspen: error: --set log.run_dir with --demo: give the demo's directory with --run-dir\n";
    return kExitUsage;
  }
  if (a.demo) {
    c.sample.prompts = {};
    for (size_t i = 0; i < 3 && i < task.test.size(); ++i)
      c.sample.prompts.push_back(train::addition_prompt(task.test[i].first, task.test[i].second));
    c.sample.max_new_tokens = 4;
  }
  if (c.schedule.warmup_steps > c.train.steps) {
    say << "aspen: warning: schedule.warmup_steps (" << c.schedule.warmup_steps << ") is more than train.steps ("
        << c.train.steps << "); warming up over all " << c.train.steps
        << " steps (set schedule.warmup_steps to choose)\n";
    c.schedule.warmup_steps = c.train.steps;
  }
  if (Status s = c.validate(); !s.is_ok()) return report(s);
  to.resume = a.resume;
  to.resume_from = a.resume_from;
  to.overwrite = to.overwrite || a.overwrite;
  to.mpi = mpi;
  to.stop_requested = &g_stop;
  to.profile = profile::profile_dir_choice(a.profile);
  to.profile_steps = a.profile_steps;
  to.profile_every = a.profile_every;
  auto trainer = api::Trainer::create(c, to);
  if (!trainer.is_ok()) return report(trainer.status());
  std::string layout;
  // The job's layout, as the trainer placed it (parallel::place: it accepted this shape).
  const bool across = parallel::place(train::mesh_shape(c), int(processes), "batch.replicas").value().across;
  if (across)
    layout = ", " + std::to_string(c.batch.replicas) + " replica" + (c.batch.replicas > 1 ? "s" : "") + " across " +
             std::to_string(processes) + " processes (one " +
             (c.parallel.pipeline_stages > 1 && c.parallel.tensor_parallel > 1 ? "tensor shard of a stage"
              : c.parallel.pipeline_stages > 1                                 ? "stage"
                                                                               : "tensor shard") +
             " each)";
  else if (c.batch.replicas > 1 || processes > 1)
    layout = ", " + std::to_string(c.batch.replicas) + " replicas (" + std::to_string(processes) + " process" +
             (processes > 1 ? "es" : "") + " x " + std::to_string(c.batch.replicas / processes) + ")";
  if (c.parallel.tensor_parallel > 1)
    layout += ", " + std::to_string(c.parallel.tensor_parallel) + " tensor shards" +
              ((*trainer)->vocab_parallel() ? " (vocabulary split)" : "");
  if (c.parallel.pipeline_stages > 1)
    layout += ", " + std::to_string(c.parallel.pipeline_stages) + " pipeline stages (" + c.parallel.schedule + ")";
  if (auto kind = c.model.attention.find("kind"); kind != c.model.attention.end()) {
    auto block = c.model.attention.find("block");
    layout += ", " + kind->second + " sparse attention" +
              (block != c.model.attention.end() ? " (blocks of " + block->second + ")" : std::string());
  }
  const bool tokens = (*trainer)->tokens();
  const std::string model = c.model.is_onnx()      ? "the ONNX model " + c.model.from
                            : c.model.from.empty() ? c.model.family + " from scratch"
                            : (*trainer)->model_config().bert()
                                ? "BERT (masked language modelling, " + std::to_string(int(c.data.mlm_probability * 100 + 0.5)) +
                                      "% of tokens) from " + c.model.from
                                : (*trainer)->model_config().model_type + " from " + c.model.from;
  say << "training " << c.name << ": " << model << ", " << c.optimizer.name << " lr " << c.optimizer.lr << ", batch "
      << c.global_batch() << (tokens ? " x " + std::to_string(c.data.seq) + " tokens" : " examples") << layout << ", "
      << c.train.steps << " steps"
      << ((*trainer)->step() > 0 ? ", resuming at step " + std::to_string((*trainer)->step()) : std::string())
            << "; run directory " << (*trainer)->run_dir() << "\n";
  say << std::setprecision(2) << std::fixed << "compile: " << (*trainer)->compile_seconds() << " s (executable cache: "
      << (c.train.executable_cache.empty() ? "off"
          : (*trainer)->cache_hit()        ? "hit"
          : (*trainer)->cache_stored()     ? "miss, stored"
                                           : "miss, not stored: see the warning above")
      << ")\n"
      << "kernels: " << (*trainer)->kernel_choices() << "\n"
      << std::defaultfloat << std::setprecision(6);
  if (a.print_plan) {  // the layout's step as each device runs it, then stop before training
    if (writer) std::cout << train::plan_text((*trainer)->model()->plan());
    trainer->reset();
    return 0;
  }
  auto r = (*trainer)->run();
  if (!r.is_ok()) return report(r.status());
  trainer->reset();  // its communicators go before MPI does
  if (r->interrupted) {  // the trainer said where the checkpoint is; this is the command that continues
    if (writer && r->steps > 0) std::cerr << "resume with: " << resume_command(a) << "\n";
    return 128 + (g_signal.load() ? g_signal.load() : SIGINT);
  }
  if (!writer) return 0;
  std::cout << std::setprecision(4) << "loss: " << r->first_loss << " at the first step of this run, " << r->last_loss
            << " at step " << r->steps;
  if (r->last_val_loss >= 0) std::cout << "; validation loss " << r->last_val_loss;
  std::cout << std::setprecision(0) << std::fixed << "; " << r->tokens_per_s << (tokens ? " tokens/s" : " examples/s");
  if (r->skipped_steps) std::cout << "; " << r->skipped_steps << " steps skipped (loss-scale overflow)";
  std::cout << "\n";
  if (c.data.packing && r->documents_per_row > 0)
    std::cout << std::setprecision(1) << "packing: " << r->documents_per_row
              << " documents per row, no padding (every slot a real token); the block-diagonal mask keeps "
              << 100.0 * r->kept_attention_pairs << "% of the causal attention pairs\n";
  if (a.demo) return report(report_addition(r->model_dir, task, c.train.threads));
  return 0;
}

int run_train(const TrainArgs& a) {
  if (a.demo == !a.config.empty()) {
    std::cerr << "aspen: error: give a CONFIG.yaml or --demo (one of them)\n";
    return kExitUsage;
  }
  if (int(a.resume) + int(!a.resume_from.empty()) + int(a.overwrite) > 1) {
    std::cerr << "aspen: error: --resume, --resume-from and --overwrite exclude each other\n";
    return kExitUsage;
  }
  if (parallel::job::launched()) {
    if (Status s = parallel::job::init("aspen train under mpirun"); !s.is_ok()) return report(s);
    install_stop_handlers(/*mpi=*/true);  // after joining the job: replaces MPI's SIGTERM handler
    const int rank = parallel::job::rank();
    const int rc = train_job(a, true, parallel::job::size(), rank == 0);
    if (rc != 0 && rc != kExitInterrupted && rc != 128 + SIGTERM) {  // interrupted runs saved and end normally
      std::cerr << "aspen: process " << rank << " of the MPI job failed\n";
      return rc;  // mpirun ends the others
    }
    parallel::job::finalize();
    return rc;
  }
  install_stop_handlers(/*mpi=*/false);
  return train_job(a, false, 1, true);
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "train or fine-tune a GPT-2 / GPT-J model (the training job)");
  cmd->footer(
      "Examples: aspen train --demo\n"
      "          aspen train configs/gpt2-tinyshakespeare.yaml --set optimizer.lr=1e-3\n"
      "          aspen train configs/gpt2-tinyshakespeare.yaml --resume\n"
      "          aspen train --demo --replicas 2\n"
      "          mpirun -np 2 aspen train --demo\n"
      "The config keys are in docs/training.md.");
  cmd->add_option("CONFIG", args->config, "the run's YAML config");
  cmd->add_flag("--demo", args->demo, "the built-in task: a small GPT learns two-digit addition (no files needed)");
  cmd->add_flag("--resume", args->resume, "continue from the run's latest checkpoint");
  cmd->add_option("--resume-from", args->resume_from,
                  "continue from this checkpoint (a step directory, e.g. the one before a damaged latest)");
  cmd->add_flag("--overwrite", args->overwrite, "delete the run directory's earlier run and start again");
  cmd->add_flag("--print-plan", args->print_plan,
                "print each device's instructions for one step of the configured layout, then stop (compiles, "
                "trains nothing)");
  // One value per --set, so that `--set k=v CONFIG.yaml` leaves the config to the positional.
  cmd->add_option("--set", args->overrides, "override a config key, e.g. --set optimizer.lr=1e-3 (repeatable)")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--steps", args->steps, "train this many steps (overrides train.steps)")->check(at_least(1));
  cmd->add_option("--seed", args->seed, "random seed (overrides train.seed)")->check(at_least(0));
  cmd->add_option("--threads", args->threads, "threads (overrides train.threads; 0: the free cores)")
      ->check(at_least(0));
  cmd->add_option("--run-dir", args->run_dir, "the run directory (overrides log.run_dir)");
  cmd->add_option("--profile", args->profile,
                  std::string(api::kProfileHelp) + ": every instruction of --profile-steps steps from the run's second");
  cmd->add_option("--profile-steps", args->profile_steps, "steps the profile records (default 10)")
      ->check(at_least(1));
  cmd->add_option("--profile-every", args->profile_every,
                  "record every N-th step from the second, each whole, until --profile-steps are recorded "
                  "(default 1: consecutive steps)")
      ->check(at_least(1));
  cmd->add_option("--replicas", args->replicas,
                  "data-parallel replicas (overrides batch.replicas; the demo keeps its global batch of 16)")
      ->check(at_least(1));
  cmd->add_option("--stages", args->stages, "pipeline stages (overrides parallel.pipeline_stages)")
      ->check(at_least(1));
  cmd->add_option("--balance", args->balance,
                  "how the pipeline cut balances its stages (overrides parallel.balance): estimated, measured, or "
                  "dynamic (layers move between stages while training when their times drift apart)")
      ->check(CLI::IsMember({"estimated", "measured", "dynamic"}));
  cmd->add_option("--tensor-parallel", args->tensor_parallel,
                  "tensor shards (overrides parallel.tensor_parallel; gpt2: n_head must divide by it)")
      ->check(at_least(1));
  return {cmd, [args] { return run_train(*args); }};
}

}  // namespace aspen::tools
