//! The syntax tree of one kernel to the compact form the executor runs: registers resolved to slots (with
//! their widths), symbols to state-space addresses, labels to instruction indices, every opcode to an
//! [`Op`] with its modifiers decoded once, and the immediate post-dominator of every conditional branch
//! (where a diverged warp reconverges).

use std::collections::HashMap;

use crate::num::{Fp8, Rnd};
use crate::parse::{self, Operand, Stmt};

/// A value type of an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    B8,
    B16,
    B32,
    B64,
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    F16,
    F32,
    F64,
    Bf16,
    F16x2,
    Bf16x2,
    Pred,
}

impl Ty {
    pub fn from(s: &str) -> Option<Ty> {
        Some(match s {
            "b8" => Ty::B8,
            "b16" => Ty::B16,
            "b32" => Ty::B32,
            "b64" => Ty::B64,
            "u8" => Ty::U8,
            "u16" => Ty::U16,
            "u32" => Ty::U32,
            "u64" => Ty::U64,
            "s8" => Ty::S8,
            "s16" => Ty::S16,
            "s32" => Ty::S32,
            "s64" => Ty::S64,
            "f16" => Ty::F16,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "bf16" => Ty::Bf16,
            "f16x2" => Ty::F16x2,
            "bf16x2" => Ty::Bf16x2,
            "pred" => Ty::Pred,
            _ => return None,
        })
    }
    pub fn bits(self) -> u32 {
        match self {
            Ty::Pred => 1,
            Ty::B8 | Ty::U8 | Ty::S8 => 8,
            Ty::B16 | Ty::U16 | Ty::S16 | Ty::F16 | Ty::Bf16 => 16,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F32 | Ty::F16x2 | Ty::Bf16x2 => 32,
            Ty::B64 | Ty::U64 | Ty::S64 | Ty::F64 => 64,
        }
    }
    pub fn bytes(self) -> u64 {
        (self.bits() as u64).div_ceil(8)
    }
    pub fn signed(self) -> bool {
        matches!(self, Ty::S8 | Ty::S16 | Ty::S32 | Ty::S64)
    }
    pub fn float(self) -> bool {
        matches!(self, Ty::F16 | Ty::F32 | Ty::F64 | Ty::Bf16 | Ty::F16x2 | Ty::Bf16x2)
    }
}

