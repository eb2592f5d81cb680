#include "collective.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "attn/dist.hpp"
#include "attn/error.hpp"

namespace attn::dist {

namespace {

constexpr int64_t kPartBytes = int64_t{1} << 30;

int count_of(int64_t n, const char* what) {
  if (n > std::numeric_limits<int>::max())
    throw ValueError(std::string("attn::dist: ") + what + " of " + std::to_string(n) +
                     " is more than one MPI call can carry (2^31 - 1)");
  return static_cast<int>(n);
}

// Every rank's bytes, concatenated in rank order, with their offsets.
std::vector<char> all_gather_bytes(const Communicator& c, const std::string& mine, std::vector<int>& offsets) {
  std::vector<int> sizes(static_cast<size_t>(c.size));
  int size = count_of(static_cast<int64_t>(mine.size()), "a description");
  MPI_Allgather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, c.comm);
  offsets.assign(static_cast<size_t>(c.size) + 1, 0);
  for (size_t r = 0; r < sizes.size(); ++r) offsets[r + 1] = offsets[r] + sizes[r];
  std::vector<char> all(static_cast<size_t>(std::max(offsets.back(), 1)));
  MPI_Allgatherv(mine.data(), size, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR, c.comm);
  return all;
}

}  // namespace

Communicator communicator(MPI_Comm comm, const char* function) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw RuntimeError(std::string(function) + ": MPI is not initialised (call MPI_Init first)");
  if (comm == MPI_COMM_NULL) throw ValueError(std::string(function) + ": comm is MPI_COMM_NULL");
  Communicator c{comm, 0, 0};
  MPI_Comm_rank(comm, &c.rank);
  MPI_Comm_size(comm, &c.size);
  return c;
}

void check_collectively(const Communicator& c, const char* function, const std::function<void()>& check) {
  enum Kind : int { kValue, kType, kRuntime };
  std::string message;
  int kind = kValue;
  int failed = c.size;  // this rank's number if check failed here
  try {
    check();
  } catch (const TypeError& e) {
    message = e.what(), kind = kType, failed = c.rank;
  } catch (const ValueError& e) {
    message = e.what(), failed = c.rank;
  } catch (const std::exception& e) {
    message = e.what(), kind = kRuntime, failed = c.rank;
  }
  int first = c.size;
  MPI_Allreduce(&failed, &first, 1, MPI_INT, MPI_MIN, c.comm);
  if (first == c.size) return;
  int header[2] = {kind, static_cast<int>(std::min<size_t>(message.size(), 1 << 16))};
  MPI_Bcast(header, 2, MPI_INT, first, c.comm);
  message.resize(static_cast<size_t>(header[1]));
  MPI_Bcast(message.data(), header[1], MPI_CHAR, first, c.comm);
  const std::string text = std::string(function) + ": rank " + std::to_string(first) + ": " + message;
  if (header[0] == kType) throw TypeError(text);
  if (header[0] == kRuntime) throw RuntimeError(text);
  throw ValueError(text);
}

void check_collectively(MPI_Comm comm, const std::string& function, const std::function<void()>& check) {
  check_collectively(communicator(comm, function.c_str()), function.c_str(), check);
}

void check_agreement(const Communicator& c, const char* function, const std::vector<Field>& fields) {
  std::string mine;
  for (const Field& f : fields) mine += f.text + '\n';
  std::vector<int> offsets;
  const std::vector<char> all = all_gather_bytes(c, mine, offsets);
  auto texts_of = [&](int r) {
    std::vector<std::string> texts;
    std::string current;
    for (int i = offsets[static_cast<size_t>(r)]; i < offsets[static_cast<size_t>(r) + 1]; ++i) {
      if (all[static_cast<size_t>(i)] == '\n') texts.push_back(std::exchange(current, {}));
      else current += all[static_cast<size_t>(i)];
    }
    return texts;
  };
  const std::vector<std::string> first = texts_of(0);
  for (int r = 1; r < c.size; ++r) {
    const std::vector<std::string> theirs = texts_of(r);
    for (size_t f = 0; f < fields.size(); ++f)
      if (f >= theirs.size() || theirs[f] != first[f])
        throw ValueError(std::string(function) + ": every rank must agree on " + fields[f].name + ", but it is " +
                         first[f] + " on rank 0 and " + (f < theirs.size() ? theirs[f] : "missing") +
                         " on rank " + std::to_string(r));
  }
}

std::vector<int64_t> all_gather(const Communicator& c, int64_t value) {
  std::vector<int64_t> values(static_cast<size_t>(c.size));
  MPI_Allgather(&value, 1, MPI_INT64_T, values.data(), 1, MPI_INT64_T, c.comm);
  return values;
}

void post_send(const Communicator& c, const void* data, int64_t bytes, int peer, int tag,
               std::vector<MPI_Request>& requests) {
  const char* p = static_cast<const char*>(data);
  for (int64_t at = 0; at < bytes; at += kPartBytes) {
    requests.emplace_back();
    MPI_Isend(p + at, static_cast<int>(std::min(kPartBytes, bytes - at)), MPI_BYTE, peer, tag, c.comm,
              &requests.back());
  }
}

void post_receive(const Communicator& c, void* data, int64_t bytes, int peer, int tag,
                  std::vector<MPI_Request>& requests) {
  char* p = static_cast<char*>(data);
  for (int64_t at = 0; at < bytes; at += kPartBytes) {
    requests.emplace_back();
    MPI_Irecv(p + at, static_cast<int>(std::min(kPartBytes, bytes - at)), MPI_BYTE, peer, tag, c.comm,
              &requests.back());
  }
}

double wait_all(std::vector<MPI_Request>& requests) {
  const auto start = std::chrono::steady_clock::now();
  MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  requests.clear();
  return seconds_since(start);
}

}  // namespace attn::dist
