//! The kernel artifact cache: what nvcc and the host C++ compiler produced, keyed by the content of
//! everything that decides it (the sources a file includes, the compiler's version, the flags), so that a
//! second profile (`cargo build` after `cargo build --release`), another feature set (`--features candle`),
//! `cargo doc`, a second checkout sharing the directory, or the emulator-only build reuses it instead of
//! compiling again. cargo's own caching is per profile and per feature set (each gets its own OUT_DIR), which
//! is why it does not cover this.
//!
//! Where: `$FA_KERNEL_CACHE`, else `<target dir>/fa-kernel-cache` (next to the profiles, so `cargo clean`
//! removes it). An entry is a directory `<name>-<key>` holding the artifacts; it is written under a temporary
//! name and renamed into place, so a concurrent or interrupted build never sees half an entry, and two builds
//! that miss at once both compile and one rename wins. Each name keeps its few most recently used entries
//! (`prune`), so editing a kernel does not grow the cache without bound.
//!
//! What is not in the key and does not change the artifact's behaviour: absolute paths (the sources are
//! hashed by their path under kernels/ and their bytes), nvcc's thread count. The one trace of a path is
//! `-lineinfo`'s source file names in a fatbin, which name the checkout that built the entry.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Bumped when the layout of an entry or the meaning of a key changes, or when the build script changes how
/// it builds an artifact in a way its key does not hash (the key covers sources, compiler and flags).
const FORMAT: &str = "fa-kernel-cache v1";
/// Entries kept per name (a kernel file, the host library): the current sources and a few recent edits.
const KEEP_PER_NAME: usize = 6;

pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    /// The cache for the build whose OUT_DIR is `out` (`<target>/<profile>/build/<pkg>-<hash>/out`).
    pub fn new(out: &Path) -> KernelCache {
        let dir = match std::env::var_os("FA_KERNEL_CACHE") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => out.ancestors().nth(4).unwrap_or(out).join("fa-kernel-cache"),
        };
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create the kernel cache {}: {e}", dir.display()));
        KernelCache { dir }
    }

    pub fn entry(&self, name: &str, key: &Key) -> Entry {
        Entry { dir: self.dir.join(format!("{name}-{}", key.0)), name: name.to_string() }
    }

    /// Removes all but the `KEEP_PER_NAME` most recently used entries of `name`, and stale temporaries.
    pub fn prune(&self, name: &str) {
        let Ok(read) = fs::read_dir(&self.dir) else { return };
        let prefix = format!("{name}-");
        let mut entries: Vec<(SystemTime, PathBuf)> = Vec::new();
        for e in read.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = file.strip_prefix(&prefix) else { continue };
            if rest.len() != 32 && !rest.contains(".tmp") {
                continue; // another name that starts with this one ("decode-" vs "decode_fp8-")
            }
            let used = fs::metadata(e.path().join(STAMP)).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
            entries.push((used, e.path()));
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.0));
        let hour = std::time::Duration::from_secs(3600);
        let mut kept = 0;
        for (used, path) in entries {
            let temporary = path.to_string_lossy().contains(".tmp");
            let old = used.elapsed().is_ok_and(|age| age > hour);
            if temporary {
                if old {
                    let _ = fs::remove_dir_all(&path);
                }
            } else if kept < KEEP_PER_NAME {
                kept += 1;
            } else {
                let _ = fs::remove_dir_all(&path);
            }
        }
    }
}

/// Marks a complete entry; its modification time is the entry's last use.
const STAMP: &str = "complete";

pub struct Entry {
    dir: PathBuf,
    name: String,
}

impl Entry {
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Copies the entry's `files` to `dest` (file name → destination path), and marks the entry used.
    /// False when the entry is missing or incomplete (then nothing is promised about `dest`).
    pub fn fetch(&self, files: &[(&str, &Path)]) -> bool {
        if !self.dir.join(STAMP).is_file() {
            return false;
        }
        for (file, dest) in files {
            if fs::copy(self.dir.join(file), dest).is_err() {
                return false; // pruned under us by a concurrent build: compile instead
            }
        }
        let _ = fs::write(self.dir.join(STAMP), self.name.as_bytes());
        true
    }

