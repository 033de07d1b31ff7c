//! An emulated causal GQA prefill through fused-attn's public API, checked against its fp64 reference.
use fused_attn::prefill::{prefill, PrefillOptions};
use fused_attn::reference::{compare, dense, Arith, Problem, Variants};
use fused_attn::{DType, Emulator, Stream, TensorView, TensorViewMut};
use half::bf16;

fn main() -> Result<(), fused_attn::Error> {
    let (b, t, hq, hkv, d) = (1, 80, 4, 2, 64);
    let gen = |n: usize, salt: usize| -> Vec<bf16> {
        (0..n).map(|i| bf16::from_f32((((i * 7919 + salt) % 1000) as f32 / 500.0 - 1.0) * 0.8 + 0.1)).collect()
    };
    let (q, k, v) = (gen(b * t * hq * d, 1), gen(b * t * hkv * d, 2), gen(b * t * hkv * d, 3));
    let mut o = vec![bf16::NAN; b * t * hq * d];
    let mut lse = vec![f32::NAN; b * hq * t];
    let emu = Emulator::new();
    prefill(
        &Stream::Emu(&emu),
        &TensorView::host(&q, [b, t, hq, d])?,
        &TensorView::host(&k, [b, t, hkv, d])?,
        &TensorView::host(&v, [b, t, hkv, d])?,
        &mut TensorViewMut::host(&mut o, [b, t, hq, d])?,
        Some(&mut TensorViewMut::host(&mut lse, [b, hq, t])?),
        &PrefillOptions { causal: true, scale: None, ..Default::default() },
    )?;
    let f = |x: &[bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let p = Problem::new(b, hq, hkv, t, t, d, true);
    let want = dense(&p, &Variants::default(), Arith::F64, &f(&q), &f(&k), &f(&v))?;
    let naive = dense(&p, &Variants::default(), Arith::Lowp(DType::Bf16), &f(&q), &f(&k), &f(&v))?.out;
    let c = compare(&f(&o), &want.out, &naive);
    println!("downstream prefill: max |err| {:.3e} (tolerance {:.3e})", c.max_abs_err, c.tolerance);
    if !c.passed {
        eprintln!("downstream check FAILED");
        std::process::exit(1);
    }
    println!("downstream ok (GPU kernels built: {})", fused_attn::build_info::has_gpu_kernels());
    Ok(())
}
