// Acting on a parameter's gradient once autograd has accumulated it (the
// training steps' hand-offs: fp32 main gradients, ZeRO's reductions).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch::autograd {
class Node;
}

namespace metamem {

// Calls `fn` each time autograd has accumulated `param`'s gradient. Returns
// the accumulator node the hook lives on, which the parameter holds only
// weakly (keep it while the hook is wanted), or null if `param` needs no
// gradient.
c10::intrusive_ptr<torch::autograd::Node> after_accumulation(const at::Tensor& param, std::function<void()> fn);

}  // namespace metamem
