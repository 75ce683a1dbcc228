// Test plugin "missing_symbol": a shared object that exports a function, but not the Krane
// entry point.
extern "C" __attribute__((visibility("default"))) int krane_plugin_entry_point_misspelled(void) {
  return 1;
}
