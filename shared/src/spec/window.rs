//! Maintenance windows: when a new release of an app may apply, as pure functions of the clock.
//!
//! An app in `fleet.yaml` lists `windows:`, modelled on Argo CD's sync windows. Each has a kind (`allow` or
//! `deny`), a 5-field cron `schedule` read in its `timeZone` (default UTC), and a `duration` that each window
//! lasts from every time the schedule matches. Deny windows may also say `heal: report`: inside them drift is
//! reported instead of healed.
//!
//! Where the data comes from and goes: the source loader (`windvane_publisher::source`) parses the windows from
//! `fleet.yaml` and checks them with [`validate_all`]; they are carried, as this module serializes them, in the
//! signed bundle ([`crate::format::bundle`]); the agent judges them against its own clock with [`decide`] and
//! [`heals`], and sets a timer on [`next_change`]. Nothing here reads the clock: every function takes the
//! instant it judges.
//!
//! Semantics: a window is *active* at `now` when its schedule matched at some minute `t` with
//! `t <= now < t + duration` ([`active_until`]). A release may apply when no deny window is active and either
//! there is no allow window or some allow window is active: deny wins over allow.
//!
//! Civil time and daylight saving time: the schedule is matched against the civil (wall-clock) minutes of the
//! window's time zone. A minute that does not exist (skipped when clocks go forward) never matches; a minute
//! that exists twice (repeated when clocks go back) matches only its earlier instance, so a window opens once.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::text::duration::format_duration;
use crate::{Error, Result};

#[cfg(test)]
mod tests;

/// The longest `duration` a window may have.
pub const MAX_DURATION: Duration = Duration::from_secs(31 * 86_400);

/// How far ahead [`next_start`] and [`WindowDecision::Closed::reopens_at`] look, in days.
pub const HORIZON_DAYS: i64 = 366;

const HORIZON: SignedDuration = SignedDuration::from_secs(HORIZON_DAYS * 86_400);

/// How far (in civil time) past `now` a backward search starts: in a fold, a civil minute later than now's
/// may have occurred, in its earlier instance, before `now`. Covers every fold in the tz database (at most 2h).
const FOLD_SLACK: SignedDuration = SignedDuration::from_secs(3 * 3_600);

/// Most successive candidate instants [`decide`] tries when looking for the reopening time.
const MAX_REOPEN_STEPS: usize = 10_000;

/// One maintenance window of an app (`fleet.yaml`: `apps[].windows[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Window {
    /// Whether releases may apply only inside such windows (allow) or never inside them (deny).
    pub kind: WindowKind,
    /// When each window starts, in [`Window::time_zone`].
    pub schedule: Schedule,
    /// How long each window lasts from each start, written like `8h` or `1h30m` (at most [`MAX_DURATION`]).
    #[serde(with = "crate::text::duration::text")]
    pub duration: Duration,
    /// The IANA time zone the schedule is read in, like `Europe/Berlin`.
    #[serde(default = "utc")]
    pub time_zone: String,
    /// Deny windows only: whether drift is healed (the default) or only reported while the window is active.
    #[serde(default)]
    pub heal: HealInWindow,
}

fn utc() -> String {
    "UTC".to_owned()
}

/// Whether a window permits or forbids releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    /// Releases apply only while some allow window is active.
    Allow,
    /// No release applies while the window is active.
    Deny,
}

/// What the agent does about drift while a deny window is active.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealInWindow {
    /// Drift is healed as usual (re-applying the release the cluster already has).
    #[default]
    Heal,
    /// Drift is only reported.
    Report,
}

