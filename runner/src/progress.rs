//! Progress on stderr while long work runs (an emulated report takes ~30 s, one large emulated `run` can
//! take minutes): `report` shows a `[12/440] <last case> (elapsed, ETA)` counter, `run` the stage it is in
//! with its elapsed time. Drawn only when stderr is a terminal (indicatif hides it otherwise, and under
//! TERM=dumb), so logs, pipes and `--json` consumers see nothing extra. Output lines printed while a bar is
//! shown go through [`Progress::suspend`] so the bar never tears them.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Clone)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A counter over `total` items: `[pos/len] message (elapsed, ETA)`.
    pub fn counter(total: usize, what: &str) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("[{pos:>3}/{len}] {prefix} {wide_msg} ({elapsed}, ETA {eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(250));
        Self { bar }
    }

    /// A spinner for one long task: `message (elapsed)`.
    pub fn stages() -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {wide_msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(250));
        Self { bar }
    }

    /// Nothing drawn (e.g. while no work is running).
    pub fn hidden() -> Self {
        Self { bar: ProgressBar::hidden() }
    }

    pub fn message(&self, msg: impl Into<String>) {
        self.bar.set_message(msg.into());
    }

    pub fn inc(&self) {
        self.bar.inc(1);
    }

    /// Runs `f` (which prints) with the bar cleared, then redraws it.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Clears the bar for good.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
