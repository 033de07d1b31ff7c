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
//!     the budget is 2 minutes of wall time for all of them on a 2-core machine (README "Build" has the
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
//!     Without nvcc (or with the feature off) the crate is emulator-only: GPU calls return
//!     `ErrorKind::NoKernels`, and a cargo warning says why.
//!
//! The C ABI (kernels/include/fa/abi.h) is mirrored by bindgen into src/sys/abi.rs, which is committed (so
//! building needs no libclang); tests/abi_bindings.rs regenerates it and fails if it is stale.
//!
//! nvcc search (first hit wins): $NVCC, $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, nvcc on PATH,
//! /usr/local/cuda/bin/nvcc, then the toolchain scripts/setup installs ($FA_TOOLCHAIN_DIR, default
//! .toolchain/). No network access at build time.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

const DEFAULT_ARCHS: &str = "80,86,89,90a";

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in ["NVCC", "CUDA_HOME", "CUDA_PATH", "FA_CUDA_ARCHS", "FA_ALLOW_SPILLS", "FA_TOOLCHAIN_DIR", "CXX"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let kernels = root.join("kernels");
    let include = kernels.join("include");
    let mut cu_sources = Vec::new();
    let mut cpp_sources = Vec::new();
    let mut asm_sources = Vec::new();
    watch_dir(&kernels, &mut |p| {
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
    cu_sources.sort();
    cpp_sources.sort();

    build_host_library(&include, &cu_sources, &cpp_sources, &asm_sources);

    let archs = env::var("FA_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_string());
    let nvcc = if env::var_os("CARGO_FEATURE_CUDA").is_some() { find_nvcc(&root) } else { None };
    let report_path = profile_dir(&out).join("ptxas-report.txt");
    let fatbin_dir = out.join("fatbin");
    fs::create_dir_all(&fatbin_dir).unwrap();
    let mut fatbins = Vec::new();
    let mut cuda_version = String::new();
    match &nvcc {
        Some(nvcc) => {
            cuda_version = nvcc_version(nvcc);
            let (header, report) = build_fatbins(nvcc, &include, &cu_sources, &archs, &fatbin_dir, &mut fatbins);
            fatbins.sort();
            let summary = check_ptxas(&report);
            fs::write(&report_path, format!("# ptxas -v for FA_CUDA_ARCHS={archs}\n{header}{summary}\n{report}"))
                .unwrap();
            if let Some(bad) = summary.lines().find(|l| l.starts_with("SPILL")) {
                if env::var("FA_ALLOW_SPILLS").is_err() {
                    panic!("ptxas reports spills or a stack frame (see {}): {bad}", report_path.display());
                }
                println!("cargo:warning=FA_ALLOW_SPILLS set, ignoring: {bad}");
            }
            if let Some(bad) = summary.lines().find(|l| l.starts_with("WGMMA")) {
                panic!("ptxas serialises wgmma or ignores setmaxnreg (see {}): {bad}", report_path.display());
            }
        }
        None => {
            let why = if env::var_os("CARGO_FEATURE_CUDA").is_some() {
                println!(
                    "cargo:warning=fused-attn: no CUDA compiler found (NVCC, CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda, \
                     FA_TOOLCHAIN_DIR or .toolchain/): building the emulator only; GPU calls will return NoKernels errors"
                );
                "no CUDA compiler was found"
            } else {
                "the `cuda` feature is off"
            };
            fs::write(&report_path, format!("# no GPU kernels were built: {why}\n")).unwrap();
        }
    }

    // The embedded fatbins, 64-byte aligned (the driver reads their headers in place).
    let mut rs = String::from("// @generated by build.rs: the GPU kernels, one fatbin per kernels/*.cu.\n");
    rs.push_str("// (name, image, sm_90a only)\n");
    rs.push_str("pub(crate) static FATBINS: &[(&str, &[u8], bool)] = &[\n");
    for (name, path) in &fatbins {
        rs.push_str(&format!(
            "    ({name:?}, &crate::kernels::Aligned(*include_bytes!({:?})).0, {}),\n",
            path.display().to_string(),
            is_sm90_only(name)
        ));
    }
    rs.push_str("];\n");
    fs::write(out.join("fatbins.rs"), rs).unwrap();

    println!("cargo:rustc-env=FA_PTXAS_REPORT={}", report_path.display());
    println!("cargo:rustc-env=FA_FATBIN_DIR={}", fatbin_dir.display());
    println!("cargo:rustc-env=FA_CUDA_ARCHS={}", if nvcc.is_some() { archs.as_str() } else { "" });
    println!("cargo:rustc-env=FA_CUDA_VERSION={cuda_version}");
}

/// libfa_host.a: launchers + emulator kernels + the SIMT executor, through `cc` (parallel jobs, jobserver).
fn build_host_library(include: &Path, cu: &[PathBuf], cpp: &[PathBuf], asm: &[PathBuf]) {
    let mut b = cc::Build::new();
    b.cpp(true)
        .opt_level(2)
        .debug(false)
        .extra_warnings(false)
        .include(include)
        .define("FA_EMULATION", "1")
        .flag("-std=c++17")
        .flag("-fno-strict-aliasing")
        .flag("-Wall")
        .flag("-Wno-unused-function")
        .flag("-Wno-unknown-pragmas")
        // Tensor maps are 64-byte aligned by-value members: GCC notes an ABI change from GCC 4.6.
        .flag("-Wno-psabi")
        // .cu sources are plain C++ in this build.
        .flag("-xc++")
        .files(cu)
        .files(cpp);
    b.compile("fa_host");
    if !asm.is_empty() {
        cc::Build::new().files(asm).compile("fa_host_asm");
    }
    println!("cargo:rustc-link-lib=dylib=pthread");
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

/// One GPU target of FA_CUDA_ARCHS: compute capability 10 · major + minor, and whether it was given
/// arch-specific ("90a").
#[derive(Clone, Copy, PartialEq)]
struct Target {
    cc: u32,
    specific: bool,
}

fn parse_targets(archs: &str) -> Vec<Target> {
    let mut targets: Vec<Target> = archs
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            let specific = a.ends_with('a');
            let cc = a.trim_end_matches('a').parse().unwrap_or_else(|_| panic!("FA_CUDA_ARCHS: bad arch {a:?}"));
            Target { cc, specific }
        })
        .collect();
    assert!(!targets.is_empty(), "FA_CUDA_ARCHS is empty");
    targets.sort_by_key(|t| (t.cc, t.specific));
    targets
}

/// Compute capabilities above the lowest target at which a file's device code changes (`__CUDA_ARCH__`
/// tests): the FP8 conversions (fa/intrinsics.cuh) use the hardware cvt from 8.9 on, so a file with FP8
/// kernels needs a front end at compute_89 for its SASS of 8.9 and up. tests/build_artifacts.rs checks that
/// the sm_89 / sm_90 SASS of every `*fp8*` kernel has the hardware conversion, so a file with FP8 kernels
/// missing here fails there.
fn code_changes_at(stem: &str) -> &'static [u32] {
    match stem {
        "append" | "decode_fp8" | "paged_prefill_fp8" | "selftest" => &[89],
        _ => &[],
    }
}

/// What nvcc builds for one file: `-gencode` flags, and the SASS archs ("80,89,90") and PTX arch ("89")
/// they produce; `None` when the file has nothing for these targets (an sm_90a-only file without 90a).
///
/// FA_CUDA_ARCHS lists the GPUs to serve, and each gets its best code with the fewest compiler passes:
///  - one front-end pass (cicc: C++ to PTX, a quarter to a half of a file's nvcc time) per distinct device
///    code, not per arch: at the lowest target, plus one at each `code_changes_at` point (compute_89 for the FP8
///    files); each SASS is compiled (ptxas) from the highest front end at or below its arch;
///  - SASS for a target only when no lower target of the same major has SASS from the same PTX: the
///    driver runs sm_XY SASS on any X.Z with Z >= Y, so sm_80 SASS serves 8.6 and 8.9 with the same code
///    (every sm_80 tile config fits the 99 KiB of shared memory of 8.6/8.9: fa/prefill/tile_config.cuh).
///    What a separate sm_86 / sm_89 pass of the same PTX would add is ptxas's scheduling for that minor
///    revision, for a full pass of nvcc time; FlashAttention-2 ships sm_80 and sm_90 SASS alone, too;
///  - "90a" (or any arch-specific target) gives plain sm_90 SASS outside kernels/*_sm90.cu: those kernels
///    use nothing arch-specific, and sm_90 SASS can come from the lower targets' PTX (sm_90a needs its
///    own compute_90a front end);
///  - PTX of the highest front end, for GPUs newer than every SASS (JIT-compiled by the driver).
///
/// So the default 80,86,89,90a builds sm_80 + sm_90 SASS from one front end for most files, and
/// sm_80 (compute_80) + sm_89, sm_90 (compute_89) for the FP8 files. An sm_90a-only file is compiled for
/// 90a alone (no PTX: arch-specific code has no forward-compatible form), when the targets include 90a.
fn gencode_flags(stem: &str, targets: &[Target]) -> Option<(Vec<String>, String, String)> {
    if is_sm90_only(stem) {
        let has_90a = targets.iter().any(|t| t.cc == 90 && t.specific);
        let flags = vec!["-gencode".to_string(), "arch=compute_90a,code=sm_90a".to_string()];
        return has_90a.then(|| (flags, "90a".into(), String::new()));
    }
    let base = targets[0].cc;
    let mut front_ends = vec![base];
    front_ends.extend(code_changes_at(stem).iter().filter(|&&c| c > base));
    let front_end = |cc: u32| front_ends.iter().copied().filter(|&f| f <= cc).max().unwrap();
    // (front end, SASS archs compiled from it)
    let mut passes: Vec<(u32, Vec<u32>)> = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let f = front_end(t.cc);
        let served = targets[..i].iter().any(|u| u.cc / 10 == t.cc / 10 && front_end(u.cc) == f);
        if served {
            continue; // a lower arch's SASS runs here with the same code (or t repeats an arch)
        }
        match passes.iter_mut().find(|(g, _)| *g == f) {
            Some((_, sass)) => sass.push(t.cc),
            None => passes.push((f, vec![t.cc])),
        }
    }
    let ptx = passes.iter().map(|(f, _)| *f).max().unwrap();
    let mut flags = Vec::new();
    for (f, sass) in &passes {
        let mut codes: Vec<String> = sass.iter().map(|a| format!("sm_{a}")).collect();
        if *f == ptx {
            codes.push(format!("compute_{f}"));
        }
        flags.push("-gencode".into());
        flags.push(format!("arch=compute_{f},code=[{}]", codes.join(",")));
    }
    let mut sass: Vec<u32> = passes.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    sass.sort();
    let sass = sass.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    Some((flags, sass, ptx.to_string()))
}

