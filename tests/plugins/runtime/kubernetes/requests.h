// Requests for the Kubernetes client tests, built in one call.
#pragma once

#include <string>

#include "plugins/runtime/kubernetes/client.h"

namespace krane::kube {

inline ListRequest listReq(std::string api_version, std::string kind, std::string ns,
                           std::string labels = "", int64_t limit = 0,
                           std::string continue_token = "", std::string fields = "") {
  ListRequest r;
  r.api_version = std::move(api_version);
  r.kind = std::move(kind);
  r.ns = std::move(ns);
  r.label_selector = std::move(labels);
  r.limit = limit;
  r.continue_token = std::move(continue_token);
  r.field_selector = std::move(fields);
  return r;
}

inline WatchRequest watchReq(std::string api_version, std::string kind, std::string ns,
                             std::string labels, std::string from, int timeout_seconds) {
  WatchRequest r;
  r.api_version = std::move(api_version);
  r.kind = std::move(kind);
  r.ns = std::move(ns);
  r.label_selector = std::move(labels);
  r.resource_version = std::move(from);
  r.timeout_seconds = timeout_seconds;
  return r;
}

}  // namespace krane::kube