/// A source operand.
#[derive(Clone, Copy, Debug)]
pub enum Src {
    Reg(u32),
    /// A predicate register, negated.
    NotReg(u32),
    Imm(u64),
    Sreg(Sreg),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sreg {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    Laneid,
    Warpid,
    LanemaskLt,
    LanemaskLe,
    LanemaskEq,
    LanemaskGe,
    LanemaskGt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    Global,
    Shared,
    Local,
    Param,
    Const,
    Generic,
}

/// `[base + off]`: base a register or none (off then holds the symbol's address in its space).
#[derive(Clone, Copy, Debug)]
pub struct Addr {
    pub base: Option<u32>,
    pub off: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntOp {
    Add,
    Sub,
    MulLo,
    MulHi,
    MulWide,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FOp {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
    Abs,
    Popc,
    Clz,
    Brev,
    Cnot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FUn {
    Neg,
    Abs,
    Ex2Approx,
    RcpRn,
    RcpApprox,
    SqrtRn,
    Lg2Approx,
    TanhApprox,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Lo,
    Ls,
    Hi,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoolOp {
    And,
    Or,
    Xor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomOp {
    Add,
    Min,
    Max,
    Exch,
    And,
    Or,
    Xor,
    Cas,
}

/// How cvt converts (after decoding the types and modifiers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntRnd {
    /// Integer rounding of a float to an integer (.rni, .rzi, .rmi, .rpi), or the default truncation.
    Rni,
    Rzi,
    Rmi,
    Rpi,
}

#[derive(Clone, Debug)]
pub enum Op {
    Mov {
        d: u32,
        a: Src,
    },
    /// `mov.bN d, {a, b, ...}`: parts low first, each `part_bits` wide.
    Pack {
        d: u32,
        parts: Vec<Src>,
        part_bits: u32,
    },
    /// `mov.bN {d0, d1, ...}, a`.
    Unpack {
        ds: Vec<Option<u32>>,
        a: Src,
        part_bits: u32,
    },
    Int {
        op: IntOp,
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
    },
    Mad {
        hi: bool,
        wide: bool,
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Un {
        op: UnOp,
        ty: Ty,
        d: u32,
        a: Src,
    },
    Float {
        op: FOp,
        ty: Ty,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        d: u32,
        a: Src,
        b: Src,
    },
    Fma {
        ty: Ty,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    FUnary {
        op: FUn,
        ty: Ty,
        ftz: bool,
        d: u32,
        a: Src,
    },
    Setp {
        cmp: Cmp,
        ty: Ty,
        d: u32,
        d2: Option<u32>,
        a: Src,
        b: Src,
        combine: Option<(BoolOp, Src)>,
    },
    /// and/or/xor/not on predicates.
    Logic {
        op: Option<BoolOp>,
        d: u32,
        a: Src,
        b: Src,
    },
    Selp {
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        p: Src,
    },
    Cvt {
        dty: Ty,
        sty: Ty,
        rnd: Option<Rnd>,
        irnd: Option<IntRnd>,
        ftz: bool,
        sat: bool,
        d: u32,
        a: Src,
    },
    /// cvt.rn[.satfinite].{f16x2,bf16x2,e4m3x2,e5m2x2}.f32 d, hi, lo.
    CvtPack {
        to: PackTo,
        relu: bool,
        d: u32,
        hi: Src,
        lo: Src,
    },
    /// cvt.rn.f16x2.{e4m3x2,e5m2x2} d, a (two codes, low byte first, to two fp16 halves).
    CvtFp8ToF16x2 {
        f: Fp8,
        d: u32,
        a: Src,
    },
    Ld {
        space: Space,
        ty: Ty,
        ds: Vec<Option<u32>>,
        addr: Addr,
    },
    St {
        space: Space,
        ty: Ty,
        srcs: Vec<Src>,
        addr: Addr,
    },
    Atom {
        space: Space,
        op: AtomOp,
        ty: Ty,
        d: Option<u32>,
        addr: Addr,
        b: Src,
        c: Option<Src>,
    },
    Cvta {
        to: bool,
        space: Space,
        d: u32,
        a: Src,
    },
    Bra {
        target: u32,
    },
    Exit,
    Bar {
        id: Src,
        count: Option<Src>,
        arrive: bool,
    },
    /// add/sub/mul/fma on packed .f16x2 / .bf16x2 (each half rounded once to nearest even).
    HalfX2 {
        op: FOp,
        fma: bool,
        bf16: bool,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    /// bar.warp.sync membermask (__syncwarp).
    WarpSync {
        mask: Src,
    },
    Shfl {
        mode: ShflMode,
        d: u32,
        p: Option<u32>,
        a: Src,
        b: Src,
        c: Src,
        mask: Src,
    },
    Vote {
        mode: VoteMode,
        d: u32,
        a: Src,
        mask: Src,
    },
    Ldmatrix {
        n: u32,
        trans: bool,
        ds: Vec<u32>,
        addr: Addr,
    },
    Mma {
        bf16: bool,
        d: [u32; 4],
        a: [Src; 4],
        b: [Src; 2],
        c: [Src; 4],
    },
    CpAsync {
        dst: Addr,
        src: Addr,
        size: u32,
        src_size: Option<Src>,
    },
    CpAsyncCommit,
    CpAsyncWait {
        n: u32,
    },
    Prmt {
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Lop3 {
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        lut: u8,
    },
    Bfe {
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Bfi {
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        e: Src,
    },
    /// membar/fence: memory here is sequentially consistent within a CTA's run.
    Nop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackTo {
    F16x2,
    Bf16x2,
    Fp8(Fp8),
}

#[derive(Clone, Debug)]
pub struct Inst {
    pub op: Op,
    pub guard: Option<Src>,
    pub line: u32,
    /// Source position from `.loc`: (file number, line); file 0 = none.
    pub loc: (u32, u32),
}

/// A register slot: its name (for messages) and width in bits (1 for predicates).
#[derive(Clone, Debug)]
pub struct RegInfo {
    pub name: String,
    pub bits: u32,
}

/// A decoded kernel.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub name: String,
    pub insts: Vec<Inst>,
    pub regs: Vec<RegInfo>,
    pub param_bytes: u64,
    /// Static shared memory (bytes) before the dynamic allocation; the dynamic one's alignment.
    pub static_shared: u64,
    pub dynamic_shared_offset: u64,
    pub local_bytes: u64,
    /// For each instruction index of a conditional branch: the instruction index where its warp
    /// reconverges (immediate post-dominator), or `EXIT`.
    pub reconverge: HashMap<u32, u32>,
    /// The module's `.file` table (number -> path).
    pub files: HashMap<u32, String>,
}

pub const EXIT: u32 = u32::MAX;

impl Kernel {
    /// "path:line" of a `.loc` position (the path from `kernels/` on when it has one: the fatbins were built
    /// in some checkout), or None without line info.
    pub fn source_of(&self, loc: (u32, u32)) -> Option<String> {
        let path = self.files.get(&loc.0)?;
        let short = path.find("kernels/").map_or(path.as_str(), |i| &path[i..]);
        Some(format!("{short}:{}", loc.1))
    }
}

#[derive(Debug)]
pub struct DecodeError {
    pub line: u32,
    pub what: String,
}

struct Ctx<'a> {
    scopes: Vec<HashMap<String, u32>>,
    regs: Vec<RegInfo>,
    symbols: HashMap<String, (Space, u64)>,
    labels: &'a HashMap<String, u32>,
    line: u32,
}

fn err<T>(line: u32, what: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError { line, what: what.into() })
}

impl Ctx<'_> {
    fn reg(&self, name: &str) -> Result<u32, DecodeError> {
        for s in self.scopes.iter().rev() {
            if let Some(&r) = s.get(name) {
                return Ok(r);
            }
        }
        err(self.line, format!("unknown register {name}"))
    }
    fn dst(&self, o: &Operand) -> Result<u32, DecodeError> {
        match o {
            Operand::Name(n) => self.reg(n),
            _ => err(self.line, format!("expected a register, found {o:?}")),
        }
    }
    fn opt_dst(&self, o: &Operand) -> Result<Option<u32>, DecodeError> {
        match o {
            Operand::Sink => Ok(None),
            o => self.dst(o).map(Some),
        }
    }
    fn src(&self, o: &Operand) -> Result<Src, DecodeError> {
        Ok(match o {
            Operand::Name(n) => {
                if let Some(s) = sreg(n) {
                    Src::Sreg(s)
                } else if let Some(&(_, addr)) = self.symbols.get(n) {
                    Src::Imm(addr)
                } else {
                    Src::Reg(self.reg(n)?)
                }
            }
            Operand::Not(n) => Src::NotReg(self.reg(n)?),
            Operand::Int(i) => Src::Imm(*i as u64),
            Operand::F32(b) => Src::Imm(*b as u64),
            Operand::F64(b) => Src::Imm(*b),
            _ => return err(self.line, format!("unsupported source operand {o:?}")),
        })
    }
    fn addr(&self, o: &Operand) -> Result<Addr, DecodeError> {
        match o {
            Operand::Addr(None, off) => Ok(Addr { base: None, off: *off }),
            Operand::Addr(Some(b), off) => {
                if let Some(&(_, a)) = self.symbols.get(b) {
                    Ok(Addr { base: None, off: a as i64 + off })
                } else {
                    Ok(Addr { base: Some(self.reg(b)?), off: *off })
                }
            }
            _ => err(self.line, format!("expected an address, found {o:?}")),
        }
    }
    fn vec_dsts(&self, o: &Operand) -> Result<Vec<Option<u32>>, DecodeError> {
        match o {
            Operand::Vec(v) => v.iter().map(|e| self.opt_dst(e)).collect(),
            o => Ok(vec![self.opt_dst(o)?]),
        }
    }
    fn vec_srcs(&self, o: &Operand) -> Result<Vec<Src>, DecodeError> {
        match o {
            Operand::Vec(v) => v.iter().map(|e| self.src(e)).collect(),
            o => Ok(vec![self.src(o)?]),
        }
    }
}

fn sreg(n: &str) -> Option<Sreg> {
    let dim = |s: &str| match s {
        "x" => Some(0u8),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    let (base, d) = n.rsplit_once('.').map_or((n, None), |(b, d)| (b, dim(d)));
    Some(match (base, d) {
        ("%tid", Some(d)) => Sreg::Tid(d),
        ("%ntid", Some(d)) => Sreg::Ntid(d),
        ("%ctaid", Some(d)) => Sreg::Ctaid(d),
        ("%nctaid", Some(d)) => Sreg::Nctaid(d),
        _ => match n {
            "%laneid" => Sreg::Laneid,
            "%warpid" => Sreg::Warpid,
            "%lanemask_lt" => Sreg::LanemaskLt,
            "%lanemask_le" => Sreg::LanemaskLe,
            "%lanemask_eq" => Sreg::LanemaskEq,
            "%lanemask_ge" => Sreg::LanemaskGe,
            "%lanemask_gt" => Sreg::LanemaskGt,
            _ => return None,
        },
    })
}

fn rnd_of(m: &[&str]) -> Option<Rnd> {
    m.iter().find_map(|s| match *s {
        "rn" => Some(Rnd::Rn),
        "rz" => Some(Rnd::Rz),
        "rm" => Some(Rnd::Rm),
        "rp" => Some(Rnd::Rp),
        _ => None,
    })
}

fn space_of(m: &[&str]) -> Space {
    for s in m {
        match *s {
            "global" => return Space::Global,
            "shared" | "shared::cta" => return Space::Shared,
            "local" => return Space::Local,
            "param" => return Space::Param,
            "const" => return Space::Const,
            _ => {}
        }
    }
    Space::Generic
}

/// The last modifier that names a type.
fn last_ty(m: &[&str]) -> Option<Ty> {
    m.iter().rev().find_map(|s| Ty::from(s))
}

fn types(m: &[&str]) -> Vec<Ty> {
    m.iter().filter_map(|s| Ty::from(s)).collect()
}

fn cmp_of(s: &str) -> Option<Cmp> {
    Some(match s {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" => Cmp::Lt,
        "le" => Cmp::Le,
        "gt" => Cmp::Gt,
        "ge" => Cmp::Ge,
        "lo" => Cmp::Lo,
        "ls" => Cmp::Ls,
        "hi" => Cmp::Hi,
        "hs" => Cmp::Hs,
        "equ" => Cmp::Equ,
        "neu" => Cmp::Neu,
        "ltu" => Cmp::Ltu,
        "leu" => Cmp::Leu,
        "gtu" => Cmp::Gtu,
        "geu" => Cmp::Geu,
        "num" => Cmp::Num,
        "nan" => Cmp::Nan,
        _ => return None,
    })
}

fn bool_op(s: &str) -> Option<BoolOp> {
    match s {
        "and" => Some(BoolOp::And),
        "or" => Some(BoolOp::Or),
        "xor" => Some(BoolOp::Xor),
        _ => None,
    }
}

fn decode_inst(c: &Ctx, ins: &parse::Instr) -> Result<Op, DecodeError> {
    let line = ins.line;
    // `.shared::cta` is `.shared` (the CTA's window; no clusters here).
    let parts: Vec<&str> = ins.opcode.split('.').map(|p| p.strip_suffix("::cta").unwrap_or(p)).collect();
    let (name, m) = (parts[0], &parts[1..]);
    let o = &ins.operands;
    let need = |n: usize| -> Result<(), DecodeError> {
        if o.len() < n {
            err(line, format!("{} needs {n} operands", ins.opcode))
        } else {
            Ok(())
        }
    };
    let ty = last_ty(m);
    let has = |s: &str| m.contains(&s);
    Ok(match name {
        "mov" => {
            need(2)?;
            let bits = ty.map_or(32, |t| t.bits());
            match (&o[0], &o[1]) {
                (Operand::Vec(ds), a) => {
                    let part_bits = bits / ds.len() as u32;
                    Op::Unpack { ds: c.vec_dsts(&Operand::Vec(ds.clone()))?, a: c.src(a)?, part_bits }
                }
                (d, Operand::Vec(parts)) => {
                    let part_bits = bits / parts.len() as u32;
                    Op::Pack { d: c.dst(d)?, parts: c.vec_srcs(&Operand::Vec(parts.clone()))?, part_bits }
                }
                (d, a) => Op::Mov { d: c.dst(d)?, a: c.src(a)? },
            }
        }
        "add" | "sub" | "mul" | "fma" if matches!(ty, Some(Ty::F16x2 | Ty::Bf16x2)) => {
            let fma = name == "fma";
            need(if fma { 4 } else { 3 })?;
            if rnd_of(m).is_some_and(|r| r != Rnd::Rn) || has("ftz") || has("sat") || has("relu") {
                return err(line, format!("unsupported {}", ins.opcode));
            }
            let op = match name {
                "sub" => FOp::Sub,
                "mul" => FOp::Mul,
                _ => FOp::Add,
            };
            Op::HalfX2 {
                op,
                fma,
                bf16: ty == Some(Ty::Bf16x2),
                d: c.dst(&o[0])?,
                a: c.src(&o[1])?,
                b: c.src(&o[2])?,
                c: if fma { c.src(&o[3])? } else { Src::Imm(0) },
            }
        }
        "add" | "sub" | "mul" | "div" | "min" | "max" | "rem" | "and" | "or" | "xor" | "shl" | "shr" => {
            need(3)?;
            let ty = ty.ok_or_else(|| DecodeError { line, what: format!("untyped {}", ins.opcode) })?;
            if ty == Ty::Pred {
                let op = bool_op(name).ok_or_else(|| DecodeError { line, what: format!("{name}.pred") })?;
                return Ok(Op::Logic { op: Some(op), d: c.dst(&o[0])?, a: c.src(&o[1])?, b: c.src(&o[2])? });
            }
            let (d, a, b) = (c.dst(&o[0])?, c.src(&o[1])?, c.src(&o[2])?);
            if ty.float() {
                if ty != Ty::F32 {
                    return err(line, format!("unsupported float type in {}", ins.opcode));
                }
                let op = match name {
                    "add" => FOp::Add,
                    "sub" => FOp::Sub,
                    "mul" => FOp::Mul,
                    "div" => {
                        if has("approx") || has("full") {
                            return err(line, format!("{} (only IEEE division is modelled)", ins.opcode));
                        }
                        FOp::Div
                    }
                    "min" => FOp::Min,
                    "max" => FOp::Max,
                    _ => return err(line, format!("unsupported {}", ins.opcode)),
                };
                if has("NaN") || has("xorsign") || has("abs") {
                    return err(line, format!("unsupported {}", ins.opcode));
                }
                let rnd = rnd_of(m).unwrap_or(Rnd::Rn);
                Op::Float { op, ty, rnd, ftz: has("ftz"), sat: has("sat"), d, a, b }
            } else {
                let op = match name {
                    "add" => IntOp::Add,
                    "sub" => IntOp::Sub,
                    "mul" if has("hi") => IntOp::MulHi,
                    "mul" if has("wide") => IntOp::MulWide,
                    "mul" => IntOp::MulLo,
                    "div" => IntOp::Div,
                    "rem" => IntOp::Rem,
                    "min" => IntOp::Min,
                    "max" => IntOp::Max,
                    "and" => IntOp::And,
                    "or" => IntOp::Or,
                    "xor" => IntOp::Xor,
                    "shl" => IntOp::Shl,
                    _ => IntOp::Shr,
                };
                if has("sat") || has("cc") {
                    return err(line, format!("unsupported {}", ins.opcode));
                }
                Op::Int { op, ty, d, a, b }
            }
        }
        "mad" | "fma" => {
            need(4)?;
            let ty = ty.ok_or_else(|| DecodeError { line, what: "untyped mad".into() })?;
            let (d, a, b, cc) = (c.dst(&o[0])?, c.src(&o[1])?, c.src(&o[2])?, c.src(&o[3])?);
            if ty.float() {
                if ty != Ty::F32 {
                    return err(line, format!("unsupported {}", ins.opcode));
                }
                let rnd = rnd_of(m).ok_or_else(|| DecodeError { line, what: "fma without rounding".into() })?;
                Op::Fma { ty, rnd, ftz: has("ftz"), sat: has("sat"), d, a, b, c: cc }
            } else {
                Op::Mad { hi: has("hi"), wide: has("wide"), ty, d, a, b, c: cc }
            }
        }
        "neg" | "abs" | "not" | "popc" | "clz" | "brev" | "cnot" => {
            need(2)?;
            let ty = ty.ok_or_else(|| DecodeError { line, what: "untyped unary".into() })?;
            let (d, a) = (c.dst(&o[0])?, c.src(&o[1])?);
            if ty == Ty::Pred && name == "not" {
                return Ok(Op::Logic { op: None, d, a, b: Src::Imm(0) });
            }
            if ty.float() {
                if ty != Ty::F32 {
                    return err(line, format!("unsupported {}", ins.opcode));
                }
                let op = match name {
                    "neg" => FUn::Neg,
                    "abs" => FUn::Abs,
                    _ => return err(line, format!("unsupported {}", ins.opcode)),
                };
                Op::FUnary { op, ty, ftz: has("ftz"), d, a }
            } else {
                let op = match name {
                    "neg" => UnOp::Neg,
                    "abs" => UnOp::Abs,
                    "not" => UnOp::Not,
                    "popc" => UnOp::Popc,
                    "clz" => UnOp::Clz,
                    "brev" => UnOp::Brev,
                    _ => UnOp::Cnot,
                };
                Op::Un { op, ty, d, a }
            }
        }
        "ex2" | "rcp" | "sqrt" | "lg2" | "tanh" => {
            need(2)?;
            let ty = ty.unwrap_or(Ty::F32);
            if ty != Ty::F32 {
                return err(line, format!("unsupported {}", ins.opcode));
            }
            let approx = has("approx");
            let op = match (name, approx) {
                ("ex2", true) => FUn::Ex2Approx,
                ("rcp", true) => FUn::RcpApprox,
                ("rcp", false) if rnd_of(m) == Some(Rnd::Rn) => FUn::RcpRn,
                ("sqrt", false) if rnd_of(m) == Some(Rnd::Rn) => FUn::SqrtRn,
                ("lg2", true) => FUn::Lg2Approx,
                ("tanh", true) => FUn::TanhApprox,
                _ => return err(line, format!("unsupported {}", ins.opcode)),
            };
            Op::FUnary { op, ty, ftz: has("ftz"), d: c.dst(&o[0])?, a: c.src(&o[1])? }
        }
        "setp" => {
            need(3)?;
            let cmp = m.iter().find_map(|s| cmp_of(s)).ok_or_else(|| DecodeError { line, what: "setp cmp".into() })?;
            let ty = ty.ok_or_else(|| DecodeError { line, what: "untyped setp".into() })?;
            let (d, d2) = match &o[0] {
                Operand::Pair(p, q) => (c.reg(p)?, if q == "_" { None } else { Some(c.reg(q)?) }),
                x => (c.dst(x)?, None),
            };
            let combine = match m.iter().find_map(|s| bool_op(s)) {
                Some(b) => {
                    need(4)?;
                    Some((b, c.src(&o[3])?))
                }
                None => None,
            };
            if ty.float() && ty != Ty::F32 {
                return err(line, format!("unsupported {}", ins.opcode));
            }
            Op::Setp { cmp, ty, d, d2, a: c.src(&o[1])?, b: c.src(&o[2])?, combine }
        }
        "selp" => {
            need(4)?;
            let ty = ty.ok_or_else(|| DecodeError { line, what: "untyped selp".into() })?;
            Op::Selp { ty, d: c.dst(&o[0])?, a: c.src(&o[1])?, b: c.src(&o[2])?, p: c.src(&o[3])? }
        }
        "cvt" => {
            let tys = types(m);
            let fp8 = |s: &str| match s {
                "e4m3x2" => Some(Fp8::E4m3),
                "e5m2x2" => Some(Fp8::E5m2),
                _ => None,
            };
            let fp8s: Vec<Fp8> = m.iter().filter_map(|s| fp8(s)).collect();
            if let Some(&f) = fp8s.first() {
                if m.iter().position(|s| fp8(s).is_some()) == m.iter().position(|s| *s == "f16x2").map(|p| p + 1) {
                    need(2)?;
                    return Ok(Op::CvtFp8ToF16x2 { f, d: c.dst(&o[0])?, a: c.src(&o[1])? });
                }
                need(3)?;
                if !has("satfinite") || tys.last() != Some(&Ty::F32) {
                    return err(line, format!("unsupported {}", ins.opcode));
                }
                return Ok(Op::CvtPack {
                    to: PackTo::Fp8(f),
                    relu: has("relu"),
                    d: c.dst(&o[0])?,
                    hi: c.src(&o[1])?,
                    lo: c.src(&o[2])?,
                });
            }
            if o.len() == 3 {
                let to = match tys.first() {
                    Some(Ty::F16x2) => PackTo::F16x2,
                    Some(Ty::Bf16x2) => PackTo::Bf16x2,
                    _ => return err(line, format!("unsupported {}", ins.opcode)),
                };
                if rnd_of(m) != Some(Rnd::Rn) || has("satfinite") {
                    return err(line, format!("unsupported {}", ins.opcode));
                }
                return Ok(Op::CvtPack {
                    to,
                    relu: has("relu"),
                    d: c.dst(&o[0])?,
                    hi: c.src(&o[1])?,
                    lo: c.src(&o[2])?,
                });
            }
            need(2)?;
            if tys.len() != 2 {
                return err(line, format!("cvt needs two types: {}", ins.opcode));
            }
            let irnd = m.iter().find_map(|s| match *s {
                "rni" => Some(IntRnd::Rni),
                "rzi" => Some(IntRnd::Rzi),
                "rmi" => Some(IntRnd::Rmi),
                "rpi" => Some(IntRnd::Rpi),
                _ => None,
            });
            Op::Cvt {
                dty: tys[0],
                sty: tys[1],
                rnd: rnd_of(m),
                irnd,
                ftz: has("ftz"),
                sat: has("sat"),
                d: c.dst(&o[0])?,
                a: c.src(&o[1])?,
            }
        }
        "ld" | "ldu" => {
            need(2)?;
            let ty = ty.ok_or_else(|| DecodeError { line, what: "untyped ld".into() })?;
            Op::Ld { space: space_of(m), ty, ds: c.vec_dsts(&o[0])?, addr: c.addr(&o[1])? }
        }
        "st" => {
            need(2)?;
            let ty = ty.ok_or_else(|| DecodeError { line, what: "untyped st".into() })?;
            Op::St { space: space_of(m), ty, srcs: c.vec_srcs(&o[1])?, addr: c.addr(&o[0])? }
        }
        "atom" | "red" => {
            let ty = ty.ok_or_else(|| DecodeError { line, what: "untyped atom".into() })?;
            let op = m
                .iter()
                .find_map(|s| {
                    Some(match *s {
                        "add" => AtomOp::Add,
                        "min" => AtomOp::Min,
                        "max" => AtomOp::Max,
                        "exch" => AtomOp::Exch,
                        "and" => AtomOp::And,
                        "or" => AtomOp::Or,
                        "xor" => AtomOp::Xor,
                        "cas" => AtomOp::Cas,
                        _ => return None,
                    })
                })
                .ok_or_else(|| DecodeError { line, what: format!("unsupported {}", ins.opcode) })?;
            let (d, rest) = if name == "atom" { (Some(c.dst(&o[0])?), &o[1..]) } else { (None, &o[..]) };
            if rest.len() < 2 {
                return err(line, "atom operands");
            }
            Op::Atom {
                space: space_of(m),
                op,
                ty,
                d,
                addr: c.addr(&rest[0])?,
                b: c.src(&rest[1])?,
                c: rest.get(2).map(|x| c.src(x)).transpose()?,
            }
        }
        "cvta" => {
            need(2)?;
            Op::Cvta { to: has("to"), space: space_of(m), d: c.dst(&o[0])?, a: c.src(&o[1])? }
        }
        "bra" => {
            need(1)?;
            match &o[0] {
                Operand::Name(l) => match c.labels.get(l) {
                    Some(&t) => Op::Bra { target: t },
                    None => return err(line, format!("unknown label {l}")),
                },
                x => return err(line, format!("bad branch target {x:?}")),
            }
        }
        "ret" | "exit" => Op::Exit,
        "bar" | "barrier" if has("warp") => {
            need(1)?;
            Op::WarpSync { mask: c.src(&o[0])? }
        }
        "bar" | "barrier" => {
            let arrive = has("arrive");
            if !(has("sync") || arrive) || has("red") {
                return err(line, format!("unsupported {}", ins.opcode));
            }
            need(1)?;
            Op::Bar { id: c.src(&o[0])?, count: o.get(1).map(|x| c.src(x)).transpose()?, arrive }
        }
        "membar" | "fence" => {
            if has("proxy") || has("mbarrier_init") {
                return err(line, format!("unsupported {}", ins.opcode));
            }
            Op::Nop
        }
        "shfl" => {
            need(5)?;
            if !has("sync") {
                return err(line, "shfl without .sync");
            }
            let mode = m
                .iter()
                .find_map(|s| match *s {
                    "up" => Some(ShflMode::Up),
                    "down" => Some(ShflMode::Down),
                    "bfly" => Some(ShflMode::Bfly),
                    "idx" => Some(ShflMode::Idx),
                    _ => None,
                })
                .ok_or_else(|| DecodeError { line, what: "shfl mode".into() })?;
            let (d, p) = match &o[0] {
                Operand::Pair(d, p) => (c.reg(d)?, Some(c.reg(p)?)),
                x => (c.dst(x)?, None),
            };
            Op::Shfl { mode, d, p, a: c.src(&o[1])?, b: c.src(&o[2])?, c: c.src(&o[3])?, mask: c.src(&o[4])? }
        }
        "vote" => {
            need(3)?;
            if !has("sync") {
                return err(line, "vote without .sync");
            }
            let mode = if has("all") {
                VoteMode::All
            } else if has("any") {
                VoteMode::Any
            } else if has("uni") {
                VoteMode::Uni
            } else {
                VoteMode::Ballot
            };
            Op::Vote { mode, d: c.dst(&o[0])?, a: c.src(&o[1])?, mask: c.src(&o[2])? }
        }
        "ldmatrix" => {
            need(2)?;
            if !has("m8n8") || !has("b16") {
                return err(line, format!("unsupported {}", ins.opcode));
            }
            let n = if has("x4") {
                4
            } else if has("x2") {
                2
            } else {
                1
            };
            let ds: Vec<u32> = c.vec_dsts(&o[0])?.into_iter().map(|d| d.unwrap_or(u32::MAX)).collect();
            if ds.len() != n as usize {
                return err(line, "ldmatrix destination count");
            }
            if space_of(m) != Space::Shared {
                return err(line, "ldmatrix needs .shared");
            }
            Op::Ldmatrix { n, trans: has("trans"), ds, addr: c.addr(&o[1])? }
        }
        "mma" => {
            need(4)?;
            let ok = has("m16n8k16") && has("row") && has("col") && has("sync") && has("aligned");
            let tys = types(m);
            let bf16 = match tys.as_slice() {
                [Ty::F32, Ty::F16, Ty::F16, Ty::F32] => false,
                [Ty::F32, Ty::Bf16, Ty::Bf16, Ty::F32] => true,
                _ => return err(line, format!("unsupported {}", ins.opcode)),
            };
            if !ok {
                return err(line, format!("unsupported {}", ins.opcode));
            }
            let dv: Vec<Option<u32>> = c.vec_dsts(&o[0])?;
            let av = c.vec_srcs(&o[1])?;
            let bv = c.vec_srcs(&o[2])?;
            let cv = c.vec_srcs(&o[3])?;
            if dv.len() != 4 || av.len() != 4 || bv.len() != 2 || cv.len() != 4 || dv.iter().any(Option::is_none) {
                return err(line, "mma operand counts");
            }
            Op::Mma {
                bf16,
                d: [dv[0].unwrap(), dv[1].unwrap(), dv[2].unwrap(), dv[3].unwrap()],
                a: [av[0], av[1], av[2], av[3]],
                b: [bv[0], bv[1]],
                c: [cv[0], cv[1], cv[2], cv[3]],
            }
        }
        "cp" => {
            if has("commit_group") {
                Op::CpAsyncCommit
            } else if has("wait_group") {
                need(1)?;
                match &o[0] {
                    Operand::Int(n) => Op::CpAsyncWait { n: *n as u32 },
                    _ => return err(line, "wait_group needs an immediate"),
                }
            } else if has("wait_all") {
                Op::CpAsyncWait { n: 0 }
            } else if has("async") && has("shared") && has("global") && !has("bulk") {
                need(3)?;
                let size = match &o[2] {
                    Operand::Int(n) => *n as u32,
                    _ => return err(line, "cp.async size"),
                };
                Op::CpAsync {
                    dst: c.addr(&o[0])?,
                    src: c.addr(&o[1])?,
                    size,
                    src_size: o.get(3).map(|x| c.src(x)).transpose()?,
                }
            } else {
                return err(line, format!("unsupported {}", ins.opcode));
            }
        }
        "prmt" => {
            need(4)?;
            if m.len() != 1 {
                return err(line, format!("unsupported {}", ins.opcode));
            }
            Op::Prmt { d: c.dst(&o[0])?, a: c.src(&o[1])?, b: c.src(&o[2])?, c: c.src(&o[3])? }
        }
        "lop3" => {
            need(5)?;
            let lut = match &o[4] {
                Operand::Int(n) => *n as u8,
                _ => return err(line, "lop3 lut"),
            };
            Op::Lop3 { d: c.dst(&o[0])?, a: c.src(&o[1])?, b: c.src(&o[2])?, c: c.src(&o[3])?, lut }
        }
        "bfe" => {
            need(4)?;
            Op::Bfe {
                ty: ty.unwrap_or(Ty::U32),
                d: c.dst(&o[0])?,
                a: c.src(&o[1])?,
                b: c.src(&o[2])?,
                c: c.src(&o[3])?,
            }
        }
        "bfi" => {
            need(5)?;
            Op::Bfi {
                ty: ty.unwrap_or(Ty::B32),
                d: c.dst(&o[0])?,
                a: c.src(&o[1])?,
                b: c.src(&o[2])?,
                c: c.src(&o[3])?,
                e: c.src(&o[4])?,
            }
        }
        _ => return err(line, format!("unsupported instruction {}", ins.opcode)),
    })
}

/// Decodes one parsed kernel of `module`.
pub fn decode(module: &parse::Module, k: &parse::Kernel) -> Result<Kernel, DecodeError> {
    let mut symbols: HashMap<String, (Space, u64)> = HashMap::new();
    let mut param_bytes = 0u64;
    for p in &k.params {
        let off = param_bytes.next_multiple_of(p.align.max(1));
        symbols.insert(p.name.clone(), (Space::Param, off));
        param_bytes = off + p.bytes;
    }
    // Static shared variables first, then the dynamic one (aligned as declared).
    let mut shared = 0u64;
    let mut dynamic_align = 16;
    let mut dynamic_names = Vec::new();
    let mut local = 0u64;
    let body_vars = k.body.iter().filter_map(|s| if let Stmt::Var(v) = s { Some(v) } else { None });
    for v in module.vars.iter().chain(body_vars) {
        match (v.space.as_str(), v.bytes) {
            (".shared", Some(b)) => {
                let off = shared.next_multiple_of(v.align.max(1));
                symbols.insert(v.name.clone(), (Space::Shared, off));
                shared = off + b;
            }
            (".shared", None) => {
                dynamic_align = dynamic_align.max(v.align);
                dynamic_names.push(v.name.clone());
            }
            (".local", Some(b)) => {
                let off = local.next_multiple_of(v.align.max(1));
                symbols.insert(v.name.clone(), (Space::Local, off));
                local = off + b;
            }
            _ => {} // module .global/.const data: not read by our kernels; an access is out of bounds
        }
    }
    let dynamic_shared_offset = shared.next_multiple_of(dynamic_align);
    for n in dynamic_names {
        symbols.insert(n, (Space::Shared, dynamic_shared_offset));
    }
    // Labels: the index of the next instruction.
    let mut labels = HashMap::new();
    let mut n = 0u32;
    for s in &k.body {
        match s {
            Stmt::Label(l) => {
                labels.insert(l.clone(), n);
            }
            Stmt::Instr(_) => n += 1,
            _ => {}
        }
    }
    let mut c = Ctx { scopes: vec![HashMap::new()], regs: Vec::new(), symbols, labels: &labels, line: k.line };
    let mut insts = Vec::new();
    for s in &k.body {
        match s {
            Stmt::Open => c.scopes.push(HashMap::new()),
            Stmt::Close => {
                c.scopes.pop();
            }
            Stmt::Reg { ty, names } => {
                let t = Ty::from(ty.trim_start_matches('.'))
                    .ok_or_else(|| DecodeError { line: c.line, what: format!("register type {ty}") })?;
                for (name, count) in names {
                    let mut add = |n: String| {
                        let id = c.regs.len() as u32;
                        c.regs.push(RegInfo { name: n.clone(), bits: t.bits() });
                        c.scopes.last_mut().unwrap().insert(n, id);
                    };
                    match count {
                        Some(k) => (0..*k).for_each(|i| add(format!("{name}{i}"))),
                        None => add(name.clone()),
                    }
                }
            }
            Stmt::Instr(ins) => {
                c.line = ins.line;
                let op = decode_inst(&c, ins)?;
                let guard = match &ins.guard {
                    Some((g, neg)) => {
                        let r = c.reg(g)?;
                        Some(if *neg { Src::NotReg(r) } else { Src::Reg(r) })
                    }
                    None => None,
                };
                insts.push(Inst { op, guard, line: ins.line, loc: ins.loc });
            }
            Stmt::Label(_) | Stmt::Var(_) => {}
        }
    }
    let reconverge = post_dominators(&insts);
    Ok(Kernel {
        name: k.name.clone(),
        insts,
        regs: c.regs,
        param_bytes,
        static_shared: shared,
        dynamic_shared_offset,
        local_bytes: local,
        reconverge,
        files: module.files.clone(),
    })
}

/// Immediate post-dominators of the conditional branches, on the basic-block graph (iterative dataflow
/// over bit sets; the strict post-dominators of a block form a chain, and the nearest one has the most
/// post-dominators of its own).
fn post_dominators(insts: &[Inst]) -> HashMap<u32, u32> {
    let n = insts.len();
    let ends_block = |i: usize| matches!(insts[i].op, Op::Bra { .. } | Op::Exit);
    let mut leader = vec![false; n + 1];
    leader[0] = true;
    for (i, ins) in insts.iter().enumerate() {
        if let Op::Bra { target } = ins.op {
            leader[target as usize] = true;
        }
        if ends_block(i) {
            leader[i + 1] = true;
        }
    }
    let starts: Vec<usize> = (0..n).filter(|&i| leader[i]).collect();
    let mut block_of = vec![0usize; n + 1];
    for (b, &s) in starts.iter().enumerate() {
        let end = starts.get(b + 1).copied().unwrap_or(n);
        for slot in &mut block_of[s..end] {
            *slot = b;
        }
    }
    let nb = starts.len();
    let exit = nb; // virtual exit node
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); nb];
    for (b, out) in succ.iter_mut().enumerate() {
        let end = starts.get(b + 1).copied().unwrap_or(n);
        let last = end - 1;
        let ins = &insts[last];
        let fall = if end < n { block_of[end] } else { exit };
        match ins.op {
            Op::Bra { target } => {
                out.push(block_of[target as usize]);
                if ins.guard.is_some() {
                    out.push(fall);
                }
            }
            Op::Exit => {
                out.push(exit);
                if ins.guard.is_some() {
                    out.push(fall);
                }
            }
            _ => out.push(fall),
        }
    }
    let words = (nb + 1).div_ceil(64);
    let full = vec![u64::MAX; words];
    let mut pdom: Vec<Vec<u64>> = vec![full; nb + 1];
    pdom[exit] = vec![0; words];
    pdom[exit][exit / 64] |= 1 << (exit % 64);
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..nb).rev() {
            let mut s = vec![u64::MAX; words];
            for &x in &succ[b] {
                for w in 0..words {
                    s[w] &= pdom[x][w];
                }
            }
            s[b / 64] |= 1 << (b % 64);
            if s != pdom[b] {
                pdom[b] = s;
                changed = true;
            }
        }
    }
    let count = |v: &Vec<u64>| v.iter().map(|w| w.count_ones()).sum::<u32>();
    let mut out = HashMap::new();
    for b in 0..nb {
        let end = starts.get(b + 1).copied().unwrap_or(n);
        let last = end - 1;
        if !(matches!(insts[last].op, Op::Bra { .. } | Op::Exit) && insts[last].guard.is_some()) {
            continue;
        }
        let mut best: Option<(u32, usize)> = None;
        for d in 0..=nb {
            if d != b && pdom[b][d / 64] >> (d % 64) & 1 == 1 {
                let c = count(&pdom[d]);
                if best.is_none_or(|(bc, _)| c > bc) {
                    best = Some((c, d));
                }
            }
        }
        let target = match best {
            Some((_, d)) if d != exit => starts[d] as u32,
            _ => EXIT,
        };
        out.insert(last as u32, target);
    }
    out
}
