// Host only: the second launch of a split-KV launcher (decode, paged prefill). Their kernels leave the fp32
// partials of each split, o [num_splits, rows, Hq, D] and lse [num_splits, rows, Hq] (contiguous, a row being
// a sequence in decode and a query token in paged prefill; D is V's head dim, head_dim_v, which the launchers
// resolve from 0 before they get here); fa_merge (merge.cu) combines them into the caller's o and lse.
#pragma once

#include "fa/abi.h"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

#if defined(FA_HOST_BUILD)
FA_NAMESPACE_BEGIN

// Where the merge writes: o[row, h] at o + row * o_row_stride + h * p.o_head_stride, lse[row, h] at
// lse + row * lse_row_stride + h * lse_head_stride (elements). Params is FaDecodeParams or
// FaPagedPrefillParams: the partials, outputs, shape, dtype and sinks are read from it under the same names.
template <class Params>
int merge_split_kv_partials(const Params &p, int rows, int64_t o_row_stride, int64_t lse_row_stride,
                            int64_t lse_head_stride, FaExec *exec) {
  FaMergeParams m = {};
  m.o_states = p.partial_o;
  m.lse_states = p.partial_lse;
  m.o = p.o;
  m.lse = p.lse;
  m.o_state_stride = (int64_t)rows * p.heads_q * p.head_dim_v;
  m.o_outer_stride = (int64_t)p.heads_q * p.head_dim_v;
  m.o_inner_stride = p.head_dim_v;
  m.lse_state_stride = (int64_t)rows * p.heads_q;
  m.lse_outer_stride = p.heads_q;
  m.lse_inner_stride = 1;
  m.o_out_outer_stride = o_row_stride;
  m.o_out_inner_stride = p.o_head_stride;
  m.lse_out_outer_stride = lse_row_stride;
  m.lse_out_inner_stride = lse_head_stride;
  m.num_states = p.num_splits;
  m.rows_outer = rows;
  m.out_rows = rows;
  m.rows_inner = p.heads_q;
  m.head_dim = p.head_dim_v;
  m.states_dtype = FA_DTYPE_F32;
  m.out_dtype = p.dtype;
  m.sinks = p.score_mod.sinks; // the partials never include the sink: it enters here, once
  return fa_merge(m, exec);
}

// The scheduled decode's merge: `rows` entries of `list` (fa/abi.h FaMergeRow), each naming its output row (a
// sequence, or a short query's q row) and its run of states in the partials [num_states, Hq, D] / [num_states, Hq].
// `out_rows` is the launch's own output rows: the list is device data (rewritten by a later prepare before a
// graph replay), so entries naming a row at or past it are skipped.
template <class Params>
int merge_split_kv_rows(const Params &p, const FaMergeRow *list, int rows, int num_states, int out_rows,
                        int64_t o_row_stride, int64_t lse_row_stride, int64_t lse_head_stride, FaExec *exec) {
  FaMergeParams m = {};
  m.o_states = p.partial_o;
  m.lse_states = p.partial_lse;
  m.o = p.o;
  m.lse = p.lse;
  m.o_state_stride = (int64_t)p.heads_q * p.head_dim_v;
  m.o_inner_stride = p.head_dim_v;
  m.lse_state_stride = p.heads_q;
  m.lse_inner_stride = 1;
  m.o_out_outer_stride = o_row_stride;
  m.o_out_inner_stride = p.o_head_stride;
  m.lse_out_outer_stride = lse_row_stride;
  m.lse_out_inner_stride = lse_head_stride;
  m.num_states = num_states;
  m.rows_outer = rows;
  m.rows_inner = p.heads_q;
  m.head_dim = p.head_dim_v;
  m.states_dtype = FA_DTYPE_F32;
  m.out_dtype = p.dtype;
  m.sinks = p.score_mod.sinks;
  m.row_list = list;
  m.out_rows = out_rows;
  return fa_merge(m, exec);
}

FA_NAMESPACE_END
#endif
