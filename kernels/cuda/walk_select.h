// Which kernel runs the state walks (forward: fwd_summaries, fwd_states; backward: bwd_summaries,
// bwd_states; GDN and KDA) of the CUDA backend: the wgmma + TMA walk (gdn_walk_wgmma.cuh)
// where it supports the problem on the current device and is the faster one, else the mma.sync
// walk (gdn_chunk_state_kernel.cuh). Host-only, no CUDA types: the GPU tests include it to run the two
// walks side by side. Not a user setting: the product always runs Auto.
#pragma once

#include "kernels/api/problem.h"

namespace kcp::kernels::cuda {

enum class WalkChoice {
  Auto,   // the wgmma walk where supported (K = V in {64, 128}, sm_90 device, sm_90a build): every
          // walk of GDN and KDA (KDA's backward walks since session 18, with qs from the prepass,
          // kda_qs.cu: H100, T = 32768, bwd_states 1.08 vs 1.64 ms, bwd_summaries 0.77 vs 1.29 ms,
          // same output bits; docs/perf-notes.md)
  Mma,    // always the mma.sync walk (the backward choice: also the mma.sync kernels of B4 and B5
          // instead of their wgmma twins, bwd_grads_use_wgmma)
  Wgmma,  // the wgmma walk wherever supported (today the same as Auto; the tests name it when
          // they judge both kernels)
};
using FwdWalkChoice = WalkChoice;  // the forward walks' name of it

// Test hooks: the choice for every later forward / backward walk of this process (default
// Auto). Not synchronised with launches in flight on other threads; set it before a run.
void set_fwd_walk_choice(WalkChoice c);
WalkChoice fwd_walk_choice();
void set_bwd_walk_choice(WalkChoice c);
WalkChoice bwd_walk_choice();

// Whether the forward (backward) walks of `p` run the wgmma walk on the current device under the
// current choice (the tensors' alignment aside: a 16-bit tensor whose address is not 16-byte
// aligned falls back to the mma.sync walk; the backend's bound tensors always are, the caller's
// dO of the backward walks where the caller's allocation is).
bool fwd_walk_uses_wgmma(const Problem& p);
bool bwd_walk_uses_wgmma(const Problem& p);

// Whether the GDN backward gradients (B4 gdn_bwd_dqk, B5 gdn_bwd_wy) may run their wgmma twins on
// the current device under the current backward choice: an sm_90 device, an sm_90a build, the
// choice not Mma. The shapes and dtypes each twin takes are its launcher's (gdn_chunk_bwd.cu).
bool bwd_grads_use_wgmma();

}  // namespace kcp::kernels::cuda
