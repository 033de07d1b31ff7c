//! Scalar models of the PTX ISA's wgmma layouts and TMA boxes, and the cases built on them, shared by
//! tests/it/hopper.rs (emulator against the models) and tests/it/gpu_vs_emulator.rs (GPU against the emulator).
#![allow(dead_code)]

use fused_attn::tensor_map::{TensorMapSpec, TmaSwizzle};
use fused_attn::testkit::emu_selftest::WgmmaCase;
use fused_attn::testkit::seed::FixtureRng;
use fused_attn::DType;
use half::{bf16, f16};
use rand::{Rng, RngCore};

/// Row and column of accumulator register `i` of thread `t` (0..128) in the 64 x N tile of
/// wgmma.m64nNk16 (PTX ISA figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix D").
pub fn d_position(t: usize, i: usize) -> (usize, usize) {
    let (w, l) = (t / 32, t % 32);
    (16 * w + l / 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (l % 4) + (i & 1))
}

/// Row and column of half `h` of A register `j` of thread `t` (the RS form's A fragment, 64 x 16).
pub fn a_position(t: usize, j: usize, h: usize) -> (usize, usize) {
    let (w, l) = (t / 32, t % 32);
    (16 * w + l / 4 + 8 * (j & 1), 2 * (l % 4) + 8 * (j >> 1) + h)
}

/// A shared-memory operand layout: the canonical layouts of PTX ISA 9.7.15.5.1.2 with the strides this
/// model picks for a tile of `rows` (M or N) x 16·k_steps.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub mn_major: bool,
    pub swizzle: u32,
    pub lbo: u32,
    pub sbo: u32,
    /// Bytes the descriptor's start advances per k16 step.
    pub k_step: u32,
    pub rows: usize,
    pub k_steps: usize,
}

impl Layout {
    pub fn new(mn_major: bool, swizzle: u32, rows: usize, k_steps: usize) -> Self {
        let ks = k_steps as u32;
        let (lbo, sbo, k_step) = match (mn_major, swizzle) {
            // Core matrices of 8 rows x 16 bytes; the K ones of a row group side by side.
            (false, 0) => (128, 256 * ks, 256),
            // Rows of S bytes (the whole K of the tile), 8-row groups S·8 apart; LBO unused (1).
            (false, s) => (16, 8 * s, 32),
            // Core matrices of 8 k-rows x 8 mn; k groups 128 bytes apart, mn groups after all of K.
            (true, 0) => (128, 256 * ks, 256),
            // Rows of S bytes along MN, 8 k-rows per group (SBO), S/2-element MN blocks after all of K.
            (true, s) => (16 * s * ks, 8 * s, 16 * s),
        };
        Layout { mn_major, swizzle, lbo, sbo, k_step, rows, k_steps }
    }

    /// Byte offset (before swizzling) of element (mn, k), k in 0..16·k_steps.
    pub fn offset(&self, mn: usize, k: usize) -> usize {
        let (kk, step) = (k % 16, k / 16);
        let (lbo, sbo, s) = (self.lbo as usize, self.sbo as usize, self.swizzle as usize);
        let within = match (self.mn_major, s) {
            (false, 0) => 16 * (mn % 8) + sbo * (mn / 8) + 2 * (kk % 8) + lbo * (kk / 8),
            (false, s) => s * (mn % 8) + sbo * (mn / 8) + 2 * kk,
            (true, 0) => 2 * (mn % 8) + sbo * (mn / 8) + 16 * (kk % 8) + lbo * (kk / 8),
            (true, s) => 2 * (mn % (s / 2)) + lbo * (mn / (s / 2)) + s * (kk % 8) + sbo * (kk / 8),
        };
        self.k_step as usize * step + within
    }

    /// Swizzle<log2(S/16), 4, 3> on an offset from a 1024-byte aligned base.
    pub fn swizzled(&self, o: usize) -> usize {
        if self.swizzle == 0 {
            o
        } else {
            o ^ (((o >> 7) & (self.swizzle as usize / 16 - 1)) << 4)
        }
    }

    /// The descriptor with start address 0 (PTX ISA "Matrix Descriptor Format").
    pub fn descriptor(&self) -> u64 {
        let mode: u64 = match self.swizzle {
            0 => 0,
            128 => 1,
            64 => 2,
            _ => 3,
        };
        ((self.lbo as u64 >> 4) << 16) | ((self.sbo as u64 >> 4) << 32) | (mode << 62)
    }

    /// The shared-memory image of `m` (rows x 16·k_steps raw 16-bit values), padded to 16 bytes.
    pub fn image(&self, m: &[u16]) -> Vec<u8> {
        let cols = 16 * self.k_steps;
        let mut size = 0;
        for r in 0..self.rows {
            for k in 0..cols {
                size = size.max(self.swizzled(self.offset(r, k)) + 2);
            }
        }
        let mut img = vec![0u8; size.div_ceil(16) * 16];
        for r in 0..self.rows {
            for k in 0..cols {
                let o = self.swizzled(self.offset(r, k));
                img[o..o + 2].copy_from_slice(&m[r * cols + k].to_le_bytes());
            }
        }
        img
    }
}

