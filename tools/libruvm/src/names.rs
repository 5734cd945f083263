// SPDX-License-Identifier: GPL-2.0

//! Names of the header's bits and kinds, generated from `include/uapi/linux/ruvm.h` at build
//! time (no hand-kept copy), and of the audit's classes, read from the loaded module.

use crate::uapi;

include!(concat!(env!("OUT_DIR"), "/names_generated.rs"));

/// The names of the bits set in `bits`, from `table` (one of the tables above); a bit the table
/// does not name shows as its hex value, so nothing vanishes silently.
pub fn bit_names(table: &[(u64, &str)], bits: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut left = bits;
    for &(bit, name) in table {
        if bit != 0 && bits & bit == bit {
            out.push(name.to_owned());
            left &= !bit;
        }
    }
    for b in 0..64 {
        if left & (1u64 << b) != 0 {
            out.push(format!("{:#x}", 1u64 << b));
        }
    }
    out
}

/// The name of value `v` in `table`, or `unknown (v)`.
pub fn value_name(table: &[(u64, &str)], v: u64) -> String {
    table
        .iter()
        .find(|(value, _)| *value == v)
        .map_or_else(|| format!("unknown ({v})"), |(_, n)| (*n).to_owned())
}

/// Where the loaded module lists its audit classes, one `name count` line each, by index.
pub const AUDIT_DEBUGFS: &str = "/sys/kernel/debug/ruvm/audit";

/// The audit class names of the loaded module, by index, read from [`AUDIT_DEBUGFS`]; `None`
/// if it cannot be read (debugfs not mounted, module not loaded).
pub fn audit_classes() -> Option<Vec<String>> {
    let text = std::fs::read_to_string(AUDIT_DEBUGFS).ok()?;
    parse_audit_classes(&text)
}

/// The class names in the text of [`AUDIT_DEBUGFS`] (its `level` line is not a class).
pub fn parse_audit_classes(text: &str) -> Option<Vec<String>> {
    let names: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "level")
        .map(str::to_owned)
        .collect();
    (names.len() == uapi::ruvm_audit_class_RUVM_AUDIT_CLASSES as usize).then_some(names)
}

/// The name of audit class `i` in `names` (from [`audit_classes`]), or `class_i`.
pub fn audit_class(names: Option<&[String]>, i: usize) -> String {
    names
        .and_then(|n| n.get(i).cloned())
        .unwrap_or_else(|| format!("class_{i}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_feature_bit_has_a_name() {
        let all = u64::from(uapi::RUVM_FEATURES_ALL);
        let names = bit_names(FEATURES, all);
        assert_eq!(names.len() as u32, all.count_ones());
        assert!(names.iter().all(|n| !n.starts_with("0x")), "{names:?}");
        assert!(names.contains(&"vidmem".to_owned()));
        assert!(names.contains(&"gpu-list".to_owned()));
        assert!(names.contains(&"streams".to_owned()));
        assert!(names.contains(&"stream-alloc".to_owned()));
        assert!(names.contains(&"ptr-attrs".to_owned()));
    }

    #[test]
    fn unknown_bits_show_in_hex() {
        let names = bit_names(FEATURES, (1 << 40) | u64::from(uapi::RUVM_FEATURE_SYSMEM));
        assert_eq!(names, vec!["sysmem".to_owned(), "0x10000000000".to_owned()]);
    }

    #[test]
    fn flag_tables_come_from_the_header() {
        assert_eq!(bit_names(ALLOC_FLAGS, 3), vec!["zero", "fallback"]);
        assert_eq!(bit_names(GPU_FLAGS, 3), vec!["present", "copy-engine"]);
        assert_eq!(value_name(GPU_KINDS, 3), "sim");
        assert_eq!(value_name(GPU_KINDS, 9), "unknown (9)");
        assert_eq!(value_name(OP_KINDS, 6), "wait-fd");
        assert_eq!(value_name(OP_KINDS, 7), "alloc");
        assert_eq!(value_name(OP_KINDS, 8), "free");
        assert_eq!(OP_KINDS.len(), 8);
        assert_eq!(bit_names(OP_FLAGS, 3 << 8), vec!["dst-index", "src-index"]);
        assert_eq!(
            bit_names(POOL_REUSE, 7),
            vec![
                "follow-event-dependencies",
                "allow-opportunistic",
                "allow-internal-dependencies"
            ]
        );
    }

    #[test]
    fn pointer_attribute_names_come_from_the_header() {
        assert_eq!(value_name(PTR_TYPES, 0), "none");
        assert_eq!(value_name(PTR_TYPES, 1), "mem");
        assert_eq!(PTR_TYPES.len(), 2);
        assert_eq!(bit_names(PTR_FLAGS, 3), vec!["other-file", "freed"]);
        assert_eq!(bit_names(PTR_FLAGS, 2), vec!["freed"]);
        assert_eq!(bit_names(PTR_FLAGS, 4), vec!["imported"]);
        assert_eq!(bit_names(POOL_FLAGS, 3), vec!["exportable", "imported"]);
    }

    #[test]
    fn audit_classes_parse_from_debugfs_text() {
        let mut text = String::from("level 1\n");
        for i in 0..uapi::ruvm_audit_class_RUVM_AUDIT_CLASSES {
            text.push_str(&format!("c{i} 0\n"));
        }
        let names = parse_audit_classes(&text).expect("parses");
        assert_eq!(names[0], "c0");
        assert_eq!(audit_class(Some(&names), 3), "c3");
        assert_eq!(audit_class(None, 3), "class_3");
        assert!(parse_audit_classes("level 1\nmems 0\n").is_none());
    }

    #[test]
    fn the_pool_pending_class_is_the_last() {
        assert_eq!(uapi::ruvm_audit_class_RUVM_AUDIT_POOL_PENDING, 30);
        assert_eq!(uapi::ruvm_audit_class_RUVM_AUDIT_CLASSES, 31);
        let mut text = String::from("level 0\n");
        for i in 0..30 {
            text.push_str(&format!("c{i} 0\n"));
        }
        text.push_str("pool_pending 65536\n");
        let names = parse_audit_classes(&text).expect("31 classes parse");
        assert_eq!(
            audit_class(
                Some(&names),
                uapi::ruvm_audit_class_RUVM_AUDIT_POOL_PENDING as usize
            ),
            "pool_pending"
        );
    }
}
