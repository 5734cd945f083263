// SPDX-License-Identifier: GPL-2.0

//! How a command's result is shown: each command produces one value ([`Report`]) that renders
//! as text with tables for a person, or as JSON (`--json`) for a script.

use anyhow::{bail, Result};
use comfy_table::{presets::NOTHING, Cell, CellAlignment, Table};
use serde::Serialize;

/// What one command produced.
pub trait Report: Serialize {
    /// The value for a person: lines and tables.
    fn render(&self) -> String;

    /// Why the command fails although it ran (a mismatch, a leak), if it does.
    fn failure(&self) -> Option<String> {
        None
    }
}

/// Prints `report` (as JSON with `json`), then fails if the report says so.
pub fn emit(report: &impl Report, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        let text = report.render();
        if !text.is_empty() {
            println!("{}", text.trim_end());
        }
    }
    match report.failure() {
        Some(why) => bail!(why),
        None => Ok(()),
    }
}

/// A command with nothing to show.
#[derive(Serialize)]
pub struct Done {}

impl Report for Done {
    fn render(&self) -> String {
        String::new()
    }
}

/// A plain table: a header row, then rows; numbers (cells that parse as such) right-aligned.
pub fn table<R, C>(header: &[&str], rows: R) -> String
where
    R: IntoIterator<Item = C>,
    C: IntoIterator<Item = String>,
{
    let mut t = Table::new();
    t.load_preset(NOTHING);
    if !header.is_empty() {
        t.set_header(header.iter().map(Cell::new));
    }
    for row in rows {
        t.add_row(row.into_iter().map(|c| {
            let numeric = !c.is_empty() && c.chars().all(|ch| ch.is_ascii_digit());
            let cell = Cell::new(c);
            if numeric {
                cell.set_alignment(CellAlignment::Right)
            } else {
                cell
            }
        }));
    }
    // No margin on the left, two spaces between columns.
    for c in t.column_iter_mut() {
        c.set_padding((0, 2));
    }
    t.trim_fmt()
}

/// `name: value` lines, the names aligned.
pub fn fields<'a>(rows: impl IntoIterator<Item = (&'a str, String)>) -> String {
    table(&[], rows.into_iter().map(|(k, v)| [format!("{k}:"), v]))
}
