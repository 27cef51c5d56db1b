//! The results: one [`Row`] per metric — Windvane's figure, the baseline measured in the same run, their
//! ratio, the goal and whether it was met — printed as one table and written as JSON.

use std::fmt::Write as _;

use serde_json::{Value, json};

/// What a figure measures, for formatting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Seconds,
    Millis,
    MiB,
    /// A plain count (requests, writes).
    Count,
    /// Requests per managed object per hour.
    PerObjectHour,
    /// Megabytes (10^6 bytes) per second.
    MBps,
    /// Requests (or heartbeats) per second.
    PerSecond,
    Micros,
    /// CPU seconds per second.
    Cores,
}

impl Unit {
    fn suffix(self) -> &'static str {
        match self {
            Self::Seconds => "s",
            Self::Millis => "ms",
            Self::MiB => "MiB",
            Self::Count => "",
            Self::PerObjectHour => "/obj/h",
            Self::MBps => "MB/s",
            Self::PerSecond => "/s",
            Self::Micros => "µs",
            Self::Cores => "cores",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::Seconds => "seconds",
            Self::Millis => "milliseconds",
            Self::MiB => "MiB",
            Self::Count => "count",
            Self::PerObjectHour => "requests per object per hour",
            Self::MBps => "MB/s",
            Self::PerSecond => "per second",
            Self::Micros => "microseconds",
            Self::Cores => "CPU seconds per second",
        }
    }

    /// `value` with its unit, rounded for reading.
    pub fn format(self, value: f64) -> String {
        // Sums of nothing are -0.0 in Rust; print them as 0.
        let value = value + 0.0;
        let number = match self {
            Self::Count | Self::PerSecond => format!("{value:.0}"),
            Self::PerObjectHour => format!("{value:.3}"),
            _ if value.abs() >= 100.0 => format!("{value:.0}"),
            _ if value.abs() >= 10.0 => format!("{value:.1}"),
            _ => format!("{value:.2}"),
        };
        match self.suffix() {
            "" => number,
            suffix => format!("{number} {suffix}"),
        }
    }
}

/// One condition a figure must meet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// Windvane's figure is at most this (in the row's unit).
    AtMost(f64),
    /// Windvane's figure divided by the baseline's is at most this.
    RatioAtMost(f64),
    /// Windvane's figure is at least this (throughput).
    AtLeast(f64),
    /// Windvane's figure divided by the baseline's is at least this (throughput against a baseline).
    RatioAtLeast(f64),
}

impl Goal {
    fn describe(self, unit: Unit) -> String {
        match self {
            Self::AtMost(limit) => format!("≤ {}", unit.format(limit)),
            Self::AtLeast(limit) => format!("≥ {}", unit.format(limit)),
            Self::RatioAtMost(ratio) => format!("≤ {ratio}×"),
            Self::RatioAtLeast(ratio) => format!("≥ {ratio}×"),
        }
    }

    /// Whether the goal holds; `None` when it needs a ratio and there is none.
    fn met(self, value: f64, ratio: Option<f64>) -> Option<bool> {
        match self {
            Self::AtMost(limit) => Some(value <= limit),
            Self::AtLeast(limit) => Some(value >= limit),
            Self::RatioAtMost(limit) => ratio.map(|r| r <= limit),
            Self::RatioAtLeast(limit) => ratio.map(|r| r >= limit),
        }
    }
}

/// The outcome of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Miss,
    /// No goal: reported for context.
    Info,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Miss => "MISS",
            Self::Info => "info",
        }
    }
}

/// One measured metric.
#[derive(Debug, Clone)]
pub struct Row {
    /// The section that measured it (`--only` name).
    pub section: &'static str,
    /// A stable machine-readable key.
    pub key: &'static str,
    /// What is measured, and against what.
    pub metric: String,
    pub unit: Unit,
    pub windvane: f64,
    pub baseline: Option<f64>,
    /// What the baseline is (e.g. `kubectl apply --server-side`).
    pub baseline_name: Option<String>,
    pub goals: Vec<Goal>,
    /// How it was measured, caveats, supporting figures.
    pub note: String,
}

