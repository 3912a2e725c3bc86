//! This process's memory as Linux reports it in `/proc/self/status` (benchmarks only).

/// A `/proc/self/status` field given in kB (`VmRSS`, `VmHWM`...), in bytes; `None` where
/// `/proc` is missing.
pub fn bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find(|l| l.split(':').next() == Some(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets the peak resident set (`VmHWM`) to the current one (Linux 4.0+).
#[allow(dead_code)] // not every benchmark resets it
pub fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}
