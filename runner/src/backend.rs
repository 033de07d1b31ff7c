//! The backend a command runs on: the first GPU, or the host emulator (`--backend auto` takes the GPU when
//! `fused_attn::device::cuda_context(0)` succeeds, and says on stderr which one it took and why).

use std::sync::Arc;

use fused_attn::cudarc::driver::CudaStream;
use fused_attn::{device, Emulator, Result};

use crate::args::BackendChoice;

pub enum Backend {
    Gpu { stream: Arc<CudaStream>, name: String },
    Emu(Emulator),
}

impl Backend {
    /// `gpu`: the first GPU or its typed error (NoDriver / NoDevice / Arch); `emu`: the emulator; `auto`:
    /// the GPU if usable, else the emulator, named on stderr.
    pub fn resolve(choice: BackendChoice) -> Result<Self> {
        let gpu = || -> Result<Self> {
            let ctx = device::cuda_context(0)?;
            let name = ctx.name().unwrap_or_else(|_| "GPU 0".to_string());
            Ok(Backend::Gpu { stream: ctx.default_stream(), name })
        };
        match choice {
            BackendChoice::Gpu => gpu(),
            BackendChoice::Emu => Ok(Backend::Emu(Emulator::new())),
            BackendChoice::Auto => match gpu() {
                Ok(b) => {
                    eprintln!("fused-attn: --backend auto: using {}", b.describe());
                    Ok(b)
                }
                Err(e) => {
                    let why = e.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
                    let b = Backend::Emu(Emulator::new());
                    eprintln!("fused-attn: --backend auto: no usable GPU ({why}); using {}", b.describe());
                    Ok(b)
                }
            },
        }
    }

    /// What the rows' `device` field says: the GPU's name, or the emulator.
    pub fn device(&self) -> String {
        match self {
            Backend::Gpu { name, .. } => name.clone(),
            Backend::Emu(_) => "host emulator".to_string(),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Gpu { .. } => "gpu",
            Backend::Emu(_) => "emu",
        }
    }

    /// Human description for the table's preamble.
    pub fn describe(&self) -> String {
        match self {
            Backend::Gpu { name, .. } => format!("gpu ({name})"),
            Backend::Emu(_) => "emu (host SIMT emulator: correctness only, no timing)".to_string(),
        }
    }
}
