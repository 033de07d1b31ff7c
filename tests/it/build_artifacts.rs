//! The build's promises, checked on the built artifacts: fatbins with SASS for every requested arch plus PTX,
//! a ptxas report that lists every kernel with no spills and no stack frame, the instructions each kernel
//! was written for, and no CUDA runtime anywhere in the binaries (kernels launch through the driver API).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use fused_attn::build_info;

fn cuobjdump() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let local = root.join(".toolchain/cuda-tools/nvidia/cu13/bin/cuobjdump");
    if local.is_file() {
        return Some(local);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("cuobjdump")).find(|p| p.is_file())
}

/// Compute capability (10 · major + minor) of each FA_CUDA_ARCHS target ("90a" -> 90).
fn target_ccs() -> Vec<u32> {
    build_info::CUDA_ARCHS.split(',').map(|a| a.trim().trim_end_matches('a').parse().unwrap()).collect()
}

/// The SASS archs ("sm_80", "sm_90a") and PTX archs ("compute_80") a fatbin holds, from cuobjdump.
fn fatbin_archs(tool: &std::path::Path, fatbin: &std::path::Path) -> (Vec<String>, Vec<String>) {
    let listing = |flag: &str| {
        let out = Command::new(tool).arg(flag).arg(fatbin).output().unwrap();
        assert!(out.status.success(), "cuobjdump {flag} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // "ELF file    1: prefill.1.sm_80.cubin", "PTX file    1: prefill.1.sm_80.ptx" (named after the virtual arch's
    // number: compute_80's PTX is "sm_80.ptx").
    let archs = |text: &str, ext: &str| -> Vec<String> {
        let mut v: Vec<String> = text
            .split_whitespace()
            .filter(|w| w.ends_with(ext))
            .filter_map(|w| w.split('.').rev().nth(1).map(str::to_string))
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let sass = archs(&listing("--list-elf"), ".cubin");
    let ptx = archs(&listing("--list-ptx"), ".ptx").iter().map(|a| a.replace("sm_", "compute_")).collect();
    (sass, ptx)
}

/// The SASS the driver runs on a GPU of compute capability `cc`: the highest sm_XY with X its major and
/// Y <= its minor (sm_XYa only on X.Y itself), or None (it would JIT the PTX, or fail).
fn driver_pick(sass: &[String], cc: u32) -> Option<&String> {
    sass.iter()
        .filter(|s| {
            let a = s.trim_start_matches("sm_");
            let n: u32 = a.trim_end_matches('a').parse().unwrap();
            n / 10 == cc / 10 && n <= cc && (!a.ends_with('a') || n == cc)
        })
        .max_by_key(|s| s.trim_start_matches("sm_").trim_end_matches('a').parse::<u32>().unwrap())
}

/// The arch contract (build.rs `gencode_flags`): every fatbin has SASS the driver runs on each target GPU
/// (sm_90a-only fatbins: on 9.0 alone) and, but for the sm_90a-only ones, PTX for newer GPUs. With the fat
/// list (8.0, 8.6, 8.9, 9.0, 10.0, 12.0) it is exactly sm_80 + sm_90 + sm_100 + sm_120 SASS and compute_80
/// PTX per fatbin, plus sm_89 SASS (and compute_89 PTX, with sm_90/100/120 compiled from it) where the FP8
/// kernels are (their hardware conversion, checked below), and sm_90a alone for the wgmma kernels: no SASS
/// the driver would never pick (sm_86: sm_80 runs there with the same code; 12.1 runs sm_120), which is
/// the nvcc time the build budget has no room for.
#[test]
fn fatbins_have_sass_for_every_target_and_ptx() {
    assert!(build_info::has_gpu_kernels(), "this test build has no GPU kernels: {}", build_info::PTXAS_REPORT);
    let Some(tool) = cuobjdump() else {
        panic!("cuobjdump not found: scripts/setup installs it into .toolchain/cuda-tools");
    };
    let fatbins = build_info::fatbins();
    assert!(fatbins.len() >= 5, "expected a fatbin per kernels/*.cu, got {fatbins:?}");
    let default = build_info::CUDA_ARCHS == "80,86,89,90a,100,120";
    for fatbin in &fatbins {
        let (sass, ptx) = fatbin_archs(&tool, fatbin);
        let name = fatbin.file_stem().unwrap().to_string_lossy();
        if build_info::is_sm90_only(fatbin) {
            // sm_90a SASS alone: arch-specific code has no PTX for other GPUs.
            assert_eq!((sass, ptx), (vec!["sm_90a".to_string()], vec![]), "{name} must hold sm_90a only");
            continue;
        }
        for cc in target_ccs() {
            assert!(driver_pick(&sass, cc).is_some(), "{name}: no SASS runs on a {cc} GPU: {sass:?}");
        }
        assert_eq!(ptx.len(), 1, "{name}: one PTX for GPUs newer than its SASS: {ptx:?}");
        if default {
            let fp8 = kernel_names(&tool, fatbin, "sm_80").iter().any(|k| k.contains("fp8"));
            let want: &[&str] = if fp8 {
                &["sm_100", "sm_120", "sm_80", "sm_89", "sm_90"]
            } else {
                &["sm_100", "sm_120", "sm_80", "sm_90"]
            };
            assert_eq!(sass, want, "{name}");
            assert_eq!(ptx, [if fp8 { "compute_89" } else { "compute_80" }], "{name}");
        }
    }
}

/// Kernel names in a fatbin's SASS for `arch` ("sm_80").
fn kernel_names(tool: &std::path::Path, fatbin: &std::path::Path, arch: &str) -> Vec<String> {
    let out = Command::new(tool).arg("--list-text").arg(fatbin).output().unwrap();
    assert!(out.status.success(), "cuobjdump --list-text failed: {}", String::from_utf8_lossy(&out.stderr));
    // "SASS text section 4 : selftest-fa_selftest_fp8_kernel.sm_80.elf.bin" (<fatbin>-<kernel>.<arch>.elf.bin)
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (_, file) = l.split_once(" : ")?;
            let (_, kernel) = file.strip_suffix(&format!(".{arch}.elf.bin"))?.split_once('-')?;
            Some(kernel.to_string())
        })
        .collect()
}

/// Every kernel the launchers can pick (every FA_KERNEL of the host library: the host build instantiates the
/// same kernels, for the emulator) is in the fatbins, in SASS the driver runs on each target GPU: the nvcc
/// jobs that split one source (kernels/decode_fp8.cu, kernels/paged_prefill_fp8.cu) lose none. The sm_90a
/// kernels count on 9.0 alone.
#[test]
fn every_host_kernel_is_in_the_fatbins_for_every_target() {
    let Some(tool) = cuobjdump() else {
        panic!("cuobjdump not found: scripts/setup installs it into .toolchain/cuda-tools");
    };
    // The C ABI's functions (launchers and host helpers) are every extern "C" fa_* that is not a kernel.
    let abi = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/runtime/sys/abi.rs")).unwrap()
        + &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/runtime/sys/selftest_abi.rs")).unwrap();
    let abi: Vec<&str> = abi.split("pub fn ").skip(1).filter_map(|r| r.split('(').next()).collect();
    // The host library: OUT_DIR/libfa_host.a, next to the fatbin directory (build.rs).
    let lib = std::path::Path::new(build_info::FATBIN_DIR).parent().unwrap().join("libfa_host.a");
    let nm = Command::new("nm").args(["--defined-only", "--format=posix"]).arg(&lib).output().expect("nm");
    assert!(nm.status.success(), "nm {} failed: {}", lib.display(), String::from_utf8_lossy(&nm.stderr));
    let mut host: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, kind) = (w.next()?, w.next()?);
            (kind == "T" && name.starts_with("fa_") && !abi.contains(&name)).then(|| name.to_string())
        })
        .collect();
    host.sort();
    host.dedup();
    // Host-only: a planted bug the GPU build cannot compile (it needs a stack frame).
    host.retain(|k| k != "fa_bug_stack_overflow");
    assert!(host.len() >= 100, "only {} kernels in {}: {host:?}", host.len(), lib.display());
    // sm_90a-only kernels: what the sm_90a-only fatbins hold.
    let sm90: Vec<String> = build_info::fatbins()
        .iter()
        .filter(|f| build_info::is_sm90_only(f))
        .flat_map(|f| kernel_names(&tool, f, "sm_90a"))
        .collect();
    for cc in target_ccs() {
        let mut gpu = Vec::new();
        for fatbin in build_info::fatbins() {
            let (sass, _) = fatbin_archs(&tool, &fatbin);
            if let Some(arch) = driver_pick(&sass, cc) {
                gpu.extend(kernel_names(&tool, &fatbin, arch));
            }
        }
        let missing: Vec<&String> =
            host.iter().filter(|k| !gpu.contains(k) && (cc == 90 || !sm90.contains(k))).collect();
        assert!(missing.is_empty(), "kernels a {cc} GPU cannot load: {missing:?}");
    }
}

