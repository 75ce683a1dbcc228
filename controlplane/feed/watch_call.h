// A Watch call as a stream (watch_stream.h) sees it, whatever carries it: gRPC's completion
// queues (watch_loops.h) or the feed's own HTTP/2 listener (h2_watch_server.h).
//
// The stream starts writes and the finish from any thread; the transport reports their outcome
// (and the client going away) on the thread of the loop that serves the call, one event at a
// time.
#pragma once

#include <memory>

#include <grpcpp/grpcpp.h>

namespace krane::feed {

// Something a loop starts writes for (a stream a published batch made ready).
class Writable {
 public:
  virtual ~Writable() = default;
  // Starts what the stream has to write (or its finish); called on its loop's thread.
  virtual void startWrites() = 0;
};

// The loop a call is served on. Thread-safe.
class WatchScheduler {
 public:
  virtual ~WatchScheduler() = default;
  // Runs target->startWrites() on the loop's thread, in the order scheduled. Once the loop is
  // stopping, nothing runs.
  virtual void schedule(std::shared_ptr<Writable> target) = 0;
};

// What serves an accepted call. Its events come on the call's loop thread, never at once.
class WatchCallHandler {
 public:
  virtual ~WatchCallHandler() = default;
  // The write started last is done: handed to the transport (ok), or the call is broken.
  virtual void OnWriteDone(bool ok) = 0;
  // The client went away (or the server is shutting down): the handler must still finish().
  virtual void OnCancel() = 0;
  // The call is over (finished, and the transport is done with it); the last event. The call is
  // gone when it returns.
  virtual void OnDone() = 0;
};

class WatchCall {
 public:
  virtual ~WatchCall() = default;

  virtual WatchScheduler& loop() = 0;
  // Serves the call with `handler` (from the opener, once).
  virtual void serve(WatchCallHandler* handler) = 0;
  // Ends the call at once with `status`, unserved (from the opener).
  void refuse(const grpc::Status& status) { finish(status); }
  // One write at a time: `message` must stay valid until OnWriteDone. The buffer hint says more
  // writes follow at once, so the transport may hold this one back to send them together. Any
  // thread.
  virtual void write(const grpc::ByteBuffer* message, grpc::WriteOptions options) = 0;
  // Once, with no write in flight. Any thread.
  virtual void finish(const grpc::Status& status) = 0;
  // Resets the call at once, a write in flight included (it completes not ok, and the handler
  // is told OnCancel): for a client that reads nothing, whose finish would wait for that write
  // for ever. The client sees the stream reset (CANCELLED), not the status. Any thread, while a
  // write is in flight (the call cannot end meanwhile).
  virtual void cancel() = 0;
};

}  // namespace krane::feed