    /// Reads a text the entry holds ("" when absent).
    pub fn read(&self, file: &str) -> String {
        fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// Stores `files` (name in the entry, source path) and `texts` (name, contents) as this entry. A
    /// failure to write the cache is not a build failure: the next build compiles again.
    pub fn store(&self, files: &[(&str, &Path)], texts: &[(&str, &str)]) {
        let tmp = self.dir.with_file_name(format!(
            "{}.tmp{}",
            self.dir.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        let write = || -> std::io::Result<()> {
            let _ = fs::remove_dir_all(&tmp);
            fs::create_dir_all(&tmp)?;
            for (file, src) in files {
                fs::copy(src, tmp.join(file))?;
            }
            for (file, text) in texts {
                fs::write(tmp.join(file), text)?;
            }
            fs::write(tmp.join(STAMP), self.name.as_bytes())?;
            match fs::rename(&tmp, &self.dir) {
                Ok(()) => Ok(()),
                Err(_) if self.dir.join(STAMP).is_file() => Ok(()), // a concurrent build stored it first
                Err(e) => Err(e),
            }
        };
        if let Err(e) = write() {
            println!("cargo:warning=fused-attn: cannot write the kernel cache entry {}: {e}", self.dir.display());
        }
        let _ = fs::remove_dir_all(&tmp);
    }
}

/// A 128-bit content key (two 64-bit SipHash streams with different domain prefixes; std's DefaultHasher
/// is fixed-keyed, so keys are stable from one build to the next; a toolchain that changed it would only
/// miss the cache once).
pub struct Key(String);

pub struct KeyBuilder {
    a: DefaultHasher,
    b: DefaultHasher,
}

impl KeyBuilder {
    pub fn new(what: &str) -> KeyBuilder {
        let mut k = KeyBuilder { a: DefaultHasher::new(), b: DefaultHasher::new() };
        k.b.write(b"second stream");
        k.text(FORMAT);
        k.text(what);
        k
    }

    /// Adds a length-delimited text (so that ("ab", "c") and ("a", "bc") differ).
    pub fn text(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        for h in [&mut self.a, &mut self.b] {
            h.write_u64(b.len() as u64);
            h.write(b);
        }
        self
    }

    /// Adds a source file: its path relative to `root` and its bytes.
    pub fn file(&mut self, root: &Path, path: &Path) -> &mut Self {
        let rel = path.strip_prefix(root).unwrap_or(path);
        self.text(&rel.to_string_lossy());
        let bytes = fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        self.bytes(&bytes)
    }

    pub fn finish(&self) -> Key {
        Key(format!("{:016x}{:016x}", self.a.finish(), self.b.finish()))
    }
}

/// `src` and every file it includes with `#include "…"`, transitively (resolved next to the including file,
/// then in `include`), sorted. A superset of what the preprocessor reads (includes under `#if` count too),
/// which is what a cache key needs; `<…>` includes are the toolchain's, keyed by its version.
pub fn include_closure(src: &Path, include: &Path) -> Vec<PathBuf> {
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(file) = stack.pop() {
        if seen.contains(&file) {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        for line in text.lines() {
            let line = line.trim_start();
            let Some(rest) = line.strip_prefix('#') else { continue };
            let Some(rest) = rest.trim_start().strip_prefix("include") else { continue };
            let Some(name) = rest.trim().strip_prefix('"').and_then(|r| r.split('"').next()) else { continue };
            let here = file.parent().unwrap().join(name);
            let found = if here.is_file() { here } else { include.join(name) };
            if found.is_file() {
                stack.push(found);
            }
        }
        seen.push(file);
    }
    seen.sort();
    seen
}