impl Window {
    /// Checks what deserialization cannot: the time zone resolves, `0 < duration <= 31d`, and `heal: report`
    /// is only on a deny window. Messages name the field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &'static str, value: String, detail: String| Error::InvalidWindow {
            index: None,
            field,
            value,
            detail,
        };
        if TimeZone::get(&self.time_zone).is_err() {
            return Err(invalid(
                "timeZone",
                format!("{:?}", self.time_zone),
                "not a known IANA time zone name (like Europe/Berlin or UTC)".to_owned(),
            ));
        }
        let duration = format_duration(self.duration);
        if self.duration.is_zero() {
            return Err(invalid(
                "duration",
                duration,
                "must be more than 0".to_owned(),
            ));
        }
        if self.duration > MAX_DURATION {
            let detail = format!("must be at most {}", format_duration(MAX_DURATION));
            return Err(invalid("duration", duration, detail));
        }
        if self.kind == WindowKind::Allow && self.heal == HealInWindow::Report {
            return Err(invalid(
                "heal",
                "\"report\"".to_owned(),
                "only a deny window can set heal (drift is healed outside deny windows)".to_owned(),
            ));
        }
        Ok(())
    }

    /// `"0 22 * * 1-5" (Europe/Berlin, 8h)`, as decisions name the window.
    fn describe(&self) -> String {
        format!(
            "{:?} ({}, {})",
            self.schedule.as_str(),
            self.time_zone,
            format_duration(self.duration)
        )
    }

    /// The time zone, or UTC when it does not resolve (which [`Window::validate`] refuses).
    fn zone(&self) -> TimeZone {
        TimeZone::get(&self.time_zone).unwrap_or(TimeZone::UTC)
    }

    /// The duration, capped at [`MAX_DURATION`] (which [`Window::validate`] refuses beyond).
    fn length(&self) -> SignedDuration {
        SignedDuration::try_from(self.duration.min(MAX_DURATION)).unwrap_or(SignedDuration::ZERO)
    }
}

/// [`Window::validate`] for each window, the error naming the window's index (`windows[i].`).
pub fn validate_all(windows: &[Window]) -> Result<()> {
    for (at, window) in windows.iter().enumerate() {
        window.validate().map_err(|error| match error {
            Error::InvalidWindow {
                field,
                value,
                detail,
                ..
            } => Error::InvalidWindow {
                index: Some(at),
                field,
                value,
                detail,
            },
            other => other,
        })?;
    }
    Ok(())
}

// ---- cron schedules ----

/// A parsed 5-field cron expression (`minute hour day-of-month month day-of-week`), which serializes back as
/// the text it was read from.
///
/// Each field takes `*`, numbers, ranges `a-b`, lists `a,b,c`, and steps `*/n`, `a-b/n` and `a/n` (from `a`
/// to the field's maximum). Months may be named `jan`–`dec` and days `sun`–`sat`, in any case; day-of-week 7
/// is Sunday, like 0. As in Vixie cron, when both day-of-month and day-of-week are restricted, a day matches
/// if either does; a field counts as unrestricted only when it is exactly `*` (so `*/2` restricts, as in the
/// cron library Argo CD uses).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Schedule {
    text: String,
    /// Bit `v` is set when value `v` matches, for each field.
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Whether day-of-month / day-of-week are other than `*` (the Vixie cron OR rule).
    days_restricted: bool,
    weekdays_restricted: bool,
}

/// The rules of one cron field.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    /// The highest value `*` and `a/n` reach (6 for day-of-week, whose 7 only repeats Sunday).
    star_max: u32,
    /// Names of the values from `min` on, and what they are called in messages.
    names: &'static [&'static str],
    names_label: &'static str,
}

const MONTH_NAMES: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAY_NAMES: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

const FIELDS: [Field; 5] = [
    Field::numeric("minute", 0, 59),
    Field::numeric("hour", 0, 23),
    Field::numeric("day-of-month", 1, 31),
    Field {
        name: "month",
        min: 1,
        max: 12,
        star_max: 12,
        names: &MONTH_NAMES,
        names_label: "a month name (jan-dec)",
    },
    Field {
        name: "day-of-week",
        min: 0,
        max: 7,
        star_max: 6,
        names: &DAY_NAMES,
        names_label: "a day name (sun-sat)",
    },
];

impl Field {
    /// This field's part of a schedule is not what cron takes.
    fn invalid(&self, detail: String) -> Error {
        Error::CronField {
            field: self.name,
            detail,
        }
    }

    const fn numeric(name: &'static str, min: u32, max: u32) -> Field {
        Field {
            name,
            min,
            max,
            star_max: max,
            names: &[],
            names_label: "",
        }
    }

    /// The bits of a whole field: a comma-separated list of items.
    fn parse(&self, text: &str) -> Result<u64> {
        let mut mask = 0;
        for item in text.split(',') {
            if item.is_empty() {
                return Err(self.invalid(format!("{text:?}: empty list item")));
            }
            mask |= self.parse_item(item)?;
        }
        Ok(mask)
    }

