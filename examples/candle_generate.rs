//! End-to-end generation with candle over fused-attn's paged KV cache: a small Llama-style decoder (token
//! embedding → RMSNorm → Q/K/V projections → RoPE → attention → output projection → SwiGLU MLP, GQA, page
//! size 16) generates greedily from two prompts of different lengths, twice:
//!
//! - **fused**: the prompts through `flash_attn_varlen_rope` (causal), their K/V through `paged_append_rope`
//!   into one paged cache per layer (pages handed out in shuffled order, as an engine's allocator would),
//!   then a decode loop: each step appends the new token's K/V and runs `paged_decode` for both sequences at
//!   once, with one decode workspace for all layers and steps. RoPE is fused everywhere: q and k reach
//!   fused-attn unrotated; the prompt's varlen prefill rotates q and k (each token at its place in its
//!   prompt) as it loads them, `paged_append_rope` rotates k into the cache at each token's position, and
//!   `paged_decode_rope` rotates the decode step's q at its position;
//! - **reference**: candle's plain attention, `softmax(QKᵀ/√d + mask)·V` in f32 over a contiguous per-sequence
//!   K/V history (what candle-transformers' Llama does without flash-attn).
//!
//! It prints both token sequences, the per-step max logit difference and the time per decode step, and exits
//! 1 if the tokens differ. Prompts are prefilled whole (dense varlen causal prefill); chunked prefill over
//! the paged cache comes with the paged-prefill op.
//!
//! ```sh
//! cargo run --release --features candle --example candle_generate -- [--steps 32] [--dtype f16|bf16]
//!     [--seed 1] [--weights model.safetensors [--head-dim 64]] [--save model.safetensors] [--device cpu|cuda]
//! ```
//! CPU tensors run fused-attn's kernels on its emulator (slow, exact); `--device cuda` needs the
//! `candle-cuda` feature and a GPU. `--weights` loads Llama-named tensors (`model.embed_tokens.weight`,
//! `model.layers.N.self_attn.q_proj.weight`, ..., `lm_head.weight`, `[out, in]` f32) from a safetensors
//! file; `--save` writes the seeded random model in that form.

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};
use fused_attn::candle as fa;
use fused_attn::DecodeProblem;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

type Result<T> = candle_core::Result<T>;

#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub vocab: usize,
    pub d_model: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub layers: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
}

impl Config {
    /// The small model of the example and the tests: GQA 4:2 with head dim 64 (decode's smallest).
    pub fn small() -> Self {
        Self {
            vocab: 256,
            d_model: 128,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            ffn: 256,
            layers: 2,
            rope_theta: 10_000.0,
            rms_eps: 1e-5,
        }
    }
}

pub const PAGE_SIZE: usize = 16;

/// Llama weight names (Hugging Face layout); linear weights are `[out, in]`.
fn names(layers: usize) -> Vec<String> {
    let mut n = vec!["model.embed_tokens.weight".to_string(), "model.norm.weight".into(), "lm_head.weight".into()];
    for l in 0..layers {
        for w in [
            "input_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "post_attention_layernorm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ] {
            n.push(format!("model.layers.{l}.{w}.weight"));
        }
    }
    n
}

pub struct Model {
    pub cfg: Config,
    weights: HashMap<String, Tensor>,
}

