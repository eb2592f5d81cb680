// PagedKVCache: the pool, the sequences' page lists and the pages'
// reference counts. Every writer checks and counts first (ids, shapes,
// values the storage cannot hold, pages needed), then changes the cache in
// a pass that cannot fail.
#include "attn/paged_kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "stored_rows.hpp"

namespace attn {

namespace detail {

ReadersOrWriter::Hold ReadersOrWriter::read(const char* who) const {
  int64_t s = state_.load(std::memory_order_acquire);
  do {
    if (s < 0)
      throw RuntimeError(std::string("PagedKVCache.") + who +
                         ": PagedKVCache is in use by another thread (a writer: append, fork, truncate, "
                         "add_sequence or remove, which run alone)");
  } while (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire));
  return Hold(*this, false);
}

ReadersOrWriter::Hold ReadersOrWriter::write(const char* who) const {
  int64_t idle = 0;
  if (!state_.compare_exchange_strong(idle, -1, std::memory_order_acquire))
    throw RuntimeError(std::string("PagedKVCache.") + who +
                       ": PagedKVCache is in use by another thread (a writer runs alone: no other call may "
                       "overlap it)");
  return Hold(*this, true);
}

}  // namespace detail

namespace {

[[noreturn]] void fail(const char* who, const std::string& msg) {
  throw ValueError(std::string("PagedKVCache.") + who + ": " + msg);
}

template <class S>
Tensor<S> pool_of(PageLayout layout, int64_t pages, int64_t page_size, int64_t heads, int64_t cols) {
  const int64_t row = detail::row_elements<S>(cols);
  return Tensor<S>(layout == PageLayout::NHD ? Shape{pages, page_size, heads, row} : Shape{pages, heads, page_size, row});
}

// Row (page, slot, head) of a pool.
template <class P>
auto* row_at(P& pool, PageLayout layout, int64_t page, int64_t slot, int64_t head) {
  return layout == PageLayout::NHD ? &pool.at({page, slot, head, 0}) : &pool.at({page, head, slot, 0});
}

// int4: the blocks of key group g (tokens 32g .. 32g + 31) of a sequence's
// pages, head h: page_size / 32 groups a page.
template <class P>
auto* group_at(P& pool, PageLayout layout, const std::vector<int32_t>& pages, int64_t page_size, int64_t g, int64_t h) {
  const int64_t token = g * kInt4Group;
  return row_at(pool, layout, pages[static_cast<size_t>(token / page_size)], token % page_size / kInt4Group, h);
}

// int4: keys t < count of group g as its blocks hold them, (count, heads, d).
std::vector<float> held_keys(const Tensor<block_int4>& pool, PageLayout layout, const std::vector<int32_t>& pages,
                             int64_t page_size, int64_t g, int64_t count, int64_t heads, int64_t d) {
  std::vector<float> keys(static_cast<size_t>(count * heads * d));
  for (int64_t h = 0; h < heads && count > 0; ++h) {
    const block_int4* row = group_at(pool, layout, pages, page_size, g, h);
    for (int64_t t = 0; t < count; ++t)
      for (int64_t c = 0; c < d; ++c) keys[static_cast<size_t>((t * heads + h) * d + c)] = int4_value(row[c], t);
  }
  return keys;
}

// int4: a sequence's keys from group `first` on, its tail (held tokens,
// (held, heads, d)) then `n` new keys (n, heads, d), any strides: blocks
// (heads, groups, d) and the new tail. ValueError naming the sequence and
// head for a value int4 cannot hold.
struct Int4Keys {
  Tensor<block_int4> groups;
  std::vector<float> tail;
};
Int4Keys int4_keys(const std::vector<float>& tail, int64_t held, TensorView<const float> k, int64_t first,
                   const char* who, int64_t seq) {
  const int64_t n = k.dim(0), heads = k.dim(1), d = k.dim(2), rows = held + n, kept = rows % kInt4Group;
  Int4Keys out{Tensor<block_int4>({heads, (rows + kInt4Group - 1) / kInt4Group, d}),
               std::vector<float>(static_cast<size_t>(kept * heads * d))};
  std::vector<float> keys(static_cast<size_t>(rows * d));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t c = 0; c < d; ++c)
        keys[static_cast<size_t>(t * d + c)] = t < held ? tail[static_cast<size_t>((t * heads + h) * d + c)]
                                                        : k.at({t - held, h, c});
    try {
      quantize_int4_key_rows(keys.data(), rows, d, out.groups.data() + h * out.groups.dim(1) * d, first * kInt4Group);
    } catch (const ValueError& e) {
      fail(who, std::string(e.what()) + " (sequence " + std::to_string(seq) + ", head " + std::to_string(h) + ")");
    }
    for (int64_t t = 0; t < kept; ++t)
      std::copy_n(keys.data() + (rows - kept + t) * d, d, out.tail.data() + (t * heads + h) * d);
  }
  return out;
}

