#include "examples/cli/Processes.h"

#include <c10/util/Exception.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>

namespace metamem::cli {
namespace {

// What precedes a task's result on the pipe.
struct Header {
  std::uint64_t task;
  std::uint64_t size;
  bool failed;
};

[[noreturn]] void fail(const char* what) { throw std::runtime_error(std::string(what) + ": " + std::strerror(errno)); }

void write_all(int fd, const void* data, std::size_t size) {
  for (const char* p = static_cast<const char*>(data); size > 0;) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(3);  // the parent is gone
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

// False at end of file before the first byte.
bool read_all(int fd, void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = ::read(fd, p + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("reading a worker's result");
    if (n == 0) {
      if (done == 0) return false;
      throw std::runtime_error("a worker process stopped in the middle of a result");
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// A child: takes tasks until none is left, or one fails (then none is left
// for the others either).
[[noreturn]] void work(int out, std::atomic<std::size_t>& next, std::size_t count,
                       const std::function<std::string(std::size_t)>& task) {
  for (std::size_t i; (i = next.fetch_add(1)) < count;) {
    Header header{i, 0, false};
    std::string result;
    try {
      result = task(i);
    } catch (const c10::Error& e) {
      result = e.what_without_backtrace();
      header.failed = true;
    } catch (const std::exception& e) {
      result = e.what();
      header.failed = true;
    }
    header.size = result.size();
    write_all(out, &header, sizeof header);
    write_all(out, result.data(), result.size());
    if (header.failed) {
      next.store(count);
      break;
    }
  }
  _exit(0);  // no destructors or atexit handlers of the parent's state
}

}  // namespace

int default_jobs() {
  cpu_set_t cores;
  return sched_getaffinity(0, sizeof cores, &cores) == 0 ? std::max(CPU_COUNT(&cores), 1) : 1;
}

std::vector<std::string> run_in_processes(std::size_t count, int jobs,
                                          const std::function<std::string(std::size_t)>& task,
                                          const std::function<void(std::size_t)>& done) {
  std::vector<std::string> results(count);
  if (jobs <= 1 || count <= 1) {
    for (std::size_t i = 0; i < count; ++i) {
      results[i] = task(i);
      if (done) done(i + 1);
    }
    return results;
  }
  void* shared = mmap(nullptr, sizeof(std::atomic<std::size_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
  if (shared == MAP_FAILED) fail("mmap");
  auto* next = new (shared) std::atomic<std::size_t>(0);
  std::fflush(nullptr);  // or the children flush the parent's buffered output again
  std::vector<pollfd> pipes;
  std::vector<pid_t> children;
  for (std::size_t j = 0; j < std::min<std::size_t>(static_cast<std::size_t>(jobs), count); ++j) {
    int fds[2];
    if (pipe(fds) != 0) fail("pipe");
    const pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
      for (const pollfd& p : pipes) close(p.fd);
      close(fds[0]);
      work(fds[1], *next, count, task);
    }
    close(fds[1]);
    pipes.push_back({fds[0], POLLIN, 0});
    children.push_back(pid);
  }

  std::optional<std::string> error;
  std::size_t finished = 0;
  for (std::size_t open = pipes.size(); open > 0;) {
    if (poll(pipes.data(), pipes.size(), -1) < 0) {
      if (errno == EINTR) continue;
      fail("poll");
    }
    for (pollfd& p : pipes) {
      if (p.fd < 0 || p.revents == 0) continue;
      Header header;
      if (!read_all(p.fd, &header, sizeof header)) {
        close(p.fd);
        p.fd = -1;
        --open;
        continue;
      }
      std::string result(header.size, '\0');
      read_all(p.fd, result.data(), result.size());
      if (header.failed) {
        if (!error) error = std::move(result);
      } else {
        results[header.task] = std::move(result);
        if (done) done(++finished);
      }
    }
  }
  for (const pid_t pid : children) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!error && WIFSIGNALED(status))
      error = "a worker process died (signal " + std::to_string(WTERMSIG(status)) + ")";
  }
  munmap(shared, sizeof(std::atomic<std::size_t>));
  if (error) throw std::runtime_error(*error);
  if (finished != count) throw std::runtime_error("a worker process stopped before its tasks were done");
  return results;
}

}  // namespace metamem::cli
