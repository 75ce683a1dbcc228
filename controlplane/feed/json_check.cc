#include "controlplane/feed/json_check.h"

#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace krane::feed {
namespace {

using Json = nlohmann::json;

// Walks a document without building it, tracking the nesting depth and the top-level kind.
class JsonChecker final : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return scalar(); }
  bool boolean(bool) override { return scalar(); }
  bool number_integer(number_integer_t) override { return scalar(); }
  bool number_unsigned(number_unsigned_t) override { return scalar(); }
  bool number_float(number_float_t, const string_t&) override { return scalar(); }
  bool string(string_t&) override { return scalar(); }
  bool binary(binary_t&) override { return scalar(); }
  bool start_object(std::size_t) override { return enter(true); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(false); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    if (error_.empty()) error_ = strCat("not valid JSON: ", e.what());
    return false;
  }
  const std::string& error() const { return error_; }
  bool topIsObject() const { return top_is_object_; }

 private:
  bool scalar() {
    seen_top_ = true;
    return true;
  }
  bool enter(bool object) {
    if (!seen_top_) top_is_object_ = object;
    seen_top_ = true;
    if (++depth_ > kMaxJsonDepth) {
      error_ = strCat("nested deeper than ", kMaxJsonDepth, " levels");
      return false;
    }
    return true;
  }
  bool leave() {
    --depth_;
    return true;
  }
  size_t depth_ = 0;
  bool seen_top_ = false;
  bool top_is_object_ = false;
  std::string error_;
};

}  // namespace

absl::Status checkJsonDocument(std::string_view field, std::string_view text, JsonShape shape) {
  JsonChecker checker;
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &checker);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(strCat(field, ": not valid JSON: ", e.what()));
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        strCat(field, ": ", checker.error().empty() ? "not valid JSON" : checker.error()));
  }
  if (shape == JsonShape::kObject && !checker.topIsObject()) {
    return absl::InvalidArgumentError(strCat(field, ": must be a JSON object"));
  }
  return absl::OkStatus();
}

}  // namespace krane::feed