// The tokens of x (n, heads, cols), any strides, as (n, heads, row) in the
// storage type: converted before the cache changes, so that a value the
// storage cannot hold refuses the whole call.
template <class S>
Tensor<S> staged(TensorView<const float> x) {
  const int64_t n = x.dim(0), heads = x.dim(1), cols = x.dim(2), row = detail::row_elements<S>(cols);
  Tensor<S> out({n, heads, row});
  std::vector<float> gathered(static_cast<size_t>(cols));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t c = 0; c < cols; ++c) gathered[static_cast<size_t>(c)] = x.at({t, h, c});
      S* dst = out.data() + (t * heads + h) * row;
      if constexpr (std::is_same_v<S, float>) std::copy(gathered.begin(), gathered.end(), dst);
      else detail::store_row(gathered.data(), dst, cols);
    }
  return out;
}

}  // namespace

PagedKVCache::PagedKVCache(int64_t num_pages, int64_t page_size, int64_t kv_heads, int64_t head_dim,
                           std::optional<int64_t> value_head_dim, KVDtype dtype, PageLayout layout)
    : num_pages_(num_pages),
      page_size_(page_size),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      value_head_dim_(value_head_dim.value_or(head_dim)),
      dtype_(dtype),
      layout_(layout) {
  const auto at_least = [](const char* name, int64_t x, int64_t min) {
    if (x < min) fail("PagedKVCache", std::string(name) + " must be >= " + std::to_string(min) + ", got " + std::to_string(x));
  };
  at_least("num_pages", num_pages, 1);
  at_least("page_size", page_size, 1);
  at_least("kv_heads", kv_heads, 1);
  at_least("head_dim", head_dim, 0);
  at_least("value_head_dim", value_head_dim_, 0);
  if (num_pages > INT32_MAX) fail("PagedKVCache", "num_pages must fit int32 page numbers, got " + std::to_string(num_pages));
  if (dtype == KVDtype::INT4 && page_size % kInt4Group != 0)
    fail("PagedKVCache", "an int4 cache's keys are quantized per channel over groups of 32 tokens, whole in a page: "
                         "page_size must be a multiple of 32, got " + std::to_string(page_size));
  if (is_block_dtype(dtype) && (head_dim % 32 != 0 || value_head_dim_ % 32 != 0))
    fail("PagedKVCache", std::string("a ") + kv_dtype_name(dtype) + " cache stores rows in blocks of 32: head_dim and "
                         "value_head_dim must be multiples of 32, got " + std::to_string(head_dim) + " and " +
                         std::to_string(value_head_dim_));
  const auto make = [&](auto zero, int64_t cols) -> Pool {
    return pool_of<decltype(zero)>(layout, num_pages, page_size, kv_heads, cols);
  };
  switch (dtype) {
    case KVDtype::F32: k_ = make(0.0f, head_dim_), v_ = make(0.0f, value_head_dim_); break;
    case KVDtype::BF16: k_ = make(bfloat16{}, head_dim_), v_ = make(bfloat16{}, value_head_dim_); break;
    case KVDtype::F16: k_ = make(float16{}, head_dim_), v_ = make(float16{}, value_head_dim_); break;
    case KVDtype::Q8_0: k_ = make(block_q8_0{}, head_dim_), v_ = make(block_q8_0{}, value_head_dim_); break;
    case KVDtype::Q4_0: k_ = make(block_q4_0{}, head_dim_), v_ = make(block_q4_0{}, value_head_dim_); break;
    case KVDtype::INT4: {  // keys: a row of head_dim blocks (one per channel) per group of 32 tokens
      const int64_t groups = page_size / kInt4Group;
      k_ = Tensor<block_int4>(layout == PageLayout::NHD ? Shape{num_pages, groups, kv_heads, head_dim_}
                                                        : Shape{num_pages, kv_heads, groups, head_dim_});
      v_ = make(block_int4{}, value_head_dim_);
      break;
    }
  }
  refs_.assign(static_cast<size_t>(num_pages), 0);
  for (int64_t p = num_pages - 1; p >= 0; --p) free_list_.push_back(static_cast<int32_t>(p));
}

