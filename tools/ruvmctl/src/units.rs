// SPDX-License-Identifier: GPL-2.0

//! Sizes on the command line: `4096`, `64K`, `2M`, `1G`, and sums such as `7M+17`.

/// Parses a size: terms with an optional K/M/G suffix (powers of 1024), joined by `+`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let mut total: u64 = 0;
    for term in s.split('+') {
        let term = term.trim();
        let (digits, shift) = match term.chars().last() {
            Some('k' | 'K') => (&term[..term.len() - 1], 10),
            Some('m' | 'M') => (&term[..term.len() - 1], 20),
            Some('g' | 'G') => (&term[..term.len() - 1], 30),
            _ => (term, 0),
        };
        let n: u64 = if let Some(hex) = digits.strip_prefix("0x") {
            u64::from_str_radix(hex, 16)
        } else {
            digits.parse()
        }
        .map_err(|_| format!("'{s}' is not a size (e.g. 4096, 64K, 2M, 7M+17)"))?;
        let v = n
            .checked_mul(1 << shift)
            .ok_or_else(|| format!("'{s}' is too large"))?;
        total = total
            .checked_add(v)
            .ok_or_else(|| format!("'{s}' is too large"))?;
    }
    Ok(total)
}

/// A size for people: `7 MiB + 17 B` style is overkill; bytes with a binary unit when exact.
pub fn show_size(n: u64) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert_eq!(parse_size("7M+17"), Ok((7 << 20) + 17));
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert!(parse_size("3X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("17179869184G").is_err());
        assert!(parse_size("18446744073709551615+1").is_err());
    }

    #[test]
    fn shown_sizes() {
        assert_eq!(show_size(4096), "4K");
        assert_eq!(show_size(2 << 20), "2M");
        assert_eq!(show_size((7 << 20) + 17), ((7u64 << 20) + 17).to_string());
        assert_eq!(show_size(0), "0");
    }
}
