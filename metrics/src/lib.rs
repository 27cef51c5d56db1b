//! What every Windvane binary's `/metrics` carries besides its own figures, on the Prometheus project's Rust
//! client (`prometheus-client`): `windvane_build_info{binary,version}` (always 1, so that a query can join a
//! version onto any series) and the process's resident memory and CPU time under the names every Prometheus
//! client uses (`process_resident_memory_bytes`, `process_cpu_seconds_total`), read from `/proc/self` at each
//! scrape. [`encode`] writes a registry in the Prometheus text format 0.0.4 ([`CONTENT_TYPE`]).
//!
//! Data comes from the binary (its name and version) and the kernel (`/proc/self/stat`, `/proc/self/status`);
//! it goes to the binary's `/metrics` handler. The `/proc` parsing is pure ([`cpu_seconds`], [`resident_bytes`]);
//! on a system without `/proc` the two process series are left out rather than reported as zero.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

pub use prometheus_client;

/// The `Content-Type` of what [`encode`] writes.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Clock ticks per second in `/proc/self/stat`'s CPU times: the kernel reports them in `USER_HZ`, which is
/// 100 on every architecture Linux runs on (the Go client's procfs makes the same assumption).
const USER_HZ: f64 = 100.0;

/// A registry holding `windvane_build_info` for `binary` at `version` and the process collector. (The
/// registry ends every help text with a period: help given to it has none.)
pub fn registry(binary: &str, version: &str) -> Registry {
    let mut registry = Registry::default();
    let build_info = Family::<Vec<(&'static str, String)>, Gauge>::default();
    build_info
        .get_or_create(&vec![
            ("binary", binary.to_owned()),
            ("version", version.to_owned()),
        ])
        .set(1);
    registry.register(
        "windvane_build_info",
        "The binary and its version; always 1",
        build_info,
    );
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// The registry's metrics in the Prometheus text format 0.0.4.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::with_capacity(4096);
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, registry);
    text
}

/// A metric written with its HELP and TYPE lines even while it has no sample (the client leaves out an empty
/// family entirely), so that a scraper or a test sees the family exists before its first sample.
#[derive(Debug, Clone)]
pub struct AlwaysDescribed<M>(pub M);

impl<M: EncodeMetric> EncodeMetric for AlwaysDescribed<M> {
    fn encode(
        &self,
        encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        self.0.metric_type()
    }
}

/// Reads the process's CPU time and resident memory at each scrape.
#[derive(Debug)]
struct ProcessCollector;

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        if let Some(seconds) = stat.as_deref().and_then(cpu_seconds) {
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            ConstCounter::new(seconds).encode(metric)?;
        }
        let status = std::fs::read_to_string("/proc/self/status").ok();
        if let Some(bytes) = status.as_deref().and_then(resident_bytes) {
            let metric = encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX)).encode(metric)?;
        }
        Ok(())
    }
}

/// User plus system CPU seconds from `/proc/self/stat` (fields 14 and 15, in clock ticks). The command name
/// (field 2) is in parentheses and may hold spaces and parentheses itself, so fields are counted after the
/// last `)`.
pub fn cpu_seconds(stat: &str) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3, so utime (14) and stime (15) are the 12th and 13th.
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / USER_HZ)
}

/// Resident memory in bytes from `/proc/self/status` (`VmRSS:  1952 kB`).
pub fn resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_counted_after_the_last_parenthesis_of_the_name() {
        let stat = "4242 (windvane (x) y) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 130 0 0 20 0 8 0 100 0 0";
        assert_eq!(cpu_seconds(stat), Some(3.8));
        assert_eq!(cpu_seconds("4242 (short) S 1"), None);
        assert_eq!(cpu_seconds("no name here"), None);
    }

    #[test]
    fn resident_memory_is_read_in_kilobytes() {
        let status = "Name:\twindvane\nVmPeak:\t  9000 kB\nVmRSS:\t    1952 kB\nThreads:\t8\n";
        assert_eq!(resident_bytes(status), Some(1952 * 1024));
        assert_eq!(resident_bytes("Name:\tx\n"), None);
        assert_eq!(resident_bytes("VmRSS:\t12 MB\n"), None);
    }

    #[test]
    fn the_registry_carries_build_info_and_this_process_s_memory_and_cpu() {
        let text = encode(&registry("windvane-test", "1.2.3"));
        assert!(
            text.lines()
                .any(|l| l == "windvane_build_info{binary=\"windvane-test\",version=\"1.2.3\"} 1"),
            "{text}"
        );
        assert!(text.contains("# TYPE windvane_build_info gauge"), "{text}");
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in {text}"));
            line[name.len() + 1..].parse().expect("a number")
        };
        assert!(value("process_resident_memory_bytes") > 1024.0 * 1024.0);
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
    }

    #[test]
    fn an_always_described_family_is_written_before_its_first_sample() {
        let mut registry = Registry::default();
        let family = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register("empty", "Nothing yet", family.clone());
        registry.register("described", "Nothing yet", AlwaysDescribed(family));
        let text = encode(&registry);
        assert!(!text.contains("TYPE empty "), "{text}");
        assert!(
            text.contains("# HELP described Nothing yet.\n# TYPE described gauge\n"),
            "{text}"
        );
    }
}
