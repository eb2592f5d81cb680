// attn: multi-head attention and positional encodings in C++.
#pragma once

#include "attn/adam.hpp"
#include "attn/attention.hpp"
#include "attn/embedding.hpp"
#include "attn/error.hpp"
#include "attn/experiments.hpp"
#include "attn/io.hpp"
#include "attn/kv_cache.hpp"
#include "attn/mask.hpp"
#include "attn/multi_head.hpp"
#include "attn/multi_head_attention.hpp"
#include "attn/picture.hpp"
#include "attn/positional.hpp"
#include "attn/softmax.hpp"
#include "attn/tensor.hpp"
#include "attn/train.hpp"