/// nvcc CPU seconds of each file with the default targets (measured 2026-12-01, README "Build"): build_fatbins
/// starts the longest first, so that the two jobs of a 2-core machine finish together. Only an ordering: a
/// file not listed starts first (it may be long).
fn nvcc_cost(stem: &str) -> u32 {
    match stem {
        "prefill" => 55,
        "paged_prefill_fp8" => 50,
        "paged_prefill" => 40,
        "decode_fp8" => 17,
        "selftest_sm90" => 8,
        "decode" => 7,
        "prefill_sm90" => 7,
        "append" => 4,
        "merge" => 3,
        "selftest" => 3,
        _ => 1000,
    }
}

fn find_nvcc(root: &Path) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(p) = env::var("NVCC") {
        candidates.push(p.into());
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(p) = env::var(var) {
            candidates.push(Path::new(&p).join("bin/nvcc"));
        }
    }
    if let Some(path) = env::var_os("PATH") {
        candidates.extend(env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    candidates.push("/usr/local/cuda/bin/nvcc".into());
    let toolchain = env::var_os("FA_TOOLCHAIN_DIR").map(PathBuf::from).unwrap_or_else(|| root.join(".toolchain"));
    candidates.push(toolchain.join("cuda/nvidia/cu13/bin/nvcc"));
    candidates.into_iter().find(|p| p.is_file())
}

/// "13.0" from `nvcc --version` ("Cuda compilation tools, release 13.0, V13.0.88").
fn nvcc_version(nvcc: &Path) -> String {
    let out =
        Command::new(nvcc).arg("--version").output().unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("release ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("cannot read the CUDA version from `{} --version`:\n{text}", nvcc.display()))
}

/// kernels/<stem>_sm90.cu: sm_90a-only kernels.
fn is_sm90_only(stem: &str) -> bool {
    stem.ends_with("_sm90")
}

/// One fatbin per kernels/*.cu (device code only), with the SASS and PTX `gencode_flags` gives it; returns
/// the report's header (each fatbin's archs and nvcc wall time) and ptxas's output of all of them.
fn build_fatbins(
    nvcc: &Path,
    include: &Path,
    sources: &[PathBuf],
    archs: &str,
    dir: &Path,
    fatbins: &mut Vec<(String, PathBuf)>,
) -> (String, String) {
    let home = nvcc.parent().and_then(Path::parent).unwrap().to_path_buf();
    let targets = parse_targets(archs);
    let jobs = env::var("NUM_JOBS").ok().and_then(|j| j.parse().ok()).unwrap_or(2usize).max(1);
    let mut files: Vec<(String, &PathBuf, Vec<String>, String)> = Vec::new();
    for src in sources {
        let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
        if let Some((gencode, sass, ptx)) = gencode_flags(&stem, &targets) {
            let what = if ptx.is_empty() { format!("SASS {sass}") } else { format!("SASS {sass} + PTX {ptx}") };
            files.push((stem, src, gencode, what));
        }
    }
    // Longest first: the last job to start should be a short one.
    files.sort_by_key(|(stem, ..)| std::cmp::Reverse(nvcc_cost(stem)));
    // More jobs than files (a many-core machine): nvcc runs a file's passes (front ends, ptxas per arch) on
    // threads of its own. With fewer, it would only oversubscribe the cores.
    let threads = jobs / files.len().max(1);
    let mut commands = Vec::new();
    let mut lines = Vec::new();
    for (stem, src, gencode, what) in files {
        let fatbin = dir.join(format!("{stem}.fatbin"));
        let mut c = Command::new(nvcc);
        // No --use_fast_math: the hot loops already use the explicit approximations they mean
        // (fa::fast_exp2 = ex2.approx, which the emulator models); everything else (epilogue exp/log/division)
        // stays IEEE, as the emulator's host build computes it. Measured: identical registers, no spills.
        c.args(["-fatbin", "-O3", "-std=c++17", "-lineinfo", "-Xptxas", "-v", "-Xcudafe", "--diag_suppress=177"])
            .args(&gencode)
            .arg("-I")
            .arg(include);
        if threads > 1 {
            c.arg("--threads").arg(threads.to_string());
        }
        // The PyPI layout keeps CCCL (needed by cuda_fp16.h for <nv/target>) under include/cccl.
        if home.join("include/cccl").is_dir() {
            c.arg("-I").arg(home.join("include/cccl"));
        }
        c.arg("-o").arg(&fatbin).arg(src);
        lines.push(format!("{stem}.fatbin: {what}"));
        fatbins.push((stem, fatbin));
        commands.push(c);
    }
    let mut header = String::new();
    let mut report = String::new();
    for (line, (stderr, seconds)) in lines.iter().zip(run_parallel(commands, jobs)) {
        header.push_str(&format!("# {line} (nvcc {seconds:.1} s wall)\n"));
        report.push_str(&stderr);
    }
    (header, report)
}

/// Runs the commands on `jobs` threads, starting them in order; panics with the compiler's output on the
/// first failure. Returns each command's stderr and wall time in seconds, in the original order.
fn run_parallel(commands: Vec<Command>, jobs: usize) -> Vec<(String, f64)> {
    let n = commands.len();
    let mut queue: Vec<_> = commands.into_iter().enumerate().collect();
    queue.reverse(); // popped from the back
    let queue = Mutex::new(queue);
    let results: Mutex<Vec<(String, f64)>> = Mutex::new(vec![(String::new(), 0.0); n]);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.min(n.max(1)) {
            s.spawn(|| loop {
                let job = queue.lock().unwrap().pop();
                let Some((i, mut cmd)) = job else { break };
                let start = std::time::Instant::now();
                let output = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
                let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
                if output.status.success() {
                    results.lock().unwrap()[i] = (stderr, start.elapsed().as_secs_f64());
                } else {
                    let stdout = String::from_utf8_lossy(&output.stdout);
                    failures.lock().unwrap().push(format!("{cmd:?}\n{stdout}{stderr}"));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    if !failures.is_empty() {
        panic!("kernel compilation failed:\n{}", failures.join("\n"));
    }
    results.into_inner().unwrap()
}

/// target/<profile>/ from OUT_DIR (target/<profile>/build/<pkg>-<hash>/out).
fn profile_dir(out: &Path) -> PathBuf {
    out.ancestors().nth(3).unwrap_or(out).to_path_buf()
}

/// Per-kernel summary of `ptxas -v`: one line per (function, arch) with registers, shared memory, stack
/// and spills; lines starting with SPILL mark a spill or a non-zero stack frame, lines starting with WGMMA
/// a serialised wgmma pipeline or an ignored setmaxnreg (ptxas info/warning C7508-C7520) outside the
/// kernels allowed them.
fn check_ptxas(report: &str) -> String {
    let mut summary = String::new();
    let mut current = String::new();
    for line in report.lines() {
        if let Some(code) =
            line.split("(C").nth(1).and_then(|r| r.split(')').next()).and_then(|c| c.parse::<u32>().ok())
        {
            if (7508..=7520).contains(&code) {
                // The message names its function ("... in function 'fa_x'"), or it belongs to the current one.
                let function =
                    line.rsplit_once("function '").map_or(current.as_str(), |(_, f)| f.trim_end_matches('\''));
                let allowed = function.contains("fa_bug_") || function.contains("fa_selftest_wgmma_");
                let tag = if allowed { "wgmma" } else { "WGMMA" };
                summary.push_str(&format!("{tag} {function}: {}\n", line.trim()));
                continue;
            }
        }
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("");
            let arch = rest.split("for '").nth(1).and_then(|a| a.split('\'').next()).unwrap_or("?");
            current = format!("{arch} {name}");
        } else if line.contains("bytes stack frame") {
            let nums: Vec<u64> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter(|t| !t.is_empty())
                .map(|t| t.parse().unwrap())
                .collect();
            if nums.iter().any(|&n| n != 0) {
                summary.push_str(&format!("SPILL {current}: {}\n", line.trim()));
            }
        } else if line.contains("Used ") && line.contains("registers") {
            summary.push_str(&format!("ok    {current}: {}\n", line.split("info    : ").last().unwrap_or(line).trim()));
        }
    }
    summary
}