impl Model {
    /// Seeded random weights scaled so every layer matters: unit-variance embeddings, linear weights of
    /// variance 1/fan_in (attention scores and logits of order 1), norm weights 1.
    pub fn random(cfg: Config, seed: u64, device: &Device) -> Result<Self> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut w = HashMap::new();
        let (d, qd, kd) = (cfg.d_model, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
        let mut uniform = |shape: (usize, usize), std: f64| {
            // Uniform on [-√3σ, √3σ): variance σ².
            let a = 3f64.sqrt() * std;
            let v: Vec<f32> = (0..shape.0 * shape.1).map(|_| (rng.random_range(-a..a)) as f32).collect();
            Tensor::from_vec(v, shape, device)
        };
        let ones = |n: usize| Tensor::ones(n, DType::F32, device);
        w.insert("model.embed_tokens.weight".into(), uniform((cfg.vocab, d), 1.0)?);
        w.insert("model.norm.weight".into(), ones(d)?);
        w.insert("lm_head.weight".into(), uniform((cfg.vocab, d), 1.0 / (d as f64).sqrt())?);
        for l in 0..cfg.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}.weight");
            w.insert(p("input_layernorm"), ones(d)?);
            w.insert(p("post_attention_layernorm"), ones(d)?);
            w.insert(p("self_attn.q_proj"), uniform((qd, d), 1.0 / (d as f64).sqrt())?);
            w.insert(p("self_attn.k_proj"), uniform((kd, d), 1.0 / (d as f64).sqrt())?);
            w.insert(p("self_attn.v_proj"), uniform((kd, d), 1.0 / (d as f64).sqrt())?);
            w.insert(p("self_attn.o_proj"), uniform((d, qd), 1.0 / (qd as f64).sqrt())?);
            w.insert(p("mlp.gate_proj"), uniform((cfg.ffn, d), 1.0 / (d as f64).sqrt())?);
            w.insert(p("mlp.up_proj"), uniform((cfg.ffn, d), 1.0 / (d as f64).sqrt())?);
            w.insert(p("mlp.down_proj"), uniform((d, cfg.ffn), 1.0 / (cfg.ffn as f64).sqrt())?);
        }
        Ok(Self { cfg, weights: w })
    }

    /// Weights from a safetensors file of Llama-named tensors; the config follows from their shapes and
    /// `head_dim`.
    pub fn load(path: &str, head_dim: usize, device: &Device) -> Result<Self> {
        let weights: HashMap<String, Tensor> = candle_core::safetensors::load(path, device)?
            .into_iter()
            .map(|(k, t)| Ok((k, t.to_dtype(DType::F32)?)))
            .collect::<Result<_>>()?;
        let get = |n: &str| weights.get(n).ok_or_else(|| candle_core::Error::Msg(format!("{path}: no tensor {n}")));
        let (vocab, d_model) = get("model.embed_tokens.weight")?.dims2()?;
        let layers =
            (0..).take_while(|l| weights.contains_key(&format!("model.layers.{l}.input_layernorm.weight"))).count();
        let rows = |n: &str| get(n).and_then(|t| t.dims2()).map(|(r, _)| r);
        let cfg = Config {
            vocab,
            d_model,
            heads: rows("model.layers.0.self_attn.q_proj.weight")? / head_dim,
            kv_heads: rows("model.layers.0.self_attn.k_proj.weight")? / head_dim,
            head_dim,
            ffn: rows("model.layers.0.mlp.gate_proj.weight")?,
            layers,
            ..Config::small()
        };
        for n in names(layers) {
            get(&n)?;
        }
        Ok(Self { cfg, weights })
    }

    pub fn save(&self, path: &str) -> Result<()> {
        candle_core::safetensors::save(&self.weights, path)
    }

    fn w(&self, name: &str) -> Result<&Tensor> {
        self.weights.get(name).ok_or_else(|| candle_core::Error::Msg(format!("no weight {name}")))
    }

    fn linear(&self, x: &Tensor, name: &str) -> Result<Tensor> {
        x.matmul(&self.w(name)?.t()?)
    }

    fn rms_norm(&self, x: &Tensor, name: &str) -> Result<Tensor> {
        let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + self.cfg.rms_eps)?.sqrt()?;
        x.broadcast_div(&rms)?.broadcast_mul(self.w(name)?)
    }

    /// Rotary embedding (Llama's rotate-half form) of `x [N, H, hd]` at `positions`.
    fn rope(&self, x: &Tensor, positions: &[usize]) -> Result<Tensor> {
        let half = self.cfg.head_dim / 2;
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for i in 0..half {
                let angle = p as f64 / self.cfg.rope_theta.powf(2.0 * i as f64 / self.cfg.head_dim as f64);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let shape = (positions.len(), 1, half);
        let (cos, sin) = (Tensor::from_vec(cos, shape, x.device())?, Tensor::from_vec(sin, shape, x.device())?);
        let (x1, x2) = (x.narrow(D::Minus1, 0, half)?, x.narrow(D::Minus1, half, half)?);
        let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
        let r2 = (x1.broadcast_mul(&sin)? + x2.broadcast_mul(&cos)?)?;
        Tensor::cat(&[r1, r2], D::Minus1)
    }

    /// One forward pass over `batch`, attention through `attn` in `dtype`; returns the logits
    /// `[batch.rows.len(), vocab]`.
    fn forward(&self, batch: &Batch, attn: &mut dyn AttentionPath, dtype: DType) -> Result<Tensor> {
        let c = self.cfg;
        let dev = self.w("model.embed_tokens.weight")?.device().clone();
        let (n, positions) = (batch.tokens.len(), &batch.positions);
        attn.begin(&batch.seqs, positions, batch.prefill)?;
        let ids = Tensor::from_slice(&batch.tokens, n, &dev)?;
        let mut x = self.w("model.embed_tokens.weight")?.index_select(&ids, 0)?;
        for l in 0..c.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}.weight");
            let h = self.rms_norm(&x, &p("input_layernorm"))?;
            let q = self.linear(&h, &p("self_attn.q_proj"))?.reshape((n, c.heads, c.head_dim))?;
            let k = self.linear(&h, &p("self_attn.k_proj"))?.reshape((n, c.kv_heads, c.head_dim))?;
            let v = self.linear(&h, &p("self_attn.v_proj"))?.reshape((n, c.kv_heads, c.head_dim))?;
            // A path that fuses RoPE into this pass gets q and k unrotated.
            let (q, k) = if attn.fuses_rope(batch.prefill) {
                (q, k)
            } else {
                (self.rope(&q, positions)?, self.rope(&k, positions)?)
            };
            // Attention sees f16/bf16 inputs on both paths (the cache's dtype) and gives that dtype back.
            let (q, k, v) = (q.to_dtype(dtype)?, k.to_dtype(dtype)?, v.to_dtype(dtype)?);
            let o = attn.attend(l, &q, &k, &v)?.to_dtype(DType::F32)?.reshape((n, c.heads * c.head_dim))?;
            x = (x + self.linear(&o, &p("self_attn.o_proj"))?)?;
            let h = self.rms_norm(&x, &p("post_attention_layernorm"))?;
            let gate = self.linear(&h, &p("mlp.gate_proj"))?.silu()?;
            let mlp = self.linear(&(gate * self.linear(&h, &p("mlp.up_proj"))?)?, &p("mlp.down_proj"))?;
            x = (x + mlp)?;
        }
        let rows = Tensor::from_slice(&batch.rows, batch.rows.len(), &dev)?;
        let x = self.rms_norm(&x.index_select(&rows, 0)?, "model.norm.weight")?;
        self.linear(&x, "lm_head.weight")
    }
}

