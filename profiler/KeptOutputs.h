// Selective checkpointing (PyTorch's selective activation checkpointing, in
// C++): while a segment runs forward without autograd, the outputs of
// chosen ops are kept; while it is recomputed, those ops hand back their
// kept outputs instead of running. Autograd, above, records them as usual,
// so their backward runs. It works at the dispatcher, under a dispatch key
// of metamem's own (PrivateUse2), for real and meta tensors alike.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace metamem {

// Ops whose outputs may be kept: matrix products and convolution, which
// return new tensors and dominate a unit's FLOPs.
const std::vector<std::string>& keepable_ops();

// Throws std::invalid_argument naming an op that cannot be kept.
void validate_keep(const std::vector<std::string>& ops);

// The outputs one segment keeps.
class KeptOutputs {
 public:
  explicit KeptOutputs(std::vector<std::string> ops);

  enum class Mode { Record, Replay };
  // While alive on this thread, kept ops record their outputs or return
  // them. A kept output changed in place since it was recorded, or an op
  // sequence that differs, throws.
  class Scope {
   public:
    Scope(KeptOutputs& outputs, Mode mode);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    struct Saved;
    std::unique_ptr<Saved> saved_;
  };

  bool keeps(const std::string& op) const;
  void clear() { entries_.clear(); }

  struct Entry {
    std::string op;
    std::vector<at::Tensor> outputs;
    std::vector<std::int64_t> versions;
  };
  std::deque<Entry>& entries() { return entries_; }

 private:
  std::vector<std::string> ops_;
  std::deque<Entry> entries_;
};

}  // namespace metamem
