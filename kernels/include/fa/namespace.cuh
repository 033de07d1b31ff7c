// The namespace every piece of kernel code lives in: fa::device in the nvcc build, fa::host_emulation in the
// host (emulator) build. Both builds compile the same sources into two static libraries linked into one
// binary; with one inline namespace per build, every kernel, helper and template instantiation has a
// different mangled name in each library, so the linker can never fold the emulator's call into the GPU
// library's copy of a function or vice versa (the One Definition Rule holds by construction, not by every
// file remembering an anonymous namespace). Code still writes and reads `fa::name`.
#pragma once

#if defined(__CUDACC__)
#define FA_NAMESPACE_BEGIN                                                                                   \
  namespace fa {                                                                                             \
  inline namespace device {
#else
#define FA_NAMESPACE_BEGIN                                                                                   \
  namespace fa {                                                                                             \
  inline namespace host_emulation {
#endif
#define FA_NAMESPACE_END                                                                                     \
  }                                                                                                          \
  }
