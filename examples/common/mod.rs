//! What the benchmark examples share.

/// Last-level cache size in bytes (sysfs), 32 MiB when unknown.
pub fn l3_bytes() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size").unwrap_or_default();
    let t = text.trim();
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        _ => (t, 1),
    };
    num.parse::<usize>().map(|v| v * mult).unwrap_or(32 << 20)
}
