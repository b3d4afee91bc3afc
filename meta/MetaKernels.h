#pragma once

namespace metamem {

// Registers Meta kernels for ops libtorch's C++ Meta backend lacks (their
// meta functions live in Python's torch/_meta_registrations.py).
void register_missing_meta_kernels();

}  // namespace metamem