/// The new tokens of one forward pass, packed by sequence: `tokens[i]` of sequence `seqs[i]` at
/// `positions[i]`; the logits of the tokens at `rows` are returned.
pub struct Batch {
    pub tokens: Vec<u32>,
    pub seqs: Vec<usize>,
    pub positions: Vec<usize>,
    pub rows: Vec<u32>,
    /// The prompts (several tokens per sequence), else a decode step (one token per sequence).
    pub prefill: bool,
}

/// One way of computing attention inside [`Model::forward`].
pub trait AttentionPath {
    fn name(&self) -> &'static str;
    /// Called once per forward pass, before the layers, with the new tokens' sequences and positions:
    /// `prefill` for the prompts (several tokens per sequence), else a decode step (one per sequence).
    fn begin(&mut self, seqs: &[usize], positions: &[usize], prefill: bool) -> Result<()>;
    /// Causal attention of layer `layer` for the new tokens: `q [N, Hq, hd]`, `k`/`v [N, Hkv, hd]` →
    /// `[N, Hq, hd]`, each new token seeing its own sequence's earlier tokens and itself.
    fn attend(&mut self, layer: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor>;
    /// Whether `attend` rotates q and k itself in a pass of this kind (`prefill` or a decode step).
    fn fuses_rope(&self, _prefill: bool) -> bool {
        false
    }
}

/// fused-attn: varlen prefill, paged append, paged decode, all with fused RoPE.
pub struct FusedPath {
    pub softmax_scale: f32,
    kv_caches: Vec<Tensor>,
    block_table: Tensor,
    pages: Vec<Vec<usize>>,
    max_seq_len: usize,
    workspace: fused_attn::DecodeWorkspace,
    /// The model's RoPE table (positions 0..max_seq_len).
    rope: fa::CandleRope,
    step: Option<FusedStep>,
}

/// What a forward pass's layers share: slots, and the varlen prefill's or decode's index tensors.
struct FusedStep {
    slot_mapping: Tensor,
    kind: FusedStepKind,
}

enum FusedStepKind {
    /// The prompts' positions (int32) rotate k in the append; the prefill rotates q and k at their places
    /// in their prompts (the default positions: Tq = Tk).
    Prefill { cu_seqlens: Tensor, max_len: usize, positions: Tensor },
    /// The new tokens' positions (int32) rotate k in the append; q is rotated at seq_len − 1.
    Decode { seq_lens: Tensor, positions: Tensor },
}

impl FusedPath {
    /// Caches for `batch` sequences of up to `max_seq_len` tokens; pages handed out in a seeded shuffled
    /// order from one pool (plus one spare page nobody owns).
    pub fn new(cfg: &Config, batch: usize, max_seq_len: usize, dtype: DType, seed: u64, dev: &Device) -> Result<Self> {
        let per_seq = max_seq_len.div_ceil(PAGE_SIZE);
        let num_pages = batch * per_seq + 1;
        let mut order: Vec<usize> = (0..num_pages).collect();
        order.shuffle(&mut StdRng::seed_from_u64(seed ^ 0x9a9e));
        let pages: Vec<Vec<usize>> = order.chunks(per_seq).take(batch).map(|c| c.to_vec()).collect();
        let table: Vec<i32> = pages.iter().flatten().map(|&p| p as i32).collect();
        let kv_shape = (2, num_pages, PAGE_SIZE, cfg.kv_heads, cfg.head_dim);
        let kv_caches = (0..cfg.layers).map(|_| Tensor::zeros(kv_shape, dtype, dev)).collect::<Result<_>>()?;
        let limits =
            DecodeProblem { batch, heads_q: cfg.heads, heads_kv: cfg.kv_heads, head_dim: cfg.head_dim, max_seq_len };
        Ok(Self {
            softmax_scale: 1.0 / (cfg.head_dim as f32).sqrt(),
            kv_caches,
            block_table: Tensor::from_vec(table, (batch, per_seq), dev)?,
            pages,
            max_seq_len,
            workspace: fa::decode_workspace(dev, &limits, None)?,
            rope: fa::CandleRope::new(
                &fused_attn::RopeConfig::new(cfg.rope_theta, cfg.head_dim, fused_attn::RopeStyle::Neox),
                max_seq_len,
                dev,
            )?,
            step: None,
        })
    }
}

impl AttentionPath for FusedPath {
    fn name(&self) -> &'static str {
        "fused-attn"
    }

