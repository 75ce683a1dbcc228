// krane-inspect-store: prints a cursor store (`<state_dir>/cursor.store`) without changing it.
// The same output as `krane inspect --state-dir DIR [--json]`.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "ipc/cursor_store.h"
#include "ipc/inspect.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Prints the agent's cursor store (watermark, plugin slots, resource table, parked events) "
      "read-only; safe while the agent runs."};
  std::string state_dir;
  bool json = false;
  app.add_option("--state-dir", state_dir, "the agent's state directory (holds cursor.store)")
      ->required();
  app.add_flag("--json", json, "print JSON instead of text");
  CLI11_PARSE(app, argc, argv);

  krane::ipc::CursorStoreOptions options;
  options.mode = krane::ipc::OpenMode::kReadOnly;
  auto store = krane::ipc::CursorStore::open(state_dir, options);
  if (!store.ok()) {
    const auto message = store.status().message();
    std::fprintf(stderr, "krane-inspect-store: %.*s\n", static_cast<int>(message.size()),
                 message.data());
    return 1;
  }
  const krane::ipc::CursorSnapshot snapshot = (*store)->snapshot();
  const std::string out =
      json ? krane::ipc::renderJson(snapshot) : krane::ipc::renderText(snapshot);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}