    /// The bits of one item: `*`, `v`, `a-b`, each optionally with `/step`.
    fn parse_item(&self, item: &str) -> Result<u64> {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(self.parse_step(item, step)?)),
            None => (item, None),
        };
        let (low, high) = if range == "*" {
            (self.min, self.star_max)
        } else if let Some((low, high)) = range.split_once('-') {
            let (low, high) = (self.parse_value(item, low)?, self.parse_value(item, high)?);
            if low > high {
                return Err(self.invalid(format!(
                    "{item:?}: range {low}-{high} is reversed (write the lower value first)"
                )));
            }
            (low, high)
        } else {
            let value = self.parse_value(item, range)?;
            (
                value,
                if step.is_some() {
                    self.star_max.max(value)
                } else {
                    value
                },
            )
        };
        let step = step.unwrap_or(1);
        let mut mask = 0;
        let mut value = low;
        while value <= high {
            // Day-of-week 7 is Sunday, bit 0.
            mask |= 1
                << if value == 7 && self.max == 7 {
                    0
                } else {
                    value
                };
            value = value.saturating_add(step);
        }
        Ok(mask)
    }

    fn parse_step(&self, item: &str, step: &str) -> Result<u32> {
        if step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.invalid(format!("{item:?}: step {step:?} is not a number")));
        }
        match step.parse::<u32>() {
            Ok(0) => Err(self.invalid(format!("{item:?}: step must be at least 1"))),
            Ok(step) => Ok(step),
            Err(_) => Err(self.invalid(format!("{item:?}: step {step} is too large"))),
        }
    }

    /// A number in range, or (month, day-of-week) a name.
    fn parse_value(&self, item: &str, token: &str) -> Result<u32> {
        if token.is_empty() {
            return Err(self.invalid(format!("{item:?}: empty value")));
        }
        if let Some(index) = self
            .names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(token))
        {
            return Ok(self.min + index as u32);
        }
        if !token.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.invalid(if self.names.is_empty() {
                format!("{token:?} is not a number")
            } else {
                format!("{token:?} is not a number or {}", self.names_label)
            }));
        }
        match token.parse::<u32>() {
            Ok(value) if (self.min..=self.max).contains(&value) => Ok(value),
            _ => Err(self.invalid(format!("{token} is out of range {}-{}", self.min, self.max))),
        }
    }
}

/// The 5-field equivalent of a cron macro, for the message refusing it.
fn macro_equivalent(text: &str) -> String {
    let fields = match text.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        "@reboot" => return "@reboot has no equivalent: a window needs a time".to_owned(),
        _ => return "write the 5 fields: minute hour day-of-month month day-of-week".to_owned(),
    };
    format!("write {fields:?}")
}

impl Schedule {
    /// Reads a 5-field cron expression. The error names the expression, the field and the problem:
    /// `schedule "0 25 * * *": hour 25 is out of range 0-23`.
    pub fn parse(text: &str) -> Result<Schedule> {
        let fail = |detail: String| Error::InvalidSchedule {
            schedule: text.to_owned(),
            detail,
        };
        let trimmed = text.trim();
        if trimmed.starts_with('@') {
            return Err(fail(format!(
                "macros such as {trimmed} are not supported; {}",
                macro_equivalent(trimmed)
            )));
        }
        let parts: Vec<&str> = trimmed.split_whitespace().collect();
        if parts.len() != FIELDS.len() {
            return Err(fail(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), found {}",
                parts.len()
            )));
        }
        let mut masks = [0u64; 5];
        for ((mask, field), part) in masks.iter_mut().zip(&FIELDS).zip(&parts) {
            *mask = field.parse(part).map_err(|error| fail(error.to_string()))?;
        }
        let [minutes, hours, days, months, weekdays] = masks;
        Ok(Schedule {
            text: text.to_owned(),
            minutes,
            hours,
            days,
            months,
            weekdays,
            days_restricted: parts[2] != "*",
            weekdays_restricted: parts[4] != "*",
        })
    }

    /// The text the schedule was read from.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the schedule matches a civil minute (seconds are ignored).
    pub fn matches(&self, at: DateTime) -> bool {
        self.matches_date(at.date()) && has(self.hours, at.hour()) && has(self.minutes, at.minute())
    }

    /// Whether some minute of `date` may match: month, then day-of-month and day-of-week (Vixie OR rule).
    fn matches_date(&self, date: Date) -> bool {
        if !has(self.months, date.month()) {
            return false;
        }
        let day = has(self.days, date.day());
        let weekday = has(self.weekdays, date.weekday().to_sunday_zero_offset());
        if self.days_restricted && self.weekdays_restricted {
            day || weekday
        } else {
            day && weekday
        }
    }
}

fn has(mask: u64, value: i8) -> bool {
    (0..64).contains(&value) && mask & (1u64 << value) != 0
}