    fn begin(&mut self, seqs: &[usize], positions: &[usize], prefill: bool) -> Result<()> {
        let dev = self.block_table.device().clone();
        let slots: Vec<i64> = seqs
            .iter()
            .zip(positions)
            .map(|(&s, &p)| (self.pages[s][p / PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE) as i64)
            .collect();
        let slot_mapping = Tensor::from_vec(slots, seqs.len(), &dev)?;
        let kind = if !prefill {
            let lens: Vec<i32> = positions.iter().map(|&p| p as i32 + 1).collect();
            let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
            FusedStepKind::Decode {
                seq_lens: Tensor::from_vec(lens, seqs.len(), &dev)?,
                positions: Tensor::from_vec(pos, seqs.len(), &dev)?,
            }
        } else {
            let mut cu = vec![0i32];
            for s in 0..self.pages.len() {
                cu.push(cu[s] + seqs.iter().filter(|&&x| x == s).count() as i32);
            }
            let max_len = cu.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
            let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
            FusedStepKind::Prefill {
                cu_seqlens: Tensor::from_vec(cu, self.pages.len() + 1, &dev)?,
                max_len,
                positions: Tensor::from_vec(pos, seqs.len(), &dev)?,
            }
        };
        self.step = Some(FusedStep { slot_mapping, kind });
        Ok(())
    }

    fn attend(&mut self, layer: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let step = self.step.as_ref().ok_or_else(|| candle_core::Error::Msg("attend before begin".into()))?;
        let kv_cache = &self.kv_caches[layer];
        match &step.kind {
            FusedStepKind::Prefill { cu_seqlens, max_len, positions } => {
                fa::paged_append_rope(k, v, &step.slot_mapping, positions, kv_cache, &self.rope)?;
                let lens = fa::VarlenLengths {
                    seqlens_q: cu_seqlens,
                    seqlens_k: cu_seqlens,
                    max_seqlen_q: *max_len,
                    max_seqlen_k: *max_len,
                };
                let (variants, keys) = (fa::Variants::default(), fa::KeyRope::default());
                let scale = self.softmax_scale;
                fa::flash_attn_varlen_rope(q, k, v, &lens, scale, true, &variants, &self.rope, None, Some(&keys))
            }
            FusedStepKind::Decode { seq_lens, positions } => {
                fa::paged_append_rope(k, v, &step.slot_mapping, positions, kv_cache, &self.rope)?;
                fa::paged_decode_rope(
                    q,
                    kv_cache,
                    &self.block_table,
                    seq_lens,
                    self.max_seq_len,
                    self.softmax_scale,
                    &self.rope,
                    None,
                    &mut self.workspace,
                )
            }
        }
    }

    fn fuses_rope(&self, _prefill: bool) -> bool {
        true
    }
}

/// candle's plain attention over a contiguous per-sequence K/V history.
pub struct ReferencePath {
    softmax_scale: f64,
    /// `history[layer][seq]`: `(k, v)` `[len, Hkv, hd]`.
    history: Vec<Vec<Option<(Tensor, Tensor)>>>,
    seqs: Vec<usize>,
}

impl ReferencePath {
    pub fn new(cfg: &Config, batch: usize) -> Self {
        Self {
            softmax_scale: 1.0 / (cfg.head_dim as f64).sqrt(),
            history: vec![vec![None; batch]; cfg.layers],
            seqs: Vec::new(),
        }
    }
}

impl AttentionPath for ReferencePath {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn begin(&mut self, seqs: &[usize], _positions: &[usize], _prefill: bool) -> Result<()> {
        self.seqs = seqs.to_vec();
        Ok(())
    }

