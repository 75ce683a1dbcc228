// serveInBackground: a server stopped right after it was started stops (httplib's stop() is lost
// while the serving thread has not begun to listen, and that thread then waits in accept()).
#include "common/http_serve.h"

#include <catch2/catch.hpp>

namespace krane {
namespace {

TEST_CASE("a server stopped right after it was started stops", "[http-serve]") {
  for (int i = 0; i < 50; ++i) {
    httplib::Server server;
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    REQUIRE(server.bind_to_any_port("127.0.0.1") > 0);
    std::thread serving = serveInBackground(server);
    INFO("iteration " << i);
    CHECK(server.is_running());  // so the stop below cannot be lost
    server.stop();
    serving.join();
  }
}

}  // namespace
}  // namespace krane
