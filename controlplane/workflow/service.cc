#include "controlplane/workflow/service.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/cord.h"
#include "common/strings.h"

namespace krane::workflow {
namespace {

constexpr char kTerminalPayload[] = "krane.workflow/terminal";

}  // namespace

RetryPolicy RetryPolicy::deployPreset() {
  RetryPolicy p;
  p.initial_interval = std::chrono::seconds(30);
  p.factor = 2.0;
  p.max_interval = std::chrono::minutes(5);
  p.max_attempts = 10;
  p.on_exhausted = OnExhausted::kFail;
  return p;
}

std::chrono::milliseconds RetryPolicy::delayAfter(int failed_attempts) const {
  double delay = static_cast<double>(initial_interval.count());
  for (int i = 1; i < failed_attempts; ++i) {
    delay *= factor;
    if (delay >= static_cast<double>(max_interval.count())) break;
  }
  delay = std::min(delay, static_cast<double>(max_interval.count()));
  return std::chrono::milliseconds(static_cast<int64_t>(delay));
}

ServiceDefinition ServiceDefinition::service(std::string name) {
  return ServiceDefinition(std::move(name), false);
}

ServiceDefinition ServiceDefinition::virtualObject(std::string name) {
  return ServiceDefinition(std::move(name), true);
}

ServiceDefinition& ServiceDefinition::exclusive(std::string handler, Handler fn) {
  if (!keyed_) {
    std::fprintf(stderr,
                 "workflow: service %s is unkeyed; exclusive handler %s needs a virtual object\n",
                 name_.c_str(), handler.c_str());
    std::abort();
  }
  handlers_[std::move(handler)] = Entry{HandlerKind::kExclusive, std::move(fn)};
  return *this;
}

ServiceDefinition& ServiceDefinition::shared(std::string handler, Handler fn) {
  handlers_[std::move(handler)] = Entry{HandlerKind::kShared, std::move(fn)};
  return *this;
}

ServiceDefinition& ServiceDefinition::handler(std::string handler, Handler fn) {
  return shared(std::move(handler), std::move(fn));
}

ServiceDefinition& ServiceDefinition::retry(RetryPolicy policy) {
  retry_ = policy;
  return *this;
}

const ServiceDefinition::Entry* ServiceDefinition::find(std::string_view handler) const {
  auto it = handlers_.find(handler);
  return it == handlers_.end() ? nullptr : &it->second;
}

absl::Status terminalError(absl::StatusCode code, std::string_view message) {
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  absl::Status status(code, absl::string_view(message.data(), message.size()));
  status.SetPayload(kTerminalPayload, absl::Cord("1"));
  return status;
}

bool isTerminal(const absl::Status& status) {
  if (status.ok()) return false;
  if (status.code() == absl::StatusCode::kCancelled) return true;
  return status.GetPayload(kTerminalPayload).has_value();
}

absl::Status Context::runVoid(std::string_view name, const std::function<absl::Status()>& fn) {
  return run(name,
             [&]() -> absl::StatusOr<std::string> {
               absl::Status s = fn();
               if (!s.ok()) return s;
               return std::string();
             })
      .status();
}

absl::Status Context::sleep(std::chrono::milliseconds delay) {
  return await(timer(delay)).status();
}

void Context::compensateRun(std::string_view name, std::function<absl::Status()> fn) {
  std::string step = strCat("compensate ", name);
  compensate(name, [step, fn = std::move(fn)](Context& ctx) { return ctx.runVoid(step, fn); });
}

}  // namespace krane::workflow