/// The set values of a mask, lowest first.
fn ascending(mask: u64) -> impl Iterator<Item = i8> {
    (0..64i8).filter(move |v| has(mask, *v))
}

/// The set values of a mask, highest first.
fn descending(mask: u64) -> impl Iterator<Item = i8> {
    (0..64i8).rev().filter(move |v| has(mask, *v))
}

impl TryFrom<String> for Schedule {
    type Error = Error;

    fn try_from(text: String) -> Result<Self> {
        Schedule::parse(&text)
    }
}

impl From<Schedule> for String {
    fn from(schedule: Schedule) -> String {
        schedule.text
    }
}

impl FromStr for Schedule {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        Schedule::parse(text)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

// ---- from civil minutes to instants ----

/// The instant a civil minute names in `tz`. A minute in a gap (clocks going forward) does not exist and never
/// matches: None. A minute in a fold (clocks going back) exists twice; only the earlier instance matches, so
/// that each window opens once. Because of that rule, later civil minutes always map to later instants.
fn instant_of(tz: &TimeZone, at: DateTime) -> Option<Timestamp> {
    match tz.to_ambiguous_timestamp(at).offset() {
        AmbiguousOffset::Unambiguous { offset } | AmbiguousOffset::Fold { before: offset, .. } => {
            offset.to_timestamp(at).ok()
        }
        AmbiguousOffset::Gap { .. } => None,
    }
}

fn minute_of(date: Date, hour: i8, minute: i8) -> Option<DateTime> {
    Time::new(hour, minute, 0, 0)
        .ok()
        .map(|time| date.to_datetime(time))
}

/// The first match strictly after `after` and at or before `limit`. Walks civil days, skipping days whose date
/// does not match and hours whose hour does not match; minutes civilly before `after`'s cannot be later
/// instants (see [`instant_of`]) and are skipped too.
fn first_match_after(
    schedule: &Schedule,
    tz: &TimeZone,
    after: Timestamp,
    limit: Timestamp,
) -> Option<Timestamp> {
    let start = tz.to_datetime(after);
    let last_date = tz.to_datetime(limit).date();
    let mut date = start.date();
    while date <= last_date {
        if schedule.matches_date(date) {
            let from = if date == start.date() {
                (start.hour(), start.minute())
            } else {
                (0, 0)
            };
            if let Some(found) = first_in_day(schedule, tz, date, from, after) {
                return (found <= limit).then_some(found);
            }
        }
        date = date.tomorrow().ok()?;
    }
    None
}

/// The first match of `date`, from civil `(hour, minute)` on, that is after `after`.
fn first_in_day(
    schedule: &Schedule,
    tz: &TimeZone,
    date: Date,
    from: (i8, i8),
    after: Timestamp,
) -> Option<Timestamp> {
    for hour in ascending(schedule.hours).filter(|h| *h >= from.0) {
        for minute in ascending(schedule.minutes) {
            if hour == from.0 && minute < from.1 {
                continue;
            }
            let found = minute_of(date, hour, minute).and_then(|at| instant_of(tz, at));
            if let Some(found) = found.filter(|found| *found > after) {
                return Some(found);
            }
        }
    }
    None
}

/// The latest match at or before `now` and strictly after `floor`: the same walk as [`first_match_after`],
/// backwards, starting [`FOLD_SLACK`] civilly past `now`.
fn last_match_between(
    schedule: &Schedule,
    tz: &TimeZone,
    floor: Timestamp,
    now: Timestamp,
) -> Option<Timestamp> {
    let start = tz.to_datetime(now).saturating_add(FOLD_SLACK);
    let first_date = tz.to_datetime(floor).date();
    let mut date = start.date();
    while date >= first_date {
        if schedule.matches_date(date) {
            let upto = if date == start.date() {
                (start.hour(), start.minute())
            } else {
                (23, 59)
            };
            if let Some(found) = last_in_day(schedule, tz, date, upto, now) {
                return (found > floor).then_some(found);
            }
        }
        date = date.yesterday().ok()?;
    }
    None
}

/// The last match of `date`, up to civil `(hour, minute)`, that is at or before `now`.
fn last_in_day(
    schedule: &Schedule,
    tz: &TimeZone,
    date: Date,
    upto: (i8, i8),
    now: Timestamp,
) -> Option<Timestamp> {
    for hour in descending(schedule.hours).filter(|h| *h <= upto.0) {
        for minute in descending(schedule.minutes) {
            if hour == upto.0 && minute > upto.1 {
                continue;
            }
            let found = minute_of(date, hour, minute).and_then(|at| instant_of(tz, at));
            if let Some(found) = found.filter(|found| *found <= now) {
                return Some(found);
            }
        }
    }
    None
}

// ---- judging windows ----

/// When `window` is active at `now`: `Some` of the end of the latest match covering `now` (the latest end),
/// else None. Start inclusive, end exclusive.
pub fn active_until(window: &Window, now: Timestamp) -> Option<Timestamp> {
    let length = window.length();
    if length.is_zero() {
        return None;
    }
    let floor = now.checked_sub(length).unwrap_or(Timestamp::MIN);
    let start = last_match_between(&window.schedule, &window.zone(), floor, now)?;
    Some(start.checked_add(length).unwrap_or(Timestamp::MAX))
}

/// The first time the schedule matches strictly after `after`, within [`HORIZON_DAYS`] days (None beyond).
pub fn next_start(window: &Window, after: Timestamp) -> Option<Timestamp> {
    let limit = after.checked_add(HORIZON).unwrap_or(Timestamp::MAX);
    first_match_after(&window.schedule, &window.zone(), after, limit)
}

/// Whether a new release of the app may apply now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowDecision {
    /// No deny window is active, and there is no allow window or one is active.
    Open,
    /// A deny window is active, or every allow window is inactive.
    Closed {
        /// For people: which window, and until when.
        reason: String,
        /// The earliest instant after now at which [`decide`] is Open; None when not found within
        /// [`HORIZON_DAYS`] days.
        reopens_at: Option<Timestamp>,
    },
}

