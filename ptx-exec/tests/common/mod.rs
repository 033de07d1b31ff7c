//! The harness of the PTX-executor tests: the fatbins' PTX (cuobjdump -ptx of what build.rs embedded), one
//! launcher call run twice — on the emulator, and recorded (`FaExec` in record mode: kernel, grid, block,
//! shared memory, params bytes) then run by the executor — over two identical sets of host buffers, and a
//! bitwise comparison of every buffer the kernels may write.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use fused_attn::{half, sys};
use ptx_exec::{Approx, Global, Launch, Module, Stats};

/// The approximate instructions' model: the emulator's own function (kernels/emu/math.cpp).
pub const APPROX: Approx = Approx { ex2_ftz: ex2_model };

fn ex2_model(x: f32) -> f32 {
    // SAFETY: a pure function of one float.
    unsafe { sys::fa_host_ex2_approx_ftz(x) }
}

/// A 16-byte aligned host buffer (the launchers require aligned pointers) with a name for messages.
#[derive(Clone)]
pub struct Buf {
    pub name: &'static CStr,
    words: Vec<u128>,
    pub len: usize,
    pub writable: bool,
}

impl Buf {
    pub fn new(name: &'static CStr, bytes: &[u8], writable: bool) -> Buf {
        let mut words = vec![0u128; bytes.len().div_ceil(16).max(1)];
        // SAFETY: words holds at least bytes.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), bytes.len()) };
        Buf { name, words, len: bytes.len(), writable }
    }
    pub fn input<T: Copy>(name: &'static CStr, v: &[T]) -> Buf {
        Buf::new(name, as_bytes(v), false)
    }
    /// An output poisoned with 0xff bytes (NaN in every float type).
    pub fn output(name: &'static CStr, bytes: usize) -> Buf {
        Buf::new(name, &vec![0xff; bytes], true)
    }
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: words holds len initialised bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
    pub fn ptr(&self) -> *mut c_void {
        self.words.as_ptr() as *mut c_void
    }
    pub fn u32s(&self) -> Vec<u32> {
        self.bytes().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
    }
}

pub fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain data viewed as bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// A small deterministic generator (xorshift64*), so the cases replay from their seed.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [lo, hi).
    pub fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

