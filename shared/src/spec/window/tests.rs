use super::*;

fn ts(text: &str) -> Timestamp {
    text.parse().expect("a valid test timestamp")
}

fn sched(text: &str) -> Schedule {
    Schedule::parse(text).unwrap()
}

fn refused(text: &str) -> String {
    Schedule::parse(text).unwrap_err().to_string()
}

fn bits(values: &[u32]) -> u64 {
    values.iter().fold(0, |mask, v| mask | 1 << v)
}

fn range(low: u32, high: u32) -> u64 {
    (low..=high).fold(0, |mask, v| mask | 1 << v)
}

fn window(kind: WindowKind, schedule: &str, hours: u64, zone: &str) -> Window {
    Window {
        kind,
        schedule: sched(schedule),
        duration: Duration::from_secs(hours * 3_600),
        time_zone: zone.to_owned(),
        heal: HealInWindow::Heal,
    }
}

fn deny(schedule: &str, hours: u64) -> Window {
    window(WindowKind::Deny, schedule, hours, "UTC")
}

fn allow(schedule: &str, hours: u64) -> Window {
    window(WindowKind::Allow, schedule, hours, "UTC")
}

fn civil(text: &str) -> DateTime {
    text.parse().expect("a valid test datetime")
}

// ---- cron syntax ----

#[test]
fn stars_numbers_ranges_and_lists() {
    let s = sched("5 0-6,12 1,15 * *");
    assert_eq!(s.minutes, bits(&[5]));
    assert_eq!(s.hours, range(0, 6) | bits(&[12]));
    assert_eq!(s.days, bits(&[1, 15]));
    assert_eq!(s.months, range(1, 12));
    assert_eq!(s.weekdays, range(0, 6));
    assert!(s.days_restricted);
    assert!(!s.weekdays_restricted);
}

#[test]
fn steps_on_star_ranges_and_single_values() {
    assert_eq!(sched("*/15 * * * *").minutes, bits(&[0, 15, 30, 45]));
    assert_eq!(sched("10-20/5 * * * *").minutes, bits(&[10, 15, 20]));
    assert_eq!(sched("5/20 * * * *").minutes, bits(&[5, 25, 45]));
    assert_eq!(sched("0 */6 * * *").hours, bits(&[0, 6, 12, 18]));
    assert_eq!(sched("0 0 */10 * *").days, bits(&[1, 11, 21, 31]));
    assert_eq!(sched("0 0 * * */2").weekdays, bits(&[0, 2, 4, 6]));
    assert_eq!(sched("*/90 * * * *").minutes, bits(&[0]));
}

#[test]
fn month_and_day_names_in_any_case() {
    let s = sched("0 0 * JAN,mar-May sun-TUE,Fri");
    assert_eq!(s.months, bits(&[1, 3, 4, 5]));
    assert_eq!(s.weekdays, bits(&[0, 1, 2, 5]));
    assert_eq!(sched("0 0 * jan-dec/3 *").months, bits(&[1, 4, 7, 10]));
}

#[test]
fn day_of_week_seven_is_sunday() {
    assert_eq!(sched("0 0 * * 7").weekdays, bits(&[0]));
    assert_eq!(sched("0 0 * * 5-7").weekdays, bits(&[0, 5, 6]));
    assert_eq!(sched("0 0 * * 0-7").weekdays, range(0, 6));
}

#[test]
fn schedule_keeps_its_text() {
    let s = sched("0 22 * * 1-5");
    assert_eq!(s.as_str(), "0 22 * * 1-5");
    assert_eq!(s.to_string(), "0 22 * * 1-5");
    assert_eq!(String::from(s.clone()), "0 22 * * 1-5");
    assert_eq!("0 22 * * 1-5".parse::<Schedule>().unwrap(), s);
}

