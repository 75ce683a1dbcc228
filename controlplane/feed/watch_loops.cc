#include "controlplane/feed/watch_loops.h"

#include "spdlog/spdlog.h"

namespace krane::feed {

// ---------------------------------------------------------------------------------------------
// GrpcWatchCall

WatchScheduler& GrpcWatchCall::loop() { return *loop_; }

void GrpcWatchCall::write(const grpc::ByteBuffer* message, grpc::WriteOptions options) {
  loop_->startOp([&] { writer_.Write(*message, options, &written_); });
}

void GrpcWatchCall::finish(const grpc::Status& status) {
  loop_->startOp([&] { writer_.Finish(status, &finished_); });
}

void GrpcWatchCall::handle(Kind kind, bool ok) {
  switch (kind) {
    case Kind::kAccepted:
      // Handled by the loop (it opens the call).
      break;
    case Kind::kWritten:
      if (handler_ != nullptr) handler_->OnWriteDone(ok);
      break;
    case Kind::kFinished:
      finish_completed_ = true;
      break;
    case Kind::kDone:
      done_seen_ = true;
      if (context_.IsCancelled() && !finish_completed_ && handler_ != nullptr) {
        handler_->OnCancel();
      }
      break;
  }
  releaseIfOver();
}

void GrpcWatchCall::releaseIfOver() {
  if (!done_seen_ || !finish_completed_) return;
  if (handler_ != nullptr) handler_->OnDone();
  loop_->count_(-1);
  delete this;
}

// ---------------------------------------------------------------------------------------------
// WatchLoop

WatchLoop::WatchLoop(std::unique_ptr<grpc::ServerCompletionQueue> cq, const RequestWatchFn& request,
                     const OpenWatchFn& open, std::function<void(int)> count)
    : cq_(std::move(cq)), request_(request), open_(open), count_(std::move(count)) {}

void WatchLoop::schedule(std::shared_ptr<Writable> target) {
  std::lock_guard lock(mutex_);
  if (closed_) return;
  ready_.push_back(std::move(target));
  if (!alarm_set_) {
    alarm_set_ = true;
    alarm_.Set(cq_.get(), gpr_time_0(GPR_CLOCK_MONOTONIC), &wake_tag_);
  }
}

void WatchLoop::accept() {
  auto* call = new GrpcWatchCall(this);
  // Before the request: the done event is how a cancelled call is seen.
  call->context_.AsyncNotifyWhenDone(&call->done_);
  bool requested = false;
  startOp([&] {
    request_(&call->context_, &call->request_, &call->writer_, cq_.get(), &call->accepted_);
    requested = true;
  });
  if (!requested) delete call;
}

void WatchLoop::run() {
  for (size_t i = 0; i < kAcceptsInFlight; ++i) accept();
  std::vector<std::shared_ptr<Writable>> ready;
  void* tag = nullptr;
  bool ok = false;
  while (cq_->Next(&tag, &ok)) {
    if (tag == &wake_tag_) {
      {
        std::lock_guard lock(mutex_);
        ready.swap(ready_);
        alarm_set_ = false;
      }
      for (auto& target : ready) target->startWrites();
      ready.clear();
      continue;
    }
    auto* t = static_cast<GrpcWatchCall::Tag*>(tag);
    GrpcWatchCall* call = t->call;
    if (t->kind != GrpcWatchCall::Kind::kAccepted) {
      call->handle(t->kind, ok);
      continue;
    }
    if (!ok) {
      // The server is shutting down. gRPC delivers no done event for a call that was never
      // accepted (grpcpp/server_context.h, AsyncNotifyWhenDone), so nothing else comes for it.
      delete call;
      continue;
    }
    count_(+1);
    accept();
    open_(call);
  }
}

void WatchLoop::close() {
  {
    std::unique_lock lock(ops_mutex_);
    ops_closed_ = true;
  }
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    ready_.clear();
  }
  cq_->Shutdown();
}

// ---------------------------------------------------------------------------------------------
// WatchLoops

WatchLoops::WatchLoops(grpc::ServerBuilder& builder, size_t threads) {
  for (size_t i = 0; i < std::max<size_t>(1, threads); ++i) {
    queues_.push_back(builder.AddCompletionQueue());
  }
}

WatchLoops::~WatchLoops() { stop(); }

void WatchLoops::start(RequestWatchFn request, OpenWatchFn open) {
  request_ = std::move(request);
  open_ = std::move(open);
  auto count = [this](int delta) {
    std::lock_guard lock(mutex_);
    calls_ = static_cast<size_t>(static_cast<long>(calls_) + delta);
    calls_changed_.notify_all();
  };
  for (auto& cq : queues_) {
    loops_.push_back(
        std::unique_ptr<WatchLoop>(new WatchLoop(std::move(cq), request_, open_, count)));
  }
  queues_.clear();
  for (auto& loop : loops_) threads_.emplace_back([loop = loop.get()] { loop->run(); });
}

size_t WatchLoops::calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

void WatchLoops::stop(std::chrono::milliseconds grace) {
  {
    std::unique_lock lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    if (!calls_changed_.wait_for(lock, grace, [&] { return calls_ == 0; })) {
      spdlog::warn("feed: {} Watch calls still open {} ms after the server's shutdown; abandoned",
                   calls_, grace.count());
    }
  }
  for (auto& loop : loops_) loop->close();
  for (auto& t : threads_) t.join();
  // Queues that never got a thread (stop without start) are drained here.
  for (auto& cq : queues_) {
    cq->Shutdown();
    void* tag;
    bool ok;
    while (cq->Next(&tag, &ok)) {
    }
  }
}

}  // namespace krane::feed
