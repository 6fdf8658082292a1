// The HBM floor of a decode-step GEMV on this GPU, in hand-written CUDA C++ (issue 6's
// reference point for example 09's and 13's projections): y = W·x with f16 W (M × K,
// row-major), f32 accumulation, at the shapes of Llama-2-7B's and Llama-3.2-1B's decode
// projections. Prints (1) the ceilings for reading the same bytes: cudaMemcpyAsync
// device-to-device and a read-only kernel at 2-8 blocks of 256 per SM and 4 or 8 loads of
// 16 bytes a thread; (2) a sweep of one GEMV kernel over its plan: R rows a warp, V 16-byte
// vectors per lane per item, the next item loaded before the current one is used, WARPS per
// block, min blocks per SM (launch bounds), full grid or persistent. Each figure is µs per
// launch: the median of 22 passes of 20 back-to-back launches (CUDA events), rotating over
// copies of W in a 1 GiB pool so that every launch reads HBM (as in a decode step, whose
// weights exceed the L2). Not part of the build; on the GPU machine:
//
//     nvcc -O3 -std=c++17 -arch=sm_90 scripts/gemv-sweep.cu -o gemv-sweep && ./gemv-sweep
//
// Results: results/gemv-sweep-h200.md.
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdint>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
    const half2* a = (const half2*)&w; const half2* b = (const half2*)&x;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) { float2 fa = __half22float2(a[i]), fb = __half22float2(b[i]); s = fmaf(fa.x, fb.x, s); s = fmaf(fa.y, fb.y, s); }
    return s;
}
__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
    uint4 r; asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p)); return r;
}

// Each warp walks items (row group of R rows, chunk s of 32*V vectors per row); the next item's
// loads are issued before the current one is used. Grid: `blocks` (persistent if fewer than needed).
template <int R, int V, int WARPS, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB) gemv(const uint4* __restrict__ w, const uint4* __restrict__ x, half* __restrict__ y, int M, int K) {
    extern __shared__ uint4 xs[];
    const int kv = K / 8, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gw = blockIdx.x * WARPS + warp, nw = gridDim.x * WARPS;
    const int steps = kv / (32 * V), groups = M / R;
    const int my_groups = groups > gw ? (groups - gw + nw - 1) / nw : 0;
    const int items = my_groups * steps;
    auto load = [&](uint4 (&buf)[R][V], int t) {
        if (t < items) {
            int g = gw + (t / steps) * nw, s = t % steps;
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int v = 0; v < V; v++) buf[r][v] = ldg_stream(w + (size_t)(g * R + r) * kv + s * 32 * V + v * 32 + lane);
        }
    };
    uint4 a[R][V], b[R][V];
    load(a, 0);
    for (int i = threadIdx.x; i < kv; i += blockDim.x) xs[i] = x[i];
    __syncthreads();
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    auto use = [&](uint4 (&buf)[R][V], int t) {
        int g = gw + (t / steps) * nw, s = t % steps;
#pragma unroll
        for (int v = 0; v < V; v++) {
            uint4 xv = xs[s * 32 * V + v * 32 + lane];
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] += dot8(buf[r][v], xv);
        }
        if (s == steps - 1) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                float t2 = acc[r];
                for (int o = 16; o; o >>= 1) t2 += __shfl_xor_sync(~0u, t2, o);
                if (lane == 0) y[g * R + r] = __float2half(t2);
                acc[r] = 0.f;
            }
        }
    };
    for (int t = 0; t < items; t += 2) {
        load(b, t + 1);
        use(a, t);
        if (t + 1 < items) { load(a, t + 2); use(b, t + 1); }
    }
}

// Read-only streaming: each thread U outstanding 16-byte loads per iteration.
template <int U>
__global__ void __launch_bounds__(256) readk(const uint4* __restrict__ w, size_t n, unsigned* out) {
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride * U) {
        uint4 r[U];
#pragma unroll
        for (int u = 0; u < U; u++) r[u] = (i + u * stride < n) ? ldg_stream(w + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
    }
    if (acc == 0x12345678) out[0] = acc;
}

static uint4* pool; static size_t pool_bytes = (size_t)1 << 30;
static cudaStream_t st;

