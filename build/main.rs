//! Builds the kernels from one set of sources, twice:
//!  1. Host library (libfa_host.a, through the `cc` crate, any C++17 compiler, no CUDA needed): every
//!     kernels/*.cu as host C++ (-DFA_EMULATION: the kernels for the emulator, plus the launchers, which
//!     validate parameters and compute every launch's geometry for both backends), kernels/host/*.cpp and the
//!     host SIMT executor kernels/emu/*.{cpp,S}. Always optimised: the emulated suite must be fast in debug too.
//!  2. GPU kernels (feature `cuda`, when nvcc is found): every kernels/*.cu through `nvcc -fatbin`, for the
//!     GPUs FA_CUDA_ARCHS lists (default 80,86,89,90a): SASS that each of them runs, with the fewest compiler
//!     passes (`gencode_flags`: one front end per distinct device code, not per arch; no SASS a lower arch of
//!     the same major already serves with the same code: by default sm_80 + sm_90, plus sm_89 for the FP8
//!     kernels' hardware conversion), plus PTX for newer GPUs; embedded in the crate (OUT_DIR/fatbins.rs)
//!     and loaded per CUDA context through the driver API. No CUDA runtime is linked. The nvcc jobs run on
//!     threads of our own (a fatbin is not an object file, which is all `cc` builds), the longest first;
//!     the budget is 2 minutes of wall time for all of them on a 2-core machine (docs/build.md has the
//!     measurements, and the reasons for each choice). `ptxas -v` of every kernel goes to
//!     target/<profile>/ptxas-report.txt (headed by each fatbin's SASS / PTX and nvcc time) and any spill
//!     or stack frame fails the build, and so does ptxas
//!     ignoring setmaxnreg (C7508) or serialising a wgmma pipeline (C7509-C7520: the Hopper kernels' silent
//!     performance cliffs), except in the planted-bug self-tests (fa_bug_*) and the wgmma primitive
//!     self-tests (fa_selftest_wgmma_*, which pick their layout at run time).
//!     kernels/*_sm90.cu hold sm_90a-only kernels (wgmma, TMA, setmaxnreg): they are compiled for 90a alone
//!     (skipped when FA_CUDA_ARCHS lacks it), without PTX, and the Rust side loads them only on a GPU of
//!     compute capability 9.0. kernels/decode_fp8.cu and kernels/paged_prefill_fp8.cu are nvcc jobs that
//!     build the FP8 half of decode.cu / paged_prefill.cu (which they include), for balance and their
//!     compute_89 front end; empty in the host build.
//!     With the feature off the crate is emulator-only: GPU calls return `ErrorKind::NoKernels`. With it on
//!     and no nvcc found, the build fails and says what to do (`no_cuda_compiler`), except on docs.rs or
//!     with FA_ALLOW_NO_CUDA set.
//!
//! The self-test kernels (kernels/selftest*.cu) are part of both only with the `testkit` feature.
//!
//! Both come from the kernel cache (build/cache.rs: keyed by content, shared by every profile and feature
//! set) when nothing they are built from changed. Each step prints a line (`cargo build -vv` shows them).
//!
//! The C ABI (kernels/include/fa/abi.h) is mirrored by bindgen into src/runtime/sys/abi.rs, which is committed (so
//! building needs no libclang) by scripts/bless-abi; tests/it/abi_bindings.rs fails if it is stale.
//!
//! nvcc search (first hit wins): $NVCC, $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, nvcc on PATH,
//! /usr/local/cuda/bin/nvcc, then the toolchain scripts/setup installs ($FA_TOOLCHAIN_DIR, default
//! .toolchain/). No network access at build time.

