#include "ipc/inspect.h"

#include <time.h>

#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace krane::ipc {

namespace {

std::string formatTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "never";
  const time_t seconds = static_cast<time_t>(unix_ms / 1000);
  tm utc;
  ::gmtime_r(&seconds, &utc);
  char buf[32];
  ::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &utc);
  return fmt::format("{}.{:03d}Z", buf, static_cast<int>(unix_ms % 1000));
}

std::string formatAge(int64_t age_ms) {
  if (age_ms < 0) return "in the future";
  const auto ms = static_cast<double>(age_ms);
  if (age_ms < 10'000) return fmt::format("{:.1f} s ago", ms / 1000.0);
  if (age_ms < 3'600'000) return fmt::format("{} s ago", age_ms / 1000);
  return fmt::format("{:.1f} h ago", ms / 3'600'000.0);
}

std::string formatBytes(uint64_t bytes) {
  constexpr uint64_t kKiB = 1024;
  const auto b = static_cast<double>(bytes);
  if (bytes < 10 * kKiB) return fmt::format("{} B", bytes);
  if (bytes < 10 * kKiB * kKiB) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
}

// Age of a heartbeat: from the monotonic clock when it is from this boot, else from wall clocks.
std::optional<int64_t> heartbeatAgeMs(const PluginSlotInfo& p, const CursorSnapshot& s) {
  if (p.heartbeat_mono_ns != 0 && p.heartbeat_mono_ns <= s.taken_mono_ns) {
    return static_cast<int64_t>((s.taken_mono_ns - p.heartbeat_mono_ns) / 1'000'000);
  }
  if (p.heartbeat_unix_ms != 0) return s.taken_unix_ms - p.heartbeat_unix_ms;
  return std::nullopt;
}

double bytesPerResource(const CursorSnapshot& s) {
  return s.tracked_resources == 0
             ? 0.0
             : static_cast<double>(s.layout.file_bytes) / static_cast<double>(s.tracked_resources);
}

}  // namespace

std::string renderText(const CursorSnapshot& s) {
  std::string out;
  auto line = [&out](std::string_view label, const std::string& value) {
    fmt::format_to(std::back_inserter(out), "{:<14}{}\n", label, value);
  };
  line("cursor store", s.path);
  line("layout",
       fmt::format("version {}, {} ({} plugin slots, {} parked, {} table entries)",
                   s.layout.layout_version, formatBytes(s.layout.file_bytes), s.layout.slot_count,
                   s.layout.parked_capacity, s.layout.table_entries));
  line("region", s.region.empty() ? "(not recorded)" : s.region);
  line("created", formatTime(s.created_unix_ms));
  line("generation", fmt::format("{} (agent pid {})", s.generation, s.agent_pid));
  line("watermark",
       s.watermark_unix_ms > 0
           ? fmt::format("{} (advanced {}, {})", s.watermark, formatTime(s.watermark_unix_ms),
                         formatAge(s.taken_unix_ms - s.watermark_unix_ms))
           : fmt::format("{} (never advanced)", s.watermark));
  line("full sync", s.full_sync_unix_ms > 0 ? fmt::format("version {} at {}", s.full_sync_version,
                                                          formatTime(s.full_sync_unix_ms))
                                            : std::string("never"));
  const double fill = s.layout.max_resources == 0
                          ? 0.0
                          : 100.0 * static_cast<double>(s.tracked_resources) /
                                static_cast<double>(s.layout.max_resources);
  line("resources", fmt::format("{} tracked of max {} ({:.1f} %), {} deleted entries",
                                s.tracked_resources, s.layout.max_resources, fill, s.tombstones));
  line("", fmt::format("probes: mean {:.2f}, longest {}; {:.1f} file bytes per tracked resource",
                       s.table.mean_probe, s.table.longest_probe, bytesPerResource(s)));
  if (s.table.live != s.tracked_resources) {
    line("", fmt::format("scan found {} live entries (the counter says {})", s.table.live,
                         s.tracked_resources));
  }
  if (s.table.damaged != 0) {
    line("",
         fmt::format("WARNING: {} damaged entries (dropped when the agent next opens the store)",
                     s.table.damaged));
  }
  if (s.superseded) line("", "NOTE: the agent replaced this file; reopen it to see current state");

  fmt::format_to(std::back_inserter(out), "\nplugins ({})\n", s.plugins.size());
  if (!s.plugins.empty()) {
    fmt::format_to(std::back_inserter(out),
                   "  {:<4} {:<20} {:>8} {:>12} {:>14} {:>8} {:>10} {:>8} {:>8} {:>11}\n", "slot",
                   "name", "pid", "acked", "heartbeat", "restarts", "applied", "failed", "parked",
                   "redelivered");
  }
  for (const PluginSlotInfo& p : s.plugins) {
    const auto age = heartbeatAgeMs(p, s);
    fmt::format_to(std::back_inserter(out),
                   "  {:<4} {:<20} {:>8} {:>12} {:>14} {:>8} {:>10} {:>8} {:>8} {:>11}\n", p.slot,
                   p.name, p.pid, p.acked_version, age ? formatAge(*age) : "never", p.restarts,
                   p.applied, p.failed, p.parked, p.redelivered);
  }

  fmt::format_to(std::back_inserter(out), "\nparked events ({})\n", s.parked.size());
  constexpr size_t kParkedShown = 50;  // the rest is in --json
  for (size_t i = 0; i < s.parked.size() && i < kParkedShown; ++i) {
    const ParkedEvent& e = s.parked[i];
    fmt::format_to(std::back_inserter(out), "  {}/{} version {}, {} attempts, parked {}\n", e.type,
                   e.id, e.version, e.attempts, formatTime(e.parked_unix_ms));
    if (!e.last_error.empty()) {
      fmt::format_to(std::back_inserter(out), "    last error: {}\n", e.last_error);
    }
  }
  if (s.parked.size() > kParkedShown) {
    fmt::format_to(std::back_inserter(out), "  ... and {} more (see --json)\n",
                   s.parked.size() - kParkedShown);
  }
  return out;
}

