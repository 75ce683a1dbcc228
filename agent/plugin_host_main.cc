// krane-plugin-host: loads one plugin .so and serves it to the agent over ZeroMQ.
//
// A crashing plugin takes down this process only; the agent restarts it and redelivers what
// was not acknowledged. Plugin calls run on worker threads (HostCallQueue), never on the
// ZeroMQ thread, so heartbeats and cancels get through during a long call. Started by the agent,
// never by hand (see --help). It dies with the agent (PR_SET_PDEATHSIG), so no host outlives the
// agent that owns it.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "agent/frame_channel.h"
#include "agent/host_calls.h"
#include "agent/plugin_loader.h"
#include "common/process_setup.h"
#include "common/strings.h"
#include "ipc/cursor_store.h"
#include "spdlog/spdlog.h"

namespace {

using krane::plugin::v1::Frame;

// An Events frame: its events run as separate calls; one Answers frame when all are answered.
struct EventBatch {
  std::mutex mutex;
  krane::plugin::v1::Answers answers;
  int remaining = 0;
};

void addAnswer(krane::plugin::v1::Answers& answers, uint64_t sequence, const absl::Status& status,
               const krane::cluster::v1::Change* change) {
  if (status.ok()) {
    auto* ack = answers.add_acks();
    ack->set_sequence(sequence);
    if (change) {
      ack->set_resource_type(change->resource().type());
      ack->set_resource_id(change->resource().id());
      ack->set_version(change->version());
    }
    return;
  }
  auto* nack = answers.add_nacks();
  nack->set_sequence(sequence);
  nack->set_code(static_cast<int>(status.code()));
  nack->set_message(std::string(status.message()));
  nack->set_retryable(!absl::IsInvalidArgument(status));
  if (change) {
    nack->set_resource_type(change->resource().type());
    nack->set_resource_id(change->resource().id());
    nack->set_version(change->version());
  }
}

struct Flags {
  std::string plugin;
  std::string endpoint;
  std::string config_file;
  size_t workers = 4;
  int heartbeat_ms = 500;
  std::string store_dir;
  int store_slot = -1;
};

int serve(const Flags& flags) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ host " + flags.plugin + ": %v");
  std::string config = "{}";
  if (!flags.config_file.empty()) {
    std::ifstream in(flags.config_file);
    if (!in) {
      std::fprintf(stderr, "krane-plugin-host: error: cannot read %s\n", flags.config_file.c_str());
      return 1;
    }
    std::stringstream s;
    s << in.rdbuf();
    config = s.str();
  }

  std::mutex mutex;
  std::condition_variable done;
  bool shutting_down = false;
  std::unique_ptr<krane::agent::FrameChannel> channel;
  krane::agent::HostCallbacks callbacks;
  callbacks.log = [](krane::agent::PluginLogLevel level, std::string_view message) {
    switch (level) {
      case krane::agent::PluginLogLevel::kDebug:
        spdlog::debug("{}", message);
        break;
      case krane::agent::PluginLogLevel::kInfo:
        spdlog::info("{}", message);
        break;
      case krane::agent::PluginLogLevel::kWarn:
        spdlog::warn("{}", message);
        break;
      case krane::agent::PluginLogLevel::kError:
        spdlog::error("{}", message);
        break;
    }
  };
  // Reports made before the channel to the agent exists (from init: a runtime reports what it
  // adopted from an earlier host at once, and says it only once) wait here, and go out first.
  std::mutex report_mutex;
  bool channel_ready = false;
  std::vector<Frame> early_reports;
  constexpr size_t kMaxEarlyReports = 100000;
  callbacks.report_status = [&](const krane::plugin::v1::StatusReport& report) {
    Frame frame;
    *frame.mutable_status_report() = report;
    std::lock_guard lock(report_mutex);
    if (channel_ready) {
      channel->send(frame);
    } else if (early_reports.size() < kMaxEarlyReports) {
      early_reports.push_back(std::move(frame));
    }
  };
  auto loaded = krane::agent::loadPlugin(flags.plugin, config, callbacks);
  if (!loaded.ok()) {
    // One line the agent shows as the reason the plugin could not start.
    std::fprintf(stderr, "krane-plugin-host: error: %s\n",
                 std::string(loaded.status().message()).c_str());
    return 3;
  }
  krane::agent::LoadedPlugin& plugin = **loaded;
  // Our slot in the agent's cursor store: heartbeats and counters for `krane inspect`.
  // Opens the store; called again when the agent replaced the file (it grew or was compacted).
  auto openStore = [&flags]() -> std::shared_ptr<krane::ipc::CursorStore> {
    if (flags.store_dir.empty() || flags.store_slot < 0) return nullptr;
    krane::ipc::CursorStoreOptions options;
    options.mode = krane::ipc::OpenMode::kHost;
    auto opened = krane::ipc::CursorStore::open(flags.store_dir, options);
    if (!opened.ok()) {
      spdlog::warn("cannot open the cursor store, no heartbeats there: {}",
                   opened.status().message());
      return nullptr;
    }
    std::shared_ptr<krane::ipc::CursorStore> store = *std::move(opened);
    store->setPluginPid(flags.store_slot, ::getpid());
    store->heartbeat(flags.store_slot);
    return store;
  };
  std::shared_ptr<krane::ipc::CursorStore> store_holder = openStore();
  std::mutex store_mutex;
  // Workers take their own reference, so a reopen never pulls the mapping from under them.
  auto currentStore = [&] {
    std::lock_guard lock(store_mutex);
    return store_holder;
  };

