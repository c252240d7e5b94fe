//! Progress of long commands: a bar on stderr when stderr is a terminal (`indicatif`), one
//! plain line per step otherwise (logs and CI keep a readable record).

use std::cell::Cell;
use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use wasmctrl::reload::CheckProgress;

/// The progress of `wasmctrl check`: which plugin is being checked, and how many of how many.
pub struct CheckDisplay {
    bar: Option<ProgressBar>,
    planned: Cell<usize>,
    done: Cell<usize>,
}

impl CheckDisplay {
    /// A bar on a terminal's stderr, plain lines elsewhere.
    pub fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{spinner} checking [{pos}/{len}] {wide_msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        CheckDisplay { bar, planned: Cell::new(0), done: Cell::new(0) }
    }

    /// Removes the bar (before the report is printed).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl CheckProgress for CheckDisplay {
    fn planned(&self, count: usize) {
        self.planned.set(self.planned.get() + count);
        if let Some(bar) = &self.bar {
            bar.inc_length(count as u64);
        }
    }

    fn started(&self, toml: &Path) {
        let name =
            toml.file_stem().map_or_else(|| toml.display().to_string(), |s| s.to_string_lossy().into_owned());
        match &self.bar {
            Some(bar) => bar.set_message(format!("{name} ({})", toml.display())),
            None => eprintln!(
                "check: [{}/{}] {name} ({})",
                self.done.get() + 1,
                self.planned.get().max(self.done.get() + 1),
                toml.display()
            ),
        }
    }

    fn finished(&self, _toml: &Path) {
        self.done.set(self.done.get() + 1);
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }
}
