// Timings the sentinel plugin and the proxy must agree on: the plugin sizes the pods' grace
// period from them and hands the drain to the proxy; the proxy applies them by default.
#pragma once

namespace krane::sentinel {

// On SIGTERM the proxy answers readiness with 503 and still serves for this long
// (KRANE_DRAIN_SECONDS) before it stops accepting, while the endpoints controller and kube-proxy
// move traffic away; then requests in flight complete, within the proxy's upstream timeout.
inline constexpr int kDrainSeconds = 5;
// The proxy's upstream timeout (ProxyOptions::upstream_timeout, --upstream-timeout-s): the
// longest a request's exchange with the instances may take, answer included, so also how long
// requests in flight may need once the proxy stops accepting.
inline constexpr int kUpstreamTimeoutSeconds = 60;

}  // namespace krane::sentinel
