//! Where rows go: a table (header, aligned lines, a summary) or JSON lines on stdout; notes go to stdout in
//! table mode and to stderr with `--json` (so stdout is only JSON). Every row is stamped with where and when
//! it ran, and kept for the plots and the summary. A closed stdout (e.g. `| head`) ends the program quietly
//! instead of panicking.

use std::io::Write;

use crate::progress::Progress;
use crate::row::Row;

/// Where and when this command ran; copied into every row.
#[derive(Clone, Debug)]
pub struct RunInfo {
    pub device: String,
    pub commit: String,
    pub date: String,
}

pub struct Output {
    json: bool,
    /// Whether the table has the timing columns (a backend that times: a GPU; not the emulator).
    timing: bool,
    header_done: bool,
    info: RunInfo,
    progress: Progress,
    pub rows: Vec<Row>,
}

/// What `pass*` means, printed under a table (or to stderr with `--json`) that has one.
pub const PASS_STAR: &str = "pass* = passed, checked against the fp64 reference on sampled query rows (256 for \
`run`, 32 for timed rows), not every row: the shape is above 2^31 multiply-adds (\"check\":\"sampled\" in JSON)";

impl Output {
    pub fn new(json: bool, info: RunInfo) -> Self {
        Self { json, timing: true, header_done: false, info, progress: Progress::hidden(), rows: Vec::new() }
    }

    /// Drops the table's timing columns (ms, TFLOPS, GB/s, %copy) when `timing` is false: a backend that
    /// only checks, like the emulator, would show `-` in all of them. JSON rows keep every field.
    pub fn set_timing(&mut self, timing: bool) {
        self.timing = timing;
    }

    /// Lines printed from now on clear and redraw `progress` around themselves.
    pub fn set_progress(&mut self, progress: Progress) {
        self.progress = progress;
    }

    fn line(&self, s: &str) {
        self.progress.suspend(|| {
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{s}").and_then(|_| out.flush()).is_err() {
                std::process::exit(141); // SIGPIPE convention
            }
        });
    }

    pub fn note(&mut self, s: &str) {
        if self.json {
            self.progress.suspend(|| eprintln!("{s}"));
        } else {
            self.line(s);
        }
    }

    pub fn row(&mut self, mut row: Row) {
        row.device.clone_from(&self.info.device);
        row.commit.clone_from(&self.info.commit);
        row.date.clone_from(&self.info.date);
        if self.json {
            self.line(&row.json());
        } else {
            if !self.header_done {
                self.line(&Row::header(self.timing));
                self.header_done = true;
            }
            self.line(&row.table_line_with(self.timing));
        }
        self.rows.push(row);
    }

    pub fn failed(&self) -> usize {
        self.rows.iter().filter(|r| r.passed == Some(false)).count()
    }

    fn sampled_passes(&self) -> usize {
        self.rows.iter().filter(|r| r.passed == Some(true) && r.check.as_deref() == Some("sampled")).count()
    }

    /// The `pass*` legend, when a row shows it.
    pub fn legend(&mut self) {
        if self.sampled_passes() > 0 {
            self.note(PASS_STAR);
        }
    }

    /// "N passed / M failed" (and timing-only rows), to stdout for a table, stderr for JSON.
    pub fn summary(&mut self) {
        let passed = self.rows.iter().filter(|r| r.passed == Some(true)).count();
        let sampled = self.sampled_passes();
        let unchecked = self.rows.iter().filter(|r| r.passed.is_none()).count();
        let mut s = format!("{passed} passed / {} failed", self.failed());
        if sampled > 0 {
            s += &format!(" ({sampled} of the passes on sampled rows, marked pass*)");
        }
        if unchecked > 0 {
            s += &format!("; {unchecked} timing-only rows");
        }
        self.note(&s);
        self.legend();
    }
}