PagedKVCache PagedKVCache::latent(int64_t num_pages, int64_t page_size, int64_t kv_lora_rank, int64_t rope_dim,
                                  KVDtype dtype) {
  if (kv_lora_rank < 1 || rope_dim < 0)
    fail("latent", "kv_lora_rank must be >= 1 and rope_dim >= 0, got " + std::to_string(kv_lora_rank) + " and " +
                       std::to_string(rope_dim));
  if (dtype == KVDtype::Q4_0 || dtype == KVDtype::INT4)
    fail("latent", std::string("a latent cache stores f32, bf16, f16 or q8_0, not ") + kv_dtype_name(dtype) +
                       " (its 4-bit latents would feed every head's keys and values alike; not offered)");
  if (dtype == KVDtype::Q8_0 && kv_lora_rank % kQ8_0Block != 0)
    fail("latent", "a q8_0 latent cache stores c in blocks of 32: kv_lora_rank must be a multiple of 32, got " +
                       std::to_string(kv_lora_rank));
  const bool two_types = dtype == KVDtype::Q8_0;
  PagedKVCache c(num_pages, page_size, 1, two_types ? kv_lora_rank : kv_lora_rank + rope_dim, 0, dtype);
  if (two_types) c.v_ = pool_of<bfloat16>(PageLayout::NHD, num_pages, page_size, 1, rope_dim);
  c.head_dim_ = kv_lora_rank + rope_dim;
  c.value_head_dim_ = kv_lora_rank;
  c.latent_rank_ = kv_lora_rank;
  return c;
}

void PagedKVCache::refuse_two_type_rows(const char* who) const {
  if (latent_rank_ > 0 && dtype_ == KVDtype::Q8_0)
    throw TypeError(std::string("PagedKVCache.") + who +
                    ": a q8_0 latent cache's rows are two types (c in q8_0 blocks, k_pe in bfloat16), not one pool "
                    "of rows: read them with latent_rows");
}

Tensor<float> PagedKVCache::latent_rows(int64_t seq) const {
  const auto held = access_.read("latent_rows");
  if (latent_rank_ == 0) fail("latent_rows", "this cache holds keys and values apart, not latent rows");
  const Sequence& s = find(seq, "latent_rows");
  Tensor<float> rows({s.length, head_dim_});
  // Columns c0 .. of each row from a pool whose rows hold `cols` values.
  const auto widen = [&](const auto& pool, int64_t c0, int64_t cols) {
    using S = std::remove_cvref_t<decltype(*pool.data())>;
    for (int64_t t = 0; t < s.length; ++t) {
      const S* src = &pool.at({s.pages[static_cast<size_t>(t / page_size_)], t % page_size_, 0, 0});
      float* dst = rows.data() + t * head_dim_ + c0;
      detail::widen_row(src, dst, cols);
    }
  };
  const int64_t k_cols = dtype_ == KVDtype::Q8_0 ? latent_rank_ : head_dim_;
  std::visit([&](const auto& pool) { widen(pool, 0, k_cols); }, k_);
  if (dtype_ == KVDtype::Q8_0) widen(std::get<Tensor<bfloat16>>(v_), k_cols, head_dim_ - k_cols);
  return rows;
}

