//! The build's promises, checked on the built artifacts: SASS for every requested arch plus PTX, and a ptxas
//! report that lists every kernel with no spills and no stack frame.

use std::path::PathBuf;
use std::process::Command;

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

#[test]
fn gpu_library_has_sass_for_every_arch_and_ptx() {
    let Some(tool) = cuobjdump() else {
        panic!("cuobjdump not found: scripts/setup installs it into .toolchain/cuda-tools");
    };
    let out = Command::new(&tool).args(["--list-elf", build_info::GPU_LIBRARY]).output().unwrap();
    assert!(out.status.success(), "cuobjdump failed: {}", String::from_utf8_lossy(&out.stderr));
    let listing = String::from_utf8_lossy(&out.stdout);
    for arch in build_info::CUDA_ARCHS.split(',') {
        let tag = format!(".sm_{}.", arch.trim());
        assert!(listing.contains(&tag), "no SASS for sm_{arch} in {}:\n{listing}", build_info::GPU_LIBRARY);
    }
    let ptx = Command::new(&tool).args(["--list-ptx", build_info::GPU_LIBRARY]).output().unwrap();
    assert!(String::from_utf8_lossy(&ptx.stdout).contains(".ptx"), "no PTX embedded for forward compatibility");
}

#[test]
fn ptxas_report_is_spill_free_and_lists_kernels() {
    let report = std::fs::read_to_string(build_info::PTXAS_REPORT).expect("ptxas report missing");
    assert!(!report.lines().any(|l| l.starts_with("SPILL")), "spills or stack frames:\n{report}");
    let kernels = report.lines().filter(|l| l.starts_with("ok ")).count();
    let archs = build_info::CUDA_ARCHS.split(',').count();
    assert!(kernels >= archs, "ptxas report lists {kernels} kernel builds for {archs} archs:\n{report}");
}
