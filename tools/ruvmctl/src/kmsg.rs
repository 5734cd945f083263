// SPDX-License-Identifier: GPL-2.0

//! The kernel log's side of the leak audit: ruvm's audit lines, kmemleak and the DMA-API debug
//! counter (the verdict itself is `cmd/audit.rs`'s).
//!
//! ruvm's audit lines have the fixed form `ruvm: audit: <event> key=value ...`
//! (Documentation/ruvm.rst, "The audit report"). This module parses them out of `/dev/kmsg`
//! records, from the start of the log or from a marker that `ruvmctl audit --mark` wrote.

use std::{
    collections::BTreeMap,
    fs::OpenOptions,
    io::{Read, Write},
    os::unix::fs::OpenOptionsExt,
};

use serde::Serialize;

/// The text of a marker record.
pub fn marker_text(id: &str) -> String {
    format!("ruvmctl: audit mark {id}")
}

/// One `/dev/kmsg` record's message (the part after `;`, without continuation lines).
pub fn kmsg_message(record: &str) -> Option<&str> {
    let first = record.lines().next()?;
    first.split_once(';').map(|(_, msg)| msg)
}

/// What the audit lines of a stretch of log say.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct Findings {
    /// Unload verdicts, in order: each `clean` or `leaked` with its class counts.
    pub unloads: Vec<Unload>,
    /// Files closed with mems still in them (the module reclaimed them: not a leak).
    pub reclaims: Vec<String>,
    /// Leaks planted on purpose by tests.
    pub planted: Vec<String>,
}

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct Unload {
    pub verdict: String,
    pub classes: BTreeMap<String, u64>,
    pub objects: Vec<String>,
}

/// `key=value` pairs of an audit line.
fn fields(s: &str) -> BTreeMap<&str, &str> {
    s.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

impl Findings {
    /// Reads the audit lines among `messages` (kernel log messages, oldest first).
    pub fn parse<'a>(messages: impl IntoIterator<Item = &'a str>) -> Self {
        let mut f = Findings::default();
        for m in messages {
            let Some(rest) = m.strip_prefix("ruvm: audit: ") else {
                continue;
            };
            if let Some(r) = rest.strip_prefix("unload ") {
                let kv = fields(r);
                f.unloads.push(Unload {
                    verdict: kv.get("verdict").copied().unwrap_or("?").to_owned(),
                    ..Default::default()
                });
            } else if let Some(r) = rest.strip_prefix("leaked class=") {
                let kv = fields(rest);
                if let (Some(u), Some(c)) = (
                    f.unloads.last_mut(),
                    kv.get("count").and_then(|c| c.parse().ok()),
                ) {
                    let class = r.split_whitespace().next().unwrap_or("?").to_owned();
                    u.classes.insert(class, c);
                }
            } else if let Some(r) = rest.strip_prefix("leaked object ") {
                if let Some(u) = f.unloads.last_mut() {
                    u.objects.push(r.to_owned());
                }
            } else if let Some(r) = rest.strip_prefix("reclaimed ") {
                if !r.starts_with("object ") {
                    f.reclaims.push(r.to_owned());
                }
            } else if let Some(r) = rest.strip_prefix("planted a leak ") {
                f.planted.push(r.to_owned());
            }
        }
        f
    }

    /// Whether any unload reported a leak.
    pub fn leaked(&self) -> bool {
        self.unloads.iter().any(|u| u.verdict != "clean")
    }
}

/// Every kernel log message from `/dev/kmsg`, oldest first.
pub fn read_kmsg() -> std::io::Result<Vec<String>> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open("/dev/kmsg")?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]);
                if let Some(m) = kmsg_message(&rec) {
                    out.push(m.to_owned());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // A record overwritten while reading: go on with the next.
            Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Writes a marker record and returns its id.
pub fn write_marker() -> std::io::Result<String> {
    let id = format!(
        "{:x}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let mut f = OpenOptions::new().write(true).open("/dev/kmsg")?;
    // With its newline: without one, printk keeps the record open as a continuation, and
    // readers see nothing until some other message closes it.
    f.write_all(format!("{}\n", marker_text(&id)).as_bytes())?;
    Ok(id)
}

/// The messages after the marker `id` (all of them without one). `None` if the marker is not
/// in the log (it may have rotated out).
pub fn since<'a>(messages: &'a [String], id: Option<&str>) -> Option<&'a [String]> {
    let Some(id) = id else { return Some(messages) };
    let text = marker_text(id);
    let at = messages.iter().position(|m| m.ends_with(&text))?;
    messages.get(at + 1..)
}

