// The namespace every piece of kernel code lives in. Only the host build (launchers + emulator) is linked
// into Rust binaries; nvcc's build is device code in fatbins, so no symbol is ever defined twice.
#pragma once

#define FA_NAMESPACE_BEGIN namespace fa {
#define FA_NAMESPACE_END }
