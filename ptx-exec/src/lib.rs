//! A CPU executor for the PTX nvcc emits for fused-attn's kernels (docs/ptx-executor.md).
//!
//! The emulator (kernels/emu/) runs the kernel *sources* as host C++ with every inline-PTX intrinsic
//! replaced by a twin. This crate runs what ships instead: the PTX of the fatbins (`cuobjdump -ptx`), with
//! each instruction's semantics written from the PTX ISA. [`Module::parse`] reads a PTX module and decodes
//! every `.entry` once into a compact form (registers resolved to slots, labels to indices, each branch's
//! reconvergence point computed); [`run`] runs one launch over host buffers registered in a [`Global`].

mod decode;
mod exec;
pub mod num;
mod parse;

pub use decode::Kernel;
pub use exec::{run, Approx, ExecError, Global, Launch, Stats, LOCAL_WINDOW, SHARED_WINDOW};

/// A decoded PTX module: its kernels by name.
pub struct Module {
    kernels: Vec<Kernel>,
}

/// A PTX text this executor cannot read: the line and what it met there.
#[derive(Debug, Clone)]
pub struct PtxError {
    pub line: u32,
    pub what: String,
}

impl std::fmt::Display for PtxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PTX line {}: {}", self.line, self.what)
    }
}

impl std::error::Error for PtxError {}

impl Module {
    /// Parses and decodes every kernel of a PTX module. Fails on the first construct outside the subset
    /// the executor models (an unsupported instruction is an error here, not when it runs).
    pub fn parse(text: &str) -> Result<Module, PtxError> {
        let m = parse::parse(text).map_err(|e| PtxError { line: e.line, what: e.what })?;
        let kernels = m
            .kernels
            .iter()
            .map(|k| {
                decode::decode(&m, k).map_err(|e| PtxError { line: e.line, what: format!("{}: {}", k.name, e.what) })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Module { kernels })
    }

    /// Parses and decodes only the kernels `keep` accepts (a module may hold kernels using instructions
    /// the executor does not model).
    pub fn parse_kernels(text: &str, keep: impl Fn(&str) -> bool) -> Result<Module, PtxError> {
        let m = parse::parse(text).map_err(|e| PtxError { line: e.line, what: e.what })?;
        let kernels = m
            .kernels
            .iter()
            .filter(|k| keep(&k.name))
            .map(|k| {
                decode::decode(&m, k).map_err(|e| PtxError { line: e.line, what: format!("{}: {}", k.name, e.what) })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Module { kernels })
    }

    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|k| k.name == name)
    }

    pub fn kernel_names(&self) -> impl Iterator<Item = &str> {
        self.kernels.iter().map(|k| k.name.as_str())
    }
}