mod archs;
mod cache;
mod host;
mod nvcc;

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "FA_CUDA_ARCHS",
        "CUDA_COMPUTE_CAP",
        "FA_ALLOW_SPILLS",
        "FA_TOOLCHAIN_DIR",
        "FA_KERNEL_CACHE",
        "FA_ALLOW_NO_CUDA",
        "FA_NVIDIA_SMI",
        "DOCS_RS",
        "CXX",
        "CXXFLAGS",
        "CXXSTDLIB",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let kernels = root.join("kernels");
    let mut all = Vec::new();
    let mut cu_sources = Vec::new();
    let mut cpp_sources = Vec::new();
    let mut asm_sources = Vec::new();
    watch_dir(&kernels, &mut |p| {
        all.push(p.to_path_buf());
        let dir = p.parent().unwrap_or(Path::new(""));
        match p.extension().and_then(|e| e.to_str()) {
            Some("cu") if dir == kernels => cu_sources.push(p.to_path_buf()),
            Some("cpp") if dir == kernels.join("emu") || dir == kernels.join("host") => {
                cpp_sources.push(p.to_path_buf())
            }
            Some("S") if dir == kernels.join("emu") => asm_sources.push(p.to_path_buf()),
            _ => {}
        }
    });
    // The self-test kernels (kernels/selftest*.cu: intrinsics, emulator fault detection, planted bugs) verify
    // the crate; they are built, for the emulator and into the fatbins, only with the `testkit` feature.
    if env::var_os("CARGO_FEATURE_TESTKIT").is_none() {
        cu_sources.retain(|p| !is_selftest(p));
    }
    cu_sources.sort();
    cpp_sources.sort();
    let cache = cache::KernelCache::new(&out);

    let nvcc = if env::var_os("CARGO_FEATURE_CUDA").is_some() { nvcc::find_nvcc(&root) } else { None };
    if nvcc.is_none() && env::var_os("CARGO_FEATURE_CUDA").is_some() {
        no_cuda_compiler(); // before the host library: a build that cannot succeed fails at once
    }
    // The GPUs to build for (build/archs.rs): only asked (nvidia-smi may run) when there is a compiler.
    let resolved = nvcc.as_ref().map(|_| {
        let var = |v| env::var(v).ok();
        let smi = env::var_os("FA_NVIDIA_SMI").unwrap_or_else(|| "nvidia-smi".into());
        archs::resolve(var("FA_CUDA_ARCHS").as_deref(), var("CUDA_COMPUTE_CAP").as_deref(), &mut || {
            archs::query_nvidia_smi(&smi)
        })
        .unwrap_or_else(|e| panic!("\n\nfused-attn: {e}\n"))
    });
    let archs = resolved.as_ref().map_or(String::new(), |r| r.archs.clone());

    host::build_host_library(&out, &kernels, &all, &cu_sources, &cpp_sources, &asm_sources, &cache);

    // The report this build embeds the path of is its own (OUT_DIR): builds of other feature sets share the
    // target dir, and an emulator-only one must not replace what a kernel build reads. A kernel build also
    // copies it to target/<profile>/ptxas-report.txt, the place to read it.
    let report_path = out.join("ptxas-report.txt");
    let report_copy = profile_dir(&out).join("ptxas-report.txt");
    let fatbin_dir = out.join("fatbin");
    fs::create_dir_all(&fatbin_dir).unwrap();
    let mut fatbins = Vec::new();
    let mut cuda_version = String::new();
    match &nvcc {
        Some(nvcc) => {
            cuda_version = nvcc::nvcc_version(nvcc);
            let (header, report) =
                nvcc::build_fatbins(nvcc, &kernels, &cu_sources, &archs, &fatbin_dir, &cache, &mut fatbins);
            fatbins.sort();
            let summary = nvcc::check_ptxas(&report);
            let why = resolved.as_ref().map_or("", |r| r.why.as_str());
            let text = format!("# ptxas -v for FA_CUDA_ARCHS={archs} ({why})\n{header}{summary}\n{report}");
            fs::write(&report_path, &text).unwrap();
            fs::write(&report_copy, &text).unwrap();
            if let Some(bad) = summary.lines().find(|l| l.starts_with("SPILL")) {
                if env::var("FA_ALLOW_SPILLS").is_err() {
                    panic!("ptxas reports spills or a stack frame (see {}): {bad}", report_copy.display());
                }
                println!("cargo:warning=FA_ALLOW_SPILLS set, ignoring: {bad}");
            }
            if let Some(bad) = summary.lines().find(|l| l.starts_with("POOL")) {
                panic!("ptxas broke a setmaxnreg register pool (see {}): {bad}", report_path.display());
            }
            if let Some(bad) = summary.lines().find(|l| l.starts_with("WGMMA")) {
                panic!("ptxas serialises wgmma or ignores setmaxnreg (see {}): {bad}", report_copy.display());
            }
        }
        None => {
            let why = if env::var_os("CARGO_FEATURE_CUDA").is_some() {
                "no CUDA compiler was found (allowed: FA_ALLOW_NO_CUDA or docs.rs)"
            } else {
                "the `cuda` feature is off"
            };
            fs::write(&report_path, format!("# no GPU kernels were built: {why}\n")).unwrap();
        }
    }

    // The embedded fatbins, 64-byte aligned (the driver reads their headers in place).
    let mut rs = String::from("// @generated by build.rs: the GPU kernels, one fatbin per kernels/*.cu.\n");
    rs.push_str("// (name, image, sm_90a only, SASS archs, PTX arch or 0)\n");
    rs.push_str("pub(crate) static FATBINS: &[crate::kernels::EmbeddedFatbin] = &[\n");
    for f in &fatbins {
        rs.push_str(&format!(
            "    ({:?}, &crate::kernels::Aligned(*include_bytes!({:?})).0, {}, &[{}], {}),\n",
            f.name,
            f.path.display().to_string(),
            nvcc::is_sm90_only(&f.name),
            f.sass.replace('a', ""),
            if f.ptx.is_empty() { "0" } else { f.ptx.as_str() },
        ));
    }
    rs.push_str("];\n");
    fs::write(out.join("fatbins.rs"), rs).unwrap();

    println!("cargo:rustc-env=FA_PTXAS_REPORT={}", report_path.display());
    println!("cargo:rustc-env=FA_FATBIN_DIR={}", fatbin_dir.display());
    println!("cargo:rustc-env=FA_CUDA_ARCHS={archs}");
    println!("cargo:rustc-env=FA_CUDA_VERSION={cuda_version}");
}