const PagedKVCache::Sequence& PagedKVCache::find(int64_t seq, const char* who) const {
  const auto it = sequences_.find(seq);
  if (it == sequences_.end())
    throw KeyError(std::string("PagedKVCache.") + who + ": no sequence " + std::to_string(seq) +
                   " (never added, or removed)");
  return it->second;
}

int32_t PagedKVCache::take_page() {
  const int32_t p = free_list_.back();  // (callers count free pages first)
  free_list_.pop_back();
  refs_[static_cast<size_t>(p)] = 1;
  return p;
}

void PagedKVCache::release(int32_t page) {
  if (--refs_[static_cast<size_t>(page)] == 0) free_list_.push_back(page);
}

void PagedKVCache::copy_page(int32_t from, int32_t to) {
  const auto copy = [&](auto& pool) {
    const int64_t page = pool.numel() / num_pages_;
    std::copy(pool.data() + from * page, pool.data() + (from + 1) * page, pool.data() + to * page);
  };
  std::visit(copy, k_);
  std::visit(copy, v_);
}

int64_t PagedKVCache::bytes_per_page() const {
  const auto bytes = [](const Pool& p) {
    return std::visit([](const auto& t) { return t.numel() * static_cast<int64_t>(sizeof(*t.data())); }, p);
  };
  return (bytes(k_) + bytes(v_)) / num_pages_;
}

int64_t PagedKVCache::add_sequence() {
  const auto held = access_.write("add_sequence");
  sequences_.emplace(next_id_, Sequence{});
  return next_id_++;
}

void PagedKVCache::remove(int64_t seq) {
  const auto held = access_.write("remove");
  const Sequence& s = find(seq, "remove");
  for (int32_t p : s.pages) release(p);
  sequences_.erase(seq);
}

int64_t PagedKVCache::fork(int64_t seq) {
  const auto held = access_.write("fork");
  Sequence child = find(seq, "fork");
  for (int32_t p : child.pages) ++refs_[static_cast<size_t>(p)];
  sequences_.emplace(next_id_, std::move(child));
  return next_id_++;
}

void PagedKVCache::truncate(int64_t seq, int64_t length) {
  const auto held = access_.write("truncate");
  find(seq, "truncate");
  Sequence& s = sequences_.at(seq);
  if (length < 0 || length > s.length)
    fail("truncate", "length must be in [0, " + std::to_string(s.length) + "] (sequence " + std::to_string(seq) +
                         "'s length), got " + std::to_string(length));
  if (length == s.length) return;  // (int4 would quantize its last group again: on a shared page, for nothing)
  const auto keep = static_cast<size_t>((length + page_size_ - 1) / page_size_);
  // int4: the group `length` ends inside, its keys and blocks (before anything changes).
  const int64_t group = length / kInt4Group, kept = length % kInt4Group;
  std::vector<float> tail;
  Int4Keys blocks;
  bool copy_last = false;
  if (dtype_ == KVDtype::INT4 && kept > 0) {
    const auto& pool = std::get<Tensor<block_int4>>(k_);
    tail = group == s.length / kInt4Group
               ? std::vector<float>(s.key_tail.begin(), s.key_tail.begin() + kept * kv_heads_ * head_dim_)
               : held_keys(pool, layout_, s.pages, page_size_, group, kept, kv_heads_, head_dim_);
    blocks = int4_keys(tail, kept, TensorView<const float>(nullptr, {0, kv_heads_, head_dim_}), group, "truncate", seq);
    copy_last = refs_[static_cast<size_t>(s.pages[keep - 1])] > 1;
    int64_t freed = 0;
    for (size_t i = keep; i < s.pages.size(); ++i) freed += refs_[static_cast<size_t>(s.pages[i])] == 1;
    if (copy_last && free_list_.empty() && freed == 0)
      throw RuntimeError("PagedKVCache.truncate: sequence " + std::to_string(seq) + "'s int4 keys " +
                         std::to_string(group * kInt4Group) + " .. " + std::to_string(length - 1) +
                         " are quantized again on a page it shares, and no page is free for its copy; nothing "
                         "was truncated");
  }
  for (size_t i = keep; i < s.pages.size(); ++i) release(s.pages[i]);
  s.pages.resize(keep);
  s.length = length;
  if (dtype_ != KVDtype::INT4) return;
  if (copy_last) {
    const int32_t copy = take_page();
    copy_page(s.pages.back(), copy);
    release(s.pages.back());
    s.pages.back() = copy;
  }
  auto& pool = std::get<Tensor<block_int4>>(k_);
  for (int64_t h = 0; h < kv_heads_ && kept > 0; ++h)
    std::copy_n(blocks.groups.data() + h * head_dim_, head_dim_,
                group_at(pool, layout_, s.pages, page_size_, group, h));
  s.key_tail = std::move(tail);
}

