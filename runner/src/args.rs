//! The runner's command line (clap derive): `report`, `run` and `plot`, their flags and defaults, and the
//! checks clap cannot express (a flag given for an op it does not apply to). Every invalid input becomes a
//! one-line `Usage` error; `--help` and `--version` print to stdout and exit 0.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use fused_attn::prefill::{PrefillKernel, Sm90Steps};
use fused_attn::testkit::cases::decode::CaseRope;
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::variants::{CaseAlibi, CaseVariants};
use fused_attn::{
    DType, Error, Fp8Format, KvDType, Result, RopeConfig, RopeScaling, RopeStyle, ScaleKind, SplitPolicy,
};

/// The runner's git commit (`git describe` at build time; "unknown" outside a git checkout).
pub const COMMIT: &str =
    git_version::git_version!(args = ["--always", "--dirty=-modified", "--abbrev=10"], fallback = "unknown");

/// Fused attention kernels: check them against an fp64 reference on a GPU or the host SIMT emulator, time
/// them against ceilings measured in the same run, and plot the results.
#[derive(Parser, Debug)]
#[command(
    name = "fused-attn",
    version,
    arg_required_else_help = true,
    after_help = "Exit status: 0 when every row passed, 1 when a row failed or a run error occurred, 2 for invalid \
                  command-line input. `fused-attn <COMMAND> --help` lists a command's flags."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of the largest variant (RunArgs) does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// The standard sweep: correctness of both ops against the fp64 reference; on a GPU also the timed
    /// shapes against the copy bandwidth measured in the same run.
    #[command(after_help = PASS_STAR_HELP, allow_negative_numbers = true)]
    Report(ReportArgs),
    /// One configuration: build it from --seed, run it, check it against the fp64 reference (and time it
    /// on a GPU).
    #[command(after_help = PASS_STAR_HELP, allow_negative_numbers = true)]
    Run(RunArgs),
    /// Draw the plots of a recorded `report --json` (e.g. a GPU run's report.jsonl) into a directory.
    Plot(PlotArgs),
}

const PASS_STAR_HELP: &str = "In the table, `pass*` is a pass checked on sampled query rows (256 for `run`, 32 for \
timed rows) rather than on every row: shapes above 2^31 multiply-adds are too large for a full fp64 check; JSON \
rows say \"check\":\"sampled\". `-` is a timing-only row.";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Op {
    Prefill,
    Decode,
    /// New query tokens per sequence over a paged cache (chunked prefill, prefix caching, verification).
    PagedPrefill,
    /// Paged append alone: new tokens' K/V written into the cache (K rotated with --rope-theta), checked bit
    /// for bit.
    Append,
    /// Multi-head latent attention decode (DeepSeek-V2/V3, Kimi K2; docs/mla.md): --heads query heads over a
    /// latent cache of --kv-lora-rank + --rope-dim columns, --q-len tokens per sequence.
    MlaDecode,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Prefill => "prefill",
            Op::Decode => "decode",
            Op::PagedPrefill => "paged-prefill",
            Op::Append => "append",
            Op::MlaDecode => "mla-decode",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// The first GPU (an error if none is usable).
    Gpu,
    /// The host SIMT emulator: correctness only, no timing.
    Emu,
    /// The GPU when one is usable, else the emulator (the choice is printed on stderr).
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    #[value(alias = "f16", alias = "float16")]
    Fp16,
    #[value(alias = "bfloat16")]
    Bf16,
}

/// Element type of the paged KV cache.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDTypeArg {
    #[value(alias = "f16", alias = "float16")]
    Fp16,
    #[value(alias = "bfloat16")]
    Bf16,
    #[value(name = "fp8_e4m3", alias = "e4m3")]
    Fp8E4m3,
    #[value(name = "fp8_e5m2", alias = "e5m2")]
    Fp8E5m2,
}

/// Paged prefill's kernel (fused_attn::PagedPrefillKernel).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagedKernelArg {
    /// Streaming (the decode kernel) for short queries, else tiled.
    Auto,
    /// The prefill tile, any query length.
    Tiled,
    /// The decode kernel over 16 packed rows per CTA.
    Streaming,
}

impl From<PagedKernelArg> for fused_attn::paged_prefill::PagedPrefillKernel {
    fn from(k: PagedKernelArg) -> Self {
        match k {
            PagedKernelArg::Auto => Self::Auto,
            PagedKernelArg::Tiled => Self::Tiled,
            PagedKernelArg::Streaming => Self::Streaming,
        }
    }
}

/// Dequantisation scales of an FP8 cache.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvScaleArg {
    PerTensor,
    PerHead,
}

impl From<DTypeArg> for DType {
    fn from(d: DTypeArg) -> Self {
        match d {
            DTypeArg::Fp16 => DType::F16,
            DTypeArg::Bf16 => DType::Bf16,
        }
    }
}

