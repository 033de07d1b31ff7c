//! PTX text to a syntax tree: the module's shared variables and each `.entry` with its parameters,
//! register declarations, labels and instructions (opcode, guard predicate, operands), each with its PTX
//! line and its `.loc` source position. Only the grammar nvcc emits for our kernels; anything else is an
//! error naming the line (no silent skipping inside a kernel body).

use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    P(char),
}

#[derive(Debug)]
pub struct ParseError {
    pub line: u32,
    pub what: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PTX line {}: {}", self.line, self.what)
    }
}

/// A variable of the module or a kernel in a state space (`.shared`, `.local`, `.global`, `.const`).
#[derive(Debug, Clone)]
pub struct VarDecl {
    pub space: String,
    pub name: String,
    pub align: u64,
    /// None: `.extern` array of unknown size (the dynamic shared memory).
    pub bytes: Option<u64>,
}

#[derive(Debug, Clone)]
pub enum Operand {
    /// A register, special register, symbol or label.
    Name(String),
    /// `!%p` (a negated predicate source).
    Not(String),
    /// An integer immediate (two's complement bits).
    Int(i128),
    /// `0f…` (fp32 bits) or `0d…` (fp64 bits).
    F32(u32),
    F64(u64),
    /// `[base + offset]`; base None for an absolute address.
    Addr(Option<String>, i64),
    /// `{a, b, ...}`.
    Vec(Vec<Operand>),
    /// `%p|%q`: setp's two destinations, or shfl's value and predicate.
    Pair(String, String),
    /// `_`: a sink.
    Sink,
}

#[derive(Debug, Clone)]
pub struct Instr {
    pub guard: Option<(String, bool)>,
    pub opcode: String,
    pub operands: Vec<Operand>,
    pub line: u32,
    /// The `.loc` in force: (file number of the `.file` table, line).
    pub loc: (u32, u32),
}

#[derive(Debug, Clone)]
pub enum Stmt {
    Reg { ty: String, names: Vec<(String, Option<u32>)> },
    Var(VarDecl),
    Label(String),
    Instr(Instr),
    Open,
    Close,
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub align: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Kernel {
    pub name: String,
    pub line: u32,
    pub params: Vec<Param>,
    pub body: Vec<Stmt>,
}

#[derive(Debug, Clone, Default)]
pub struct Module {
    pub vars: Vec<VarDecl>,
    pub kernels: Vec<Kernel>,
    pub files: HashMap<u32, String>,
}

fn tokenize(text: &str) -> Result<Vec<(Tok, u32)>, ParseError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1u32;
    let word = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'%' | b'.');
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 2;
        } else if c == b'"' {
            let start = i + 1;
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += 1;
            }
            out.push((Tok::Str(text[start..i].to_string()), line));
            i += 1;
        } else if word(c) {
            let start = i;
            while i < b.len() && word(b[i]) {
                i += 1;
            }
            out.push((Tok::Word(text[start..i].to_string()), line));
        } else {
            out.push((Tok::P(c as char), line));
            i += 1;
        }
    }
    Ok(out)
}

struct P {
    t: Vec<(Tok, u32)>,
    i: usize,
    loc: (u32, u32),
}

