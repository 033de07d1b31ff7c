//! Where rows go: a table (header, aligned lines, a summary) or JSON lines on stdout; notes go to stdout in
//! table mode and to stderr with `--json` (so stdout is only JSON). Rows are kept for the plots and the
//! summary. A closed stdout (e.g. `| head`) ends the program quietly instead of panicking.

use std::io::Write;

use crate::row::Row;

pub struct Output {
    json: bool,
    header_done: bool,
    pub rows: Vec<Row>,
}

impl Output {
    pub fn new(json: bool) -> Self {
        Self { json, header_done: false, rows: Vec::new() }
    }

    fn line(s: &str) {
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{s}").and_then(|_| out.flush()).is_err() {
            std::process::exit(141); // SIGPIPE convention
        }
    }

    pub fn note(&mut self, s: &str) {
        if self.json {
            eprintln!("{s}");
        } else {
            Self::line(s);
        }
    }

    pub fn row(&mut self, row: Row) {
        if self.json {
            Self::line(&row.json());
        } else {
            if !self.header_done {
                Self::line(Row::HEADER);
                self.header_done = true;
            }
            Self::line(&row.table_line());
        }
        self.rows.push(row);
    }

    pub fn failed(&self) -> usize {
        self.rows.iter().filter(|r| r.passed == Some(false)).count()
    }

    /// "N passed / M failed" (and timing-only rows), to stdout for a table, stderr for JSON.
    pub fn summary(&mut self) {
        let passed = self.rows.iter().filter(|r| r.passed == Some(true)).count();
        let sampled = self.rows.iter().filter(|r| r.passed == Some(true) && r.check == Some("sampled")).count();
        let unchecked = self.rows.iter().filter(|r| r.passed.is_none()).count();
        let mut s = format!("{passed} passed / {} failed", self.failed());
        if sampled > 0 {
            s += &format!(" ({sampled} of the passes on sampled rows, marked pass*)");
        }
        if unchecked > 0 {
            s += &format!("; {unchecked} timing-only rows");
        }
        self.note(&s);
    }
}
