//! The executor on small handwritten PTX: reconvergence after divergence, the ISA-named undefined behaviour
//! it reports (an uninitialised register, a shfl.sync member mask that does not match the lanes, a
//! misaligned access), and messages naming kernel, thread and PTX line. No fused-attn kernel involved.

use ptx_exec::{run, Approx, Global, Launch, Module};

const APPROX: Approx = Approx { ex2_ftz: f32::exp2 };

fn module(body: &str) -> Module {
    let text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry k(\n.param .align 8 .b8 k_param_0[8]\n)\n{{\n{body}\n}}\n"
    );
    Module::parse(&text).unwrap_or_else(|e| panic!("{e}"))
}

fn launch(m: &Module, block: u32, out: &mut [u32]) -> Result<(), String> {
    let params = (out.as_ptr() as u64).to_le_bytes();
    let mut g = Global::new();
    // SAFETY: u32 viewed as bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 4) };
    g.output("out", bytes);
    let l = Launch { grid: [1, 1, 1], block, dynamic_shared: 0, params: &params };
    run(m.kernel("k").unwrap(), &l, &mut g, APPROX).map(drop).map_err(|e| e.to_string())
}

const PROLOGUE: &str = "
.reg .pred %p<4>;
.reg .b32 %r<16>;
.reg .b64 %rd<8>;
ld.param.u64 %rd1, [k_param_0];
cvta.to.global.u64 %rd2, %rd1;
mov.u32 %r1, %tid.x;
mul.wide.u32 %rd3, %r1, 4;
add.s64 %rd4, %rd2, %rd3;
";

/// Odd and even lanes take different paths, then shuffle after the join: a full-warp shfl.sync there is
/// only defined if the warp has reconverged (the immediate post-dominator of the branch).
#[test]
fn diverged_lanes_reconverge_before_a_full_warp_shuffle() {
    let m = module(&format!(
        "{PROLOGUE}
and.b32 %r2, %r1, 1;
setp.eq.s32 %p1, %r2, 0;
@%p1 bra $EVEN;
mul.lo.s32 %r3, %r1, 100;
bra.uni $JOIN;
$EVEN:
add.s32 %r3, %r1, 7;
$JOIN:
shfl.sync.bfly.b32 %r4, %r3, 1, 31, -1;
st.global.u32 [%rd4], %r4;
ret;"
    ));
    let mut out = vec![0u32; 64];
    launch(&m, 64, &mut out).unwrap();
    let own = |l: u32| if l % 2 == 0 { l + 7 } else { l * 100 };
    let want: Vec<u32> = (0..64).map(|l| own(l ^ 1)).collect();
    assert_eq!(out, want);
}

#[test]
fn reading_an_uninitialised_register_is_reported() {
    let m = module(&format!(
        "{PROLOGUE}
setp.lt.u32 %p1, %r1, 5;
@%p1 mov.u32 %r5, 1;
st.global.u32 [%rd4], %r5;
ret;"
    ));
    let mut out = vec![0u32; 32];
    let e = launch(&m, 32, &mut out).unwrap_err();
    assert!(e.contains("thread 5: reads register %r5 before any write to it"), "{e}");
    assert!(e.contains("kernel k block (0,0,0)") && e.contains("PTX line 21"), "{e}");
}

#[test]
fn a_shuffle_whose_member_mask_is_not_the_converged_lanes_is_reported() {
    let m = module(&format!(
        "{PROLOGUE}
setp.lt.u32 %p1, %r1, 16;
@!%p1 bra $DONE;
shfl.sync.idx.b32 %r4, %r1, 0, 31, -1;
st.global.u32 [%rd4], %r4;
$DONE:
ret;"
    ));
    let mut out = vec![0u32; 32];
    let e = launch(&m, 32, &mut out).unwrap_err();
    assert!(e.contains("shfl.sync with member mask 0xffffffff executed by lanes 0x0000ffff"), "{e}");
}

#[test]
fn a_misaligned_vector_store_is_reported() {
    let m = module(&format!(
        "{PROLOGUE}
st.global.v2.u32 [%rd4+4], {{%r1, %r1}};
ret;"
    ));
    let mut out = vec![0u32; 80];
    let e = launch(&m, 32, &mut out).unwrap_err();
    assert!(e.contains("thread 0: misaligned global store of 8 bytes"), "{e}");
}