impl P {
    fn err<T>(&self, what: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError { line: self.line(), what: what.into() })
    }
    fn line(&self) -> u32 {
        self.t.get(self.i).or(self.t.last()).map_or(0, |t| t.1)
    }
    fn peek(&self) -> Option<&Tok> {
        self.t.get(self.i).map(|t| &t.0)
    }
    fn next(&mut self) -> Option<Tok> {
        let t = self.t.get(self.i).map(|t| t.0.clone());
        self.i += 1;
        t
    }
    fn is_p(&self, c: char) -> bool {
        self.peek() == Some(&Tok::P(c))
    }
    fn expect_p(&mut self, c: char) -> Result<(), ParseError> {
        if self.is_p(c) {
            self.i += 1;
            Ok(())
        } else {
            self.err(format!("expected '{c}', found {:?}", self.peek()))
        }
    }
    fn word(&mut self) -> Result<String, ParseError> {
        match self.next() {
            Some(Tok::Word(w)) => Ok(w),
            t => {
                self.i -= 1;
                self.err(format!("expected a word, found {t:?}"))
            }
        }
    }
    /// Skips the rest of the current source line (directives without a semicolon).
    fn skip_line(&mut self) {
        let l = self.t[self.i - 1].1;
        while self.i < self.t.len() && self.t[self.i].1 == l {
            self.i += 1;
        }
    }
    fn skip_to_semicolon(&mut self) {
        while let Some(t) = self.next() {
            if t == Tok::P(';') {
                break;
            }
        }
    }
    fn skip_braces(&mut self) -> Result<(), ParseError> {
        while !self.is_p('{') {
            if self.next().is_none() {
                return self.err("unterminated section");
            }
        }
        let mut depth = 0;
        while let Some(t) = self.next() {
            match t {
                Tok::P('{') => depth += 1,
                Tok::P('}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        self.err("unbalanced braces")
    }
}

fn parse_int(w: &str) -> Option<i128> {
    let w = w.strip_suffix('U').unwrap_or(w);
    if let Some(h) = w.strip_prefix("0x").or_else(|| w.strip_prefix("0X")) {
        i128::from_str_radix(h, 16).ok()
    } else if w.len() > 1 && w.starts_with('0') && w.bytes().all(|c| c.is_ascii_digit()) {
        i128::from_str_radix(&w[1..], 8).ok()
    } else {
        w.parse().ok()
    }
}

/// A variable declaration after its state space: `.align N .b8 name[SIZE]` (or `name` of the type's size).
fn var_decl(p: &mut P, space: &str) -> Result<VarDecl, ParseError> {
    let mut align = 1;
    let mut elem = 1u64;
    loop {
        let w = p.word()?;
        match w.as_str() {
            ".align" => {
                let n = p.word()?;
                align =
                    parse_int(&n).ok_or_else(|| ParseError { line: p.line(), what: format!("bad align {n}") })? as u64;
            }
            ".b8" | ".u8" | ".s8" => elem = 1,
            ".b16" | ".u16" | ".s16" | ".f16" => elem = 2,
            ".b32" | ".u32" | ".s32" | ".f32" => elem = 4,
            ".b64" | ".u64" | ".s64" | ".f64" => elem = 8,
            ".v2" | ".v4" | ".extern" | ".visible" => {}
            name if !name.starts_with('.') => {
                let mut bytes = Some(elem);
                if p.is_p('[') {
                    p.next();
                    if p.is_p(']') {
                        bytes = None;
                    } else {
                        let n = p.word()?;
                        bytes = Some(elem * parse_int(&n).unwrap_or(0) as u64);
                    }
                    p.expect_p(']')?;
                }
                // Initialisers (`= {...}`) only on module constants, which our kernels do not read.
                p.skip_to_semicolon();
                return Ok(VarDecl { space: space.to_string(), name: name.to_string(), align, bytes });
            }
            _ => return p.err(format!("unexpected {w} in a {space} declaration")),
        }
    }
}

fn operand(p: &mut P) -> Result<Operand, ParseError> {
    match p.next() {
        Some(Tok::P('[')) => {
            let mut base = None;
            let mut off: i64 = 0;
            let mut sign = 1i64;
            loop {
                match p.next() {
                    Some(Tok::P(']')) => break,
                    Some(Tok::P('+')) => sign = 1,
                    Some(Tok::P('-')) => sign = -sign,
                    Some(Tok::Word(w)) => {
                        if let Some(n) = parse_int(&w) {
                            off += sign * n as i64;
                        } else {
                            base = Some(w);
                        }
                        sign = 1;
                    }
                    t => return p.err(format!("bad address token {t:?}")),
                }
            }
            Ok(Operand::Addr(base, off))
        }
        Some(Tok::P('{')) => {
            let mut v = Vec::new();
            loop {
                v.push(operand(p)?);
                match p.next() {
                    Some(Tok::P(',')) => continue,
                    Some(Tok::P('}')) => break,
                    t => return p.err(format!("bad vector token {t:?}")),
                }
            }
            Ok(Operand::Vec(v))
        }
        Some(Tok::P('!')) => Ok(Operand::Not(p.word()?)),
        Some(Tok::P('-')) => match operand(p)? {
            Operand::Int(n) => Ok(Operand::Int(-n)),
            o => p.err(format!("cannot negate {o:?}")),
        },
        Some(Tok::Word(w)) => {
            if w == "_" {
                return Ok(Operand::Sink);
            }
            if p.is_p('|') {
                p.next();
                let q = p.word()?;
                return Ok(Operand::Pair(w, q));
            }
            let lower = w.to_ascii_lowercase();
            if (lower.starts_with("0f") && w.len() == 10) || (lower.starts_with("0d") && w.len() == 18) {
                let bits = u64::from_str_radix(&w[2..], 16)
                    .map_err(|_| ParseError { line: p.line(), what: format!("bad float {w}") })?;
                return Ok(if lower.starts_with("0f") { Operand::F32(bits as u32) } else { Operand::F64(bits) });
            }
            if w.as_bytes()[0].is_ascii_digit() {
                return parse_int(&w)
                    .map(Operand::Int)
                    .ok_or_else(|| ParseError { line: p.line(), what: format!("bad number {w}") });
            }
            // `sym+off` outside brackets (mov of a symbol's address plus a constant) is not emitted for us.
            Ok(Operand::Name(w))
        }
        t => {
            p.i -= 1;
            p.err(format!("unexpected operand token {t:?}"))
        }
    }
}

fn body(p: &mut P) -> Result<Vec<Stmt>, ParseError> {
    let mut out = Vec::new();
    let mut depth = 0;
    loop {
        let line = p.line();
        match p.next() {
            None => return p.err("unterminated kernel body"),
            Some(Tok::P('{')) => {
                depth += 1;
                out.push(Stmt::Open);
            }
            Some(Tok::P('}')) => {
                if depth == 0 {
                    return Ok(out);
                }
                depth -= 1;
                out.push(Stmt::Close);
            }
            Some(Tok::P('@')) => {
                let neg = if p.is_p('!') {
                    p.next();
                    true
                } else {
                    false
                };
                let g = p.word()?;
                let mut ins = instr(p, line)?;
                ins.guard = Some((g, neg));
                out.push(Stmt::Instr(ins));
            }
            Some(Tok::Word(w)) if w.starts_with('.') => match w.as_str() {
                ".loc" => {
                    let file = p.word()?;
                    let l = p.word()?;
                    p.loc = (parse_int(&file).unwrap_or(0) as u32, parse_int(&l).unwrap_or(0) as u32);
                    p.skip_line();
                }
                ".pragma" => p.skip_to_semicolon(),
                ".reg" => {
                    let ty = p.word()?;
                    let mut names = Vec::new();
                    let ty = if ty == ".v2" || ty == ".v4" { return p.err("vector registers") } else { ty };
                    loop {
                        let n = p.word()?;
                        let mut count = None;
                        if p.is_p('<') {
                            p.next();
                            count = Some(parse_int(&p.word()?).unwrap_or(0) as u32);
                            p.expect_p('>')?;
                        }
                        names.push((n, count));
                        match p.next() {
                            Some(Tok::P(',')) => continue,
                            Some(Tok::P(';')) => break,
                            t => return p.err(format!("bad .reg token {t:?}")),
                        }
                    }
                    out.push(Stmt::Reg { ty, names });
                }
                ".local" | ".shared" => out.push(Stmt::Var(var_decl(p, &w)?)),
                _ => return p.err(format!("unsupported directive {w} in a kernel body")),
            },
            Some(Tok::Word(w)) => {
                if p.is_p(':') {
                    p.next();
                    out.push(Stmt::Label(w));
                } else {
                    p.i -= 1;
                    out.push(Stmt::Instr(instr(p, line)?));
                }
            }
            Some(t) => return p.err(format!("unexpected {t:?}")),
        }
    }
}

fn instr(p: &mut P, line: u32) -> Result<Instr, ParseError> {
    let opcode = p.word()?;
    let mut operands = Vec::new();
    if !p.is_p(';') {
        loop {
            operands.push(operand(p)?);
            match p.next() {
                Some(Tok::P(',')) => continue,
                Some(Tok::P(';')) => break,
                t => return p.err(format!("bad operand list token {t:?} in {opcode}")),
            }
        }
    } else {
        p.next();
    }
    Ok(Instr { guard: None, opcode, operands, line, loc: p.loc })
}

/// Parses a PTX module.
pub fn parse(text: &str) -> Result<Module, ParseError> {
    let mut p = P { t: tokenize(text)?, i: 0, loc: (0, 0) };
    let mut m = Module::default();
    while let Some(t) = p.next() {
        let w = match t {
            Tok::Word(w) => w,
            Tok::P(';') => continue,
            t => return p.err(format!("unexpected {t:?} at module level")),
        };
        match w.as_str() {
            ".version" | ".target" | ".address_size" => p.skip_line(),
            ".file" => {
                let n = parse_int(&p.word()?).unwrap_or(0) as u32;
                if let Some(Tok::Str(s)) = p.peek().cloned() {
                    m.files.insert(n, s);
                }
                p.skip_line();
            }
            ".section" => p.skip_braces()?,
            ".extern" | ".visible" | ".weak" => {}
            ".shared" | ".global" | ".const" => m.vars.push(var_decl(&mut p, &w)?),
            ".func" => {
                // A device function (not inlined): declarations are skipped; a body is an error when reached.
                while !p.is_p(';') && !p.is_p('{') {
                    p.next();
                }
                if p.is_p('{') {
                    p.skip_braces()?;
                } else {
                    p.next();
                }
            }
            ".entry" => {
                let line = p.line();
                let name = p.word()?;
                let mut params = Vec::new();
                p.expect_p('(')?;
                while !p.is_p(')') {
                    if p.word()? != ".param" {
                        return p.err("expected .param");
                    }
                    let d = var_decl_until(&mut p)?;
                    params.push(d);
                    if p.is_p(',') {
                        p.next();
                    }
                }
                p.expect_p(')')?;
                // Performance directives (.maxntid, .minnctapersm, .maxnreg, ...) up to the body.
                while !p.is_p('{') {
                    if p.next().is_none() {
                        return p.err("kernel without body");
                    }
                }
                p.next();
                let body = body(&mut p)?;
                m.kernels.push(Kernel { name, line, params, body });
            }
            _ => return p.err(format!("unsupported module-level {w}")),
        }
    }
    Ok(m)
}

/// A `.param` declaration inside the parameter list (ends at ',' or ')', not ';').
fn var_decl_until(p: &mut P) -> Result<Param, ParseError> {
    let mut align = 1;
    let mut elem = 1;
    loop {
        let w = p.word()?;
        match w.as_str() {
            ".align" => align = parse_int(&p.word()?).unwrap_or(1) as u64,
            ".b8" | ".u8" | ".s8" => elem = 1,
            ".b16" | ".u16" | ".s16" => elem = 2,
            ".b32" | ".u32" | ".s32" | ".f32" => elem = 4,
            ".b64" | ".u64" | ".s64" | ".f64" => elem = 8,
            ".ptr" | ".global" | ".shared" | ".const" | ".local" => {}
            name if !name.starts_with('.') => {
                let mut bytes = elem;
                if p.is_p('[') {
                    p.next();
                    bytes = elem * parse_int(&p.word()?).unwrap_or(0) as u64;
                    p.expect_p(']')?;
                }
                return Ok(Param { name: name.to_string(), align, bytes });
            }
            _ => return p.err(format!("unexpected {w} in a parameter")),
        }
    }
}