void PagedKVCache::append(const std::vector<int64_t>& seq_ids, TensorView<const float> k, TensorView<const float> v,
                          TensorView<const int64_t> append_indptr) {
  const auto held = access_.write("append");
  constexpr const char* who = "append";
  std::set<int64_t> seen;
  for (int64_t id : seq_ids) {
    find(id, who);
    if (!seen.insert(id).second) fail(who, "seq_ids must be distinct, got " + std::to_string(id) + " twice");
  }
  if (latent_rank_ > 0) {
    if (k.rank() != 3 || k.dim(1) != 1 || k.dim(2) != head_dim_ || !v.empty_view())
      fail(who, "a latent cache takes rows k (nnz, 1, kv_lora_rank + rope_dim) = (nnz, 1, " +
                    std::to_string(head_dim_) + ") and no v (its values are the rows' first " +
                    std::to_string(latent_rank_) + " columns), got k " + shape_str(k.shape()) +
                    (v.empty_view() ? std::string() : ", v " + shape_str(v.shape())));
  } else if (k.rank() != 3 || v.rank() != 3 || k.dim(0) != v.dim(0) || k.dim(1) != kv_heads_ ||
             v.dim(1) != kv_heads_ || k.dim(2) != head_dim_ || v.dim(2) != value_head_dim_) {
    fail(who, "k and v must be (nnz, kv_heads, head_dim) = (nnz, " + std::to_string(kv_heads_) + ", " +
                  std::to_string(head_dim_) + ") and (nnz, " + std::to_string(kv_heads_) + ", " +
                  std::to_string(value_head_dim_) + "), got k " + shape_str(k.shape()) +
                  (v.empty_view() ? ", no v" : ", v " + shape_str(v.shape())));
  }
  const auto n = static_cast<int64_t>(seq_ids.size());
  if (append_indptr.rank() != 1 || append_indptr.dim(0) != n + 1)
    fail(who, "append_indptr must be (len(seq_ids) + 1,) = (" + std::to_string(n + 1) + ",), got " +
                  shape_str(append_indptr.shape()));
  const auto at = [&](int64_t i) { return append_indptr.at({i}); };
  if (at(0) != 0) fail(who, "append_indptr[0] must be 0, got " + std::to_string(at(0)));
  for (int64_t i = 1; i <= n; ++i)
    if (at(i) < at(i - 1))
      fail(who, "append_indptr must not decrease, got " + std::to_string(at(i - 1)) + " then " +
                    std::to_string(at(i)) + " at " + std::to_string(i));
  if (at(n) != k.dim(0))
    fail(who, "append_indptr must end at k's length " + std::to_string(k.dim(0)) + ", got " + std::to_string(at(n)));

  // Pages needed: each sequence's new pages, and a copy of a shared partial last page.
  int64_t needed = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Sequence& s = sequences_.at(seq_ids[static_cast<size_t>(i)]);
    const int64_t add = at(i + 1) - at(i);
    if (add == 0) continue;
    const bool shared_partial = s.length % page_size_ != 0 && refs_[static_cast<size_t>(s.pages.back())] > 1;
    needed += shared_partial + (s.length + add + page_size_ - 1) / page_size_ - static_cast<int64_t>(s.pages.size());
  }
  if (needed > static_cast<int64_t>(free_list_.size()))
    throw RuntimeError("PagedKVCache.append: needs " + std::to_string(needed) + " pages, " +
                       std::to_string(free_list_.size()) + " free (of " + std::to_string(num_pages_) +
                       "); nothing was appended");

  // What each pool takes: keys and values, or a latent cache's rows (split
  // into c and k_pe where those are two types).
  const int64_t k_cols = latent_rank_ > 0 && dtype_ == KVDtype::Q8_0 ? latent_rank_ : head_dim_;
  const TensorView<const float> k_part(k.data(), {k.dim(0), kv_heads_, k_cols}, k.strides());
  const TensorView<const float> v_part =
      latent_rank_ == 0 ? v : TensorView<const float>(k.data() + k_cols * k.stride(2),
                                                      {k.dim(0), 1, head_dim_ - k_cols}, k.strides());
  std::visit(
      [&](auto& k_pool, auto& v_pool) {
        using SK = std::remove_cvref_t<decltype(*k_pool.data())>;
        using SV = std::remove_cvref_t<decltype(*v_pool.data())>;
        constexpr bool key_groups = std::is_same_v<SK, block_int4>;
        // (Each may refuse a value.) int4's keys: each sequence's groups from its tail's on.
        const Tensor<SK> k_rows = key_groups ? Tensor<SK>() : staged<SK>(k_part);
        std::vector<Int4Keys> k_groups;
        if constexpr (key_groups)
          for (int64_t i = 0; i < n; ++i) {
            const int64_t id = seq_ids[static_cast<size_t>(i)];
            const Sequence& s = sequences_.at(id);
            if (at(i + 1) == at(i)) {
              k_groups.emplace_back();
              continue;
            }
            const TensorView<const float> added(k.data() + at(i) * k.stride(0),
                                                {at(i + 1) - at(i), kv_heads_, head_dim_}, k.strides());
            k_groups.push_back(int4_keys(s.key_tail, s.length % kInt4Group, added, s.length / kInt4Group, who, id));
          }
        const Tensor<SV> v_rows = staged<SV>(v_part);
        const int64_t k_row = k_pool.dim(3), v_row = v_pool.dim(3);
        for (int64_t i = 0; i < n; ++i) {
          Sequence& s = sequences_.at(seq_ids[static_cast<size_t>(i)]);
          if (at(i + 1) == at(i)) continue;
          if (s.length % page_size_ != 0 && refs_[static_cast<size_t>(s.pages.back())] > 1) {
            const int32_t copy = take_page();  // copy on write
            copy_page(s.pages.back(), copy);
            release(s.pages.back());
            s.pages.back() = copy;
          }
          const int64_t first_group = s.length / kInt4Group;
          for (int64_t t = at(i); t < at(i + 1); ++t, ++s.length) {
            if (s.length % page_size_ == 0) s.pages.push_back(take_page());
            const int64_t page = s.pages.back(), slot = s.length % page_size_;
            for (int64_t h = 0; h < kv_heads_; ++h) {
              if constexpr (!key_groups)
                std::copy_n(k_rows.data() + (t * kv_heads_ + h) * k_row, k_row, row_at(k_pool, layout_, page, slot, h));
              std::copy_n(v_rows.data() + (t * kv_heads_ + h) * v_row, v_row, row_at(v_pool, layout_, page, slot, h));
            }
          }
          if constexpr (key_groups) {
            Int4Keys& g = k_groups[static_cast<size_t>(i)];
            for (int64_t h = 0; h < kv_heads_; ++h)
              for (int64_t j = 0; j < g.groups.dim(1); ++j)
                std::copy_n(g.groups.data() + (h * g.groups.dim(1) + j) * k_row, k_row,
                            group_at(k_pool, layout_, s.pages, page_size_, first_group + j, h));
            s.key_tail = std::move(g.tail);
          }
        }
      },
      k_, v_);
}

