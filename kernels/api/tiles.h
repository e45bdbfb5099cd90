// The tiling of the CUDA state walks (kernels/cuda/gdn_chunk_state_kernel.cuh: fwd_summaries,
// fwd_states, bwd_summaries, bwd_states), in one place for the kernels and the segment planner
// (core/plan/segment_plan.cpp). A walk runs one thread block per (segment, value head, tile of
// kStateWalkTileV value columns) (the forward summaries add K / kStateWalkTileV tiles of the
// transfer plane), and the kernels are compiled for kStateWalkBlocksPerSm resident blocks per
// SM (__launch_bounds__). Host and device, header-only, C++17.
#pragma once

namespace kcp::kernels {

inline constexpr int kStateWalkTileV = 32;       // value columns per block of a state walk
inline constexpr int kStateWalkBlocksPerSm = 2;  // resident blocks per SM the walks are built for

}  // namespace kcp::kernels
