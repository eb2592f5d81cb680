// read_safetensors on arbitrary bytes: a refusal (attn::Error) or tensors and
// metadata that survive a write (float32) and a second read bit for bit.
#include "attn/io.hpp"
#include "fuzz_input.hpp"

using namespace attn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::scratch_file(data, size);
  Safetensors file;
  if (!fuzz::accepted([&] { file = read_safetensors(path); })) return 0;
  std::map<std::string, TensorView<const float>> views;
  for (const auto& [name, t] : file.tensors) views.emplace(name, t.view());
  write_safetensors(path, views, file.metadata);
  const Safetensors again = read_safetensors(path);
  if (again.metadata != file.metadata || again.tensors.size() != file.tensors.size())
    fuzz::finding("read, write, read changed the names or the metadata");
  for (const auto& [name, t] : file.tensors)
    if (!again.tensors.count(name) || !fuzz::identical(again.tensors.at(name), t))
      fuzz::finding("read, write, read changed tensor '" + name + "'");
  return 0;
}