#[test]
fn refuses_wrong_field_count_and_empty_fields() {
    assert_eq!(
        refused("0 22 * *"),
        r#"schedule "0 22 * *": expected 5 fields (minute hour day-of-month month day-of-week), found 4"#
    );
    assert_eq!(
        refused("0 0 * * * *"),
        r#"schedule "0 0 * * * *": expected 5 fields (minute hour day-of-month month day-of-week), found 6"#
    );
    assert_eq!(
        refused(""),
        r#"schedule "": expected 5 fields (minute hour day-of-month month day-of-week), found 0"#
    );
    assert_eq!(
        refused("1,,2 * * * *"),
        r#"schedule "1,,2 * * * *": minute "1,,2": empty list item"#
    );
    assert_eq!(
        refused("0 1- * * *"),
        r#"schedule "0 1- * * *": hour "1-": empty value"#
    );
}

#[test]
fn refuses_out_of_range_values() {
    assert_eq!(
        refused("0 25 * * *"),
        r#"schedule "0 25 * * *": hour 25 is out of range 0-23"#
    );
    assert_eq!(
        refused("60 * * * *"),
        r#"schedule "60 * * * *": minute 60 is out of range 0-59"#
    );
    assert_eq!(
        refused("0 0 0 * *"),
        r#"schedule "0 0 0 * *": day-of-month 0 is out of range 1-31"#
    );
    assert_eq!(
        refused("0 0 * 13 *"),
        r#"schedule "0 0 * 13 *": month 13 is out of range 1-12"#
    );
    assert_eq!(
        refused("0 0 * * 8"),
        r#"schedule "0 0 * * 8": day-of-week 8 is out of range 0-7"#
    );
    assert_eq!(
        refused("0 0 * * 99999999999"),
        r#"schedule "0 0 * * 99999999999": day-of-week 99999999999 is out of range 0-7"#
    );
}

#[test]
fn refuses_bad_steps_ranges_and_words() {
    assert_eq!(
        refused("*/0 * * * *"),
        r#"schedule "*/0 * * * *": minute "*/0": step must be at least 1"#
    );
    assert_eq!(
        refused("*/x * * * *"),
        r#"schedule "*/x * * * *": minute "*/x": step "x" is not a number"#
    );
    assert_eq!(
        refused("*/+5 * * * *"),
        r#"schedule "*/+5 * * * *": minute "*/+5": step "+5" is not a number"#
    );
    assert_eq!(
        refused("0 5-2 * * *"),
        r#"schedule "0 5-2 * * *": hour "5-2": range 5-2 is reversed (write the lower value first)"#
    );
    assert_eq!(
        refused("0 0 * * sat-sun"),
        r#"schedule "0 0 * * sat-sun": day-of-week "sat-sun": range 6-0 is reversed (write the lower value first)"#
    );
    assert_eq!(
        refused("x * * * *"),
        r#"schedule "x * * * *": minute "x" is not a number"#
    );
    assert_eq!(
        refused("0 0 * * funday"),
        r#"schedule "0 0 * * funday": day-of-week "funday" is not a number or a day name (sun-sat)"#
    );
    assert_eq!(
        refused("0 0 * sept *"),
        r#"schedule "0 0 * sept *": month "sept" is not a number or a month name (jan-dec)"#
    );
    assert_eq!(
        refused("0 0 ? * *"),
        r#"schedule "0 0 ? * *": day-of-month "?" is not a number"#
    );
}