int64_t PagedKVCache::length(int64_t seq) const {
  const auto held = access_.read("length");
  return find(seq, "length").length;
}

std::vector<int64_t> PagedKVCache::positions(int64_t seq) const {
  const auto held = access_.read("positions");
  std::vector<int64_t> p(static_cast<size_t>(find(seq, "positions").length));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int64_t>(i);
  return p;
}

std::vector<int64_t> PagedKVCache::sequences() const {
  const auto held = access_.read("sequences");
  std::vector<int64_t> ids;
  for (const auto& [id, s] : sequences_) ids.push_back(id);
  return ids;
}

std::vector<int32_t> PagedKVCache::pages_of(int64_t seq) const {
  const auto held = access_.read("pages_of");
  return find(seq, "pages_of").pages;
}

int64_t PagedKVCache::pages_in_use() const {
  const auto held = access_.read("pages_in_use");
  return num_pages_ - static_cast<int64_t>(free_list_.size());
}

int64_t PagedKVCache::free_pages() const {
  const auto held = access_.read("free_pages");
  return static_cast<int64_t>(free_list_.size());
}

int64_t PagedKVCache::nbytes() const {
  const auto held = access_.read("nbytes");
  int64_t tails = 0;
  for (const auto& [id, s] : sequences_) tails += static_cast<int64_t>(s.key_tail.size() * sizeof(float));
  return (num_pages_ - static_cast<int64_t>(free_list_.size())) * bytes_per_page() + tails;
}

