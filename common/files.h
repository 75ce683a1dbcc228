// Reading a whole file, with an error that names what the file is for.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "common/strings.h"

namespace krane {

// NOT_FOUND "cannot read <what> <path>" when the file cannot be opened.
inline absl::StatusOr<std::string> readFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(strCat("cannot read ", what, " ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace krane
