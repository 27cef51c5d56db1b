//! TEMPORARY: logs VmRSS/VmHWM at phases.
pub fn log(phase: &str) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let f = |n: &str| text.lines().find(|l| l.starts_with(n)).map(|l| l.trim_start_matches(n).trim().to_owned()).unwrap_or_default();
    tracing::info!(phase, rss = %f("VmRSS:"), hwm = %f("VmHWM:"), anon = %f("RssAnon:"), "RSSPROBE");
}