/// Flags of both `report` and `run`.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Where to run.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// One JSON object per row on stdout (notes go to stderr) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seed of the random inputs; `report` derives one seed per case from it.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub seed: u64,
    /// Prefill kernel: auto (sm90 on a compute capability 9.0 GPU when it supports the case, else sm80;
    /// always sm80 on the emulator), sm80, or sm90 (also on the emulator; an error where it cannot run).
    #[arg(long, value_parser = parse_kernel, default_value = "auto", value_name = "KERNEL")]
    pub kernel: PrefillKernel,
}

fn parse_sm90_off(s: &str) -> std::result::Result<Sm90Steps, String> {
    let mut steps = Sm90Steps::default();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "persistent" => steps.persistent = false,
            "wide-tile" => steps.wide_tile = false,
            "tma-store" => steps.tma_store = false,
            "l2-hints" => steps.l2_hints = false,
            _ => return Err(format!("unknown sm90 step {name:?} (persistent, wide-tile, tma-store, l2-hints)")),
        }
    }
    Ok(steps)
}

/// `balanced` or `fixed:N` (N tokens per chunk, a multiple of 64).
fn parse_split_policy(s: &str) -> std::result::Result<SplitPolicy, String> {
    match s.split_once(':') {
        None if s == "balanced" => Ok(SplitPolicy::Balanced),
        Some(("fixed", n)) => {
            n.parse().map(SplitPolicy::FixedSplitTokens).map_err(|_| format!("fixed:{n}: N must be a token count"))
        }
        _ => Err(format!("unknown split policy {s:?} (balanced, fixed:N)")),
    }
}