impl Row {
    /// A row without baseline or goal; add them with the builder methods.
    pub fn new(
        section: &'static str,
        key: &'static str,
        metric: &str,
        unit: Unit,
        value: f64,
    ) -> Self {
        Self {
            section,
            key,
            metric: metric.to_owned(),
            unit,
            windvane: value,
            baseline: None,
            baseline_name: None,
            goals: Vec::new(),
            note: String::new(),
        }
    }

    /// The baseline measured in the same run.
    pub fn baseline(mut self, name: &str, value: f64) -> Self {
        self.baseline = Some(value);
        self.baseline_name = Some(name.to_owned());
        self
    }

    /// Adds a goal; all goals of a row must hold for it to pass.
    pub fn goal(mut self, goal: Goal) -> Self {
        self.goals.push(goal);
        self
    }

    /// Sets the note.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    /// Windvane's figure over the baseline's.
    pub fn ratio(&self) -> Option<f64> {
        self.baseline
            .filter(|b| *b != 0.0)
            .map(|b| self.windvane / b)
    }

    /// Pass when every goal holds, Miss when one does not (or cannot be judged), Info without goals.
    pub fn verdict(&self) -> Verdict {
        if self.goals.is_empty() {
            return Verdict::Info;
        }
        let ratio = self.ratio();
        if self
            .goals
            .iter()
            .all(|g| g.met(self.windvane, ratio) == Some(true))
        {
            Verdict::Pass
        } else {
            Verdict::Miss
        }
    }

    fn goal_text(&self) -> String {
        if self.goals.is_empty() {
            return "—".to_owned();
        }
        self.goals
            .iter()
            .map(|g| g.describe(self.unit))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The row as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "section": self.section,
            "key": self.key,
            "metric": self.metric,
            "unit": self.unit.key(),
            "windvane": self.windvane,
            "baseline": self.baseline,
            "baselineName": self.baseline_name,
            "ratio": self.ratio(),
            "goal": self.goal_text(),
            "result": self.verdict().as_str(),
            "note": self.note,
        })
    }
}

/// The table: metric, Windvane, baseline, ratio, goal, result; then the notes, numbered.
pub fn table(rows: &[Row]) -> String {
    let header = ["metric", "Windvane", "baseline", "ratio", "goal", "result"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|row| {
            let baseline = match (&row.baseline, &row.baseline_name) {
                (Some(value), Some(name)) => format!("{} ({name})", row.unit.format(*value)),
                _ => "—".to_owned(),
            };
            [
                row.metric.clone(),
                row.unit.format(row.windvane),
                baseline,
                row.ratio()
                    .map_or_else(|| "—".to_owned(), |r| format!("{r:.2}×")),
                row.goal_text(),
                row.verdict().as_str().to_owned(),
            ]
        })
        .collect();
    let width = |i: usize| {
        cells
            .iter()
            .map(|c| c[i].chars().count())
            .chain([header[i].len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let mut out = String::new();
    let line = |out: &mut String, columns: &[String]| {
        let padded: Vec<String> = columns
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        let _ = writeln!(out, "| {} |", padded.join(" | "));
    };
    line(&mut out, &header.map(str::to_owned));
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    let _ = writeln!(out, "|-{}-|", rule.join("-|-"));
    for row in &cells {
        line(&mut out, row);
    }
    let notes: Vec<&Row> = rows.iter().filter(|r| !r.note.is_empty()).collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\nNotes:");
        for (i, row) in notes.iter().enumerate() {
            let _ = writeln!(out, "  {}. {}: {}", i + 1, row.metric, row.note);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_on_values_and_ratios_decide_the_verdict() {
        let row = Row::new("sync", "k", "m", Unit::Seconds, 2.0)
            .baseline("kubectl", 10.0)
            .goal(Goal::RatioAtMost(0.25));
        assert_eq!(row.ratio(), Some(0.2));
        assert_eq!(row.verdict(), Verdict::Pass);
        let row = Row::new("drift", "k", "m", Unit::Millis, 60.0)
            .baseline("ssa", 10.0)
            .goal(Goal::AtMost(50.0))
            .goal(Goal::RatioAtMost(3.0));
        assert_eq!(row.verdict(), Verdict::Miss);
        let info = Row::new("x", "k", "m", Unit::Count, 1.0);
        assert_eq!(info.verdict(), Verdict::Info);
        assert!(table(&[row, info]).contains("| MISS"));
    }
}
