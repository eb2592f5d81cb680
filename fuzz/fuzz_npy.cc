// read_npy on arbitrary bytes: a refusal (attn::Error) or an array that
// survives a write and a second read bit for bit.
#include "attn/io.hpp"
#include "fuzz_input.hpp"

using namespace attn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::scratch_file(data, size);
  NpyArray array;
  if (!fuzz::accepted([&] { array = read_npy(path); })) return 0;
  std::visit(
      [&](const auto& t) {
        using T = std::remove_cvref_t<decltype(t)>;
        write_npy(path, t.view());
        const NpyArray again = read_npy(path);
        if (!std::holds_alternative<T>(again) || !fuzz::identical(std::get<T>(again), t))
          fuzz::finding("read, write, read changed the array");
      },
      array);
  return 0;
}
