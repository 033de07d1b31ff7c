//! The `fused-attn` binary end to end: bad flags and shapes give one-line typed errors and the right exit
//! status (never a panic), `run` on the emulator prints a valid JSON row, `--dump` writes .npy files with
//! the documented names, dtypes and shapes, `--backend gpu` without a GPU names what is missing, and
//! `report --quick --json` prints only passing JSON rows.

use std::path::Path;
use std::process::{Command, Output};

fn fused_attn(args: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fused-attn"))
        .args(args.split_whitespace())
        .output()
        .expect("the fused-attn binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

// ---------------------------------------------------------------------------------------------- a tiny JSON
// parser (the crate has no JSON dependency): enough to check that every row is valid JSON and read fields.

#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v).unwrap_or_else(|| panic!("no {key}")),
            _ => panic!("not an object"),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser { s: text.as_bytes(), i: 0 };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing characters at {}", p.i));
        }
        Ok(v)
    }
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }
    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        let c = *self.s.get(self.i).ok_or("unexpected end")?;
        match c {
            b'n' if self.eat("null") => Ok(Json::Null),
            b't' if self.eat("true") => Ok(Json::Bool(true)),
            b'f' if self.eat("false") => Ok(Json::Bool(false)),
            b'"' => self.string().map(Json::Str),
            b'[' => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.eat("]") {
                    return Ok(Json::Arr(v));
                }
                loop {
                    v.push(self.value()?);
                    self.ws();
                    if self.eat("]") {
                        return Ok(Json::Arr(v));
                    }
                    if !self.eat(",") {
                        return Err(format!("expected , or ] at {}", self.i));
                    }
                }
            }
            b'{' => {
                self.i += 1;
                let mut kv = Vec::new();
                self.ws();
                if self.eat("}") {
                    return Ok(Json::Obj(kv));
                }
                loop {
                    self.ws();
                    let k = self.string()?;
                    self.ws();
                    if !self.eat(":") {
                        return Err(format!("expected : at {}", self.i));
                    }
                    kv.push((k, self.value()?));
                    self.ws();
                    if self.eat("}") {
                        return Ok(Json::Obj(kv));
                    }
                    if !self.eat(",") {
                        return Err(format!("expected , or }} at {}", self.i));
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                // JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
                let start = self.i;
                self.eat("-");
                let digits = |p: &mut Self| {
                    let s = p.i;
                    while p.i < p.s.len() && p.s[p.i].is_ascii_digit() {
                        p.i += 1;
                    }
                    p.i - s
                };
                let int_start = self.i;
                if digits(self) == 0 || (self.s[int_start] == b'0' && self.i - int_start > 1) {
                    return Err(format!("bad number at {start}"));
                }
                if self.eat(".") && digits(self) == 0 {
                    return Err(format!("bad fraction at {start}"));
                }
                if self.eat("e") || self.eat("E") {
                    let _ = self.eat("+") || self.eat("-");
                    if digits(self) == 0 {
                        return Err(format!("bad exponent at {start}"));
                    }
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
                text.parse().map(Json::Num).map_err(|e| format!("{text}: {e}"))
            }
            _ => Err(format!("unexpected '{}' at {}", c as char, self.i)),
        }
    }
    fn string(&mut self) -> Result<String, String> {
        if !self.eat("\"") {
            return Err(format!("expected string at {}", self.i));
        }
        let mut out = String::new();
        loop {
            let c = *self.s.get(self.i).ok_or("unterminated string")?;
            self.i += 1;
            match c {
                b'"' => return Ok(out),
                b'\\' => {
                    let e = *self.s.get(self.i).ok_or("bad escape")?;
                    self.i += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e as char),
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hex = std::str::from_utf8(&self.s[self.i..self.i + 4]).map_err(|e| e.to_string())?;
                            self.i += 4;
                            out.push(
                                char::from_u32(u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?).unwrap_or('?'),
                            );
                        }
                        _ => return Err("bad escape".into()),
                    }
                }
                c if c < 0x20 => return Err("control character in string".into()),
                _ => {
                    // Copy the whole UTF-8 sequence.
                    let start = self.i - 1;
                    while self.i < self.s.len() && (self.s[self.i] & 0xc0) == 0x80 {
                        self.i += 1;
                    }
                    out.push_str(std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?);
                }
            }
        }
    }
}

const ROW_FIELDS: [&str; 18] = [
    "op",
    "backend",
    "dtype",
    "head_dim",
    "batch",
    "heads_q",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
    "causal",
    "page_size",
    "max_abs_err",
    "rel_l2_err",
    "tolerance",
    "passed",
    "ms",
    "tflops",
    "gbps",
];