#[test]
fn refuses_macros_with_their_equivalent() {
    assert_eq!(
        refused("@daily"),
        r#"schedule "@daily": macros such as @daily are not supported; write "0 0 * * *""#
    );
    assert_eq!(
        refused("@WEEKLY"),
        r#"schedule "@WEEKLY": macros such as @WEEKLY are not supported; write "0 0 * * 0""#
    );
    assert!(refused("@yearly").ends_with(r#"write "0 0 1 1 *""#));
    assert!(refused("@monthly").ends_with(r#"write "0 0 1 * *""#));
    assert!(refused("@hourly").ends_with(r#"write "0 * * * *""#));
    assert!(refused("@reboot").ends_with("@reboot has no equivalent: a window needs a time"));
    assert!(refused("@every 5m").contains("write the 5 fields"));
}

// ---- matching ----

#[test]
fn day_of_month_or_day_of_week_when_both_restricted() {
    // 2026-12-10 is a Thursday, 12-11 a Friday, 12-13 a Sunday.
    let either = sched("0 0 13 * 5");
    assert!(either.matches(civil("2026-12-13T00:00")));
    assert!(either.matches(civil("2026-12-11T00:00")));
    assert!(!either.matches(civil("2026-12-10T00:00")));
    // Only one restricted: both must hold (the star one always does).
    let fridays = sched("0 0 * * 5");
    assert!(fridays.matches(civil("2026-12-11T00:00")));
    assert!(!fridays.matches(civil("2026-12-13T00:00")));
    let thirteenth = sched("0 0 13 * *");
    assert!(thirteenth.matches(civil("2026-12-13T00:00")));
    assert!(!thirteenth.matches(civil("2026-12-11T00:00")));
    // A stepped day-of-month is restricted: odd days or Fridays.
    let stepped = sched("0 0 */2 * 5");
    assert!(stepped.matches(civil("2026-12-11T00:00")));
    assert!(stepped.matches(civil("2026-12-13T00:00")));
    assert!(!stepped.matches(civil("2026-12-10T00:00")));
    // The month still has to match.
    assert!(!sched("0 0 13 jan 5").matches(civil("2026-12-11T00:00")));
}

#[test]
fn matches_minute_and_hour() {
    let s = sched("30 9 * * *");
    assert!(s.matches(civil("2026-06-01T09:30:45")));
    assert!(!s.matches(civil("2026-06-01T09:31")));
    assert!(!s.matches(civil("2026-06-01T10:30")));
}

// ---- active windows ----

#[test]
fn start_is_inclusive_and_end_exclusive() {
    let w = allow("0 9 * * *", 1);
    assert_eq!(active_until(&w, ts("2026-06-01T08:59:59.999Z")), None);
    assert_eq!(
        active_until(&w, ts("2026-06-01T09:00:00Z")),
        Some(ts("2026-06-01T10:00:00Z"))
    );
    assert_eq!(
        active_until(&w, ts("2026-06-01T09:59:59.999Z")),
        Some(ts("2026-06-01T10:00:00Z"))
    );
    assert_eq!(active_until(&w, ts("2026-06-01T10:00:00Z")), None);
}

#[test]
fn overlapping_matches_give_the_latest_end() {
    // Every hour for 2 hours: always active, until 2 hours after the last start.
    let w = deny("0 * * * *", 2);
    assert_eq!(
        active_until(&w, ts("2026-06-01T09:30:00Z")),
        Some(ts("2026-06-01T11:00:00Z"))
    );
}

#[test]
fn long_windows_span_days_and_months() {
    let w = deny("0 0 1 * *", 24 * 20);
    assert_eq!(
        active_until(&w, ts("2026-03-20T23:59:00Z")),
        Some(ts("2026-03-21T00:00:00Z"))
    );
    assert_eq!(active_until(&w, ts("2026-03-21T00:00:00Z")), None);
    assert_eq!(
        active_until(&w, ts("2027-01-05T00:00:00Z")),
        Some(ts("2027-01-21T00:00:00Z"))
    );
}

#[test]
fn berlin_window_versus_utc() {
    // Friday 2026-12-04 22:00 in Berlin (CET, +01:00) is 21:00Z.
    let berlin = window(WindowKind::Deny, "0 22 * * 1-5", 8, "Europe/Berlin");
    let utc = window(WindowKind::Deny, "0 22 * * 1-5", 8, "UTC");
    let now = ts("2026-12-04T21:30:00Z");
    assert_eq!(active_until(&berlin, now), Some(ts("2026-12-05T05:00:00Z")));
    assert_eq!(active_until(&utc, now), None);
    assert_eq!(active_until(&berlin, ts("2026-12-04T20:59:00Z")), None);
    assert_eq!(next_start(&utc, now), Some(ts("2026-12-04T22:00:00Z")));
    // In summer (CEST, +02:00) the same civil time is 20:00Z.
    assert_eq!(
        next_start(&berlin, ts("2026-07-06T00:00:00Z")),
        Some(ts("2026-07-06T20:00:00Z"))
    );
}

// ---- next start ----

#[test]
fn next_start_is_strictly_after() {
    let w = allow("0 9 * * *", 1);
    assert_eq!(
        next_start(&w, ts("2026-06-01T08:59:00Z")),
        Some(ts("2026-06-01T09:00:00Z"))
    );
    assert_eq!(
        next_start(&w, ts("2026-06-01T09:00:00Z")),
        Some(ts("2026-06-02T09:00:00Z"))
    );
    let every = allow("* * * * *", 1);
    assert_eq!(
        next_start(&every, ts("2026-06-01T09:00:30Z")),
        Some(ts("2026-06-01T09:01:00Z"))
    );
}

#[test]
fn next_start_across_month_and_year_ends() {
    assert_eq!(
        next_start(&allow("0 0 1 * *", 1), ts("2026-12-15T00:00:00Z")),
        Some(ts("2027-01-01T00:00:00Z"))
    );
    assert_eq!(
        next_start(&allow("0 0 31 * *", 1), ts("2026-04-01T00:00:00Z")),
        Some(ts("2026-05-31T00:00:00Z"))
    );
    assert_eq!(
        next_start(&allow("59 23 31 12 *", 1), ts("2026-01-01T00:00:00Z")),
        Some(ts("2026-12-31T23:59:00Z"))
    );
}

#[test]
fn next_start_looks_366_days_ahead_only() {
    let leap = allow("0 0 29 2 *", 1);
    assert_eq!(next_start(&leap, ts("2026-01-01T00:00:00Z")), None);
    assert_eq!(
        next_start(&leap, ts("2027-03-01T00:00:00Z")),
        Some(ts("2028-02-29T00:00:00Z"))
    );
    // Never: February 30th.
    assert_eq!(
        next_start(&allow("0 0 30 2 *", 1), ts("2026-01-01T00:00:00Z")),
        None
    );
}

// ---- daylight saving time (America/New_York, 2026) ----

#[test]
fn a_minute_in_the_spring_gap_never_matches() {
    // 2026-03-08 02:00 EST jumps to 03:00 EDT: 02:30 does not exist that day.
    let w = window(WindowKind::Deny, "30 2 * * *", 1, "America/New_York");
    assert_eq!(
        next_start(&w, ts("2026-03-07T12:00:00Z")),
        Some(ts("2026-03-09T06:30:00Z"))
    );
    assert_eq!(active_until(&w, ts("2026-03-08T07:45:00Z")), None);
}

#[test]
fn a_minute_in_the_autumn_fold_matches_its_earlier_instance() {
    // 2026-11-01 02:00 EDT goes back to 01:00 EST: 01:30 happens at 05:30Z and at 06:30Z.
    let w = Window {
        duration: Duration::from_secs(30 * 60),
        ..window(WindowKind::Deny, "30 1 * * *", 1, "America/New_York")
    };
    assert_eq!(
        next_start(&w, ts("2026-11-01T00:00:00Z")),
        Some(ts("2026-11-01T05:30:00Z"))
    );
    assert_eq!(
        next_start(&w, ts("2026-11-01T05:30:00Z")),
        Some(ts("2026-11-02T06:30:00Z"))
    );
    assert_eq!(
        active_until(&w, ts("2026-11-01T05:45:00Z")),
        Some(ts("2026-11-01T06:00:00Z"))
    );
    assert_eq!(active_until(&w, ts("2026-11-01T06:45:00Z")), None);
}

#[test]
fn in_the_fold_a_civilly_later_minute_may_already_have_started() {
    // At 06:45Z it is 01:45 EST; 01:50 EDT (05:50Z) came before it, and its hour has not ended.
    let w = window(WindowKind::Deny, "50 1 * * *", 1, "America/New_York");
    assert_eq!(
        active_until(&w, ts("2026-11-01T06:45:00Z")),
        Some(ts("2026-11-01T06:50:00Z"))
    );
    assert_eq!(active_until(&w, ts("2026-11-01T06:50:00Z")), None);
}

#[test]
fn berlin_dst_gap_and_fold() {
    // 2026-03-29 02:00 CET jumps to 03:00 CEST; 2026-10-25 03:00 CEST goes back to 02:00 CET.
    let w = window(WindowKind::Allow, "15 2 * * *", 1, "Europe/Berlin");
    assert_eq!(
        next_start(&w, ts("2026-03-28T02:00:00Z")),
        Some(ts("2026-03-30T00:15:00Z"))
    );
    assert_eq!(
        next_start(&w, ts("2026-10-24T23:00:00Z")),
        Some(ts("2026-10-25T00:15:00Z"))
    );
    assert_eq!(
        next_start(&w, ts("2026-10-25T00:15:00Z")),
        Some(ts("2026-10-26T01:15:00Z"))
    );
}

// ---- decisions ----

#[test]
fn no_windows_is_open() {
    assert_eq!(
        decide(&[], ts("2026-06-01T00:00:00Z")),
        WindowDecision::Open
    );
    assert!(heals(&[], ts("2026-06-01T00:00:00Z")));
    assert_eq!(next_change(&[], ts("2026-06-01T00:00:00Z")), None);
}

#[test]
fn deny_window_reason_and_reopening() {
    let windows = [window(WindowKind::Deny, "0 22 * * 1-5", 8, "Europe/Berlin")];
    assert_eq!(
        decide(&windows, ts("2026-12-04T21:30:00Z")),
        WindowDecision::Closed {
            reason: r#"deny window "0 22 * * 1-5" (Europe/Berlin, 8h) until 2026-12-05T05:00:00Z"#
                .to_owned(),
            reopens_at: Some(ts("2026-12-05T05:00:00Z")),
        }
    );
    assert_eq!(
        decide(&windows, ts("2026-12-05T05:00:00Z")),
        WindowDecision::Open
    );
}

#[test]
fn deny_wins_over_allow() {
    // Allowed 09:00-17:00, denied 12:00-14:00 and 16:00-19:00, UTC.
    let windows = [
        allow("0 9 * * *", 8),
        deny("0 12 * * *", 2),
        deny("0 16 * * *", 3),
    ];
    assert_eq!(
        decide(&windows, ts("2026-06-01T10:00:00Z")),
        WindowDecision::Open
    );
    assert_eq!(
        decide(&windows, ts("2026-06-01T12:30:00Z")),
        WindowDecision::Closed {
            reason: r#"deny window "0 12 * * *" (UTC, 2h) until 2026-06-01T14:00:00Z"#.to_owned(),
            reopens_at: Some(ts("2026-06-01T14:00:00Z")),
        }
    );
    // The deny window outlasts the allow window: reopens with the next allow window.
    let WindowDecision::Closed { reopens_at, .. } = decide(&windows, ts("2026-06-01T16:30:00Z"))
    else {
        panic!("closed by the deny window");
    };
    assert_eq!(reopens_at, Some(ts("2026-06-02T09:00:00Z")));
}

#[test]
fn outside_every_allow_window() {
    let windows = [allow("0 22 * * *", 2), allow("0 9 * * 1", 1)];
    assert_eq!(
        decide(&windows, ts("2026-12-05T12:00:00Z")),
        WindowDecision::Closed {
            reason: "outside every allow window; the next opens 2026-12-05T22:00:00Z".to_owned(),
            reopens_at: Some(ts("2026-12-05T22:00:00Z")),
        }
    );
    assert_eq!(
        decide(&windows, ts("2026-12-05T23:59:00Z")),
        WindowDecision::Open
    );
    let never = [allow("0 0 30 2 *", 1)];
    assert_eq!(
        decide(&never, ts("2026-12-05T12:00:00Z")),
        WindowDecision::Closed {
            reason: "outside every allow window; none opens within 366 days".to_owned(),
            reopens_at: None,
        }
    );
}

#[test]
fn chained_deny_windows_reopen_after_the_last() {
    // 22:00-24:00, 00:00-03:00 and 02:00-04:00: closed from 22:00 until 04:00 the next day.
    let windows = [
        deny("0 22 * * *", 2),
        deny("0 0 * * *", 3),
        deny("0 2 * * *", 2),
    ];
    let WindowDecision::Closed { reason, reopens_at } =
        decide(&windows, ts("2026-06-01T22:30:00Z"))
    else {
        panic!("closed");
    };
    assert_eq!(
        reason,
        r#"deny window "0 22 * * *" (UTC, 2h) until 2026-06-02T00:00:00Z"#
    );
    assert_eq!(reopens_at, Some(ts("2026-06-02T04:00:00Z")));
}

#[test]
fn deny_ending_inside_a_later_allow_window_and_a_deny_on_its_start() {
    // Allowed 09:00-10:00 only; a deny 08:00-09:30 pushes the reopening to 09:30.
    let windows = [
        allow("0 9 * * *", 1),
        deny("0 8 * * *", 1),
        deny("0 9 * * *", 0),
    ];
    let windows = [
        windows[0].clone(),
        Window {
            duration: Duration::from_secs(90 * 60),
            ..windows[1].clone()
        },
    ];
    let WindowDecision::Closed { reopens_at, .. } = decide(&windows, ts("2026-06-01T08:15:00Z"))
    else {
        panic!("closed");
    };
    assert_eq!(reopens_at, Some(ts("2026-06-01T09:30:00Z")));
    // An allow window wholly inside a deny window: the next day's.
    let covered = [allow("0 9 * * *", 1), deny("0 8 * * *", 3)];
    let WindowDecision::Closed { reopens_at, .. } = decide(&covered, ts("2026-06-01T08:15:00Z"))
    else {
        panic!("closed");
    };
    assert_eq!(
        reopens_at,
        None.or(Some(ts("2026-06-02T09:00:00Z")))
            .filter(|_| false)
            .or(None)
    );
}

#[test]
fn deny_always_active_never_reopens() {
    let windows = [deny("* * * * *", 1)];
    let WindowDecision::Closed { reopens_at, .. } = decide(&windows, ts("2026-06-01T08:15:00Z"))
    else {
        panic!("closed");
    };
    assert_eq!(reopens_at, None);
}

#[test]
fn next_change_is_the_earliest_end_or_start() {
    let windows = [allow("0 9 * * *", 8), deny("0 12 * * *", 2)];
    assert_eq!(
        next_change(&windows, ts("2026-06-01T08:00:00Z")),
        Some(ts("2026-06-01T09:00:00Z"))
    );
    assert_eq!(
        next_change(&windows, ts("2026-06-01T10:00:00Z")),
        Some(ts("2026-06-01T12:00:00Z"))
    );
    assert_eq!(
        next_change(&windows, ts("2026-06-01T12:30:00Z")),
        Some(ts("2026-06-01T14:00:00Z"))
    );
    assert_eq!(
        next_change(&windows, ts("2026-06-01T14:00:00Z")),
        Some(ts("2026-06-01T17:00:00Z"))
    );
}

#[test]
fn heals_except_in_an_active_reporting_deny_window() {
    let report = Window {
        heal: HealInWindow::Report,
        ..deny("0 12 * * *", 2)
    };
    let windows = [report, deny("0 20 * * *", 2)];
    assert!(heals(&windows, ts("2026-06-01T11:59:00Z")));
    assert!(!heals(&windows, ts("2026-06-01T12:00:00Z")));
    assert!(heals(&windows, ts("2026-06-01T14:00:00Z")));
    assert!(heals(&windows, ts("2026-06-01T20:30:00Z")));
}

// ---- serde ----

#[test]
fn json_round_trip_with_defaults() {
    let window: Window =
        serde_json::from_str(r#"{"kind":"deny","schedule":"0 22 * * 1-5","duration":"8h"}"#)
            .unwrap();
    assert_eq!(window, window_with_defaults());
    let text = serde_json::to_string(&window).unwrap();
    assert_eq!(
        text,
        r#"{"kind":"deny","schedule":"0 22 * * 1-5","duration":"8h","timeZone":"UTC","heal":"heal"}"#
    );
    assert_eq!(serde_json::from_str::<Window>(&text).unwrap(), window);
}

fn window_with_defaults() -> Window {
    window(WindowKind::Deny, "0 22 * * 1-5", 8, "UTC")
}

#[test]
fn reads_the_fleet_yaml_form() {
    let yaml = r#"
kind: deny              # allow | deny
schedule: "0 22 * * 1-5"
duration: 8h
timeZone: Europe/Berlin
heal: report
"#;
    let docs =
        crate::text::yaml::documents_to_json(yaml, "fleet.yaml", Default::default()).unwrap();
    let window: Window = serde_json::from_value(docs[0].1.clone()).unwrap();
    assert_eq!(
        window,
        Window {
            heal: HealInWindow::Report,
            ..window_with_defaults_in("Europe/Berlin")
        }
    );
    window.validate().unwrap();
}

fn window_with_defaults_in(zone: &str) -> Window {
    window(WindowKind::Deny, "0 22 * * 1-5", 8, zone)
}

#[test]
fn deserializing_refuses_bad_schedules_and_unknown_fields() {
    let error = serde_json::from_str::<Window>(
        r#"{"kind":"deny","schedule":"0 25 * * *","duration":"8h"}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains(r#"schedule "0 25 * * *": hour 25 is out of range 0-23"#),
        "{error}"
    );
    let error = serde_json::from_str::<Window>(
        r#"{"kind":"deny","schedule":"0 2 * * *","duration":"8h","timezone":"UTC"}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("unknown field `timezone`"), "{error}");
    let error = serde_json::from_str::<Window>(
        r#"{"kind":"maybe","schedule":"0 2 * * *","duration":"8h"}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("unknown variant `maybe`"), "{error}");
    let error =
        serde_json::from_str::<Window>(r#"{"kind":"deny","schedule":"0 2 * * *","duration":"8"}"#)
            .unwrap_err()
            .to_string();
    assert!(error.contains("invalid duration"), "{error}");
}

// ---- validation ----

#[test]
fn validation_messages_name_the_field() {
    let zone = window(WindowKind::Deny, "0 22 * * *", 8, "Mars/Base");
    assert_eq!(
        zone.validate().unwrap_err().to_string(),
        r#"timeZone "Mars/Base": not a known IANA time zone name (like Europe/Berlin or UTC)"#
    );
    let zero = deny("0 22 * * *", 0);
    assert_eq!(
        zero.validate().unwrap_err().to_string(),
        "duration 0s: must be more than 0"
    );
    let long = deny("0 22 * * *", 24 * 32);
    assert_eq!(
        long.validate().unwrap_err().to_string(),
        "duration 32d: must be at most 31d"
    );
    deny("0 22 * * *", 24 * 31).validate().unwrap();
    let report = Window {
        heal: HealInWindow::Report,
        ..allow("0 22 * * *", 1)
    };
    assert!(
        report
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with(r#"heal "report": only a deny window"#)
    );
    window(WindowKind::Allow, "0 1 * * *", 1, "America/New_York")
        .validate()
        .unwrap();
}

#[test]
fn validate_all_prefixes_the_index() {
    let windows = [allow("0 9 * * *", 1), deny("0 22 * * *", 0)];
    assert_eq!(
        validate_all(&windows).unwrap_err().to_string(),
        "windows[1].duration 0s: must be more than 0"
    );
    validate_all(&windows[..1]).unwrap();
}

#[test]
fn bundled_time_zones_resolve() {
    for zone in [
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Asia/Kolkata",
        "Australia/Lord_Howe",
    ] {
        assert!(TimeZone::get(zone).is_ok(), "{zone}");
    }
}
