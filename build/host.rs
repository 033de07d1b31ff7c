//! libfa_host.a: the launchers, the kernels compiled as host C++ for the emulator, and the SIMT executor,
//! through `cc` (parallel jobs, jobserver). It depends on no cargo feature (but `testkit`, which adds the self-test kernels) or profile (always -O2: the
//! emulated suite must be fast in debug too), so it comes from the kernel cache whenever the sources under
//! kernels/, the C++ compiler and its flags are the ones an entry was built from.

use crate::cache::{KernelCache, KeyBuilder};
use std::path::{Path, PathBuf};
use std::process::Command;

const LIBS: [&str; 2] = ["libfa_host.a", "libfa_host_asm.a"];

/// Builds (or fetches) the host library into `out` and tells cargo to link it. `all` is every file under
/// kernels/ (the key: any of them can be included), `cu`/`cpp`/`asm` what is compiled.
pub fn build_host_library(
    out: &Path,
    kernels: &Path,
    all: &[PathBuf],
    cu: &[PathBuf],
    cpp: &[PathBuf],
    asm: &[PathBuf],
    cache: &KernelCache,
) {
    let mut b = cc::Build::new();
    b.cpp(true)
        .opt_level(2)
        .debug(false)
        .extra_warnings(false)
        .cargo_metadata(false)
        .include(kernels.join("include"))
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
    let mut a = cc::Build::new();
    // Fixed flags, so that the entry does not depend on the profile either.
    a.opt_level(2).debug(false).cargo_metadata(false).files(asm);

    let compiler = b.get_compiler();
    let version = Command::new(compiler.path())
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut key = KeyBuilder::new("host library");
    key.text(&compiler.path().to_string_lossy()).text(&version);
    // The flags cc chose (target, PIC, CXXFLAGS, ours), without the checkout's absolute include path.
    let root = kernels.to_string_lossy().into_owned();
    for arg in compiler.args() {
        let arg = arg.to_string_lossy();
        if !arg.contains(root.as_str()) {
            key.text(&arg);
        }
    }
    key.text(&a.get_compiler().args().iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "));
    for f in all {
        key.file(kernels, f);
    }
    // Which .cu files are compiled depends on the `testkit` feature (the self-test kernels).
    for f in cu {
        key.text(&f.strip_prefix(kernels).unwrap_or(f).to_string_lossy());
    }
    let entry = cache.entry("host", &key.finish());
    let dests: Vec<PathBuf> = LIBS.iter().map(|l| out.join(l)).collect();
    let files: Vec<(&str, &Path)> = LIBS.iter().copied().zip(dests.iter().map(PathBuf::as_path)).collect();
    if entry.fetch(&files) {
        println!("fused-attn: host library from the kernel cache ({})", entry.path("").display());
    } else {
        println!("fused-attn: compiling the host library ({} files)", cu.len() + cpp.len() + asm.len());
        let start = std::time::Instant::now();
        b.compile("fa_host");
        a.compile("fa_host_asm");
        println!("fused-attn: host library: {:.1} s", start.elapsed().as_secs_f64());
        entry.store(&files, &[]);
    }
    cache.prune("host");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=fa_host");
    println!("cargo:rustc-link-lib=static=fa_host_asm");
    // cc's own choice for C++ on this target (CXXSTDLIB overrides it, empty for none).
    match std::env::var("CXXSTDLIB") {
        Ok(lib) if lib.is_empty() => {}
        Ok(lib) => println!("cargo:rustc-link-lib={lib}"),
        Err(_) => println!("cargo:rustc-link-lib=stdc++"),
    }
    println!("cargo:rustc-link-lib=dylib=pthread");
}