fn parse_kernel(s: &str) -> std::result::Result<PrefillKernel, String> {
    s.parse().map_err(|e: fused_attn::Error| e.message().to_string())
}

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    #[command(flatten)]
    pub common: Common,
    /// A few-second smoke subset instead of the full sweep.
    #[arg(long)]
    pub quick: bool,
    /// Write DIR/prefill.png and DIR/decode.png from the timed rows (needs a GPU run: the emulator is not
    /// timed).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// The bf16 matmul rate to draw as the prefill plot's compute ceiling (tools/torch_compare.py measures
    /// it; the report does not).
    #[arg(long, env = "FA_MATMUL_TFLOPS", value_name = "TFLOPS")]
    pub matmul_tflops: Option<f64>,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Which kernel.
    #[arg(long, value_enum, default_value_t = Op::Prefill)]
    pub op: Op,
    /// Element type [prefill, decode].
    #[arg(long, value_enum, default_value_t = DTypeArg::Bf16)]
    pub dtype: DTypeArg,
    /// Head dimension D [prefill, decode].
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub head_dim: usize,
    /// V's and O's head dim Dv, when it differs from Q·K's --head-dim (DeepSeek-V2/V3: --head-dim 192
    /// --head-dim-v 128; the paged ops' V pages are that wide; --dump writes v, v_cache and out that wide)
    /// [prefill, decode, paged-prefill, append] [default: --head-dim].
    #[arg(long, value_name = "N")]
    pub head_dim_v: Option<usize>,
    /// Batch size B [prefill, decode].
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub batch: usize,
    /// Query heads Hq [prefill, decode].
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub heads: usize,
    /// KV heads Hkv, dividing Hq [prefill, decode] [default: --heads].
    #[arg(long, value_name = "N")]
    pub kv_heads: Option<usize>,
    /// Query length Tq [prefill]; new tokens per sequence [paged-prefill, append; decode is one token per sequence].
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub seqlen_q: usize,
    /// Key length Tk [prefill]; the context length of every sequence, the new tokens included [decode,
    /// paged-prefill] [default: --seqlen-q].
    #[arg(long, value_name = "N")]
    pub seqlen_k: Option<usize>,
    /// Bottom-right aligned causal mask [prefill; paged-prefill, where it is the default].
    #[arg(long)]
    pub causal: bool,
    /// sm90 prefill only: tuning steps to turn off, comma-separated — persistent, wide-tile, tma-store, l2-hints
    /// (docs/hopper.md; `report` on an H100/H200 times each one off by itself).
    #[arg(long, value_parser = parse_sm90_off, default_value = "", value_name = "STEPS")]
    pub sm90_off: Sm90Steps,
    /// Uneven batch: each sequence's context length, comma-separated (e.g. 131072,1024,1024); the batch is
    /// their count [decode, paged-prefill, append; replaces --batch and --seqlen-k].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...", conflicts_with_all = ["batch", "seqlen_k"])]
    pub seq_lens: Option<Vec<usize>>,
    /// New query tokens per sequence, one per --seq-lens entry [paged-prefill, append; default: --seqlen-q each].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...", requires = "seq_lens")]
    pub q_lens: Option<Vec<usize>>,
    /// Bidirectional attention over the whole context [paged-prefill only; it is causal by default].
    #[arg(long, conflicts_with = "causal")]
    pub no_causal: bool,
    /// Page size of the KV cache, any in 1..=MAX_PAGE_SIZE (2^31 - 4097) [decode, paged-prefill, append].
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub page_size: usize,
    /// Element type of the KV cache [decode, paged-prefill, append] [default: --dtype]. FP8 caches hold the 16-bit cache
    /// quantised with calibrated scales (amax / the format's max); q and the output stay --dtype.
    #[arg(long, value_enum, value_name = "TYPE")]
    pub kv_dtype: Option<KvDTypeArg>,
    /// FP8 dequantisation scales: one per tensor or one per KV head (K and V separately) [decode, append,
    /// paged-prefill; FP8 --kv-dtype only].
    #[arg(long, value_enum, default_value_t = KvScaleArg::PerTensor, value_name = "KIND")]
    pub kv_scale: KvScaleArg,
    /// Force the split-KV count [decode, paged-prefill] [default: the planner's choice].
    #[arg(long, value_name = "N")]
    pub num_splits: Option<usize>,
    /// Schedule the streaming kernel's split-KV by each sequence's work (docs/scheduling.md): `balanced`, or
    /// `fixed:N` (every sequence cut into N-token chunks, N a multiple of 64: a sequence's bits independent of
    /// its batch) [decode, paged-prefill; default: the uniform plan].
    #[arg(long, value_parser = parse_split_policy, value_name = "POLICY", conflicts_with = "num_splits")]
    pub split_policy: Option<SplitPolicy>,
    /// CTA slots the schedule packs onto [decode, paged-prefill, with --split-policy] [default: the device's; the
    /// emulator models an H100's 132 SMs x 3].
    #[arg(long, value_name = "N", requires = "split_policy")]
    pub sched_slots: Option<usize>,
    /// Paged prefill's kernel: streaming (decode's pipeline, for short queries) or tiled [paged-prefill].
    #[arg(long, value_enum, default_value_t = PagedKernelArg::Auto, value_name = "KERNEL")]
    pub paged_kernel: PagedKernelArg,
    /// Sliding window: keys up to N positions left of a query's own are visible; -1 = unbounded
    /// [prefill, decode].
    #[arg(long, default_value_t = -1, value_name = "N")]
    pub window_left: i32,
    /// Sliding window: keys up to N positions right of a query's own are visible; -1 = unbounded (with
    /// --causal the right bound is 0) [prefill, decode; no key lies right of a decode token].
    #[arg(long, default_value_t = -1, value_name = "N")]
    pub window_right: i32,
    /// Logit softcap c: scores become c·tanh(s/c); 0 = off [prefill, decode].
    #[arg(long, default_value_t = 0.0, value_name = "X")]
    pub softcap: f32,
    /// ALiBi with the standard geometric slopes 2^(-8(h+1)/Hq) [prefill, decode].
    #[arg(long)]
    pub alibi: bool,
    /// Attention sinks: a logit per query head, N(0, 1) from --seed [prefill, decode].
    #[arg(long)]
    pub sinks: bool,
    /// RoPE, fused: the base θ (e.g. 10000, 500000); unset = taken as already rotated. prefill: q and k; decode,
    /// paged-prefill: q (the cache is taken as rotated).
    #[arg(long, value_name = "THETA")]
    pub rope_theta: Option<f64>,
    /// RoPE pair layout: neox (rotate-half) or gptj (interleaved) [with --rope-theta].
    #[arg(long, value_enum, default_value_t = RopeStyleArg::Neox, value_name = "STYLE")]
    pub rope_style: RopeStyleArg,
    /// Rotated dims, even, <= --head-dim (partial rotary) [with --rope-theta] [default: --head-dim].
    #[arg(long, value_name = "N")]
    pub rotary_dim: Option<usize>,
    /// Frequency scheme [with --rope-theta]: none, linear:F, ntk:F, llama3 (3.1's 8/1/4/8192) or
    /// llama3:F:LOW:HIGH:ORIG, yarn:F:ORIG (β 32/1).
    #[arg(long, default_value = "none", value_name = "SCHEME")]
    pub rope_scaling: String,
    /// RoPE positions: `last` (decode: each sequence's seq_len - 1; paged-prefill: each token's place in the
    /// cache; prefill: query row i at i + Tk - Tq, key j at j) or `explicit` (drawn from --seed) [with
    /// --rope-theta].
    #[arg(long, value_enum, default_value_t = RopePositionsArg::Last, value_name = "KIND")]
    pub rope_positions: RopePositionsArg,
    /// MLA: latent columns of a cache row (DeepSeek: 512) [mla-decode].
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub kv_lora_rank: usize,
    /// MLA: rope-key columns of a cache row (DeepSeek: 64) [mla-decode].
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub rope_dim: usize,
    /// MLA: query tokens per sequence (1: decode; 2-4: MTP / speculative verification) [mla-decode].
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub q_len: usize,
    #[command(flatten)]
    pub common: Common,
    /// Write every input and output as .npy into DIR (docs/runner.md lists names, dtypes and shapes).
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// On a GPU: check without timing (one launch, e.g. under compute-sanitizer).
    #[arg(long)]
    pub no_timing: bool,
    /// Print the emulator's cost counters of the run (bytes per buffer, mma, exp2, barriers, shared bytes)
    /// and their ratio to the kernel's cost model [emu backend; --json rows always carry them].
    #[arg(long)]
    pub counters: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RopeStyleArg {
    Neox,
    Gptj,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RopePositionsArg {
    Last,
    Explicit,
}

/// `--rope-scaling`'s value: none, linear:F, ntk:F, llama3[:F:LOW:HIGH:ORIG], yarn:F:ORIG.
pub fn parse_rope_scaling(s: &str) -> Result<RopeScaling> {
    let parts: Vec<&str> = s.split(':').collect();
    let num = |i: usize| -> Result<f64> {
        parts
            .get(i)
            .and_then(|x| x.parse::<f64>().ok())
            .ok_or_else(|| Error::usage(format!("--rope-scaling {s}: field {i} is not a number")))
    };
    let int = |i: usize| -> Result<usize> {
        parts
            .get(i)
            .and_then(|x| x.parse::<usize>().ok())
            .ok_or_else(|| Error::usage(format!("--rope-scaling {s}: field {i} is not a count")))
    };
    let want = |n: usize| -> Result<()> {
        if parts.len() == n {
            Ok(())
        } else {
            Err(Error::usage(format!("--rope-scaling {s}: {} takes {} values", parts[0], n - 1)))
        }
    };
    Ok(match parts[0] {
        "none" => {
            want(1)?;
            RopeScaling::None
        }
        "linear" => {
            want(2)?;
            RopeScaling::Linear { factor: num(1)? }
        }
        "ntk" => {
            want(2)?;
            RopeScaling::Ntk { factor: num(1)? }
        }
        "llama3" if parts.len() == 1 => RopeScaling::llama31(),
        "llama3" => {
            want(5)?;
            RopeScaling::Llama3 {
                factor: num(1)?,
                low_freq_factor: num(2)?,
                high_freq_factor: num(3)?,
                original_max_pos: int(4)?,
            }
        }
        "yarn" => {
            want(3)?;
            RopeScaling::yarn(num(1)?, int(2)?)
        }
        other => {
            return Err(Error::usage(format!(
                "--rope-scaling {other}: one of none, linear:F, ntk:F, llama3[:F:LOW:HIGH:ORIG], yarn:F:ORIG"
            )))
        }
    })
}

#[derive(Args, Debug, Clone)]
pub struct PlotArgs {
    /// A recorded `fused-attn report --json` (one JSON row per line; other lines are ignored).
    #[arg(value_name = "REPORT.jsonl")]
    pub report: PathBuf,
    /// Directory to write prefill.png and decode.png into.
    #[arg(long, short, default_value = ".", value_name = "DIR")]
    pub out: PathBuf,
    /// The bf16 matmul rate to draw as the prefill plot's compute ceiling.
    #[arg(long, env = "FA_MATMUL_TFLOPS", value_name = "TFLOPS")]
    pub matmul_tflops: Option<f64>,
}

impl RunArgs {
    pub fn kv_heads(&self) -> usize {
        self.kv_heads.unwrap_or(self.heads)
    }
    /// Decode: the context length of every sequence; prefill: Tk.
    pub fn seqlen_k(&self) -> usize {
        self.seqlen_k.unwrap_or(self.seqlen_q)
    }
    /// Decode: every sequence's context length (--seq-lens, or --batch copies of --seqlen-k).
    pub fn context_lens(&self) -> Vec<usize> {
        self.seq_lens.clone().unwrap_or_else(|| vec![self.seqlen_k(); self.batch])
    }
    /// Paged prefill: (q_len, seq_len) per sequence.
    pub fn paged_seqs(&self) -> Result<Vec<(usize, usize)>> {
        let lens = self.context_lens();
        let q = self.q_lens.clone().unwrap_or_else(|| vec![self.seqlen_q; lens.len()]);
        if q.len() != lens.len() {
            return Err(Error::usage(format!("--q-lens has {} entries, --seq-lens {}", q.len(), lens.len())));
        }
        Ok(q.into_iter().zip(lens).collect())
    }
    /// The score variants the flags ask for.
    pub fn variants(&self) -> CaseVariants {
        let window = (self.window_left, self.window_right);
        CaseVariants {
            window: (window != (-1, -1)).then_some(window),
            softcap: (self.softcap != 0.0).then_some(self.softcap),
            alibi: if self.alibi { CaseAlibi::PerHead } else { CaseAlibi::None },
            sinks: self.sinks,
        }
    }
    /// The RoPE the flags ask for (`None` without --rope-theta); bad values are usage errors.
    pub fn rope(&self) -> Result<Option<CaseRope>> {
        let Some(theta) = self.rope_theta else { return Ok(None) };
        let config = RopeConfig {
            theta,
            rotary_dim: self.rotary_dim.unwrap_or(self.head_dim),
            style: match self.rope_style {
                RopeStyleArg::Neox => RopeStyle::Neox,
                RopeStyleArg::Gptj => RopeStyle::Gptj,
            },
            scaling: parse_rope_scaling(&self.rope_scaling)?,
        };
        config.check().map_err(|e| Error::usage(format!("--rope-*: {}", e.message())))?;
        if config.rotary_dim > self.head_dim {
            return Err(Error::usage(format!(
                "--rotary-dim {} exceeds --head-dim {}",
                config.rotary_dim, self.head_dim
            )));
        }
        Ok(Some(CaseRope { config, explicit_positions: self.rope_positions == RopePositionsArg::Explicit }))
    }
    /// The cache's element type: --kv-dtype, or --dtype.
    pub fn kv_dtype(&self) -> KvDType {
        match self.kv_dtype {
            None => KvDType::Sixteen(self.dtype.into()),
            Some(KvDTypeArg::Fp16) => KvDType::Sixteen(DType::F16),
            Some(KvDTypeArg::Bf16) => KvDType::Sixteen(DType::Bf16),
            Some(KvDTypeArg::Fp8E4m3) => KvDType::Fp8(Fp8Format::E4m3),
            Some(KvDTypeArg::Fp8E5m2) => KvDType::Fp8(Fp8Format::E5m2),
        }
    }
    pub fn kv_scale(&self) -> ScaleKind {
        match self.kv_scale {
            KvScaleArg::PerTensor => ScaleKind::PerTensor,
            KvScaleArg::PerHead => ScaleKind::PerHead,
        }
    }
    /// A case's cache format: 16-bit (the queries' dtype, checked by `check_kv`), or FP8 with --kv-scale.
    pub fn kv_format(&self) -> KvFormat {
        match self.kv_dtype().fp8() {
            Some(format) => KvFormat::Fp8 { format, scales: self.kv_scale() },
            None => KvFormat::Sixteen,
        }
    }
    /// A 16-bit cache is the queries' dtype; scales apply to FP8 caches only.
    fn check_kv(&self, m: &ArgMatches) -> Result<()> {
        match self.kv_dtype() {
            KvDType::Sixteen(d) if d != DType::from(self.dtype) => Err(Error::usage(format!(
                "--kv-dtype {}: a 16-bit cache has the queries' dtype (--dtype {}); FP8 caches are fp8_e4m3 / fp8_e5m2",
                d.name(),
                DType::from(self.dtype).name()
            ))),
            KvDType::Sixteen(_) if m.value_source("kv_scale") == Some(ValueSource::CommandLine) => {
                Err(Error::usage("--kv-scale applies to FP8 caches (--kv-dtype fp8_e4m3 / fp8_e5m2) only"))
            }
            _ => Ok(()),
        }
    }
    /// The RoPE flags other than --rope-theta need it; and their values must make a table.
    fn check_rope(&self, m: &ArgMatches) -> Result<()> {
        if self.rope_theta.is_none() {
            for (id, flag) in [
                ("rope_style", "--rope-style"),
                ("rotary_dim", "--rotary-dim"),
                ("rope_scaling", "--rope-scaling"),
                ("rope_positions", "--rope-positions"),
            ] {
                if m.value_source(id) == Some(ValueSource::CommandLine) {
                    return Err(Error::usage(format!("{flag} needs --rope-theta (RoPE is off without it)")));
                }
            }
        }
        self.rope().map(|_| ())
    }
    /// The checks clap cannot express on the variant flags.
    fn check_variants(&self) -> Result<()> {
        for (flag, v) in [("--window-left", self.window_left), ("--window-right", self.window_right)] {
            if v < -1 {
                return Err(Error::usage(format!("{flag} {v}: a window bound is >= 0, or -1 for unbounded")));
            }
        }
        if !(self.softcap.is_finite() && self.softcap >= 0.0) {
            return Err(Error::usage(format!("--softcap {}: must be finite and positive (0 = off)", self.softcap)));
        }
        Ok(())
    }
}

/// The ops that compute attention scores (all but append).
const ATTENTION: [Op; 3] = [Op::Prefill, Op::Decode, Op::PagedPrefill];

/// Flags that apply to some ops only, by clap id: (id, flag, the ops it applies to, why).
const OP_ONLY: [(&str, &str, &[Op], &str); 23] = [
    (
        "head_dim_v",
        "--head-dim-v",
        &[Op::Prefill, Op::Decode, Op::PagedPrefill, Op::Append],
        "MLA's latent row sets its dims: --kv-lora-rank and --rope-dim",
    ),
    (
        "seq_lens",
        "--seq-lens",
        &[Op::Decode, Op::PagedPrefill, Op::Append, Op::MlaDecode],
        "prefill's batches are uniform",
    ),
    ("q_lens", "--q-lens", &[Op::PagedPrefill, Op::Append], "decode is one query token per sequence"),
    (
        "seqlen_q",
        "--seqlen-q",
        &[Op::Prefill, Op::PagedPrefill, Op::Append],
        "decode is one query token per sequence; --seqlen-k sets the context",
    ),
    ("causal", "--causal", &[Op::Prefill, Op::PagedPrefill], "a decode token attends to its whole cache"),
    ("no_causal", "--no-causal", &[Op::PagedPrefill], "prefill is bidirectional unless --causal"),
    (
        "page_size",
        "--page-size",
        &[Op::Decode, Op::PagedPrefill, Op::Append, Op::MlaDecode],
        "prefill reads contiguous K/V, not a paged cache",
    ),
    (
        "num_splits",
        "--num-splits",
        &[Op::Decode, Op::PagedPrefill, Op::MlaDecode],
        "prefill does not split the KV range",
    ),
    ("paged_kernel", "--paged-kernel", &[Op::PagedPrefill], "only paged prefill has two kernels"),
    ("split_policy", "--split-policy", &[Op::Decode, Op::PagedPrefill], "prefill does not split the KV range"),
    ("sched_slots", "--sched-slots", &[Op::Decode, Op::PagedPrefill], "it sizes --split-policy's schedule"),
    (
        "kv_dtype",
        "--kv-dtype",
        &[Op::Decode, Op::PagedPrefill, Op::Append, Op::MlaDecode],
        "prefill reads contiguous 16-bit K/V",
    ),
    ("kv_scale", "--kv-scale", &[Op::Decode, Op::PagedPrefill, Op::Append], "prefill reads contiguous 16-bit K/V"),
    ("window_left", "--window-left", &ATTENTION, "append computes no scores"),
    ("window_right", "--window-right", &ATTENTION, "append computes no scores"),
    ("softcap", "--softcap", &ATTENTION, "append computes no scores"),
    ("alibi", "--alibi", &ATTENTION, "append computes no scores"),
    ("sinks", "--sinks", &ATTENTION, "append computes no scores"),
    (
        "heads",
        "--heads",
        &[Op::Prefill, Op::Decode, Op::PagedPrefill, Op::MlaDecode],
        "append writes KV heads only: --kv-heads",
    ),
    ("kv_lora_rank", "--kv-lora-rank", &[Op::MlaDecode], "only MLA has a latent cache"),
    ("rope_dim", "--rope-dim", &[Op::MlaDecode], "only MLA has a latent cache"),
    ("q_len", "--q-len", &[Op::MlaDecode], "--seqlen-q / --q-lens set the other ops' query tokens"),
    ("kernel", "--kernel", &[Op::Prefill, Op::Decode, Op::PagedPrefill], "append has one kernel per cache format"),
];

/// A flag the user gave for an op it does not apply to.
fn inapplicable(m: &ArgMatches, op: Op) -> Option<String> {
    OP_ONLY
        .iter()
        .find(|(id, _, applies, _)| !applies.contains(&op) && m.value_source(id) == Some(ValueSource::CommandLine))
        .map(|(_, flag, applies, why)| {
            let names: Vec<&str> = applies.iter().map(|o| o.name()).collect();
            format!("{flag} applies to --op {} only, not --op {} ({why})", names.join(" or --op "), op.name())
        })
}

/// What parsing decided: run a command, or print help/version text to stdout and exit 0, or (no command
/// given) print the help to stderr and exit 2.
pub enum Parsed {
    /// Boxed: the run flags make it much larger than the text variants.
    Command(Box<Command>),
    Print(String),
    Help(String),
}

/// clap's error text as one line: the message lines before its usage block, and where to look for help.
fn one_line_clap_error(e: &clap::Error, sub: Option<&str>) -> String {
    let text = e.render().to_string();
    let msg: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    let msg = msg.join(" ").replace(" tip: ", "; tip: ");
    let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
    let help = sub.map_or("fused-attn --help".to_string(), |s| format!("fused-attn {s} --help"));
    format!("{msg} (see `{help}`)")
}

pub fn parse<I, T>(argv: I) -> Result<Parsed>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    // For the error hint: the subcommand the user named, if any.
    let sub = argv.get(1).and_then(|a| a.to_str()).filter(|a| ["report", "run", "plot"].contains(a));
    let command = Cli::command().version(format!("{} (commit {COMMIT})", env!("CARGO_PKG_VERSION")));
    let matches = match command.try_get_matches_from(&argv) {
        Ok(m) => m,
        Err(e) => {
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    Ok(Parsed::Print(e.render().to_string()))
                }
                clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    Ok(Parsed::Help(e.render().to_string()))
                }
                _ => Err(Error::usage(one_line_clap_error(&e, sub))),
            };
        }
    };
    let cli = Cli::from_arg_matches(&matches).map_err(|e| Error::usage(one_line_clap_error(&e, sub)))?;
    if let (Command::Run(run), Some(("run", m))) = (&cli.command, matches.subcommand()) {
        if let Some(msg) = inapplicable(m, run.op) {
            return Err(Error::usage(msg));
        }
        run.check_variants()?;
        run.check_kv(m)?;
        run.check_rope(m)?;
    }
    Ok(Parsed::Command(Box::new(cli.command)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Parsed> {
        parse(std::iter::once("fused-attn").chain(s.split_whitespace()))
    }

    fn run(s: &str) -> RunArgs {
        match p(s) {
            Ok(Parsed::Command(c)) => match *c {
                Command::Run(r) => r,
                _ => panic!("{s}: not a run"),
            },
            _ => panic!("{s}: not a run"),
        }
    }

    #[test]
    fn rope_flags() {
        let a = run("run --op decode --head-dim 80 --rope-theta 10000 --rope-style gptj --rotary-dim 20 --rope-scaling yarn:4:2048 --rope-positions explicit");
        let r = a.rope().unwrap().unwrap();
        assert_eq!((r.config.theta, r.config.rotary_dim, r.config.style), (10000.0, 20, RopeStyle::Gptj));
        assert_eq!(r.config.scaling, RopeScaling::yarn(4.0, 2048));
        assert!(r.explicit_positions);
        let r = run("run --op decode --rope-theta 500000 --rope-scaling llama3").rope().unwrap().unwrap();
        assert_eq!((r.config.rotary_dim, r.config.scaling, r.explicit_positions), (128, RopeScaling::llama31(), false));
        assert_eq!(parse_rope_scaling("linear:2").unwrap(), RopeScaling::Linear { factor: 2.0 });
        assert_eq!(parse_rope_scaling("ntk:4").unwrap(), RopeScaling::Ntk { factor: 4.0 });
        assert_eq!(
            parse_rope_scaling("llama3:8:1:4:8192").unwrap(),
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_pos: 8192 }
        );
        assert!(run("run --op decode").rope().unwrap().is_none());
        let r = run("run --op paged-prefill --rope-theta 10000 --rope-positions explicit").rope().unwrap().unwrap();
        assert_eq!((r.config.theta, r.explicit_positions), (10000.0, true));
        let r = run("run --op prefill --rope-theta 10000 --rotary-dim 64").rope().unwrap().unwrap();
        assert_eq!((r.config.rotary_dim, r.explicit_positions), (64, false));
        for bad in [
            "run --op decode --rope-theta 10000 --rotary-dim 7",
            "run --op decode --rope-theta 10000 --rotary-dim 256",
            "run --op decode --rope-theta 10000 --rope-scaling yarn:4",
            "run --op decode --rope-theta 10000 --rope-scaling cubic:2",
            "run --op decode --rope-style gptj",
            "run --op prefill --rope-theta 10000 --rotary-dim 130",
        ] {
            assert!(matches!(p(bad), Err(e) if e.kind() == &fused_attn::ErrorKind::Usage), "{bad}");
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_a_full_run_line_in_both_spellings() {
        for line in [
            "run --op decode --dtype fp16 --head-dim 64 --batch 3 --heads 8 --kv-heads 2 --seqlen-k 100 \
             --page-size 8 --backend emu --json --seed 7",
            "run --op=decode --dtype=f16 --head-dim=64 --batch=3 --heads=8 --kv-heads=2 --seqlen-k=100 \
             --page-size=8 --backend=emu --json --seed=7",
        ] {
            let a = run(line);
            assert_eq!((a.op, DType::from(a.dtype), a.head_dim, a.batch, a.heads), (Op::Decode, DType::F16, 64, 3, 8));
            assert_eq!((a.kv_heads(), a.seqlen_k(), a.page_size, a.common.seed), (2, 100, 8, 7));
            assert!(a.common.json && a.common.backend == BackendChoice::Emu);
        }
        let a = run("run --heads 4 --seqlen-q 33");
        assert_eq!((a.kv_heads(), a.seqlen_k(), a.common.backend, a.head_dim), (4, 33, BackendChoice::Auto, 128));
    }

    #[test]
    fn sm90_steps_flag() {
        assert_eq!(run("run --kernel sm90").sm90_off, Sm90Steps::default());
        let a = run("run --kernel sm90 --sm90-off persistent,tma-store");
        assert_eq!(a.sm90_off, Sm90Steps { persistent: false, tma_store: false, ..Sm90Steps::default() });
        assert!(!run("run --sm90-off l2-hints").sm90_off.l2_hints);
        assert_eq!(run("run --sm90-off=wide-tile").sm90_off.label(), "-no-wide-tile");
        assert!(p("run --sm90-off pingpong").is_err());
    }

    #[test]
    fn variant_flags() {
        let a = run("run --op decode --window-left 255 --window-right=0 --softcap 30 --alibi --sinks");
        let v = a.variants();
        assert_eq!((v.window, v.softcap, v.alibi, v.sinks), (Some((255, 0)), Some(30.0), CaseAlibi::PerHead, true));
        assert!(run("run --causal").variants().is_plain());
        assert_eq!(run("run --window-right 4").variants().window, Some((-1, 4)));
    }

    #[test]
    fn help_and_version_print() {
        for line in ["--help", "-h", "run --help", "report --help", "plot --help", "--version", "-V"] {
            assert!(matches!(p(line), Ok(Parsed::Print(_))), "{line}");
        }
    }

    #[test]
    fn bad_flags_are_one_line_usage_errors() {
        assert!(matches!(p(""), Ok(Parsed::Help(h)) if h.contains("Usage: fused-attn")));
        for line in [
            "frobnicate",
            "run --head-dim",
            "run --head-dim x",
            "run --dtype fp8",
            "run --op sort",
            "run --backend tpu",
            "run --wat",
            "run --plot x",
            "run --quick",
            "report --dump x",
            "report --no-timing",
            "report --op decode",
            "run --op prefill --num-splits 2",
            "run --page-size 8",
            "run --op decode --causal",
            "run --op decode --seqlen-q 4",
            "run --batch -1",
            "run --window-left -2",
            "run --op decode --window-right -5",
            "run --softcap -1",
            "run --softcap nan",
            "run --softcap inf",
            "run --alibi 3",
            "run --op decode --kv-dtype fp8",
            "run --op decode --dtype bf16 --kv-dtype fp16",
            "run --op decode --kv-scale per-head",
            "run --kv-dtype fp8_e4m3",
            "run --op decode --kv-dtype fp8_e5m2 --kv-scale per-row",
            "report --sinks",
            "plot",
        ] {
            let e = p(line).err().unwrap_or_else(|| panic!("{line}: accepted"));
            assert_eq!(e.kind(), &fused_attn::ErrorKind::Usage, "{line}");
            assert_eq!(e.message().lines().count(), 1, "{line}: {}", e.message());
            assert!(!e.message().contains("Some("), "{line}: {}", e.message());
        }
    }

    #[test]
    fn inapplicable_flags_name_the_flag() {
        let msg = |s: &str| p(s).err().map(|e| e.message().to_string()).unwrap_or_default();
        assert!(
            msg("run --op decode --causal").starts_with("--causal applies to --op prefill or --op paged-prefill only")
        );
        assert!(msg("run --op=decode --seqlen-q=4").starts_with("--seqlen-q applies to --op prefill or"));
        assert!(msg("run --page-size 8").starts_with(
            "--page-size applies to --op decode or --op paged-prefill or --op append or --op mla-decode only"
        ));
        assert!(msg("run --op mla-decode --head-dim-v 128").starts_with(
            "--head-dim-v applies to --op prefill or --op decode or --op paged-prefill or --op append only"
        ));
        // The MLA flags.
        assert!(msg("run --op decode --kv-lora-rank 256").starts_with("--kv-lora-rank applies to --op mla-decode only"));
        assert!(msg("run --op paged-prefill --q-len 2").starts_with("--q-len applies to --op mla-decode only"));
        assert!(msg("run --op mla-decode --softcap 30").starts_with("--softcap applies to --op prefill"));
        assert!(msg("run --op mla-decode --kv-dtype fp8_e4m3 --kv-scale per-head").starts_with("--kv-scale applies"));
        let m = run("run --op mla-decode --heads 128 --kv-lora-rank 256 --rope-dim 32 --q-len 3 --kv-dtype fp8_e5m2");
        assert_eq!((m.op, m.heads, m.kv_lora_rank, m.rope_dim, m.q_len), (Op::MlaDecode, 128, 256, 32, 3));
        assert!(msg("run --num-splits 2").starts_with("--num-splits applies to --op decode or"));
        assert!(msg("run --no-causal").starts_with("--no-causal applies to --op paged-prefill only"));
        assert!(msg("run --op prefill --split-policy balanced").starts_with("--split-policy applies to --op decode"));
        let d = run("run --op decode --seq-lens 9000,64 --split-policy balanced --sched-slots 8");
        assert_eq!((d.split_policy, d.sched_slots), (Some(fused_attn::SplitPolicy::Balanced), Some(8)));
        // The split policy: balanced or fixed:N, not with a forced split count; --sched-slots needs it.
        let a = run("run --op paged-prefill --seq-lens 900,64 --q-lens 4,2 --split-policy fixed:256 --sched-slots 8");
        assert_eq!((a.split_policy, a.sched_slots), (Some(fused_attn::SplitPolicy::FixedSplitTokens(256)), Some(8)));
        assert_eq!(
            run("run --op paged-prefill --split-policy balanced").split_policy,
            Some(fused_attn::SplitPolicy::Balanced)
        );
        for bad in [
            "run --op paged-prefill --split-policy even",
            "run --op paged-prefill --split-policy fixed:x",
            "run --op paged-prefill --split-policy balanced --num-splits 2",
            "run --op paged-prefill --sched-slots 8",
        ] {
            assert!(p(bad).is_err(), "{bad}: accepted");
        }
        // Defaults are not "given": decode with no prefill flags is fine, and so is each op's own flag.
        run("run --op decode --page-size 8 --num-splits 2 --seqlen-k 9");
        run("run --causal --seqlen-q 9");
        run("run --op decode --kv-dtype fp8_e4m3 --kv-scale per-head");
        run("run --op decode --dtype fp16 --kv-dtype fp16");
        assert!(
            msg("run --kv-dtype fp8_e5m2").starts_with("--kv-dtype applies to --op decode or --op paged-prefill or")
        );
        run("run --op paged-prefill --kv-dtype fp8_e5m2 --kv-scale per-head");
        run("run --op append --kv-dtype fp8_e5m2 --kv-scale per-head --kv-heads 2 --seqlen-q 5 --page-size 3");
        assert!(msg("run --op append --alibi").starts_with("--alibi applies to --op prefill or --op decode or"));
        let a = run("run --op paged-prefill --seqlen-q 5 --seqlen-k 300 --page-size 64 --num-splits 2 --no-causal");
        assert_eq!(
            (a.op, a.seqlen_q, a.seqlen_k(), a.page_size, a.num_splits),
            (Op::PagedPrefill, 5, 300, 64, Some(2))
        );
        assert!(a.no_causal && !run("run --op paged-prefill --causal").no_causal);
    }
}
