//! Builds the kernels twice from the same sources and mirrors the C ABI into Rust:
//!  1. GPU library (libfa_gpu.a): every kernels/*.cu through nvcc, SASS for each arch in FA_CUDA_ARCHS
//!     (default 80,86,89,90a) plus PTX of the lowest arch for forward compatibility; `ptxas -v` output of
//!     every kernel goes to target/<profile>/ptxas-report.txt and any spill or stack frame fails the build.
//!  2. Emulator library (libfa_emu.a): the same kernels/*.cu as host C++ (-DFA_EMULATION) plus the host
//!     SIMT executor kernels/emu/*.{cpp,S}, always optimised (the emulated suite must be fast in debug too).
//!  3. src/sys.rs includes OUT_DIR/abi.rs, bindgen's output for kernels/include/fa/abi.h.
//!
//! Toolchain search (first hit wins): $NVCC, $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, nvcc on PATH,
//! /usr/local/cuda/bin/nvcc, then the project-local .toolchain/ that scripts/setup fills from PyPI. libclang
//! likewise: $LIBCLANG_PATH, the system's, then .toolchain/libclang. No network access at build time.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

const DEFAULT_ARCHS: &str = "80,86,89,90a";

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in ["NVCC", "CUDA_HOME", "CUDA_PATH", "FA_CUDA_ARCHS", "FA_ALLOW_SPILLS", "LIBCLANG_PATH", "CXX"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let kernels = root.join("kernels");
    let mut gpu_sources = Vec::new();
    let mut emu_sources = Vec::new();
    watch_dir(&kernels, &mut |p| match p.extension().and_then(|e| e.to_str()) {
        Some("cu") if p.parent() == Some(kernels.as_path()) => {
            gpu_sources.push(p.to_path_buf());
            emu_sources.push(p.to_path_buf());
        }
        Some("cpp") | Some("S") if p.parent() == Some(kernels.join("emu").as_path()) => {
            emu_sources.push(p.to_path_buf())
        }
        _ => {}
    });
    gpu_sources.sort();
    emu_sources.sort();

    let cuda = Cuda::find(&root);
    let include = kernels.join("include");
    let jobs = env::var("NUM_JOBS").ok().and_then(|j| j.parse().ok()).unwrap_or(2usize).max(1);

    let archs = env::var("FA_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_string());
    let gencode = gencode_flags(&archs);
    let gpu_dir = out.join("gpu");
    let emu_dir = out.join("emu");
    fs::create_dir_all(&gpu_dir).unwrap();
    fs::create_dir_all(&emu_dir).unwrap();

    // One job list, both libraries: nvcc jobs are the long ones, so they go first.
    let mut commands: Vec<(PathBuf, Command, bool)> = Vec::new();
    for src in &gpu_sources {
        let obj = gpu_dir.join(object_name(src));
        let mut c = Command::new(&cuda.nvcc);
        // No --use_fast_math: the hot loops already use the explicit approximations they mean
        // (fa::fast_exp2 = ex2.approx, which the emulator models); everything else (epilogue exp/log/division)
        // stays IEEE, as the emulator's host build computes it. Measured: identical registers, no spills.
        c.args(["-c", "-O3", "-std=c++17", "-lineinfo", "-Xptxas", "-v"])
            .args(["-Xcompiler", "-fPIC", "-Xcudafe", "--diag_suppress=177"])
            .args(&gencode)
            .arg("-I")
            .arg(&include);
        for inc in &cuda.includes {
            c.arg("-I").arg(inc);
        }
        c.arg("-o").arg(&obj).arg(src);
        commands.push((obj, c, true));
    }
    let cxx = env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    for src in &emu_sources {
        let obj = emu_dir.join(object_name(src));
        let mut c = Command::new(&cxx);
        if src.extension().and_then(|e| e.to_str()) == Some("cu") {
            c.args(["-x", "c++"]);
        }
        c.args(["-c", "-O2", "-std=c++17", "-fPIC", "-g0", "-DFA_EMULATION=1", "-fno-strict-aliasing"])
            .args(["-Wall", "-Wno-unused-function", "-Wno-unknown-pragmas"])
            .arg("-I")
            .arg(&include);
        for inc in &cuda.includes {
            c.arg("-I").arg(inc);
        }
        c.arg("-o").arg(&obj).arg(src);
        commands.push((obj, c, false));
    }

    let results = run_parallel(commands, jobs);
    let mut report = String::new();
    let mut gpu_objs = Vec::new();
    let mut emu_objs = Vec::new();
    for (obj, is_gpu, stderr) in results {
        if is_gpu {
            report.push_str(&stderr);
            gpu_objs.push(obj);
        } else {
            emu_objs.push(obj);
        }
    }
    archive(&out.join("libfa_gpu.a"), &gpu_objs);
    archive(&out.join("libfa_emu.a"), &emu_objs);

    let report_path = profile_dir(&out).join("ptxas-report.txt");
    let summary = check_ptxas(&report);
    fs::write(&report_path, format!("# ptxas -v for FA_CUDA_ARCHS={archs}\n{summary}\n{report}")).unwrap();
    fs::write(out.join("ptxas-report.txt"), &report).unwrap();
    println!("cargo:rustc-env=FA_PTXAS_REPORT={}", report_path.display());
    println!("cargo:rustc-env=FA_GPU_LIB={}", out.join("libfa_gpu.a").display());
    println!("cargo:rustc-env=FA_CUDA_ARCHS={archs}");
    if let Some(bad) = summary.lines().find(|l| l.starts_with("SPILL")) {
        if env::var("FA_ALLOW_SPILLS").is_err() {
            panic!("ptxas reports spills or a stack frame (see {}): {bad}", report_path.display());
        }
        println!("cargo:warning=FA_ALLOW_SPILLS set, ignoring: {bad}");
    }

    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=fa_gpu");
    println!("cargo:rustc-link-lib=static=fa_emu");
    println!("cargo:rustc-link-search=native={}", cuda.lib.display());
    println!("cargo:rustc-link-lib=static=cudart_static");
    for lib in ["stdc++", "dl", "rt", "pthread"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }

    bindgen_abi(&root, &include, &out);
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

fn object_name(src: &Path) -> String {
    format!("{}.o", src.file_name().unwrap().to_string_lossy())
}

/// `-gencode` flags. Plain archs share one virtual arch (the lowest) so the front end runs once for all of
/// them; arch-specific ones (90a) need their own. PTX of the lowest plain arch is embedded for GPUs newer
/// than any SASS we ship.
fn gencode_flags(archs: &str) -> Vec<String> {
    let list: Vec<&str> = archs.split(',').map(str::trim).filter(|a| !a.is_empty()).collect();
    assert!(!list.is_empty(), "FA_CUDA_ARCHS is empty");
    let (specific, plain): (Vec<&str>, Vec<&str>) = list.iter().partition(|a| a.ends_with('a'));
    let mut flags = Vec::new();
    if let Some(lowest) = plain.iter().min_by_key(|a| a.parse::<u32>().expect("FA_CUDA_ARCHS: bad arch")) {
        let codes: Vec<String> = plain.iter().map(|a| format!("sm_{a}")).collect();
        flags.push("-gencode".into());
        flags.push(format!("arch=compute_{lowest},code=[{},compute_{lowest}]", codes.join(",")));
    }
    for a in specific {
        flags.push("-gencode".into());
        flags.push(format!("arch=compute_{a},code=sm_{a}"));
    }
    flags
}

struct Cuda {
    nvcc: PathBuf,
    includes: Vec<PathBuf>,
    lib: PathBuf,
}

impl Cuda {
    fn find(root: &Path) -> Cuda {
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
        candidates.push(root.join(".toolchain/cuda/nvidia/cu13/bin/nvcc"));
        let nvcc = candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
            panic!(
                "no CUDA compiler found (looked at $NVCC, $CUDA_HOME, $CUDA_PATH, PATH, /usr/local/cuda, \
                 .toolchain/): run scripts/setup, which installs the pinned CUDA 13.0 nvcc from PyPI"
            )
        });
        let home = nvcc.parent().and_then(Path::parent).unwrap().to_path_buf();
        let mut includes = vec![home.join("include")];
        // The PyPI layout keeps CCCL (needed by cuda_fp16.h for <nv/target>) under include/cccl.
        if home.join("include/cccl").is_dir() {
            includes.push(home.join("include/cccl"));
        }
        let lib = ["lib64", "lib", "lib/x64"]
            .iter()
            .map(|d| home.join(d))
            .find(|d| d.join("libcudart_static.a").is_file())
            .unwrap_or_else(|| panic!("libcudart_static.a not found under {}", home.display()));
        Cuda { nvcc, includes, lib }
    }
}

