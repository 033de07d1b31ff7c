//! nvcc: which GPU code each kernels/*.cu gets (`gencode_flags`), finding the compiler, running the fatbin
//! jobs in parallel (longest first) and reading ptxas's report (`check_ptxas`).

use crate::cache::{include_closure, KernelCache, KeyBuilder};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
/// One GPU target of FA_CUDA_ARCHS: compute capability 10 · major + minor, and whether it was given
/// arch-specific ("90a").
#[derive(Clone, Copy, PartialEq)]
struct Target {
    cc: u32,
    specific: bool,
}

fn parse_targets(archs: &str) -> Vec<Target> {
    // `archs` is build/archs.rs's normalised list: sorted, each "NN" or "NNa".
    archs
        .split(',')
        .map(|a| Target { cc: a.trim_end_matches('a').parse().expect("a normalised arch"), specific: a.ends_with('a') })
        .collect()
}

/// Compute capabilities above the lowest target at which a file's device code changes (`__CUDA_ARCH__`
/// tests): the FP8 conversions (fa/intrinsics.cuh) use the hardware cvt from 8.9 on, so a file with FP8
/// kernels needs a front end at compute_89 for its SASS of 8.9 and up. tests/it/build_artifacts.rs checks that
/// the sm_89 / sm_90 SASS of every `*fp8*` kernel has the hardware conversion, so a file with FP8 kernels
/// missing here fails there.
fn code_changes_at(stem: &str) -> &'static [u32] {
    match stem {
        "append" | "decode_fp8" | "paged_prefill_fp8" | "selftest" | "mla" => &[89],
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
///    (every sm_80 tile config fits the 99 KiB of shared memory of 8.6/8.9: fa/prefill/tile_config.cuh),
///    sm_100 serves 10.3 and sm_120 serves 12.1. SASS never crosses a major: 9.0, 10.0 and 12.0 each get
///    a ptxas pass of their own over the same PTX (12.0 is the 99 KiB-per-block Ampere-style mma.sync
///    machine the sm_80 tile configs are sized for, too);
///    What a separate sm_86 / sm_89 pass of the same PTX would add is ptxas's scheduling for that minor
///    revision, for a full pass of nvcc time; FlashAttention-2 ships sm_80 and sm_90 SASS alone, too;
///  - "90a" (or any arch-specific target) gives plain sm_90 SASS outside kernels/*_sm90.cu: those kernels
///    use nothing arch-specific, and sm_90 SASS can come from the lower targets' PTX (sm_90a needs its
///    own compute_90a front end);
///  - PTX of the highest front end, for GPUs newer than every SASS (JIT-compiled by the driver).
///
/// So the fat list 80,86,89,90a,100,120 builds sm_80 + sm_90 + sm_100 + sm_120 SASS from one front end for
/// most files, and sm_80 (compute_80) + sm_89, sm_90, sm_100, sm_120 (compute_89) for the FP8 files. An sm_90a-only file is compiled for
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

/// nvcc CPU seconds of each file with the default targets (measured 2026-12-01, docs/build.md): build_fatbins
/// starts the longest first, so that the two jobs of a 2-core machine finish together. Only an ordering: a
/// file not listed starts first (it may be long).
fn nvcc_cost(stem: &str) -> u32 {
    match stem {
        "prefill" => 55,
        "paged_prefill_fp8" => 50,
        "paged_prefill" => 40,
        "decode_fp8" => 24, // 17 before the width 512 (+40%, 2026-12-03)
        "selftest_sm90" => 8,
        "decode" => 9,
        "prefill_sm90" => 7,
        "append" => 4,
        "merge" => 3,
        "mla" => 12, // 17.2 s wall with the FP8 kernels and a compute_89 front end (2.6 s before, 2026-12-04)
        "selftest" => 3,
        _ => 1000,
    }
}

pub fn find_nvcc(root: &Path) -> Option<PathBuf> {
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

/// The whole `nvcc --version` text: the compiler's identity in the kernel cache's keys.
fn nvcc_identity(nvcc: &Path) -> String {
    let out =
        Command::new(nvcc).arg("--version").output().unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// "13.0" from `nvcc --version` ("Cuda compilation tools, release 13.0, V13.0.88").
pub fn nvcc_version(nvcc: &Path) -> String {
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
pub fn is_sm90_only(stem: &str) -> bool {
    stem.ends_with("_sm90")
}

/// An embedded fatbin: its name (the kernels/*.cu stem), where nvcc wrote it, and the SASS archs ("80,90")
/// and PTX arch ("80"; empty for none) it holds.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
pub struct Fatbin {
    pub name: String,
    pub path: PathBuf,
    pub sass: String,
    pub ptx: String,
}

/// One fatbin per kernels/*.cu (device code only), with the SASS and PTX `gencode_flags` gives it, from the
/// kernel cache where an entry has the same key (the file's include closure, nvcc's `--version`, the flags),
/// else compiled and stored; returns the report's header (each fatbin's archs and nvcc wall time) and
/// ptxas's output of all of them. Prints a line per file (cargo shows them with `-vv`).
pub fn build_fatbins(
    nvcc: &Path,
    kernels: &Path,
    sources: &[PathBuf],
    archs: &str,
    dir: &Path,
    cache: &KernelCache,
    fatbins: &mut Vec<Fatbin>,
) -> (String, String) {
    let include = kernels.join("include");
    let home = nvcc.parent().and_then(Path::parent).unwrap().to_path_buf();
    let identity = nvcc_identity(nvcc);
    let targets = parse_targets(archs);
    let jobs = env::var("NUM_JOBS").ok().and_then(|j| j.parse().ok()).unwrap_or(2usize).max(1);
    let mut files: Vec<(String, &PathBuf, Vec<String>, String)> = Vec::new();
    let mut archs_of = Vec::new();
    for src in sources {
        let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
        if let Some((gencode, sass, ptx)) = gencode_flags(&stem, &targets) {
            let what = if ptx.is_empty() { format!("SASS {sass}") } else { format!("SASS {sass} + PTX {ptx}") };
            archs_of.push((stem.clone(), sass, ptx));
            files.push((stem, src, gencode, what));
        }
    }
    // Longest first: the last job to start should be a short one.
    files.sort_by_key(|(stem, ..)| std::cmp::Reverse(nvcc_cost(stem)));
    // No --use_fast_math: the hot loops already use the explicit approximations they mean
    // (fa::fast_exp2 = ex2.approx, which the emulator models); everything else (epilogue exp/log/division)
    // stays IEEE, as the emulator's host build computes it. Measured: identical registers, no spills.
    let flags = ["-fatbin", "-O3", "-std=c++17", "-lineinfo", "-Xptxas", "-v", "-Xcudafe", "--diag_suppress=177"];
    // The PyPI layout keeps CCCL (needed by cuda_fp16.h for <nv/target>) under include/cccl.
    let cccl = home.join("include/cccl");
    let mut header = vec![String::new(); files.len()];
    let mut report = vec![String::new(); files.len()];
    // Files to compile: (index, entry to store into, fatbin) beside their (label, nvcc command).
    let mut misses = Vec::new();
    let mut commands = Vec::new();
    for (i, (stem, src, gencode, what)) in files.iter().enumerate() {
        let fatbin = dir.join(format!("{stem}.fatbin"));
        let mut key = KeyBuilder::new("fatbin");
        key.text(&identity).text(&flags.join(" ")).text(&gencode.join(" ")).text(&cccl.is_dir().to_string());
        for f in include_closure(src, &include) {
            key.file(kernels, &f);
        }
        let entry = cache.entry(stem, &key.finish());
        let (_, sass, ptx) = archs_of.iter().find(|(s, ..)| s == stem).unwrap();
        fatbins.push(Fatbin { name: stem.clone(), path: fatbin.clone(), sass: sass.clone(), ptx: ptx.clone() });
        if entry.fetch(&[("kernel.fatbin", &fatbin)]) {
            let seconds = entry.read("nvcc-seconds");
            println!("fused-attn: {stem}.fatbin from the kernel cache ({})", entry.path("").display());
            header[i] = format!("# {stem}.fatbin: {what} (kernel cache; nvcc {} s wall when built)\n", seconds.trim());
            report[i] = entry.read("ptxas.txt");
            continue;
        }
        let mut c = Command::new(nvcc);
        c.args(flags).args(gencode).arg("-I").arg(&include);
        if cccl.is_dir() {
            c.arg("-I").arg(&cccl);
        }
        c.arg("-o").arg(&fatbin).arg(src);
        misses.push((i, entry, fatbin));
        commands.push((format!("{stem}.cu ({what})"), c));
    }
    // More jobs than files to compile (a many-core machine): nvcc runs a file's passes (front ends, ptxas per
    // arch) on threads of its own. With fewer, it would only oversubscribe the cores.
    let threads = jobs / misses.len().max(1);
    if threads > 1 {
        for (_, c) in &mut commands {
            c.arg("--threads").arg(threads.to_string());
        }
    }
    let labels: Vec<String> = commands.iter().map(|(label, _)| label.clone()).collect();
    let results = run_parallel(commands, jobs);
    for (((i, entry, fatbin), what), (stderr, seconds)) in misses.into_iter().zip(labels).zip(results) {
        println!("fused-attn: nvcc {what}: {seconds:.1} s");
        let seconds = format!("{seconds:.1}");
        entry.store(&[("kernel.fatbin", &fatbin)], &[("ptxas.txt", &stderr), ("nvcc-seconds", &seconds)]);
        header[i] = format!("# {}.fatbin: {} (nvcc {seconds} s wall)\n", files[i].0, files[i].3);
        report[i] = stderr;
    }
    for (stem, ..) in &files {
        cache.prune(stem);
    }
    (header.concat(), report.concat())
}

/// Runs the commands on `jobs` threads, starting them in order; panics with the compiler's output on the
/// first failure. Returns each command's stderr and wall time in seconds, in the original order.
fn run_parallel(commands: Vec<(String, Command)>, jobs: usize) -> Vec<(String, f64)> {
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
                let Some((i, (label, mut cmd))) = job else { break };
                println!("fused-attn: nvcc {label}");
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

/// The sm_90a kernels that redistribute registers with setmaxnreg (by name prefix, first match wins) and
/// their threads per CTA. Their role budgets add up to the pool of 65536 / threads registers per thread
/// (rounded down to 8: fa/hopper/traits.cuh), which holds only if ptxas launches them with exactly that
/// many; with fewer, setmaxnreg.inc waits forever on the GPU. `check_ptxas` asserts it for each
/// (tests/it/build_artifacts.rs checks that every kernel with USETMAXREG in its SASS is listed here).
const SETMAXNREG_KERNELS: &[(&str, u32)] = &[
    ("fa_prefill_sm90_f16_d64", 512),
    ("fa_prefill_sm90_bf16_d64", 512),
    ("fa_prefill_sm90_", 384),
    ("fa_selftest_ws_gemm_", 384),
    ("fa_bug_sm90_setmaxnreg", 384),
];

/// The launch registers of a setmaxnreg kernel's `Used N registers` line: a `pool` line, or `POOL` (a build
/// error) when ptxas gave it another count than its pool needs.
fn check_pool(function: &str, line: &str) -> Option<String> {
    let name = function.strip_prefix("sm_90a ")?;
    let &(_, threads) = SETMAXNREG_KERNELS.iter().find(|(prefix, _)| name.starts_with(prefix))?;
    let used: u32 = line.split("Used ").nth(1)?.split_whitespace().next()?.parse().ok()?;
    let pool = (65536 / threads / 8 * 8).min(255);
    Some(if used == pool {
        format!("pool  {function}: {used} registers at launch = 65536 / {threads} threads, the setmaxnreg pool\n")
    } else {
        format!(
            "POOL  {function}: ptxas launches it with {used} registers, its setmaxnreg budgets need {pool} \
             (65536 / {threads} threads): setmaxnreg.inc would wait forever\n"
        )
    })
}

/// Per-kernel summary of `ptxas -v`: one line per (function, arch) with registers, shared memory, stack
/// and spills; lines starting with SPILL mark a spill or a non-zero stack frame, lines starting with WGMMA
/// a serialised wgmma pipeline or an ignored setmaxnreg (ptxas info/warning C7508-C7520) outside the
/// kernels allowed them; POOL a setmaxnreg kernel launched with other registers than its pool (`pool` when
/// it holds).
pub fn check_ptxas(report: &str) -> String {
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
            if let Some(pool) = check_pool(&current, line) {
                summary.push_str(&pool);
            }
        }
    }
    summary
}