/// kmemleak's findings, after asking it to scan: the number of unreferenced objects, or `None`
/// if this kernel has no kmemleak.
///
/// Two scans: kmemleak does not report an object whose contents changed since the previous
/// scan (it greys it until the next one), so a leak made just before a single scan goes unseen.
/// kmemleak also ignores objects younger than about 5 s: callers wait for that themselves.
pub fn kmemleak_scan() -> Option<(usize, String)> {
    let path = "/sys/kernel/debug/kmemleak";
    std::fs::write(path, "scan").ok()?;
    std::fs::write(path, "scan").ok()?;
    let report = std::fs::read_to_string(path).ok()?;
    Some((report.matches("unreferenced object").count(), report))
}

/// The DMA-API debug error count, if this kernel counts.
pub fn dma_api_errors() -> Option<u64> {
    std::fs::read_to_string("/sys/kernel/debug/dma-api/error_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kmsg_records() {
        assert_eq!(
            kmsg_message("6,123,456789,-;ruvm: audit: unload verdict=clean\n"),
            Some("ruvm: audit: unload verdict=clean")
        );
        assert_eq!(kmsg_message("6,1,2,-;a;b\n SUBSYSTEM=x\n"), Some("a;b"));
        assert_eq!(kmsg_message("garbage"), None);
    }

    #[test]
    fn parses_a_leak_report() {
        let log = [
            "ruvm: version 0.1.0 loaded (ABI 1)",
            "ruvm: audit: reclaimed mems=2 bytes=8192 pid=7 comm=x ioctl=open age_ms=3",
            "ruvm: audit: reclaimed object class=mems handle=3 bytes=4096",
            "ruvm: audit: planted a leak what=1 count=2 lost=false",
            "ruvm: audit: unload verdict=leaked classes=3",
            "ruvm: audit: leaked class=mems count=2",
            "ruvm: audit: leaked class=sysmem_bytes count=8192",
            "ruvm: audit: leaked class=sysmem_chunks_o0 count=2",
            "ruvm: audit: leaked object class=mems id=9 bytes=4096 size=10 pid=1 comm=a ioctl=TEST_LEAK age_ms=5",
            "ruvm: audit: freed objects=2",
            "ruvm: unloaded",
        ];
        let f = Findings::parse(log);
        assert!(f.leaked());
        assert_eq!(f.unloads.len(), 1);
        assert_eq!(f.unloads[0].classes.get("mems"), Some(&2));
        assert_eq!(f.unloads[0].classes.get("sysmem_chunks_o0"), Some(&2));
        assert_eq!(f.unloads[0].classes.len(), 3);
        assert_eq!(f.unloads[0].objects.len(), 1);
        assert_eq!(
            f.reclaims,
            vec!["mems=2 bytes=8192 pid=7 comm=x ioctl=open age_ms=3".to_owned()]
        );
        assert_eq!(f.planted.len(), 1);
    }

    #[test]
    fn clean_and_since() {
        let log: Vec<String> = [
            "ruvm: audit: unload verdict=leaked classes=1",
            "x ruvmctl: audit mark abc",
            "ruvm: audit: unload verdict=clean",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert!(Findings::parse(log.iter().map(String::as_str)).leaked());
        let after = since(&log, Some("abc")).unwrap();
        let f = Findings::parse(after.iter().map(String::as_str));
        assert!(!f.leaked());
        assert_eq!(f.unloads.len(), 1);
        assert!(since(&log, Some("nope")).is_none());
    }
}