std::string renderJson(const CursorSnapshot& s) {
  using nlohmann::json;
  json plugins = json::array();
  for (const PluginSlotInfo& p : s.plugins) {
    const auto age = heartbeatAgeMs(p, s);
    plugins.push_back({
        {"slot", p.slot},
        {"name", p.name},
        {"pid", p.pid},
        {"acked_version", p.acked_version},
        {"heartbeat_mono_ns", p.heartbeat_mono_ns},
        {"heartbeat_unix_ms", p.heartbeat_unix_ms},
        {"heartbeat_age_ms", age ? json(*age) : json(nullptr)},
        {"assigned_unix_ms", p.assigned_unix_ms},
        {"restarts", p.restarts},
        {"applied", p.applied},
        {"failed", p.failed},
        {"parked", p.parked},
        {"redelivered", p.redelivered},
    });
  }
  json parked = json::array();
  for (const ParkedEvent& e : s.parked) {
    parked.push_back({
        {"type", e.type},
        {"id", e.id},
        {"version", e.version},
        {"attempts", e.attempts},
        {"last_error", e.last_error},
        {"parked_unix_ms", e.parked_unix_ms},
        {"parked_at", formatTime(e.parked_unix_ms)},
    });
  }
  const StoreLayout& l = s.layout;
  json doc = {
      {"path", s.path},
      {"layout",
       {
           {"layout_version", l.layout_version},
           {"file_bytes", l.file_bytes},
           {"header_bytes", l.header_bytes},
           {"slot_count", l.slot_count},
           {"slot_bytes", l.slot_bytes},
           {"slots_offset", l.slots_offset},
           {"parked_capacity", l.parked_capacity},
           {"parked_entry_bytes", l.parked_entry_bytes},
           {"parked_offset", l.parked_offset},
           {"max_resources", l.max_resources},
           {"table_entries", l.table_entries},
           {"table_entry_bytes", l.table_entry_bytes},
           {"table_offset", l.table_offset},
       }},
      {"region", s.region},
      {"created_unix_ms", s.created_unix_ms},
      {"created_at", formatTime(s.created_unix_ms)},
      {"generation", s.generation},
      {"agent_pid", s.agent_pid},
      {"watermark",
       {{"version", s.watermark},
        {"unix_ms", s.watermark_unix_ms},
        {"at", formatTime(s.watermark_unix_ms)}}},
      {"full_sync",
       {{"version", s.full_sync_version},
        {"unix_ms", s.full_sync_unix_ms},
        {"at", formatTime(s.full_sync_unix_ms)}}},
      {"resources",
       {
           {"tracked", s.tracked_resources},
           {"max", l.max_resources},
           {"tombstones", s.tombstones},
           {"bytes_per_tracked_resource", bytesPerResource(s)},
           {"scan",
            {
                {"live", s.table.live},
                {"tombstones", s.table.tombstones},
                {"half_written", s.table.half_written},
                {"damaged", s.table.damaged},
                {"longest_probe", s.table.longest_probe},
                {"mean_probe", s.table.mean_probe},
            }},
       }},
      {"plugins", std::move(plugins)},
      {"parked", std::move(parked)},
      {"superseded", s.superseded},
      {"taken_unix_ms", s.taken_unix_ms},
  };
  // Texts are cut at UTF-8 boundaries when stored, but the file may hold anything: replace
  // invalid bytes rather than fail.
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace krane::ipc
