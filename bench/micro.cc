// Google Benchmark microbenchmarks of the kernels: softmax, exp2, one attention
// tile (the Q·Kᵀ and P·V micro-kernels with the vectorised exp), decode,
// RoPE and the projection GEMM. `build/bin/attn_micro`.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "attn/attn.hpp"
#include "kernels/attention_kernel.hpp"
#include "kernels/linear.hpp"

namespace {

attn::Tensor<float> random_tensor(const attn::Shape& shape) {
  attn::Tensor<float> t(shape);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = u(rng);
  return t;
}

void BM_Softmax(benchmark::State& state) {
  const auto a = random_tensor({64, state.range(0)});
  attn::Tensor<float> out(a.shape());
  for (auto _ : state) attn::softmax(a.view(), out.view());
  state.SetItemsProcessed(state.iterations() * a.numel());
}
BENCHMARK(BM_Softmax)->Arg(64)->Arg(4096)->UseRealTime();

// The softmax's exponential (2^x, x <= 8) over a tile's worth of scores.
void BM_Exp2(benchmark::State& state) {
  std::vector<float> x(static_cast<size_t>(state.range(0))), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = -static_cast<float>(i % 1000) * 0.03f;
  for (auto _ : state) {
    attn::kernels::softmax_exp2(x.data(), y.data(), static_cast<int64_t>(x.size()));
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Exp2)->Arg(8192)->UseRealTime();

// One head, n × n: at n = 128 a single query tile against two key tiles.
void BM_AttentionTile(benchmark::State& state) {
  const int64_t n = state.range(0), d = state.range(1);
  const auto q = random_tensor({n, d}), k = random_tensor({n, d}), v = random_tensor({n, d});
  attn::Tensor<float> out({n, d});
  for (auto _ : state) attn::AttentionPlan(q.view(), k.view(), v.view()).run(out.view());
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * n * n * d * state.iterations(),
                                                 benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionTile)->Args({128, 64})->Args({512, 64})->Args({512, 128})->UseRealTime();

// Prefill at n = 4096, 8 heads, in each precision, and bf16 with its unit
// forced off: the Highway path, which CPUs without a fast unit (the Xeons
// seen so far) run, timed on any CPU. First arg 0: float32, 1: bf16 as
// chosen, 2: bf16 on the Highway path, 3: int8 as chosen; second: the head
// dim (16 and 80 have the unit's narrow blocks, 64 and 128 none).
void BM_AttentionPrecision(benchmark::State& state) {
  const int64_t n = 4096, d = state.range(1);
  const auto q = random_tensor({8, n, d}), k = random_tensor({8, n, d}), v = random_tensor({8, n, d});
  attn::Tensor<float> out({8, n, d});
  const attn::Precision precisions[] = {attn::Precision::Float32, attn::Precision::BF16, attn::Precision::BF16,
                                        attn::Precision::Int8};
  attn::AttentionOptions options;
  options.precision = precisions[state.range(0)];
  const auto use = state.range(0) == 2 ? attn::kernels::BF16UnitUse::Never : attn::kernels::BF16UnitUse::Measured;
  attn::kernels::set_bf16_unit_use(use);
  for (auto _ : state) attn::AttentionPlan(q.view(), k.view(), v.view(), options).run(out.view());
  attn::kernels::set_bf16_unit_use(attn::kernels::BF16UnitUse::Measured);
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * 8 * n * n * d * state.iterations(),
                                                 benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionPrecision)
    ->ArgsProduct({{0, 1, 2, 3}, {16, 64, 80, 128}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_Decode(benchmark::State& state) {
  const int64_t len = state.range(0);
  const auto q = random_tensor({8, 1, 128}), k = random_tensor({8, len, 128}),
             v = random_tensor({8, len, 128});
  attn::Tensor<float> out({8, 1, 128});
  for (auto _ : state) attn::AttentionPlan(q.view(), k.view(), v.view()).run(out.view());
  state.SetBytesProcessed(state.iterations() * 2 * k.numel() * 4);
}
BENCHMARK(BM_Decode)->Arg(4096)->Arg(32768)->UseRealTime();

void BM_Rope(benchmark::State& state) {
  const auto x = random_tensor({8, state.range(0), 128});
  attn::Tensor<float> out(x.shape());
  for (auto _ : state) attn::apply_rope(x.view(), out.view());
  state.SetItemsProcessed(state.iterations() * x.numel());
}
BENCHMARK(BM_Rope)->Arg(512)->Arg(4096)->UseRealTime();

void BM_Linear(benchmark::State& state) {
  const int64_t rows = state.range(0), width = state.range(1);
  const auto x = random_tensor({rows, width}), w = random_tensor({width, width}),
             b = random_tensor({width});
  attn::Tensor<float> y({rows, width});
  for (auto _ : state) attn::kernels::linear(x.view(), w.data(), b.data(), y.view());
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * width * width * state.iterations(),
                                                 benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Linear)->Args({4096, 512})->Args({64, 512})->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
