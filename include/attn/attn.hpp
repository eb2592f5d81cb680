// attn: multi-head attention and positional encodings in C++. This umbrella
// covers the core (tensors, masks, attention, merge_state, linear, softmax, errors,
// threads, random tensors) and the layer (multi_head, positional encodings,
// MultiHeadAttention, KVCache, PagedKVCache). Files (attn/io.hpp, attn/file.hpp) and ONNX's
// operators (attn/onnx.hpp) have their own headers.
#pragma once

#include "attn/attention.hpp"
#include "attn/batch_attention.hpp"
#include "attn/cascade.hpp"
#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "attn/latent_attention.hpp"
#include "attn/latent_cache.hpp"
#include "attn/linear.hpp"
#include "attn/mask.hpp"
#include "attn/multi_head.hpp"
#include "attn/multi_head_attention.hpp"
#include "attn/multi_head_latent_attention.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/positional.hpp"
#include "attn/random.hpp"
#include "attn/rope_scaling.hpp"
#include "attn/softmax.hpp"
#include "attn/sparse_attention.hpp"
#include "attn/tensor.hpp"
#include "attn/threads.hpp"
#include "attn/varlen.hpp"
