// What every rank must agree on before data moves, and the messages that
// move it.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace attn::dist {

struct Communicator {
  MPI_Comm comm;
  int rank;
  int size;
};
// Checks that MPI is initialised (RuntimeError) and comm is not
// MPI_COMM_NULL (ValueError), the same on every rank.
Communicator communicator(MPI_Comm comm, const char* function);

// Runs check on every rank. If it throws on any, every rank throws the error
// of the lowest such rank (same type), its message prefixed with the
// function and that rank's number, so that no rank goes on to wait for one
// that gave up.
void check_collectively(const Communicator& c, const char* function, const std::function<void()>& check);

// Runs the part of a call that communicates, after the checks: an error
// there (memory running out on one rank) can no longer be agreed on, so it
// aborts the job with MPI_Abort, as MPI's own errors do, rather than leave
// the other ranks waiting for this one.
template <class F>
auto or_abort(const Communicator& c, const char* function, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s; aborting the job (the other ranks would wait for this one)\n",
                 function, c.rank, e.what());
    std::fflush(stderr);
    MPI_Abort(c.comm, 1);
    throw;  // (MPI_Abort does not return)
  }
}

// A property that must be the same on every rank, written out exactly
// (numbers to 17 digits).
struct Field {
  std::string name;
  std::string text;
};
// Compares every rank's fields with rank 0's; every rank throws ValueError
// naming the first field and rank that differ.
void check_agreement(const Communicator& c, const char* function, const std::vector<Field>& fields);

// Every rank's value, in rank order.
std::vector<int64_t> all_gather(const Communicator& c, int64_t value);

// Nonblocking messages of any number of bytes (an MPI count is an int:
// larger messages go in parts, received in order). MPI matches messages of
// one tag between two ranks in the order they were posted.
void post_send(const Communicator& c, const void* data, int64_t bytes, int peer, int tag,
               std::vector<MPI_Request>& requests);
void post_receive(const Communicator& c, void* data, int64_t bytes, int peer, int tag,
                  std::vector<MPI_Request>& requests);
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Waits for the requests and clears them; returns the seconds waited.
double wait_all(std::vector<MPI_Request>& requests);

}  // namespace attn::dist
