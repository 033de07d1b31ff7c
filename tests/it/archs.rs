//! The build's choice of GPUs (build/archs.rs, included here by path: the build script's own code): an
//! explicit FA_CUDA_ARCHS, `all`, `native`, candle's CUDA_COMPUTE_CAP, a GPU seen at build time, and the fat
//! list when there is none; the GPU query run against a fake `nvidia-smi`.

#[path = "../../build/archs.rs"]
#[allow(dead_code)]
mod build_archs;

use build_archs::{normalise, query_nvidia_smi, resolve, FAT_LIST};
use std::path::PathBuf;

/// A fake `nvidia-smi` that prints `out` for the compute-capability query (and fails on anything else, as
/// the real one does for an unknown flag) and exits with `code`.
fn fake_nvidia_smi(name: &str, out: &str, code: i32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("fa-fake-smi-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nvidia-smi");
    let script = format!(
        "#!/bin/sh\n[ \"$1 $2\" = \"--query-gpu=compute_cap --format=csv,noheader\" ] || exit 9\nprintf '{out}'\nexit {code}\n"
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn the_gpu_query_reads_nvidia_smi() {
    let two = fake_nvidia_smi("two", "8.9\\n12.0\\n", 0);
    assert_eq!(query_nvidia_smi(two.as_os_str()), Some(vec!["8.9".to_string(), "12.0".to_string()]));
    // No driver: nvidia-smi fails ("couldn't communicate with the NVIDIA driver"); no GPU: it lists none.
    let failing = fake_nvidia_smi("failing", "", 9);
    assert_eq!(query_nvidia_smi(failing.as_os_str()), None);
    let none = fake_nvidia_smi("none", "\\n", 0);
    assert_eq!(query_nvidia_smi(none.as_os_str()), None);
    assert_eq!(query_nvidia_smi("/nonexistent/nvidia-smi".as_ref()), None);

    // `native` and the default both build for exactly what it lists (a 9.0 GPU: the sm_90a kernels too).
    let hopper = fake_nvidia_smi("hopper", "9.0\\n9.0\\n", 0);
    for (var, want) in [(Some("native"), "90a"), (None, "90a")] {
        let r = resolve(var, None, &mut || query_nvidia_smi(hopper.as_os_str())).unwrap();
        assert_eq!(r.archs, want, "{var:?}");
    }
    let r = resolve(Some("native"), None, &mut || query_nvidia_smi(two.as_os_str())).unwrap();
    assert_eq!(r.archs, "89,120");
}

#[test]
fn the_targets_follow_the_documented_order() {
    let mut no_gpu = || None;
    let mut rtx5090 = || Some(vec!["12.0".to_string()]);
    // Nothing set, no GPU: the fat list, with Blackwell (10.0 and 12.0) in it.
    assert_eq!(resolve(None, None, &mut no_gpu).unwrap().archs, FAT_LIST);
    assert!(FAT_LIST.split(',').any(|a| a == "100") && FAT_LIST.split(',').any(|a| a == "120"));
    // Empty is unset.
    assert_eq!(resolve(Some(" "), Some(""), &mut no_gpu).unwrap().archs, FAT_LIST);
    // A GPU at build time: that GPU alone.
    assert_eq!(resolve(None, None, &mut rtx5090).unwrap().archs, "120");
    // candle's CUDA_COMPUTE_CAP beats the query; FA_CUDA_ARCHS beats both; `all` is the fat list anywhere.
    assert_eq!(resolve(None, Some("90"), &mut rtx5090).unwrap().archs, "90a");
    assert_eq!(resolve(None, Some("8.6"), &mut rtx5090).unwrap().archs, "86");
    assert_eq!(resolve(Some("120,80,80"), Some("90"), &mut rtx5090).unwrap().archs, "80,120");
    assert_eq!(resolve(Some("all"), None, &mut rtx5090).unwrap().archs, FAT_LIST);
    // An explicit list is taken as written (plain 90: no sm_90a kernels).
    assert_eq!(resolve(Some("90"), None, &mut no_gpu).unwrap().archs, "90");
    // `native` without a GPU, a bad arch, and one below sm_80 are errors that say what to do.
    let e = resolve(Some("native"), None, &mut no_gpu).unwrap_err();
    assert!(e.contains("native") && e.contains("no GPU") && e.contains("all"), "{e}");
    let e = resolve(Some("80,sm90"), None, &mut no_gpu).unwrap_err();
    assert!(e.contains("FA_CUDA_ARCHS") && e.contains("sm90"), "{e}");
    let e = resolve(Some("75"), None, &mut no_gpu).unwrap_err();
    assert!(e.contains("sm_75") && e.contains("sm_80"), "{e}");
    let e = resolve(None, Some("7.5"), &mut no_gpu).unwrap_err();
    assert!(e.contains("sm_75"), "{e}");
    assert_eq!(normalise("9.0a, 8.0", "x").unwrap(), "80,90a");
}

/// The library says what serves each GPU of the fat list, and names the archs built when nothing does (a
/// GPU below every target, a new major without PTX). Without kernels every answer is NoKernels.
#[test]
fn support_names_what_serves_each_gpu() {
    use fused_attn::{build_info, ErrorKind};
    if !build_info::has_gpu_kernels() {
        assert_eq!(*build_info::support(9, 0).unwrap_err().kind(), ErrorKind::NoKernels);
        return;
    }
    let built: Vec<u32> = build_info::CUDA_ARCHS.split(',').map(|a| a.trim_end_matches('a').parse().unwrap()).collect();
    for &cc in &built {
        let s = build_info::support(cc / 10, cc % 10).unwrap_or_else(|e| panic!("sm_{cc}: {e}"));
        assert!(s.jit.is_empty(), "a listed target runs SASS: {s}");
        assert!(!s.sass.is_empty(), "{s}");
        assert_eq!(s.hopper_kernels, cc == 90 && build_info::CUDA_ARCHS.contains("90a"), "{s}");
        // The SASS the driver picks is of the GPU's own major.
        assert!(s.sass.iter().all(|(a, _)| a[3..].parse::<u32>().unwrap() / 10 == cc / 10), "{s}");
    }
    if build_info::CUDA_ARCHS == FAT_LIST {
        // 12.1 (DGX Spark) runs sm_120 SASS, 10.3 (B300) sm_100; 8.6 sm_80, and 8.9 sm_89 for the FP8 kernels.
        let names = |cc: u32| -> Vec<String> {
            build_info::support(cc / 10, cc % 10).unwrap().sass.into_iter().map(|(a, _)| a).collect()
        };
        assert_eq!(names(121), ["sm_120"]);
        assert_eq!(names(103), ["sm_100"]);
        assert_eq!(names(86), ["sm_80"]);
        assert_eq!(names(89), ["sm_80", "sm_89"]);
        // A major no SASS has (11.0, Thor): the PTX, JIT-compiled.
        let thor = build_info::support(11, 0).unwrap();
        assert!(thor.sass.is_empty() && !thor.jit.is_empty(), "{thor}");
        assert!(thor.to_string().contains("JIT"), "{thor}");
    }
    // Below every target: an Arch error naming what was built and how to add the GPU.
    let e = build_info::support(7, 5).unwrap_err();
    assert_eq!(*e.kind(), ErrorKind::Arch);
    let msg = e.to_string();
    assert!(msg.contains("sm_75") && msg.contains(build_info::CUDA_ARCHS) && msg.contains("FA_CUDA_ARCHS="), "{msg}");
}