fn json_rows(o: &Output) -> Vec<Json> {
    stdout(o)
        .lines()
        .map(|l| Parser::parse(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .inspect(|row| {
            for f in ROW_FIELDS {
                row.get(f);
            }
        })
        .collect()
}

fn assert_one_line_error(o: &Output, code: i32, contains: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "want one stderr line, got: {err}");
    assert!(err.starts_with("fused-attn: ") && err.contains(contains), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn json_parser_accepts_and_rejects() {
    assert!(Parser::parse(r#"{"a":[1,-2.5e-3,true,null,"x\"y"]}"#).is_ok());
    for bad in ["{\"a\":NaN}", "{\"a\":inf}", "{\"a\":1,}", "[01]", "{\"a\":1.}"] {
        assert!(Parser::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn bad_flags_are_usage_errors() {
    for (args, msg) in [
        ("", "usage:"),
        ("frobnicate", "unknown verb"),
        ("run --wat", "unknown flag '--wat'"),
        ("run --head-dim", "--head-dim needs a value"),
        ("run --head-dim x", "'x' is not a non-negative integer"),
        ("run --batch -1", "'-1' is not a non-negative integer"),
        ("run --dtype fp8", "--dtype must be fp16 or bf16"),
        ("run --op sort", "--op must be prefill or decode"),
        ("run --backend tpu", "--backend must be gpu, emu or auto"),
        ("report --dump /tmp/x", "--dump applies to `run` only"),
    ] {
        assert_one_line_error(&fused_attn(args), 2, msg);
    }
}

#[test]
fn bad_shapes_are_typed_errors() {
    let o = fused_attn("run --backend emu --head-dim 100 --seqlen-q 16");
    assert_one_line_error(&o, 1, "Unsupported error: q: head dim 100");
    let o = fused_attn("run --backend emu --heads 6 --kv-heads 4 --seqlen-q 16");
    assert_one_line_error(&o, 1, "Shape error: q: 6 query heads are not a positive multiple of k's 4 KV heads");
    let o = fused_attn("run --backend emu --op decode --head-dim 100 --seqlen-k 16");
    assert_one_line_error(&o, 1, "Unsupported error: ");
    let o = fused_attn("run --backend emu --op decode --page-size 48 --seqlen-k 16");
    assert_one_line_error(&o, 1, "Unsupported error: k_cache: page size 48");
    let o = fused_attn("run --backend emu --op decode --page-size 0 --seqlen-k 16");
    assert_one_line_error(&o, 1, "Unsupported error: page_size: 0");
    let o = fused_attn("run --backend emu --seqlen-q 100000000 --heads 1000");
    assert_one_line_error(&o, 1, "more than the runner builds");
}

#[test]
fn run_emulated_prefill_and_decode_print_a_passing_json_row() {
    for (args, op) in [
        ("run --backend emu --op prefill --causal --heads 8 --kv-heads 2 --seqlen-q 70 --seqlen-k 100 --head-dim 64", "prefill"),
        ("run --backend emu --op prefill --dtype fp16 --batch 2 --heads 4 --seqlen-q 33 --head-dim 128", "prefill"),
        ("run --backend emu --op decode --dtype fp16 --heads 8 --kv-heads 2 --seqlen-k 100 --batch 3 --page-size 8 --num-splits 2", "decode"),
    ] {
        let o = fused_attn(&format!("{args} --json --seed 5"));
        assert_eq!(o.status.code(), Some(0), "{args}: {}", stderr(&o));
        let rows = json_rows(&o);
        assert_eq!(rows.len(), 1, "{args}");
        let r = &rows[0];
        assert_eq!(r.get("op"), &Json::Str(op.into()));
        assert_eq!(r.get("backend"), &Json::Str("emu".into()));
        assert_eq!(r.get("passed"), &Json::Bool(true), "{args}: {r:?}");
        for t in ["ms", "tflops", "gbps"] {
            assert_eq!(r.get(t), &Json::Null, "{args}: emulation is not timed");
        }
        assert!(matches!(r.get("max_abs_err"), Json::Num(x) if *x >= 0.0));
        assert_eq!(r.get("seed"), &Json::Num(5.0));
    }
    // The table form: a header and one PASS line.
    let o = fused_attn("run --backend emu --seqlen-q 20 --heads 2 --head-dim 64");
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0));
    assert!(out.lines().next().is_some_and(|l| l.starts_with("op ")), "{out}");
    assert!(out.lines().nth(1).is_some_and(|l| l.contains("PASS")), "{out}");
}

/// Reads a .npy header: (descr, shape), and checks the file length against them.
fn npy_header(path: &Path) -> (String, Vec<usize>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..8], b"\x93NUMPY\x01\x00", "{}", path.display());
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    assert_eq!((10 + hlen) % 64, 0);
    let h = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(h.contains("'fortran_order': False"), "{h}");
    let descr = h.split("'descr': '").nth(1).unwrap().split('\'').next().unwrap().to_string();
    let shape_txt = h.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape: Vec<usize> =
        shape_txt.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    let item = match descr.as_str() {
        "<f2" => 2,
        "<f4" | "<i4" => 4,
        d => panic!("unexpected descr {d}"),
    };
    assert_eq!(b.len() - 10 - hlen, item * shape.iter().product::<usize>(), "{}", path.display());
    (descr, shape)
}

#[test]
fn dump_writes_every_tensor_as_npy() {
    let dir = std::env::temp_dir().join(format!("fa-runner-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let p = dir.join("prefill");
    let o = fused_attn(&format!(
        "run --backend emu --op prefill --dtype fp16 --causal --batch 2 --heads 4 --kv-heads 2 --seqlen-q 50 \
         --seqlen-k 70 --head-dim 64 --json --dump {}",
        p.display()
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for (name, descr, shape) in [
        ("q", "<f2", vec![2, 50, 4, 64]),
        ("k", "<f2", vec![2, 70, 2, 64]),
        ("v", "<f2", vec![2, 70, 2, 64]),
        ("out", "<f2", vec![2, 50, 4, 64]),
        ("lse", "<f4", vec![2, 4, 50]),
    ] {
        assert_eq!(npy_header(&p.join(format!("{name}.npy"))), (descr.to_string(), shape), "{name}");
    }
    let d = dir.join("decode");
    let o = fused_attn(&format!(
        "run --backend emu --op decode --dtype bf16 --batch 3 --heads 8 --kv-heads 2 --seqlen-k 37 --head-dim 64 \
         --page-size 8 --json --dump {}",
        d.display()
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // 37 tokens in pages of 8: 5 pages per sequence, a spare table column, the null page and two spares.
    for (name, descr, shape) in [
        ("q", "<f4", vec![3, 8, 64]),
        ("k", "<f4", vec![3, 37, 2, 64]),
        ("v", "<f4", vec![3, 37, 2, 64]),
        ("out", "<f4", vec![3, 8, 64]),
        ("lse", "<f4", vec![3, 8]),
        ("k_cache", "<f4", vec![18, 8, 2, 64]),
        ("v_cache", "<f4", vec![18, 8, 2, 64]),
        ("block_table", "<i4", vec![3, 6]),
        ("seq_lens", "<i4", vec![3]),
    ] {
        assert_eq!(npy_header(&d.join(format!("{name}.npy"))), (descr.to_string(), shape), "{name}");
    }
    // seq_lens holds the context length; the bf16 values are exactly representable (low 16 bits zero).
    let lens = std::fs::read(d.join("seq_lens.npy")).unwrap();
    assert_eq!(&lens[lens.len() - 12..], [37i32, 37, 37].map(i32::to_le_bytes).concat().as_slice());
    let q = std::fs::read(d.join("q.npy")).unwrap();
    assert!(q[128..].chunks(4).all(|c| c[0] == 0 && c[1] == 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpu_backend_without_a_gpu_names_what_is_missing() {
    if fused_attn::device::cuda_context(0).is_ok() {
        eprintln!("a GPU is present: the missing-GPU message is not checked here");
        return;
    }
    let o = fused_attn("run --backend gpu --seqlen-q 16");
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(0));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("NoDriver error") || err.contains("NoDevice error") || err.contains("Arch error"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // `auto` falls back to the emulator.
    let o = fused_attn("run --backend auto --seqlen-q 16 --heads 2 --head-dim 64 --json");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json_rows(&o)[0].get("backend"), &Json::Str("emu".into()));
}

#[test]
fn quick_emulated_report_is_all_passing_json() {
    let dir = std::env::temp_dir().join(format!("fa-runner-plot-{}", std::process::id()));
    let o = fused_attn(&format!("report --backend emu --quick --json --plot {}", dir.display()));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = json_rows(&o);
    assert!(rows.len() >= 10, "{} rows", rows.len());
    for r in &rows {
        assert_eq!(r.get("passed"), &Json::Bool(true), "{r:?}");
        assert_eq!(r.get("ms"), &Json::Null);
    }
    for op in ["prefill", "decode"] {
        assert!(rows.iter().any(|r| r.get("op") == &Json::Str(op.into())), "no {op} rows");
    }
    // No timed rows on the emulator: no plots, and a note saying so.
    assert!(!dir.join("prefill.png").exists());
    assert!(stderr(&o).contains("no plots"), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("{} passed / 0 failed", rows.len())), "{}", stderr(&o));
}
