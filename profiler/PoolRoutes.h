// Which private pool the caching allocator serves a request from, as c10
// routes them while CUDA graphs capture or a MemPool is in use: routings
// in the order they began, each taking the requests on its streams or,
// where it names none, those of the thread that began it. The tracer
// routes by thread; the allocator simulator, which has none, takes every
// request there.
#pragma once

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace metamem {

class PoolRoutes {
 public:
  // Throws std::invalid_argument where requests are routed to `pool` already.
  void begin(int pool, std::optional<int> stream, std::thread::id thread = {}) {
    if (routes(pool)) throw std::invalid_argument("requests are already routed to pool " + std::to_string(pool));
    routes_.push_back({pool, stream ? std::vector<int>{*stream} : std::vector<int>{}, thread});
  }

  // Stream `stream` joins the routing to `pool` (a stream that waited on
  // a capturing one is captured too, and c10 routes its requests to the
  // graph's pool). Throws std::invalid_argument where requests are not
  // routed to `pool`, or not by stream.
  void join(int pool, int stream) {
    const auto route = std::find_if(routes_.begin(), routes_.end(), [&](const Route& r) { return r.pool == pool; });
    if (route == routes_.end() || route->streams.empty())
      throw std::invalid_argument("requests are not routed to pool " + std::to_string(pool) + " by stream");
    if (std::find(route->streams.begin(), route->streams.end(), stream) == route->streams.end())
      route->streams.push_back(stream);
  }

  // Throws std::invalid_argument where requests are not routed to `pool`.
  void end(int pool) {
    const auto route = std::find_if(routes_.begin(), routes_.end(), [&](const Route& r) { return r.pool == pool; });
    if (route == routes_.end()) throw std::invalid_argument("requests are not routed to pool " + std::to_string(pool));
    routes_.erase(route);
  }

  bool routes(int pool) const {
    return std::any_of(routes_.begin(), routes_.end(), [&](const Route& route) { return route.pool == pool; });
  }

  // The latest routing that takes a request of `thread` on `stream`, as c10
  // nests them; else the device's own pools (0).
  int pool_for(int stream, std::thread::id thread = {}) const {
    for (auto route = routes_.rbegin(); route != routes_.rend(); ++route) {
      const auto& streams = route->streams;
      if (streams.empty() ? route->thread == thread
                          : std::find(streams.begin(), streams.end(), stream) != streams.end())
        return route->pool;
    }
    return 0;
  }

 private:
  struct Route {
    int pool;
    std::vector<int> streams;  // none: the thread's requests
    std::thread::id thread;
  };
  std::vector<Route> routes_;
};

}  // namespace metamem
