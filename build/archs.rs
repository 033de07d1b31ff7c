//! Which GPUs the kernels are built for. Shared by the build script (build/main.rs) and its tests
//! (tests/it/archs.rs includes this file by path), so the rules below are tested like library code, the
//! GPU query with a fake `nvidia-smi`.
//!
//! In order, the first that is set decides:
//!  1. `FA_CUDA_ARCHS`: a comma list of compute capabilities (`80,90a,120`), `native` (the GPUs
//!     `nvidia-smi` sees now; an error when it sees none) or `all` (the fat list, [`FAT_LIST`]: what a
//!     package or a binary for other machines should carry);
//!  2. `CUDA_COMPUTE_CAP`: candle's knob (`89`, `8.9`, or a list), so an engine built for one GPU with candle
//!     builds fused-attn for the same one;
//!  3. a GPU visible at build time (`nvidia-smi` lists one or more): those GPUs alone (as `native`);
//!  4. otherwise the fat list: a build machine without a GPU builds for every GPU it may run on.
//!
//! A native compute capability 9.0 means "90a" (the Hopper kernels' wgmma/TMA code is arch-specific); any
//! other one its plain number ("8.9" -> "89"). An explicit list is taken as written.

/// Every GPU family Rust engines run on, from Ampere to Blackwell: 8.0 (A100), 8.6 (RTX 30, A10), 8.9
/// (RTX 40, L4, L40S), 9.0 with its arch-specific Hopper kernels (H100, H200), 10.0 (B200, GB200; 10.3 runs
/// its SASS) and 12.0 (RTX 50, RTX PRO 6000; 12.1, DGX Spark, runs its SASS). GPUs newer than all of
/// them JIT-compile the PTX each fatbin also holds.
pub const FAT_LIST: &str = "80,86,89,90a,100,120";

/// The targets a build resolved to, and why (for the build's report and its error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Comma list of targets, each `NN` or `NNa`, sorted and without repeats.
    pub archs: String,
    pub why: String,
}

/// Resolves the targets from the two variables (`None` when unset or empty) and a GPU query (the
/// compute capabilities `nvidia-smi` reports, `None` when it cannot run or sees no GPU), in the order the
/// module doc gives. An error says which input was wrong.
pub fn resolve(
    fa_cuda_archs: Option<&str>,
    cuda_compute_cap: Option<&str>,
    query_gpus: &mut dyn FnMut() -> Option<Vec<String>>,
) -> Result<Resolved, String> {
    let set = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(str::to_string);
    if let Some(v) = set(fa_cuda_archs) {
        return match v.as_str() {
            "all" => Ok(Resolved { archs: FAT_LIST.into(), why: "FA_CUDA_ARCHS=all (the fat list)".into() }),
            "native" => match query_gpus() {
                Some(caps) => Ok(Resolved { archs: native(&caps)?, why: "FA_CUDA_ARCHS=native (nvidia-smi)".into() }),
                None => Err("FA_CUDA_ARCHS=native, but nvidia-smi reports no GPU on this machine: list the \
                             compute capabilities instead (e.g. FA_CUDA_ARCHS=89,120), or `all`"
                    .into()),
            },
            list => Ok(Resolved { archs: normalise(list, "FA_CUDA_ARCHS")?, why: "FA_CUDA_ARCHS".into() }),
        };
    }
    if let Some(v) = set(cuda_compute_cap) {
        let caps: Vec<String> = v.split(',').map(str::to_string).collect();
        return Ok(Resolved { archs: native(&caps)?, why: "CUDA_COMPUTE_CAP (candle's)".into() });
    }
    match query_gpus() {
        Some(caps) => Ok(Resolved {
            archs: native(&caps)?,
            why: "the GPUs nvidia-smi sees (FA_CUDA_ARCHS=all builds for every GPU)".into(),
        }),
        None => Ok(Resolved { archs: FAT_LIST.into(), why: "no GPU visible at build time: the fat list".into() }),
    }
}

/// Targets for the GPUs themselves ("9.0", "89", "12.0"): a 9.0 GPU gets the arch-specific 90a.
fn native(caps: &[String]) -> Result<String, String> {
    let mut list = Vec::new();
    for cap in caps.iter().map(|c| c.trim()).filter(|c| !c.is_empty()) {
        let cc = parse_cc(cap).ok_or_else(|| format!("bad compute capability {cap:?} (from the GPU query)"))?;
        list.push(if cc == 90 { "90a".to_string() } else { cc.to_string() });
    }
    normalise(&list.join(","), "the GPU query")
}

/// "8.9" or "89" -> 89.
fn parse_cc(cap: &str) -> Option<u32> {
    match cap.split_once('.') {
        Some((major, minor)) => Some(major.parse::<u32>().ok()? * 10 + minor.parse::<u32>().ok()?),
        None => cap.parse().ok(),
    }
}

/// Checks and sorts a comma list of targets (`80`, `90a`, `8.9`), dropping repeats; below 8.0 is an error
/// (the kernels use sm_80's mma.sync, cp.async and ldmatrix).
pub fn normalise(list: &str, from: &str) -> Result<String, String> {
    let mut targets: Vec<(u32, bool)> = Vec::new();
    for a in list.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let specific = a.ends_with('a');
        let cc = parse_cc(a.trim_end_matches('a'))
            .ok_or_else(|| format!("{from}: bad arch {a:?} (want compute capabilities like 80,90a,120)"))?;
        if cc < 80 {
            return Err(format!("{from}: sm_{cc} is below sm_80, the oldest GPU the kernels are written for"));
        }
        targets.push((cc, specific));
    }
    if targets.is_empty() {
        return Err(format!("{from} names no arch"));
    }
    targets.sort();
    targets.dedup();
    Ok(targets.iter().map(|&(cc, a)| format!("{cc}{}", if a { "a" } else { "" })).collect::<Vec<_>>().join(","))
}

/// The compute capabilities of the GPUs `program` (`nvidia-smi`) lists, or `None` when it cannot be run,
/// fails, or lists none (no driver, no GPU).
pub fn query_nvidia_smi(program: &std::ffi::OsStr) -> Option<Vec<String>> {
    let out = std::process::Command::new(program)
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let caps: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    (!caps.is_empty()).then_some(caps)
}