pub fn to_f32(dtype: DType, bits: u16) -> f32 {
    match dtype {
        DType::F16 => f16::from_bits(bits).to_f32(),
        DType::Bf16 => bf16::from_bits(bits).to_f32(),
    }
}

pub fn from_f32(dtype: DType, x: f32) -> u16 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_bits(),
        DType::Bf16 => bf16::from_f32(x).to_bits(),
    }
}

/// Small integers: every sum of products is exact in fp32, so any summation order gives the same bits
/// (what makes a bit-for-bit GPU comparison meaningful).
pub fn exact_values(rng: &mut FixtureRng, dtype: DType, n: usize) -> Vec<u16> {
    (0..n).map(|_| from_f32(dtype, rng.random_range(0..9usize) as f32 - 4.0)).collect()
}

/// D = A·B + C in fragment order, summing the products of each k16 step in k order in fp32 (as the
/// emulator and mma.sync's model do). a: 64 x K, b: N x K (B's element (k, n) is b[n][k]); c, result:
/// [128][N/2]. `accumulate` false: C is ignored.
pub fn wgmma_reference(
    dtype: DType,
    a: &[u16],
    b: &[u16],
    c: &[f32],
    n: usize,
    k: usize,
    accumulate: bool,
) -> Vec<f32> {
    let mut d = vec![0f32; 128 * n / 2];
    for t in 0..128 {
        for i in 0..n / 2 {
            let (row, col) = d_position(t, i);
            let mut acc = if accumulate { c[t * n / 2 + i] } else { 0.0 };
            for kk in 0..k {
                acc += to_f32(dtype, a[row * k + kk]) * to_f32(dtype, b[col * k + kk]);
            }
            d[t * n / 2 + i] = acc;
        }
    }
    d
}

/// A TMA box's shared-memory image: row-major over the box, zero where a coordinate is out of bounds,
/// then swizzled. `tensor` holds `dims` elements of `elem` bytes with byte `strides` (dimension 0 dense).
pub fn tma_box_image(
    tensor: &[u8],
    elem: usize,
    dims: &[u64],
    strides: &[u64],
    box_dims: &[u32],
    coords: &[i32],
    swizzle: u32,
) -> Vec<u8> {
    let total: usize = box_dims.iter().map(|&b| b as usize).product();
    let mut img = vec![0u8; total * elem];
    for linear in 0..total {
        let mut rem = linear;
        let mut src = Some(0usize);
        for d in 0..dims.len() {
            let i = rem % box_dims[d] as usize;
            rem /= box_dims[d] as usize;
            let g = coords[d] as i64 + i as i64;
            if g < 0 || g >= dims[d] as i64 {
                src = None;
            } else if let Some(s) = src.as_mut() {
                *s += g as usize * if d == 0 { elem } else { strides[d - 1] as usize };
            }
        }
        let o = linear * elem;
        let o = if swizzle == 0 { o } else { o ^ (((o >> 7) & (swizzle as usize / 16 - 1)) << 4) };
        if let Some(s) = src {
            img[o..o + elem].copy_from_slice(&tensor[s..s + elem]);
        }
    }
    img
}

pub fn tensor_bytes(rng: &mut FixtureRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8 | 1).collect() // never 0: zero fill is visible
}

pub fn spec(elem: u32, dims: &[u64], box_dims: &[u32], swizzle: TmaSwizzle) -> TensorMapSpec {
    // Dense rows padded to 16 bytes.
    let mut strides = Vec::new();
    let mut s = (dims[0] * elem as u64).div_ceil(16) * 16;
    for &d in &dims[1..] {
        strides.push(s);
        s *= d;
    }
    TensorMapSpec { elem_bytes: elem, dims: dims.to_vec(), strides, box_dims: box_dims.to_vec(), swizzle }
}

pub fn tensor_len(s: &TensorMapSpec) -> usize {
    (s.strides.last().copied().unwrap_or(0) * s.dims.last().copied().unwrap_or(1)).max(s.dims[0] * s.elem_bytes as u64)
        as usize
}

pub fn tma_cases() -> Vec<(TensorMapSpec, Vec<i32>)> {
    vec![
        (spec(2, &[40], &[16], TmaSwizzle::None), vec![32]),
        (spec(2, &[64, 30], &[64, 16], TmaSwizzle::B128), vec![0, 22]),
        (spec(2, &[64, 30], &[64, 8], TmaSwizzle::B128), vec![-8, -3]),
        (spec(2, &[48, 20], &[32, 16], TmaSwizzle::B64), vec![24, 8]),
        (spec(2, &[24, 20], &[16, 12], TmaSwizzle::B32), vec![16, -4]),
        (spec(4, &[20, 9, 5], &[8, 4, 3], TmaSwizzle::B32), vec![16, 7, 3]),
        (spec(2, &[64, 6, 5, 3], &[64, 4, 2, 2], TmaSwizzle::B128), vec![0, 3, -1, 2]),
        (spec(2, &[16, 3, 4, 2, 3], &[8, 2, 2, 2, 2], TmaSwizzle::None), vec![12, 2, 3, 1, -1]),
    ]
}