/// Runs the compile commands on `jobs` threads; panics with the compiler's output on the first failure.
/// Returns (object, is_gpu, stderr) in the original order.
fn run_parallel(commands: Vec<(PathBuf, Command, bool)>, jobs: usize) -> Vec<(PathBuf, bool, String)> {
    let n = commands.len();
    let queue = Mutex::new(commands.into_iter().enumerate().collect::<Vec<_>>());
    let results: Mutex<Vec<Option<(PathBuf, bool, String)>>> = Mutex::new(vec![None; n]);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.min(n.max(1)) {
            s.spawn(|| loop {
                let job = queue.lock().unwrap().pop();
                let Some((i, (obj, mut cmd, is_gpu))) = job else { break };
                let output = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
                let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
                if output.status.success() {
                    results.lock().unwrap()[i] = Some((obj, is_gpu, stderr));
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
    results.into_inner().unwrap().into_iter().map(Option::unwrap).collect()
}

fn archive(lib: &Path, objs: &[PathBuf]) {
    let _ = fs::remove_file(lib);
    let ar = env::var("AR").unwrap_or_else(|_| "ar".to_string());
    let status = Command::new(ar).arg("crs").arg(lib).args(objs).status().expect("cannot run ar");
    assert!(status.success(), "ar failed for {}", lib.display());
}

/// target/<profile>/ from OUT_DIR (target/<profile>/build/<pkg>-<hash>/out).
fn profile_dir(out: &Path) -> PathBuf {
    out.ancestors().nth(3).unwrap_or(out).to_path_buf()
}

/// Per-kernel summary of `ptxas -v`: one line per (function, arch) with registers, shared memory, stack
/// and spills; lines starting with SPILL mark a spill or a non-zero stack frame.
fn check_ptxas(report: &str) -> String {
    let mut summary = String::new();
    let mut current = String::new();
    for line in report.lines() {
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

fn bindgen_abi(root: &Path, include: &Path, out: &Path) {
    if env::var_os("LIBCLANG_PATH").is_none() {
        let local = root.join(".toolchain/libclang/clang/native");
        if local.join("libclang.so").is_file() {
            env::set_var("LIBCLANG_PATH", &local);
        }
    }
    let header = include.join("fa/abi.h");
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_item("(fa_|Fa|FA_).*")
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!("bindgen failed on {} (libclang missing? run scripts/setup): {e}", header.display())
        });
    bindings.write_to_file(out.join("abi.rs")).unwrap();
}