  // Applies one event and writes its answer into `answers`.
  auto applyEvent = [&](const krane::plugin::v1::Event& event,
                        krane::plugin::v1::Answers& answers) {
    const auto& change = event.change();
    const absl::Status status = change.op() == krane::cluster::v1::CHANGE_OP_DELETE
                                    ? plugin.remove(change)
                                    : plugin.apply(change);
    addAnswer(answers, event.sequence(), status, &change);
    if (auto store = currentStore()) {
      if (status.ok()) {
        store->countApplied(flags.store_slot);
        store->ackPlugin(flags.store_slot, change.version());
      } else {
        store->countFailed(flags.store_slot);
      }
    }
  };
  // Sends the one answer in `answers` as an Ack or Nack frame.
  auto sendSingle = [&channel](const krane::plugin::v1::Answers& answers) {
    Frame reply;
    if (answers.acks_size() > 0) {
      *reply.mutable_ack() = answers.acks(0);
    } else {
      *reply.mutable_nack() = answers.nacks(0);
    }
    channel->send(reply);
  };
  auto answer = [&](uint64_t sequence, const absl::Status& status,
                    const krane::cluster::v1::Change* change) {
    krane::plugin::v1::Answers answers;
    addAnswer(answers, sequence, status, change);
    sendSingle(answers);
  };
  const absl::Status not_started =
      absl::CancelledError("cancelled by the agent (its deadline passed) before it started");
  auto resourceKey = [](const krane::cluster::v1::Change& change) {
    return krane::strCat(change.resource().type(), "/", change.resource().id());
  };
  // Declared after what its calls use, so it is closed first. Sync calls take a worker too: they
  // run alone, never beside an apply.
  krane::agent::HostCallQueue calls(flags.workers);
  // Only queues work: this runs on the ZeroMQ thread, which must stay free for heartbeats.
  channel = std::make_unique<krane::agent::FrameChannel>(
      flags.endpoint, krane::agent::FrameChannel::Mode::kConnect, [&](Frame&& frame) {
        switch (frame.body_case()) {
          case Frame::kEvent: {
            auto event =
                std::make_shared<krane::plugin::v1::Event>(std::move(*frame.mutable_event()));
            calls.submit(
                {event->sequence(), resourceKey(event->change()),
                 [&, event] {
                   krane::plugin::v1::Answers answers;
                   applyEvent(*event, answers);
                   sendSingle(answers);
                 },
                 [&, event] { answer(event->sequence(), not_started, &event->change()); }});
            break;
          }
          case Frame::kEvents: {
            // Different resources, one call each; one Answers frame when all are answered.
            auto events =
                std::make_shared<krane::plugin::v1::Events>(std::move(*frame.mutable_events()));
            auto batch = std::make_shared<EventBatch>();
            batch->remaining = events->events_size();
            if (batch->remaining == 0) {
              Frame reply;
              reply.mutable_answers();
              channel->send(reply);
              break;
            }
            auto finish = [&channel, batch](const krane::plugin::v1::Answers& mine) {
              std::lock_guard lock(batch->mutex);
              batch->answers.MergeFrom(mine);
              if (--batch->remaining == 0) {
                Frame reply;
                *reply.mutable_answers() = std::move(batch->answers);
                channel->send(reply);
              }
            };
            for (int i = 0; i < events->events_size(); ++i) {
              const auto& event = events->events(i);
              calls.submit({event.sequence(), resourceKey(event.change()),
                            [&, events, finish, i] {
                              krane::plugin::v1::Answers mine;
                              applyEvent(events->events(i), mine);
                              finish(mine);
                            },
                            [&, events, finish, i] {
                              krane::plugin::v1::Answers mine;
                              addAnswer(mine, events->events(i).sequence(), not_started,
                                        &events->events(i).change());
                              finish(mine);
                            }});
            }
            break;
          }
          case Frame::kSyncBegin: {
            const auto begin = frame.sync_begin();
            calls.submit({begin.sequence(), "",
                          [&, begin] {
                            answer(begin.sequence(), plugin.syncBegin(begin.snapshot_version()),
                                   nullptr);
                          },
                          [&, begin] { answer(begin.sequence(), not_started, nullptr); }});
            break;
          }
          case Frame::kSyncEnd: {
            auto end =
                std::make_shared<krane::plugin::v1::SyncEnd>(std::move(*frame.mutable_sync_end()));
            calls.submit({end->sequence(), "",
                          [&, end] { answer(end->sequence(), plugin.syncEnd(*end), nullptr); },
                          [&, end] { answer(end->sequence(), not_started, nullptr); }});
            break;
          }
          case Frame::kCancel:
            for (uint64_t sequence : frame.cancel().sequences()) {
              switch (calls.cancel(sequence)) {
                case krane::agent::HostCallQueue::CancelOutcome::kDropped:
                  spdlog::warn("call {} cancelled by the agent before it started", sequence);
                  break;
                case krane::agent::HostCallQueue::CancelOutcome::kRunning:
                  spdlog::warn(
                      "call {} outlived its deadline and is still running: the agent retries it "
                      "once it returns",
                      sequence);
                  break;
                case krane::agent::HostCallQueue::CancelOutcome::kUnknown:
                  break;  // answered already; the answer is on its way
              }
            }
            break;
          case Frame::kShutdown: {
            std::lock_guard lock(mutex);
            shutting_down = true;
            done.notify_all();
            break;
          }
          default:
            spdlog::warn("unexpected frame {} from the agent", static_cast<int>(frame.body_case()));
        }
      });
  if (auto st = channel->start(); !st.ok()) {
    std::fprintf(stderr, "krane-plugin-host: error: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  Frame hello;
  auto* h = hello.mutable_hello();
  h->set_plugin_name(plugin.name());
  h->set_plugin_version(plugin.version());
  h->set_abi_major(plugin.abiMajor());
  h->set_abi_minor(plugin.abiMinor());
  for (const auto& t : plugin.resourceTypes()) h->add_resource_types(t);
  h->set_pid(::getpid());
  channel->send(hello);
  {
    std::lock_guard lock(report_mutex);
    channel_ready = true;
    for (const Frame& frame : early_reports) channel->send(frame);
    early_reports.clear();
  }

  std::unique_lock lock(mutex);
  while (!shutting_down) {
    if (done.wait_for(lock, std::chrono::milliseconds(flags.heartbeat_ms),
                      [&] { return shutting_down; }))
      break;
    Frame beat;
    beat.mutable_heartbeat()->set_sent_at_unix_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::system_clock::now().time_since_epoch())
            .count());
    beat.mutable_heartbeat()->set_in_flight(calls.inFlight());
    channel->send(beat);
    if (auto store = currentStore()) {
      if (store->superseded()) {
        spdlog::info("the agent replaced the cursor store; reopening it");
        auto reopened = openStore();
        std::lock_guard store_lock(store_mutex);
        store_holder = reopened;
      } else {
        store->heartbeat(flags.store_slot);
      }
    }
  }
  lock.unlock();
  // shutdown must not overlap another call: queued ones are answered as cancelled, running
  // ones finish first.
  calls.close();
  plugin.shutdown();
  channel->stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  krane::setUpProcess();
  CLI::App app{
      "krane-plugin-host: serves one Krane plugin to the agent over ZeroMQ. The agent starts it; "
      "it is not meant to be run by hand.",
      "krane-plugin-host"};
  Flags flags;
  app.add_option("--plugin", flags.plugin, "Path of the plugin .so")->required();
  app.add_option("--endpoint", flags.endpoint,
                 "ZeroMQ endpoint of the agent, e.g. ipc:///var/lib/krane/h.sock")
      ->required();
  app.add_option("--config-file", flags.config_file, "The plugin's configuration (JSON)");
  app.add_option("--workers", flags.workers, "Resources applied in parallel")
      ->check(CLI::Range(1, 64));
  app.add_option("--heartbeat-ms", flags.heartbeat_ms, "Heartbeat interval")
      ->check(CLI::Range(10, 60000));
  app.add_option("--store-dir", flags.store_dir,
                 "The agent's cursor store directory (heartbeats, counters)");
  app.add_option("--store-slot", flags.store_slot, "This plugin's slot in the cursor store");
  CLI11_PARSE(app, argc, argv);
  return serve(flags);
}