template <class F> float time_us(size_t bytes, F launch) {
    // rotate over copies of W in a 1 GiB pool so that every launch reads HBM
    int copies = (int)std::min<size_t>(pool_bytes / bytes, 32);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<float> v;
    for (int rep = 0; rep < 25; rep++) {
        cudaEventRecord(e0, st);
        for (int i = 0; i < 20; i++) launch((const uint4*)((const char*)pool + (size_t)((rep * 20 + i) % copies) * bytes));
        cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1); if (rep >= 3) v.push_back(ms * 1000 / 20);
    }
    std::sort(v.begin(), v.end()); return v[v.size() / 2];
}

static uint4* dx; static half* dy; static int sms;
template <int R, int V, int WARPS, int MINB> void run(int M, int K, int blocks_per_sm) {
    auto k = gemv<R, V, WARPS, MINB>;
    int smem = K * 2;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int occ; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, WARPS * 32, smem));
    int full = M / R / WARPS;
    int blocks = blocks_per_sm > 0 ? std::min(full, sms * std::min(occ, blocks_per_sm)) : full;
    size_t bytes = (size_t)M * K * 2;
    float us = time_us(bytes, [&](const uint4* w) { k<<<blocks, WARPS * 32, smem, st>>>(w, dx, dy, M, K); });
    CK(cudaGetLastError());
    cudaFuncAttributes fa; cudaFuncGetAttributes(&fa, k);
    printf("| %5dx%-5d | R%d V%d W%d minB%d | %3d regs occ %2d | %5d blocks | %7.2f us | %5.2f TB/s | %3.0f%% |\n", M, K, R, V, WARPS, MINB, fa.numRegs, occ, blocks, us, bytes / us / 1e6, bytes / us / 1e6 / 4.3 * 100);
}

int main() {
    CK(cudaStreamCreate(&st));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&pool, pool_bytes)); CK(cudaMemset(pool, 0x11, pool_bytes));
    CK(cudaMalloc(&dx, 16384 * 2)); CK(cudaMemset(dx, 0x22, 16384 * 2)); CK(cudaMalloc(&dy, 65536 * 2));
    unsigned* dout; CK(cudaMalloc(&dout, 4));
    // copy and pure-read ceilings at each size
    int shapes[][2] = {{4096, 4096}, {12288, 4096}, {2048, 8192}, {16384, 2048}, {3072, 2048}, {2048, 2048}};
    printf("| bytes | kernel | us | TB/s |\n|---|---|---|---|\n");
    for (auto& s : shapes) {
        size_t bytes = (size_t)s[0] * s[1] * 2;
        void* dst; CK(cudaMalloc(&dst, bytes));
        float c = time_us(bytes, [&](const uint4* w) { cudaMemcpyAsync(dst, w, bytes, cudaMemcpyDeviceToDevice, st); });
        printf("| %zu | memcpy D2D (read+write) | %.2f | %.2f (r+w %.2f) |\n", bytes, c, bytes / c / 1e6, 2 * bytes / c / 1e6);
        CK(cudaFree(dst));
        for (int bps : {2, 4, 8}) {
            float r4 = time_us(bytes, [&](const uint4* w) { readk<4><<<sms * bps, 256, 0, st>>>(w, bytes / 16, dout); });
            float r8 = time_us(bytes, [&](const uint4* w) { readk<8><<<sms * bps, 256, 0, st>>>(w, bytes / 16, dout); });
            printf("| %zu | read-only %d blocks/SM, 4 / 8 loads a thread | %.2f / %.2f | %.2f / %.2f |\n", bytes, bps, r4, r8, bytes / r4 / 1e6, bytes / r8 / 1e6);
        }
    }
    printf("\n| shape | config | regs | grid | us | TB/s | %% of 4.3 |\n|---|---|---|---|---|---|---|\n");
    for (auto& s : shapes) {
        int M = s[0], K = s[1];
        run<2, 4, 8, 2>(M, K, 0);   // like decode_qkv_rope: 2 rows x 4 vectors, 2 blocks/SM
        run<2, 4, 8, 3>(M, K, 0);
        run<2, 4, 8, 4>(M, K, 0);
        run<1, 4, 8, 4>(M, K, 0);
        run<1, 8, 8, 3>(M, K, 0);
        run<2, 2, 8, 4>(M, K, 0);
        run<4, 2, 8, 3>(M, K, 0);
        run<2, 4, 8, 3>(M, K, 3);   // persistent
        run<2, 4, 8, 4>(M, K, 4);
        run<1, 4, 8, 4>(M, K, 4);
        run<1, 8, 8, 3>(M, K, 3);
        run<2, 4, 4, 8>(M, K, 0);
        run<1, 4, 4, 8>(M, K, 0);
    }
    return 0;
}
