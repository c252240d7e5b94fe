//! This process's memory figures from `/proc/self/status` (Linux; elsewhere every figure is 0).

/// `/proc/self/status`, read once.
pub struct ProcStatus(String);

impl ProcStatus {
    pub fn read() -> Self {
        Self(std::fs::read_to_string("/proc/self/status").unwrap_or_default())
    }

    /// A field given in kB (`"VmRSS:"`, `"VmHWM:"`, `"RssAnon:"`, ...), in bytes; 0 if absent.
    pub fn bytes(&self, name: &str) -> u64 {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_kb_fields_as_bytes() {
        let s = super::ProcStatus("Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t1024 kB\n".into());
        assert_eq!((s.bytes("VmRSS:"), s.bytes("VmHWM:"), s.bytes("RssAnon:")), (1 << 20, 2 << 20, 0));
    }
}