    fn attend(&mut self, layer: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (hq, hkv) = (q.dim(1)?, k.dim(1)?);
        let mut outs = Vec::new();
        let mut start = 0;
        while start < self.seqs.len() {
            let s = self.seqs[start];
            let len = self.seqs[start..].iter().take_while(|&&x| x == s).count();
            let (k_new, v_new) = (k.narrow(0, start, len)?, v.narrow(0, start, len)?);
            let (k_all, v_all) = match self.history[layer][s].take() {
                Some((hk, hv)) => (Tensor::cat(&[&hk, &k_new], 0)?, Tensor::cat(&[&hv, &v_new], 0)?),
                None => (k_new, v_new),
            };
            let (tq, tk) = (len, k_all.dim(0)?);
            // [H, T, hd] in f32, K/V heads repeated for GQA.
            let heads = |t: &Tensor, h: usize| -> Result<Tensor> {
                let t = t.to_dtype(DType::F32)?.transpose(0, 1)?;
                let (_, n, d) = t.dims3()?;
                t.unsqueeze(1)?.expand((h, hq / h, n, d))?.reshape((hq, n, d))
            };
            let qh = q.narrow(0, start, len)?.to_dtype(DType::F32)?.transpose(0, 1)?.contiguous()?;
            let (kh, vh) = (heads(&k_all, hkv)?, heads(&v_all, hkv)?);
            let scores = (qh.matmul(&kh.t()?)? * self.softmax_scale)?;
            // Bottom-right causal mask: row i sees key j iff j <= i + tk - tq.
            let mask: Vec<f32> = (0..tq)
                .flat_map(|i| (0..tk).map(move |j| if j <= i + tk - tq { 0.0 } else { f32::NEG_INFINITY }))
                .collect();
            let scores = scores.broadcast_add(&Tensor::from_vec(mask, (tq, tk), q.device())?)?;
            let e = scores.broadcast_sub(&scores.max_keepdim(D::Minus1)?)?.exp()?;
            let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
            outs.push(p.matmul(&vh)?.transpose(0, 1)?.to_dtype(q.dtype())?);
            self.history[layer][s] = Some((k_all, v_all));
            start += len;
        }
        Tensor::cat(&outs, 0)
    }
}

/// What one generation run produced.
pub struct Run {
    /// Per sequence: the generated tokens (the first from the prompt's logits, then one per decode step).
    pub tokens: Vec<Vec<u32>>,
    /// Per generated token: the logits `[batch][vocab]` it was chosen from.
    pub logits: Vec<Vec<Vec<f32>>>,
    pub prefill_s: f64,
    /// Wall time per decode step (one new token for every sequence).
    pub decode_s_per_step: f64,
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefill of `prompts`, then `steps` greedy decode steps, attention through `attn`.
pub fn generate(
    model: &Model,
    prompts: &[Vec<u32>],
    steps: usize,
    attn: &mut dyn AttentionPath,
    dtype: DType,
) -> Result<Run> {
    let mut batch =
        Batch { tokens: Vec::new(), seqs: Vec::new(), positions: Vec::new(), rows: Vec::new(), prefill: true };
    for (s, p) in prompts.iter().enumerate() {
        batch.tokens.extend_from_slice(p);
        batch.seqs.extend(std::iter::repeat_n(s, p.len()));
        batch.positions.extend(0..p.len());
        batch.rows.push((batch.tokens.len() - 1) as u32);
    }
    let t0 = Instant::now();
    let mut logits = model.forward(&batch, attn, dtype)?.to_vec2::<f32>()?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut run =
        Run { tokens: vec![Vec::new(); prompts.len()], logits: Vec::new(), prefill_s, decode_s_per_step: 0.0 };
    let t0 = Instant::now();
    for step in 0..=steps {
        let next: Vec<u32> = logits.iter().map(|row| argmax(row)).collect();
        for (s, &t) in next.iter().enumerate() {
            run.tokens[s].push(t);
        }
        run.logits.push(logits);
        if step == steps {
            break;
        }
        let batch = Batch {
            positions: prompts.iter().zip(&run.tokens).map(|(p, g)| p.len() + g.len() - 1).collect(),
            tokens: next,
            seqs: (0..prompts.len()).collect(),
            rows: (0..prompts.len() as u32).collect(),
            prefill: false,
        };
        logits = model.forward(&batch, attn, dtype)?.to_vec2::<f32>()?;
    }
    run.decode_s_per_step = t0.elapsed().as_secs_f64() / steps.max(1) as f64;
    Ok(run)
}

/// Two seeded prompts of different lengths (crossing page boundaries).
pub fn prompts(cfg: &Config, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    [21usize, 7].iter().map(|&n| (0..n).map(|_| rng.random_range(0..cfg.vocab as u32)).collect()).collect()
}

/// Both paths on the same model and prompts: `(fused, reference)`.
pub fn run_both(model: &Model, prompts: &[Vec<u32>], steps: usize, dtype: DType, seed: u64) -> Result<(Run, Run)> {
    let dev = model.w("model.embed_tokens.weight")?.device().clone();
    let max_seq_len = prompts.iter().map(|p| p.len()).max().unwrap_or(0) + steps + 1;
    let mut fused = FusedPath::new(&model.cfg, prompts.len(), max_seq_len, dtype, seed, &dev)?;
    let mut reference = ReferencePath::new(&model.cfg, prompts.len());
    Ok((generate(model, prompts, steps, &mut fused, dtype)?, generate(model, prompts, steps, &mut reference, dtype)?))
}

/// Per generated token: the largest |logit difference| between two runs over all sequences.
pub fn logit_diffs(a: &Run, b: &Run) -> Vec<f32> {
    a.logits
        .iter()
        .zip(&b.logits)
        .map(|(x, y)| {
            x.iter().flatten().zip(y.iter().flatten()).map(|(p, q)| (p - q).abs()).fold(0.0, |m: f32, d| {
                if d.is_nan() {
                    f32::NAN
                } else {
                    m.max(d)
                }
            })
        })
        .collect()
}

/// The first generated token (index, sequence) at which two runs chose differently.
pub fn first_divergence(a: &Run, b: &Run) -> Option<(usize, usize)> {
    let steps = a.tokens.first().map_or(0, |t| t.len());
    (0..steps).find_map(|i| (0..a.tokens.len()).find(|&s| a.tokens[s].get(i) != b.tokens[s].get(i)).map(|s| (i, s)))
}

struct Args {
    steps: usize,
    dtype: DType,
    seed: u64,
    weights: Option<String>,
    head_dim: usize,
    save: Option<String>,
    device: String,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut a =
        Args { steps: 32, dtype: DType::F16, seed: 1, weights: None, head_dim: 64, save: None, device: "cpu".into() };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--steps" => a.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--seed" => a.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--head-dim" => a.head_dim = value()?.parse().map_err(|e| format!("--head-dim: {e}"))?,
            "--weights" => a.weights = Some(value()?),
            "--save" => a.save = Some(value()?),
            "--device" => a.device = value()?,
            "--dtype" => {
                a.dtype = match value()?.as_str() {
                    "f16" => DType::F16,
                    "bf16" => DType::BF16,
                    other => return Err(format!("--dtype {other}: expected f16 or bf16")),
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("candle_generate: {e}");
            std::process::exit(2);
        }
    };
    match run(&args) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("candle_generate: {e}");
            std::process::exit(1);
        }
    }
}