fn denies(windows: &[Window]) -> impl Iterator<Item = &Window> {
    windows.iter().filter(|w| w.kind == WindowKind::Deny)
}

fn allows(windows: &[Window]) -> impl Iterator<Item = &Window> {
    windows.iter().filter(|w| w.kind == WindowKind::Allow)
}

/// Judges the windows of one app at `now`. Deny wins over allow.
pub fn decide(windows: &[Window], now: Timestamp) -> WindowDecision {
    let active_deny = denies(windows).find_map(|w| active_until(w, now).map(|end| (w, end)));
    let reason = if let Some((window, end)) = active_deny {
        format!("deny window {} until {end}", window.describe())
    } else if allows(windows).next().is_none()
        || allows(windows).any(|w| active_until(w, now).is_some())
    {
        return WindowDecision::Open;
    } else {
        match allows(windows).filter_map(|w| next_start(w, now)).min() {
            Some(at) => format!("outside every allow window; the next opens {at}"),
            None => format!("outside every allow window; none opens within {HORIZON_DAYS} days"),
        }
    };
    WindowDecision::Closed {
        reason,
        reopens_at: reopens_at(windows, now),
    }
}

/// The earliest instant after `now` at which the windows are open. Jumps from candidate to candidate: past
/// the latest end of the deny windows active there (a deny window covers everything up to its end), or to
/// the next start of an allow window when none is active; stops at the first candidate where neither applies.
fn reopens_at(windows: &[Window], now: Timestamp) -> Option<Timestamp> {
    let limit = now.checked_add(HORIZON).unwrap_or(Timestamp::MAX);
    let has_allow = allows(windows).next().is_some();
    let mut at = now;
    for _ in 0..MAX_REOPEN_STEPS {
        if at > limit {
            return None;
        }
        if let Some(end) = denies(windows).filter_map(|w| active_until(w, at)).max() {
            at = end;
        } else if has_allow && !allows(windows).any(|w| active_until(w, at).is_some()) {
            at = allows(windows).filter_map(|w| next_start(w, at)).min()?;
        } else {
            return (at > now && at <= limit).then_some(at);
        }
    }
    None
}

/// The next instant after `now` at which [`decide`] or [`heals`] may change: the earliest of the active
/// windows' ends and every window's next start. The agent sets a timer on it.
pub fn next_change(windows: &[Window], now: Timestamp) -> Option<Timestamp> {
    windows
        .iter()
        .flat_map(|w| [active_until(w, now), next_start(w, now)])
        .flatten()
        .min()
}

/// Whether the agent heals drift at `now`: false only while an active deny window says `heal: report`.
pub fn heals(windows: &[Window], now: Timestamp) -> bool {
    !denies(windows)
        .filter(|w| w.heal == HealInWindow::Report)
        .any(|w| active_until(w, now).is_some())
}
