// Launchers of the wgmma + TMA state walks (gdn_walk_wgmma.cuh), the hooks of the walks'
// dispatchers (dispatch_fwd_walk, dispatch_bwd_walk: gdn_chunk_state_kernel.cuh), GDN and KDA.
// Host code, included by kernels/cuda/*.cu only.
#pragma once

#include <cuda_runtime.h>

#include "kernels/api/problem.h"
#include "kernels/cuda/kda_qs.h"
#include "kernels/cuda/walk_select.h"

namespace kcp::kernels::cuda {

struct FwdWalkParams;  // gdn_chunk_state_kernel.cuh
struct BwdWalkParams;

// Runs the forward walk (states: fwd_states, else fwd_summaries) with the wgmma kernel and returns
// true when it supports the problem here (fwd_walk_uses_wgmma and 16-byte-aligned 16-bit
// tensors); returns false having launched nothing otherwise (the caller runs fwd_walk_kernel).
// p.o set (GDN, states only): the walk also writes o and leaves h unwritten (gdn_walk_out.cuh).
bool launch_fwd_walk_wgmma(const Problem& pb, const FwdWalkParams& p, bool states, cudaStream_t st);

// The same for the backward walk (states: bwd_states, else bwd_summaries; bwd_walk_uses_wgmma;
// otherwise the caller runs bwd_walk_kernel). KDA: also needs p.qs (the scratch that
// launch_kda_qs fills first, on the same stream, for the tokens of qs_rows, null: every token;
// 16-byte aligned).
bool launch_bwd_walk_wgmma(const Problem& pb, const BwdWalkParams& p, bool states, cudaStream_t st,
                           const QsRows* qs_rows = nullptr);

}  // namespace kcp::kernels::cuda
