// What autograd needs to run backward on fake CUDA tensors in a libtorch
// built without CUDA. Where libtorch has CUDA, nothing is replaced.
#pragma once

namespace metamem {

// Registers a no-op CUDA device guard (streams, events) and CUDA hooks that
// report one device while a fake-CUDA MetaMode is active. Must run before
// the first backward: the autograd engine sizes its device queues then.
void install_fake_cuda();

// Whether a fake-CUDA MetaMode is active (set by MetaMode).
void set_fake_cuda_active(bool active);

}  // namespace metamem