fn toolchain_tool(rel: &str, name: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dirs = [std::env::var_os("FA_TOOLCHAIN_DIR").map(PathBuf::from), Some(root.join(".toolchain"))];
    for d in dirs.into_iter().flatten() {
        let p = d.join(rel).join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// cuobjdump (scripts/setup installs it into .toolchain/cuda-tools).
pub fn cuobjdump() -> PathBuf {
    toolchain_tool("cuda-tools/nvidia/cu13/bin", "cuobjdump")
        .expect("cuobjdump not found: scripts/setup installs it into .toolchain/cuda-tools")
}

/// nvcc, looked for where build/nvcc.rs `find_nvcc` looks (NVCC, CUDA_HOME, CUDA_PATH, PATH,
/// /usr/local/cuda, the toolchain scripts/setup installs), for the planted-bug builds; it must be the
/// toolkit the fatbins were built with.
pub fn nvcc() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("NVCC") {
        candidates.push(p.into());
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = std::env::var_os(var) {
            candidates.push(PathBuf::from(p).join("bin/nvcc"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    candidates.push("/usr/local/cuda/bin/nvcc".into());
    let toolchain = std::env::var_os("FA_TOOLCHAIN_DIR").map(PathBuf::from).unwrap_or_else(|| root.join(".toolchain"));
    candidates.push(toolchain.join("cuda/nvidia/cu13/bin/nvcc"));
    let nvcc = candidates.into_iter().find(|p| p.is_file()).expect("nvcc not found: scripts/setup installs it");
    let out = Command::new(&nvcc).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout).into_owned();
    let want = format!("release {},", fused_attn::build_info::CUDA_VERSION);
    assert!(
        version.contains(&want),
        "{} is not the toolkit the fatbins were built with ({want}): {version}",
        nvcc.display()
    );
    nvcc
}

/// The PTX modules of a `cuobjdump -ptx` listing (the text after each "Fatbin ptx code:" header).
pub fn ptx_of_listing(listing: &str) -> Vec<String> {
    listing
        .split("Fatbin ptx code:")
        .skip(1)
        .filter_map(|p| {
            // From the `.version` line on, so that the executor's PTX line numbers are this text's (and
            // `cuobjdump -ptx X.fatbin | sed -n '/^\.version/,$p'`'s).
            let start = p.find("\n.version")? + 1;
            let body = &p[start..];
            Some(body[..body.find("\nFatbin ").unwrap_or(body.len())].to_string())
        })
        .collect()
}

/// The decoded PTX the fatbin `stem` (merge, append, selftest, ...) carries: what ships.
pub fn fatbin_module(stem: &str) -> &'static Module {
    static CACHE: OnceLock<Mutex<HashMap<String, &'static Module>>> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap();
    if let Some(m) = cache.get(stem) {
        return m;
    }
    let fatbin = fused_attn::build_info::fatbins()
        .into_iter()
        .find(|f| f.file_stem().is_some_and(|s| s == stem))
        .unwrap_or_else(|| panic!("no fatbin {stem}.fatbin in this build: {}", fused_attn::build_info::FATBIN_DIR));
    let out = Command::new(cuobjdump()).arg("-ptx").arg(&fatbin).output().unwrap();
    assert!(out.status.success(), "cuobjdump -ptx {}: {}", fatbin.display(), String::from_utf8_lossy(&out.stderr));
    let ptx = ptx_of_listing(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(ptx.len(), 1, "{stem}.fatbin: expected one PTX module");
    let m: &'static Module =
        Box::leak(Box::new(Module::parse(&ptx[0]).unwrap_or_else(|e| panic!("{stem}.fatbin's PTX: {e}"))));
    cache.insert(stem.to_string(), m);
    m
}

/// Per kernel (by name): the instructions of its PTX any run of this test binary reached, and their count.
static COVERAGE: Mutex<Vec<(String, Vec<bool>)>> = Mutex::new(Vec::new());

/// "kernel: reached / instructions (percent)" for every kernel whose name starts with `prefix` that this test
/// binary ran so far. With PTX_EXEC_UNREACHED=<kernel> set, also the source lines (`.loc` file:line) of that
/// kernel's unreached instructions, most first: where the cases leave the PTX untested.
pub fn coverage(prefix: &str) -> Vec<String> {
    let c = COVERAGE.lock().unwrap();
    if let Ok(want) = std::env::var("PTX_EXEC_UNREACHED") {
        if let Some((k, r)) = c.iter().find(|(k, _)| *k == want && k.starts_with(prefix)) {
            let module = ["decode", "decode_fp8", "prefill", "paged_prefill", "paged_prefill_fp8", "mla", "merge"]
                .iter()
                .map(|m| fatbin_module(m))
                .find(|m| m.kernel(k).is_some())
                .unwrap();
            let kernel = module.kernel(k).unwrap();
            let mut lines: HashMap<String, usize> = HashMap::new();
            for (ins, reached) in kernel.insts.iter().zip(r) {
                if !reached {
                    *lines.entry(kernel.source_of(ins.loc).unwrap_or_default()).or_default() += 1;
                }
            }
            let mut v: Vec<_> = lines.into_iter().collect();
            v.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
            eprintln!("{k}: unreached instructions by source file:line: {v:?}");
        }
    }
    let mut out: Vec<String> = c
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, r)| {
            let n = r.iter().filter(|&&x| x).count();
            format!("{k}: {n}/{} ({:.0}%)", r.len(), 100.0 * n as f64 / r.len().max(1) as f64)
        })
        .collect();
    out.sort();
    out
}

thread_local! {
    /// The kernels the last [`run_ptx`] on this thread ran, in launch order.
    pub static LAST_KERNELS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The launcher of an op (abi.h) or a self-test (selftest_abi.h).
pub type Launcher<P> = unsafe extern "C" fn(P, *mut sys::FaExec) -> i32;

/// Runs `launcher(params(pointers of bufs))` on the emulator (seed `seed`); returns the buffers after it.
pub fn run_emulator<P: Copy>(
    bufs: &[Buf],
    params: &impl Fn(&[*mut c_void]) -> P,
    launcher: Launcher<P>,
    seed: u64,
) -> Result<Vec<Buf>, String> {
    let bufs = bufs.to_vec();
    let ptrs: Vec<*mut c_void> = bufs.iter().map(Buf::ptr).collect();
    let regions: Vec<sys::FaEmuRegion> = bufs
        .iter()
        .map(|b| sys::FaEmuRegion {
            base: b.ptr(),
            bytes: b.len as u64,
            writable: b.writable as i32,
            name: b.name.as_ptr(),
        })
        .collect();
    let mut ctx = Box::new(sys::FaEmuLaunch {
        regions: regions.as_ptr(),
        num_regions: regions.len() as i32,
        seed,
        ..Default::default()
    });
    // SAFETY: FaExec is plain data; all-zero is valid.
    let mut exec: Box<sys::FaExec> = Box::new(unsafe { std::mem::zeroed() });
    exec.mode = sys::FA_EXEC_EMULATE as i32;
    exec.emu = &mut *ctx;
    // SAFETY: the params point into `bufs`, all listed as regions.
    let status = unsafe { launcher(params(&ptrs), &mut *exec) };
    if status != 0 {
        // SAFETY: NUL-terminated by the executor.
        let msg = unsafe { CStr::from_ptr(ctx.message.as_ptr()) }.to_string_lossy().into_owned();
        return Err(format!("emulator: status {status}: {msg}"));
    }
    Ok(bufs)
}

/// One recorded launch (FaKernelLaunch): kernel, geometry and the params struct's bytes.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: u32,
    pub smem: u32,
    pub params: Vec<u8>,
}

/// The launches `launcher(params(pointers of bufs))` records (record mode: validation and geometry only).
pub fn record<P: Copy>(
    bufs: &[Buf],
    params: &impl Fn(&[*mut c_void]) -> P,
    launcher: Launcher<P>,
) -> Result<Vec<Recorded>, String> {
    let ptrs: Vec<*mut c_void> = bufs.iter().map(Buf::ptr).collect();
    // SAFETY: FaExec is plain data; all-zero is valid.
    let mut exec: Box<sys::FaExec> = Box::new(unsafe { std::mem::zeroed() });
    exec.mode = sys::FA_EXEC_RECORD as i32;
    // SAFETY: in record mode the launcher validates and records; it touches no buffer.
    let status = unsafe { launcher(params(&ptrs), &mut *exec) };
    if status != 0 {
        return Err(format!("launcher (record): status {status}"));
    }
    Ok(exec.launches[..exec.num_launches as usize]
        .iter()
        .map(|l| Recorded {
            // SAFETY: a static NUL-terminated symbol name.
            kernel: unsafe { CStr::from_ptr(l.kernel) }.to_string_lossy().into_owned(),
            grid: [l.grid[0] as u32, l.grid[1] as u32, l.grid[2] as u32],
            block: l.block as u32,
            smem: l.smem_bytes as u32,
            params: as_bytes(&l.params)[..l.params_bytes as usize].to_vec(),
        })
        .collect())
}

/// Runs recorded launches in order through the executor, the kernels found by name in `modules`, over
/// `bufs` (their host addresses are the ones the params carry); returns the executor's counts.
pub fn execute(modules: &[&Module], bufs: &mut [Buf], launches: &[Recorded]) -> Result<Stats, String> {
    let mut stats = Stats::default();
    LAST_KERNELS.with(|k| k.borrow_mut().clear());
    for l in launches {
        LAST_KERNELS.with(|k| k.borrow_mut().push(l.kernel.clone()));
        let kernel = modules
            .iter()
            .find_map(|m| m.kernel(&l.kernel))
            .ok_or_else(|| format!("kernel {} is not in these PTX modules", l.kernel))?;
        let launch = Launch { grid: l.grid, block: l.block, dynamic_shared: l.smem, params: &l.params };
        let mut global = Global::new();
        for b in bufs.iter_mut() {
            let (name, writable) = (b.name.to_string_lossy().into_owned(), b.writable);
            if writable {
                global.output(&name, b.bytes_mut());
            } else {
                global.input(&name, b.bytes_mut());
            }
        }
        let s = ptx_exec::run(kernel, &launch, &mut global, APPROX).map_err(|e| format!("PTX executor: {e}"))?;
        stats.warp_instructions += s.warp_instructions;
        stats.ctas += s.ctas;
        let mut cov = COVERAGE.lock().unwrap();
        match cov.iter_mut().find(|(k, _)| *k == l.kernel) {
            Some((_, r)) => r.iter_mut().zip(&s.reached).for_each(|(a, b)| *a |= b),
            None => cov.push((l.kernel.clone(), s.reached)),
        }
    }
    Ok(stats)
}

/// Records the launches of `launcher(params(pointers of bufs))` and runs each through the executor on the
/// PTX `modules`; returns the buffers after it and the executor's counts.
pub fn run_ptx<P: Copy>(
    modules: &[&Module],
    bufs: &[Buf],
    params: &impl Fn(&[*mut c_void]) -> P,
    launcher: Launcher<P>,
) -> Result<(Vec<Buf>, Stats), String> {
    let mut bufs = bufs.to_vec();
    let launches = record(&bufs, params, launcher)?;
    let stats = execute(modules, &mut bufs, &launches)?;
    Ok((bufs, stats))
}

/// Byte offsets where two runs' writable buffers differ, as "name+offset: a vs b" (32-bit words), at most
/// `limit`; `nan_equal`: two fp32 NaNs of any payload compare equal (the GPU returns the canonical NaN,
/// the emulator the host's).
pub fn differences(a: &[Buf], b: &[Buf], nan_equal: bool, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    for (x, y) in a.iter().zip(b) {
        if !x.writable {
            continue;
        }
        for (i, (p, q)) in x.bytes().chunks(4).zip(y.bytes().chunks(4)).enumerate() {
            if p == q {
                continue;
            }
            if nan_equal && p.len() == 4 {
                let (f, g) = (f32::from_le_bytes(p.try_into().unwrap()), f32::from_le_bytes(q.try_into().unwrap()));
                if f.is_nan() && g.is_nan() {
                    continue;
                }
            }
            if out.len() < limit {
                out.push(format!("{}+{}: emulator {:02x?} vs PTX {:02x?}", x.name.to_string_lossy(), 4 * i, p, q));
            } else {
                return out;
            }
        }
    }
    out
}

/// Runs one launcher both ways and asserts every writable byte equal; returns the executor's counts.
pub fn assert_same<P: Copy>(
    what: &str,
    modules: &[&Module],
    bufs: &[Buf],
    params: impl Fn(&[*mut c_void]) -> P,
    launcher: Launcher<P>,
) -> (Vec<Buf>, Stats) {
    assert_same_but(what, modules, bufs, params, launcher, &[])
}

/// [`assert_same`], except that the fp32 buffers named in `ulp_bufs` may differ by 4 ulp per element (and
/// 16-bit ones named "name:16" / "name:bf16" by a rounding at the tensor's scale), for
/// arithmetic the two builds do not share (docs/ptx-executor.md): an LSE through CUDA's log2f / logf, which
/// nvcc inlines, against the host's (1 ulp there, carried through the add of the row max and the multiply by
/// ln 2); an fp32 output through an `a * b + c` that nvcc contracts into one fma and the host rounds twice.
pub fn assert_same_but<P: Copy>(
    what: &str,
    modules: &[&Module],
    bufs: &[Buf],
    params: impl Fn(&[*mut c_void]) -> P,
    launcher: Launcher<P>,
    ulp_bufs: &[&str],
) -> (Vec<Buf>, Stats) {
    let emu = run_emulator(bufs, &params, launcher, 0x5eed).unwrap_or_else(|e| panic!("{what}: {e}"));
    let (mut ptx, stats) = run_ptx(modules, bufs, &params, launcher).unwrap_or_else(|e| panic!("{what}: {e}"));
    let written = !differences(bufs, &ptx, false, 1).is_empty();
    for (e, p) in emu.iter().zip(ptx.iter_mut()) {
        // "name": fp32 within 4 ulp; "name:16": fp16/bf16 within 2^-8 of the buffer's largest |value| (one
        // bf16 rounding at the tensor's scale: a row's small outputs come from cancellation).
        let name = e.name.to_string_lossy();
        let Some(spec) = ulp_bufs.iter().find(|s| s.split(':').next() == Some(&*name)) else { continue };
        if let Some((_, kind)) = spec.split_once(':') {
            let bf16 = kind == "bf16";
            let val = |c: &[u8]| {
                let h = u16::from_le_bytes([c[0], c[1]]);
                if bf16 {
                    half::bf16::from_bits(h).to_f32()
                } else {
                    half::f16::from_bits(h).to_f32()
                }
            };
            let scale = e.bytes().chunks(2).map(|c| val(c).abs()).filter(|v| v.is_finite()).fold(0f32, f32::max);
            let mut unequal = 0;
            for (i, (a, b)) in e.bytes().chunks(2).zip(p.bytes().chunks(2)).enumerate() {
                let (a, b) = (val(a), val(b));
                unequal += (a.to_bits() != b.to_bits()) as usize;
                assert!(
                    a.to_bits() == b.to_bits() || (a - b).abs() <= scale / 256.0,
                    "{what}: {name}[{i}]: emulator {a:e} vs PTX {b:e} (scale {scale:e})"
                );
            }
            if unequal > 0 {
                eprintln!("{what}: {unequal} of {} {name} elements not bitwise equal (within the bound)", e.len / 2);
            }
        } else {
            for (i, (a, b)) in e.u32s().into_iter().zip(p.u32s()).enumerate() {
                let (fa, fb) = (f32::from_bits(a), f32::from_bits(b));
                assert!(
                    a == b
                        || (a >> 31 == b >> 31 && fa.is_finite() && fb.is_finite() && (a as i64 - b as i64).abs() <= 4),
                    "{what}: {name}[{i}]: emulator {fa:e} vs PTX {fb:e} (more than 4 ulp)"
                );
            }
        }
        let bytes = e.bytes().to_vec();
        p.bytes_mut().copy_from_slice(&bytes);
    }
    let diff = differences(&emu, &ptx, true, 8);
    assert!(diff.is_empty(), "{what}: nvcc's PTX and the emulator differ:\n{}", diff.join("\n"));
    assert!(written, "{what}: the kernel wrote nothing");
    (ptx, stats)
}

/// nvcc's PTX of `kernels/<file>.cu` for `arch` (compute_80, compute_89) built against a copy of
/// kernels/include whose fa/intrinsics.cuh has `from` replaced by `to` (a bug planted in the device branch
/// of the intrinsics, which only the GPU, and this executor, ever run).
pub fn planted_module(file: &str, arch: &str, from: &str, to: &str) -> Module {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ptx-exec-planted-{}-{n}", std::process::id()));
    let include = dir.join("include");
    copy_dir(&root.join("kernels/include"), &include);
    let path = include.join("fa/intrinsics.cuh");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "the planted bug's text {from:?} is not in fa/intrinsics.cuh any more");
    std::fs::write(&path, text.replace(from, to)).unwrap();
    let nvcc = nvcc();
    let cccl = nvcc.parent().unwrap().parent().unwrap().join("include/cccl");
    let ptx = dir.join("out.ptx");
    // The build's flags (build/nvcc.rs), -ptx instead of -fatbin.
    let out = Command::new(&nvcc)
        .args(["-ptx", &format!("-arch={arch}"), "-O3", "-std=c++17", "-lineinfo", "-Xcudafe", "--diag_suppress=177"])
        .arg("-I")
        .arg(&include)
        .arg("-I")
        .arg(&cccl)
        .arg("-o")
        .arg(&ptx)
        .arg(root.join(format!("kernels/{file}.cu")))
        .output()
        .unwrap();
    assert!(out.status.success(), "nvcc: {}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&ptx).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Module::parse(&text).unwrap_or_else(|e| panic!("planted PTX: {e}"))
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}