/// One wgmma case: random A and B in the model's layouts, their shared images, RS registers, C.
pub struct WgmmaSetup {
    pub a: Vec<u16>,
    pub b: Vec<u16>,
    pub a_img: Vec<u8>,
    pub b_img: Vec<u8>,
    pub a_regs: Option<Vec<u32>>,
    pub c: Vec<f32>,
    pub la: Layout,
    pub lb: Layout,
}

/// One case of the wgmma layout sweep: A and B layouts (MN-major?, swizzle bytes), `rs` (A from registers,
/// K-major only), whether D accumulates onto C.
#[derive(Clone, Copy, Debug)]
pub struct WgmmaSweepCase {
    pub dtype: DType,
    pub n: usize,
    pub a_sw: (bool, u32),
    pub b_sw: (bool, u32),
    pub rs: bool,
    pub accumulate: bool,
}

/// Every layout pair of A and B (K/MN-major x no/32/64/128-byte swizzle), SS and RS (RS on the diagonal),
/// f16 and bf16, at N = 64; N in {16, 128, 176, 256} with a rotating subset of layouts.
pub fn wgmma_sweep() -> Vec<WgmmaSweepCase> {
    let layouts: Vec<(bool, u32)> =
        [false, true].iter().flat_map(|&mn| [0u32, 32, 64, 128].map(move |s| (mn, s))).collect();
    let mut cases = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for (i, &a_sw) in layouts.iter().enumerate() {
            for (j, &b_sw) in layouts.iter().enumerate() {
                for n in [16usize, 64, 128, 176, 256] {
                    if n == 64 || (i + j + n / 16) % 7 == 0 {
                        cases.push(WgmmaSweepCase { dtype, n, a_sw, b_sw, rs: i == j, accumulate: (i + j) % 2 == 0 });
                    }
                }
            }
        }
    }
    cases
}

pub fn k_steps_for(swizzles: &[(bool, u32)]) -> usize {
    // K-major swizzled tiles keep all of K in one S-byte row: S / 32 k16 steps at most.
    swizzles.iter().map(|&(mn, s)| if !mn && s != 0 { (s / 32) as usize } else { 2 }).min().unwrap_or(2).min(2)
}

pub fn wgmma_setup(
    rng: &mut FixtureRng,
    dtype: DType,
    n: usize,
    a_sw: (bool, u32),
    b_sw: (bool, u32),
    rs: bool,
    exact: bool,
) -> WgmmaSetup {
    let k_steps = k_steps_for(&if rs { vec![b_sw] } else { vec![a_sw, b_sw] });
    let k = 16 * k_steps;
    let values = |rng: &mut FixtureRng, len| {
        if exact {
            exact_values(rng, dtype, len)
        } else {
            (0..len).map(|_| from_f32(dtype, rng.random_range(-2.0..2.0) as f32)).collect()
        }
    };
    let a = values(rng, 64 * k);
    let b = values(rng, n * k);
    let la = Layout::new(a_sw.0, a_sw.1, 64, k_steps);
    let lb = Layout::new(b_sw.0, b_sw.1, n, k_steps);
    let a_regs = rs.then(|| {
        let mut r = vec![0u32; k_steps * 128 * 4];
        for s in 0..k_steps {
            for t in 0..128 {
                for j in 0..4 {
                    let half = |h| {
                        let (row, col) = a_position(t, j, h);
                        a[row * k + 16 * s + col] as u32
                    };
                    r[(s * 128 + t) * 4 + j] = half(0) | half(1) << 16;
                }
            }
        }
        r
    });
    let c: Vec<f32> = (0..128 * n / 2)
        .map(|_| if exact { rng.random_range(0..17usize) as f32 - 8.0 } else { rng.random_range(-4.0..4.0) as f32 })
        .collect();
    WgmmaSetup { a_img: if rs { vec![] } else { la.image(&a) }, b_img: lb.image(&b), a, b, a_regs, c, la, lb }
}

impl WgmmaSetup {
    pub fn case(&self, dtype: DType, n: usize, accumulate: bool) -> WgmmaCase<'_> {
        WgmmaCase {
            dtype,
            n,
            a_smem: &self.a_img,
            b_smem: &self.b_img,
            a_regs: self.a_regs.as_deref(),
            c: &self.c,
            desc_a: if self.a_regs.is_some() { 0 } else { self.la.descriptor() },
            desc_b: self.lb.descriptor(),
            a_k_step_bytes: self.la.k_step,
            b_k_step_bytes: self.lb.k_step,
            k_steps: self.lb.k_steps,
            trans_a: self.a_regs.is_none() && self.la.mn_major,
            trans_b: self.lb.mn_major,
            accumulate,
        }
    }

    pub fn reference(&self, dtype: DType, n: usize, accumulate: bool) -> Vec<f32> {
        wgmma_reference(dtype, &self.a, &self.b, &self.c, n, 16 * self.lb.k_steps, accumulate)
    }
}