/// The `cuda` feature is on and no CUDA compiler was found. A library built on without kernels would fail
/// only at run time (`NoKernels`), in the dependent's binary, and cargo shows a dependency's warnings to
/// nobody: so this is a build error, unless the builder said an emulator-only build is what they want
/// (FA_ALLOW_NO_CUDA) or this is docs.rs (DOCS_RS), which documents the crate and never runs it.
fn no_cuda_compiler() {
    if env::var_os("DOCS_RS").is_some() {
        return;
    }
    if env::var_os("FA_ALLOW_NO_CUDA").is_some_and(|v| !v.is_empty() && v != "0") {
        println!("cargo:warning=fused-attn: no CUDA compiler found, FA_ALLOW_NO_CUDA set: emulator only (GPU calls return NoKernels)");
        return;
    }
    panic!(
        "\n\nfused-attn: the `cuda` feature is on, but no CUDA compiler (nvcc >= 12.4) was found.\n\
         Searched: $NVCC, $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, nvcc on PATH, /usr/local/cuda/bin/nvcc,\n\
         $FA_TOOLCHAIN_DIR/cuda (default <fused-attn>/.toolchain/cuda, which fused-attn's scripts/setup fills from PyPI).\n\
         Fix one of:\n\
         \x20 - install the CUDA toolkit, or set NVCC=/path/to/nvcc (or CUDA_HOME);\n\
         \x20 - in a fused-attn checkout, run scripts/setup (installs nvcc 13.0 into .toolchain/);\n\
         \x20 - build without GPU kernels (emulator only): depend with `default-features = false`, or set\n\
         \x20   FA_ALLOW_NO_CUDA=1 (GPU calls then return ErrorKind::NoKernels at run time).\n\
         FA_CUDA_ARCHS chooses the GPUs kernels are built for (a list, `native` or `all`; default: the GPUs\n\
         \x20 nvidia-smi sees, else {}).\n",
        archs::FAT_LIST
    );
}

/// Emits rerun-if-changed for every file under `dir` and hands each to `f`.
fn watch_dir(dir: &Path, f: &mut dyn FnMut(&Path)) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            watch_dir(&p, f);
        } else {
            println!("cargo:rerun-if-changed={}", p.display());
            f(&p);
        }
    }
}

/// target/<profile>/ from OUT_DIR (target/<profile>/build/<pkg>-<hash>/out).
/// kernels/selftest.cu, kernels/selftest_sm90.cu.
fn is_selftest(path: &Path) -> bool {
    path.file_stem().and_then(|s| s.to_str()).is_some_and(|s| s.starts_with("selftest"))
}

fn profile_dir(out: &Path) -> PathBuf {
    out.ancestors().nth(3).unwrap_or(out).to_path_buf()
}
