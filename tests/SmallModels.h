// Zoo configs small enough for CI: gpt2 with 2 layers of width 64.
#pragma once

#include <string>

#include "examples/zoo/Zoo.h"

namespace metamem::testing {

// `size` is the image side for resnets and the sequence length for gpt2.
inline ZooConfig small_model(std::string model, std::int64_t batch, std::int64_t size) {
  ZooConfig config;
  config.model = std::move(model);
  config.batch = batch;
  config.image = size;
  config.seq = size;
  config.layers = 2;
  config.width = 64;
  config.heads = 4;
  config.vocab = 100;
  config.kv_heads = 2;  // llama: grouped-query attention, two query heads per key/value head
  return config;
}

}  // namespace metamem::testing
