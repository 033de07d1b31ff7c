// Eight consecutive elements <-> eight floats, as 16-byte global accesses: the unit in which the decode
// epilogue and the merge kernel move rows. fp16/bf16: one 16-byte access; fp32: two. Row starts must be
// 16-byte aligned (the Rust layer checks base pointers and strides).
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/paged_view.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

template <class T> struct Vec8 {
  FA_DEVICE static void load(const T *p, float (&x)[8]) {
    const Vec16 v = ld_global_nc(reinterpret_cast<const Vec16 *>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) unpack2<T>(w[i], x[2 * i], x[2 * i + 1]);
  }
  FA_DEVICE static void store(T *p, const float (&x)[8]) {
    Vec16 v;
    v.x = pack2<T>(x[0], x[1]);
    v.y = pack2<T>(x[2], x[3]);
    v.z = pack2<T>(x[4], x[5]);
    v.w = pack2<T>(x[6], x[7]);
    st_global(reinterpret_cast<Vec16 *>(p), v);
  }
};

template <> struct Vec8<float> {
  FA_DEVICE static void load(const float *p, float (&x)[8]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 v = ld_global_nc(reinterpret_cast<const float4 *>(p + 4 * h));
      x[4 * h] = v.x;
      x[4 * h + 1] = v.y;
      x[4 * h + 2] = v.z;
      x[4 * h + 3] = v.w;
    }
  }
  FA_DEVICE static void store(float *p, const float (&x)[8]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      st_global(reinterpret_cast<float4 *>(p + 4 * h), make_float4(x[4 * h], x[4 * h + 1], x[4 * h + 2], x[4 * h + 3]));
  }
};

FA_NAMESPACE_END
