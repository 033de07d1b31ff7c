//! fused-attn as a dependency (tools/downstream): a crate that enables cudarc's `cuda-12080` itself builds
//! against fused-attn, `cargo tree -e features` shows no other CUDA-version feature on cudarc, and it runs an
//! emulated prefill through the public API. The crate is copied outside the repository so that this
//! repository's .cargo/config.toml (CUDARC_CUDA_VERSION for its own builds) does not apply, as for any
//! dependent. Its target dir is target/downstream (a nested cargo cannot share the outer one, which the
//! running `cargo test` holds); the kernel cache is the outer build's (FA_KERNEL_CACHE, else
//! target/fa-kernel-cache) and FA_CUDA_ARCHS is the outer build's, so its fatbins and host library are
//! cache hits: no nvcc runs.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn a_downstream_crate_chooses_the_cuda_version_and_runs() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("fused-attn-downstream-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = std::fs::read_to_string(root.join("tools/downstream/Cargo.toml")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), manifest.replace("FUSED_ATTN_PATH", &root.display().to_string())).unwrap();
    std::fs::copy(root.join("tools/downstream/src/main.rs"), dir.join("src/main.rs")).unwrap();
    // The repository's lock file pins the same versions its own build uses.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let kernel_cache =
        std::env::var_os("FA_KERNEL_CACHE").map_or_else(|| root.join("target/fa-kernel-cache"), PathBuf::from);
    let cmd = |args: &[&str]| {
        let out = Command::new(&cargo)
            .args(args)
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", root.join("target/downstream"))
            .env("FA_KERNEL_CACHE", &kernel_cache)
            .env_remove("CUDARC_CUDA_VERSION")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "cargo {args:?} failed in {}:\n{text}", dir.display());
        text
    };
    let tree = cmd(&["tree", "-e", "features", "-i", "cudarc"]);
    let versions: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split("cudarc feature \"").nth(1))
        .filter_map(|f| f.split('"').next())
        .filter(|f| f.starts_with("cuda-") && f[5..].chars().all(|c| c.is_ascii_digit()))
        .collect();
    assert!(!versions.is_empty(), "no CUDA-version feature in the tree:\n{tree}");
    assert!(
        versions.iter().all(|v| *v == "cuda-12080"),
        "fused-attn forces another CUDA version: {versions:?}\n{tree}"
    );
    // The dev profile: a dependent's first `cargo run`; it compiles in about half the time of a release build
    // (the emulator's host library is the same in every profile, a kernel-cache hit).
    let run = cmd(&["run", "--quiet"]);
    assert!(run.contains("downstream ok"), "{run}");
    let _ = std::fs::remove_dir_all(&dir);
}
