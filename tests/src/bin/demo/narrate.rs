//! How the demo talks: numbered steps, time-stamped lines and indented details on stdout, flushed at once so
//! a pipe (the demo's test, `| tee`) sees them as they happen. Only this module prints the story.

use std::io::Write;
use std::time::{Duration, Instant};

/// Prints the story, each line stamped with the time since the demo started.
#[derive(Debug)]
pub struct Narrator {
    started: Instant,
}

impl Narrator {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
        }
    }

    /// Time since the demo started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// A step heading.
    pub fn step(&self, title: &str) {
        emit(&format!("\n== {title}"));
    }

    /// A time-stamped line: something the demo did or saw.
    pub fn say(&self, text: &str) {
        emit(&format!(
            "[{:>6.1}s] {text}",
            self.started.elapsed().as_secs_f64()
        ));
    }

    /// An indented detail under the last line (each line of `text` indented).
    pub fn detail(&self, text: &str) {
        for line in text.lines() {
            emit(&format!("          {line}"));
        }
    }

    /// A command the demo runs, shown as a shell line.
    pub fn command(&self, text: &str) {
        emit(&format!("          $ {text}"));
    }
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `12.3 s`-style text for the story's "after …"; under a second in milliseconds (`40 ms`), which a tenth of
/// a second would round to nothing.
pub fn seconds(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        format!("{} ms", duration.as_millis())
    } else {
        format!("{:.1} s", duration.as_secs_f64())
    }
}