/// The FP8 kernels convert with the hardware cvt (F2FP ... E4M3 / E5M2) in their SASS for 8.9 and up, which
/// build.rs gets by compiling it from a compute_89 front end (`code_changes_at`), except bf16 decode (in
/// registers, below); sm_80 SASS has the software model (8.0 and 8.6 have no such instruction). Only the fatbins that hold FP8 kernels are disassembled.
#[test]
fn fp8_kernels_use_the_hardware_conversion_from_sm89() {
    let Some(tool) = cuobjdump() else {
        panic!("cuobjdump not found: scripts/setup installs it into .toolchain/cuda-tools");
    };
    let mut checked = 0;
    for fatbin in build_info::fatbins() {
        let (sass, _) = fatbin_archs(&tool, &fatbin);
        if !kernel_names(&tool, &fatbin, &sass[0]).iter().any(|k| k.contains("fp8")) {
            continue;
        }
        for arch in &sass {
            let n: u32 = arch.trim_start_matches("sm_").trim_end_matches('a').parse().unwrap();
            for (name, body) in sass_of(&tool, &fatbin, arch).iter() {
                let hardware = body.lines().any(|l| l.contains("F2FP") && (l.contains(".E4M3") || l.contains(".E5M2")));
                if n < 89 {
                    assert!(!hardware, "{arch}: {name} has an FP8 cvt");
                } else if (name.starts_with("fa_paged_decode_bf16") || name.starts_with("fa_mla_decode_fp8_bf16"))
                    && name.contains("fp8")
                {
                    // bf16 FP8 decode (and MLA decode, the same WarpAttention code) converts in registers on
                    // every arch (byte permute, shift and a power-of-two multiply, exact for every finite
                    // code: fa/fp8_convert.cuh): the cvt produces fp16 only, and fp16 -> bf16 would cost more
                    // than it saves.
                    assert!(!hardware, "{arch}: {name} has an FP8 cvt (bf16 converts in registers)");
                    assert!(body.lines().any(|l| l.contains("PRMT")), "{arch}: {name} has no byte permute");
                    checked += 1;
                } else if name.contains("fp8") {
                    for format in [".E4M3", ".E5M2"] {
                        assert!(
                            body.lines().any(|l| l.contains("F2FP") && l.contains(format)),
                            "{arch}: {name} converts {format} without the hardware cvt (a front end below compute_89?)"
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    let want = if target_ccs().iter().any(|&cc| cc >= 89) { 20 } else { 0 };
    assert!(checked >= want, "only {checked} FP8 kernels checked on sm_89+");
}

/// Kernels launch through the driver API (cudarc): no CUDA runtime is linked, statically or dynamically,
/// into the library's users. Checked on this test binary, which links the library with its kernels as a
/// user's binary does: no cuda* runtime symbols, no libcudart needed.
#[test]
fn no_cuda_runtime_in_the_binaries() {
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe.to_str().expect("a UTF-8 path");
    let nm = Command::new("nm").arg(bin).output().expect("nm (binutils) is needed for this check");
    assert!(nm.status.success(), "nm failed: {}", String::from_utf8_lossy(&nm.stderr));
    let symbols = String::from_utf8_lossy(&nm.stdout);
    let runtime: Vec<&str> = symbols
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| {
            (s.starts_with("cuda") && s[4..].starts_with(|c: char| c.is_ascii_uppercase()))
                || s.starts_with("__cudaRegister")
                || s.starts_with("__cudart")
        })
        .collect();
    assert!(runtime.is_empty(), "CUDA runtime symbols in {bin}: {:?}", &runtime[..runtime.len().min(10)]);
    let dynamic = Command::new("readelf").args(["-d", bin]).output().expect("readelf (binutils) is needed");
    let needed = String::from_utf8_lossy(&dynamic.stdout);
    assert!(!needed.contains("cudart"), "{bin} needs libcudart:\n{needed}");
    // libcuda itself is loaded at run time by cudarc (dlopen), not linked.
    assert!(!needed.contains("libcuda.so"), "{bin} links libcuda instead of loading it:\n{needed}");
}

#[test]
fn ptxas_report_is_spill_free_and_lists_kernels() {
    let report = std::fs::read_to_string(build_info::PTXAS_REPORT).expect("ptxas report missing");
    assert!(!report.lines().any(|l| l.starts_with("SPILL")), "spills or stack frames:\n{report}");
    let kernels = report.lines().filter(|l| l.starts_with("ok ")).count();
    let archs = build_info::CUDA_ARCHS.split(',').count();
    assert!(kernels >= archs, "ptxas report lists {kernels} kernel builds for {archs} archs:\n{report}");
}

/// Decode's wide CTAs (256 threads, docs/decode-memory.md): the planner and scheduler count one per SM
/// (`schedule::decode_ctas_per_sm`), which is what the hardware does only while every kernel that runs them
/// (widths 64 and 128) uses more than 128 registers a thread (two 256-thread CTAs of 129 or more exceed 64 K
/// registers); and the register cap holds (168: three narrow CTAs per SM). Read from the ptxas report.
#[test]
fn wide_decode_ctas_hold_one_per_sm_by_registers() {
    use fused_attn::schedule::decode_ctas_per_sm;
    let report = std::fs::read_to_string(build_info::PTXAS_REPORT).expect("ptxas report missing");
    let mut seen = 0;
    for line in report.lines().filter(|l| l.starts_with("ok ") && l.contains("fa_paged_decode_")) {
        let wide = line.contains("_d64") || line.contains("_d128");
        let regs: usize = line
            .split("Used ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no register count: {line}"));
        if wide {
            assert!(regs > 128 && regs <= 168, "{line}: two wide CTAs per SM would fit, or the cap moved");
            seen += 1;
        }
    }
    assert!(seen >= 16, "{seen} width-64/128 decode kernel builds in the report");
    for cc in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)] {
        assert_eq!([decode_ctas_per_sm(cc, 64, 128), decode_ctas_per_sm(cc, 128, 64)], [1, 1], "sm_{}{}", cc.0, cc.1);
    }
}

/// SASS of every kernel of one fatbin for `arch` ("sm_80"), as (name, body) pairs; disassembled once per
/// test binary (the SASS tests share fatbins and archs, and cuobjdump is most of their time).
fn sass_of(tool: &std::path::Path, fatbin: &std::path::Path, arch: &str) -> Arc<Vec<(String, String)>> {
    type Cell = Arc<OnceLock<Arc<Vec<(String, String)>>>>;
    static DUMPS: Mutex<BTreeMap<(PathBuf, String), Cell>> = Mutex::new(BTreeMap::new());
    let cell = DUMPS.lock().unwrap().entry((fatbin.to_path_buf(), arch.to_string())).or_default().clone();
    cell.get_or_init(|| Arc::new(dump_sass(tool, fatbin, arch))).clone()
}

fn dump_sass(tool: &std::path::Path, fatbin: &std::path::Path, arch: &str) -> Vec<(String, String)> {
    // cuobjdump needs nvdisasm from the same directory on PATH to print SASS.
    let dir = tool.parent().unwrap();
    let path = std::env::join_paths(
        std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    let out = Command::new(tool).args(["--dump-sass", "-arch", arch]).arg(fatbin).env("PATH", &path).output().unwrap();
    assert!(out.status.success(), "cuobjdump --dump-sass failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split("Function : ")
        .skip(1)
        .map(|chunk| (chunk.lines().next().unwrap_or("").trim().to_string(), chunk.to_string()))
        .collect()
}

/// SASS of every kernel a GPU of compute capability `cc` runs (each fatbin's `driver_pick`), as (name, body).
fn sass_functions(tool: &std::path::Path, cc: u32) -> Vec<(String, String)> {
    let mut funcs = Vec::new();
    for fatbin in build_info::fatbins() {
        let (sass, _) = fatbin_archs(tool, &fatbin);
        if let Some(arch) = driver_pick(&sass, cc) {
            funcs.extend(sass_of(tool, &fatbin, arch).iter().cloned());
        }
    }
    funcs
}

/// The instructions each kernel was written to use are really in its SASS, on every target GPU (each
/// distinct SASS the driver picks for one: sm_80, sm_90, sm_100, sm_120 with the fat list): tensor-core MMA, ldmatrix and 16-byte cp.async in prefill and decode, 128-bit global accesses in
/// merge and append, and no local memory anywhere.
#[test]
fn sass_has_the_instructions_the_kernels_were_written_for() {
    let Some(tool) = cuobjdump() else {
        panic!("cuobjdump not found: scripts/setup installs it into .toolchain/cuda-tools");
    };
    let mut checked = 0;
    for cc in target_ccs() {
        let funcs = sass_functions(&tool, cc);
        let want: [(&str, &[&str]); 5] = [
            ("fa_prefill_", &["HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS.E.BYPASS.128"]),
            ("fa_paged_prefill_", &["HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS.E.BYPASS.128"]),
            ("fa_paged_decode_", &["HMMA.16816.F32", "LDSM.16", "LDGSTS.E.BYPASS.128"]),
            ("fa_merge_states_", &[".128"]),
            ("fa_paged_append", &["LDG.E.128", "STG.E.128"]),
        ];
        for (kernel, needles) in want {
            // The sm_90a prefill kernel (fa_prefill_sm90_*) is checked in the Hopper test below.
            let bodies: Vec<&(String, String)> =
                funcs.iter().filter(|(n, _)| n.contains(kernel) && !n.contains("_sm90")).collect();
            assert!(!bodies.is_empty(), "{cc}: no {kernel}* kernel in the fatbins");
            for (name, body) in bodies {
                for needle in needles {
                    assert!(body.contains(needle), "{cc}: {name} has no {needle} in its SASS");
                }
                for local in ["LDL", "STL"] {
                    assert!(!body.contains(&format!(" {local}")), "{cc}: {name} uses local memory ({local})");
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "only {checked} kernels checked");
}

/// The sm_90a kernels really use Hopper's machinery: wgmma (HGMMA), TMA (UTMALDG / UTMASTG), mbarriers
/// (SYNCS.*) and setmaxnreg (USETMAXREG), and the warp-specialised GEMM has no mma.sync (HMMA). The build
/// itself fails when ptxas serialises a wgmma pipeline or ignores setmaxnreg (build.rs: C7508-C7520); here
/// the report shows that only the kernels allowed to (planted bugs, run-time layout dispatch) had any.
#[test]
fn sm90_kernels_use_wgmma_tma_mbarriers_and_setmaxnreg() {
    if !build_info::CUDA_ARCHS.split(',').any(|a| a.trim() == "90a") {
        eprintln!("skipped: FA_CUDA_ARCHS={} has no 90a", build_info::CUDA_ARCHS);
        return;
    }
    let Some(tool) = cuobjdump() else {
        panic!("cuobjdump not found: scripts/setup installs it into .toolchain/cuda-tools");
    };
    let funcs = sass_functions(&tool, 90);
    let want: [(&str, &[&str]); 6] = [
        (
            "fa_prefill_sm90_",
            &[
                "HGMMA.64x",
                "UTMALDG.4D",
                "UTMASTG.4D",
                "SYNCS.ARRIVE.TRANS64",
                "SYNCS.PHASECHK",
                "USETMAXREG",
                "BAR.SYNC",
                "BPT.TRAP",
            ],
        ),
        (
            "fa_selftest_ws_gemm_",
            &["HGMMA.64x128x16.F32", "UTMALDG.2D", "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK", "USETMAXREG"],
        ),
        ("fa_selftest_wgmma_", &["HGMMA"]),
        ("fa_selftest_tma_kernel", &["UTMALDG.5D", "UTMASTG.5D", "UTMALDG.1D", "UTMASTG.1D", "SYNCS"]),
        ("fa_bug_sm90_setmaxnreg", &["USETMAXREG"]),
        ("fa_bug_sm90", &["HGMMA", "UTMALDG", "UTMASTG", "SYNCS"]),
    ];
    for (kernel, needles) in want {
        // A name ending in '_' is a family prefix; any other is one kernel.
        let bodies: Vec<_> =
            funcs.iter().filter(|(n, _)| n == kernel || (kernel.ends_with('_') && n.starts_with(kernel))).collect();
        assert!(!bodies.is_empty(), "no {kernel}* kernel in the sm_90a fatbins");
        for (name, body) in bodies {
            for needle in needles {
                assert!(body.contains(needle), "{name} has no {needle} in its SASS");
            }
            if name.starts_with("fa_selftest_ws_gemm_") || name.starts_with("fa_prefill_sm90_") {
                assert!(!body.contains("HMMA."), "{name} uses mma.sync (HMMA)");
            }
            if name.starts_with("fa_prefill_sm90_") {
                check_role_registers(name, body);
                // Every TMA load carries an L2 cache policy (`desc[URx]`: Q evict_first, K and V evict_last);
                // the dynamic shared memory alignment check survives as a trap (BPT.TRAP above).
                for l in body.lines().filter(|l| l.contains("UTMALDG")) {
                    assert!(l.contains("desc["), "{name}: a TMA load without an L2 cache hint: {l}");
                }
            }
        }
    }
    let report = std::fs::read_to_string(build_info::PTXAS_REPORT).expect("ptxas report missing");
    // Every kernel that redistributes registers is launched with exactly its pool (build.rs fails on a
    // POOL line; here: none of them is missing from the list it checks).
    for (name, body) in &funcs {
        if body.contains("USETMAXREG") {
            assert!(
                report.lines().any(|l| l.starts_with(&format!("pool  sm_90a {name}: "))),
                "{name} uses setmaxnreg but build/nvcc.rs SETMAXNREG_KERNELS does not check its launch registers"
            );
        }
    }
    assert!(!report.lines().any(|l| l.starts_with("POOL")), "{report}");
    assert!(!report.lines().any(|l| l.starts_with("WGMMA")), "serialised wgmma outside the allowed kernels:\n{report}");
    assert!(report.contains("ok    sm_90a fa_selftest_ws_gemm_f16: Used 168 registers"), "{report}");
}

/// The highest register each role of an sm_90a prefill kernel uses fits the budget its setmaxnreg gives it
/// (fa/hopper/traits.cuh: producer 40 and consumers 232 for the 128 x 128 D 128 tile; 24 and 160 with three
/// consumer warpgroups, D 64; 24 and 240 for the 128 x 176 D 128 tile, D 256 and 192 / 128): the producer's code is what follows
/// `USETMAXREG.DEALLOC` up to its `EXIT` (its retry loops included), and no instruction of the kernel uses
/// a register at or past the consumers' budget. No local memory either (a spill would hide there).
fn check_role_registers(name: &str, body: &str) {
    let (producer_regs, consumer_regs): (usize, usize) = if name.ends_with("_d64") {
        (24, 160)
    } else if name.ends_with("_bc176") || name.ends_with("_d256") || name.ends_with("_d192_dv128") {
        (24, 240)
    } else {
        (40, 232)
    };
    let lines: Vec<&str> =
        body.lines().filter(|l| l.trim_start().starts_with("/*")).map(|l| l.split(';').next().unwrap_or("")).collect();
    let max_reg = |ls: &[&str]| -> usize {
        ls.iter()
            .flat_map(|l| l.split(|c: char| !c.is_ascii_alphanumeric()))
            .filter_map(|w| w.strip_prefix('R').and_then(|n| n.parse::<usize>().ok()))
            .max()
            .unwrap_or(0)
    };
    let dealloc = lines
        .iter()
        .position(|l| l.contains("USETMAXREG.DEALLOC"))
        .unwrap_or_else(|| panic!("{name}: no USETMAXREG.DEALLOC"));
    let is_exit = |l: &&str| l.split_whitespace().nth(1) == Some("EXIT");
    let exit =
        dealloc + lines[dealloc..].iter().position(is_exit).unwrap_or_else(|| panic!("{name}: producer never exits"));
    assert!(
        lines.iter().any(|l| l.contains(&format!("USETMAXREG.DEALLOC.CTAPOOL {producer_regs:#x}"))),
        "{name}: producer budget"
    );
    assert!(
        lines.iter().any(|l| l.contains("USETMAXREG.TRY_ALLOC") && l.contains(&format!("{consumer_regs:#x}"))),
        "{name}: consumer budget"
    );
    let producer = max_reg(&lines[dealloc..=exit]);
    assert!(producer < producer_regs, "{name}: the producer uses R{producer}, past its {producer_regs} registers");
    let all = max_reg(&lines);
    assert!(all < consumer_regs, "{name}: R{all} is past the consumers' {consumer_regs} registers");
    for local in [" LDL", " STL"] {
        assert!(!body.contains(local), "{name} uses local memory ({local})");
    }
}