PageTable PagedKVCache::page_table(const std::vector<int64_t>& seq_ids) const {
  const auto held = access_.read("page_table");
  const auto n = static_cast<int64_t>(seq_ids.size());
  PageTable t{Tensor<int32_t>({n + 1}), Tensor<int32_t>(), Tensor<int32_t>({n})};
  std::vector<int32_t> indices;
  for (int64_t i = 0; i < n; ++i) {
    const Sequence& s = find(seq_ids[static_cast<size_t>(i)], "page_table");
    indices.insert(indices.end(), s.pages.begin(), s.pages.end());
    if (indices.size() > INT32_MAX) fail("page_table", "more than 2^31 - 1 pages in one table");
    t.kv_indptr[i + 1] = static_cast<int32_t>(indices.size());
    t.kv_last_page_len[i] = static_cast<int32_t>(s.length == 0 ? 0 : (s.length - 1) % page_size_ + 1);
  }
  t.kv_indices = Tensor<int32_t>({static_cast<int64_t>(indices.size())});
  std::copy(indices.begin(), indices.end(), t.kv_indices.data());
  return t;
}

TensorView<const float> PagedKVCache::k_pages() const {
  if (const auto* f = std::get_if<Tensor<float>>(&k_)) return f->view();
  throw TypeError(std::string("PagedKVCache.pages: the pools are views of float32 storage; this cache stores ") +
                  kv_dtype_name(dtype_));
}
TensorView<const float> PagedKVCache::v_pages() const {
  const TensorView<const float> k = k_pages();  // (the same refusal)
  if (latent_rank_ > 0) return TensorView<const float>(k.data(), {k.dim(0), k.dim(1), k.dim(2), latent_rank_}, k.strides());
  return std::get<Tensor<float>>(v_).view();
}

namespace {
template <class Pool>
std::vector<uint8_t> bytes_of(const Pool& pool) {
  return std::visit([](const auto& t) {
    const auto* b = reinterpret_cast<const uint8_t*>(t.data());
    return std::vector<uint8_t>(b, b + t.numel() * sizeof(*t.data()));
  }, pool);
}
}  // namespace

std::vector<uint8_t> PagedKVCache::k_bytes() const {
  const auto held = access_.read("k_bytes");
  return bytes_of(k_);
}
std::vector<uint8_t> PagedKVCache::v_bytes() const {
  const auto held = access_.read("v_bytes");
  return bytes_of(v_);
}