fn run(args: &Args) -> Result<bool> {
    let device = match args.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0)?,
        other => return Err(candle_core::Error::Msg(format!("--device {other}: expected cpu or cuda"))),
    };
    let model = match &args.weights {
        Some(path) => Model::load(path, args.head_dim, &device)?,
        None => Model::random(Config::small(), args.seed, &device)?,
    };
    if let Some(path) = &args.save {
        model.save(path)?;
    }
    let prompts = prompts(&model.cfg, args.seed);
    let c = model.cfg;
    println!(
        "model: {} layers, d_model {}, {} query heads / {} KV heads of {} dims, vocab {}; attention in {:?}, \
         page size {PAGE_SIZE}, device {:?}{}",
        c.layers,
        c.d_model,
        c.heads,
        c.kv_heads,
        c.head_dim,
        c.vocab,
        args.dtype,
        device.location(),
        if device.is_cpu() { " (fused-attn on its emulator)" } else { "" }
    );
    println!("prompts: {} and {} tokens; {} decode steps", prompts[0].len(), prompts[1].len(), args.steps);
    let (fused, reference) = run_both(&model, &prompts, args.steps, args.dtype, args.seed)?;
    for (name, r) in [("fused-attn", &fused), ("candle    ", &reference)] {
        for (s, t) in r.tokens.iter().enumerate() {
            println!("{name} seq {s}: {t:?}");
        }
    }
    let diffs = logit_diffs(&fused, &reference);
    let shown: Vec<String> = diffs.iter().map(|d| format!("{d:.1e}")).collect();
    println!("max |logit difference| per generated token: [{}]", shown.join(", "));
    for (name, r) in [("fused-attn", &fused), ("candle", &reference)] {
        println!(
            "{name}: prefill {:.1} ms, {:.2} ms per decode step ({} sequences)",
            r.prefill_s * 1e3,
            r.decode_s_per_step * 1e3,
            prompts.len()
        );
    }
    match first_divergence(&fused, &reference) {
        None => {
            println!("tokens: identical");
            Ok(true)
        }
        Some((i, s)) => {
            // A flip where the reference's two best logits are closer than the paths' logit difference is a
            // near-tie of the random model, not necessarily an attention bug.
            let mut row = reference.logits[i][s].clone();
            row.sort_by(|a, b| b.total_cmp(a));
            println!(
                "tokens: DIFFER from generated token {i} of sequence {s} on (reference top-2 logit margin there {:.1e}, \
                 max logit difference {:.1e})",
                row[0] - row[1],
                diffs[i]
            );
            Ok(false)
        }
    }
}