PagedKVCache::Sequences PagedKVCache::sequences_state() const {
  const auto held = access_.read("sequences_state");
  Sequences st;
  for (const auto& [id, s] : sequences_) {
    st.ids.push_back(id);
    st.lengths.push_back(s.length);
    st.pages.push_back(s.pages);
    if (dtype_ == KVDtype::INT4) st.key_tails.push_back(s.key_tail);
  }
  st.next_id = next_id_;
  return st;
}

void PagedKVCache::restore(const std::vector<uint8_t>& k_bytes, const std::vector<uint8_t>& v_bytes,
                           const Sequences& st) {
  const auto held = access_.write("restore");
  constexpr const char* who = "restore";
  const auto pool_bytes = [](const Pool& p) {
    return std::visit([](const auto& t) { return static_cast<size_t>(t.numel()) * sizeof(*t.data()); }, p);
  };
  if (k_bytes.size() != pool_bytes(k_) || v_bytes.size() != pool_bytes(v_))
    fail(who, "the pools must be " + std::to_string(pool_bytes(k_)) + " and " + std::to_string(pool_bytes(v_)) +
                  " bytes, got " + std::to_string(k_bytes.size()) + " and " + std::to_string(v_bytes.size()));
  if (st.lengths.size() != st.ids.size() || st.pages.size() != st.ids.size())
    fail(who, "ids, lengths and pages must be as many");
  const bool tails = !st.key_tails.empty();
  if (tails && (dtype_ != KVDtype::INT4 || st.key_tails.size() != st.ids.size()))
    fail(who, dtype_ == KVDtype::INT4
                  ? "key_tails must be none or one per sequence"
                  : "key_tails are an int4 cache's; this one stores " + std::string(kv_dtype_name(dtype_)));
  std::vector<int32_t> refs(static_cast<size_t>(num_pages_), 0);
  std::map<int64_t, Sequence> sequences;
  for (size_t i = 0; i < st.ids.size(); ++i) {
    const int64_t id = st.ids[i], length = st.lengths[i];
    if (id < 0 || id >= st.next_id || !sequences.emplace(id, Sequence{st.pages[i], length, {}}).second)
      fail(who, "sequence ids must be distinct, in [0, next_id), got " + std::to_string(id));
    if (length < 0 || static_cast<int64_t>(st.pages[i].size()) != (length + page_size_ - 1) / page_size_)
      fail(who, "sequence " + std::to_string(id) + " of length " + std::to_string(length) + " cannot hold " +
                    std::to_string(st.pages[i].size()) + " pages");
    for (int32_t p : st.pages[i]) {
      if (p < 0 || p >= num_pages_) fail(who, "page " + std::to_string(p) + " is not in the pool");
      ++refs[static_cast<size_t>(p)];
    }
    const auto tail_size = static_cast<size_t>(length % kInt4Group * kv_heads_ * head_dim_);
    if (tails && st.key_tails[i].size() != tail_size)
      fail(who, "sequence " + std::to_string(id) + "'s key tail must hold (length % 32, kv_heads, head_dim) = " +
                    std::to_string(tail_size) + " values, got " + std::to_string(st.key_tails[i].size()));
  }
  const auto put = [](Pool& pool, const std::vector<uint8_t>& bytes) {
    std::visit([&](auto& t) { std::memcpy(static_cast<void*>(t.data()), bytes.data(), bytes.size()); }, pool);
  };
  put(k_, k_bytes);
  put(v_, v_bytes);
  if (dtype_ == KVDtype::INT4)
    for (size_t i = 0; i < st.ids.size(); ++i) {
      Sequence& s = sequences.at(st.ids[i]);
      s.key_tail = tails ? st.key_tails[i]
                         : held_keys(std::get<Tensor<block_int4>>(k_), layout_, s.pages, page_size_,
                                     s.length / kInt4Group, s.length % kInt4Group, kv_heads_, head_dim_);
    }
  sequences_ = std::move(sequences);
  refs_ = std::move(refs);
  free_list_.clear();
  for (int64_t p = num_pages_ - 1; p >= 0; --p)
    if (refs_[static_cast<size_t>(p)] == 0) free_list_.push_back(static_cast<int32_t>(p));
  next_id_ = st.next_id;
}

}  // namespace attn
