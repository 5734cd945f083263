// SPDX-License-Identifier: GPL-2.0

//! Generates, from `include/uapi/linux/ruvm.h` (the single source of truth for the ABI, shared
//! with the module): its Rust view with bindgen, and the names of its feature and flag bits.

use std::{env, fmt::Write as _, path::PathBuf};

/// The bits of one family as `(constant, name)`, read from the header's text: `#define PREFIXX
/// (1ULL << n)` lines, or the members of `enum NAME` (each of whose constants bindgen names
/// `NAME_MEMBER`). `*_ALL` unions are left out. Names are lower case with dashes.
fn bits(header: &str, family: &Family) -> Vec<(String, String)> {
    let name_of = |member: &str| {
        member
            .trim_start_matches(family.strip)
            .to_ascii_lowercase()
            .replace('_', "-")
    };
    let mut out = Vec::new();
    match family.source {
        Source::Defines(prefix) => {
            for line in header.lines() {
                let Some(rest) = line.strip_prefix("#define ") else {
                    continue;
                };
                let mut words = rest.split_whitespace();
                let (Some(member), Some(value)) = (words.next(), words.next()) else {
                    continue;
                };
                if member.starts_with(prefix) && !member.ends_with("_ALL") && value.starts_with('(')
                {
                    out.push((member.to_owned(), name_of(member)));
                }
            }
        }
        Source::Enum(enum_name) => {
            let start = format!("enum {enum_name} {{");
            let Some(at) = header.find(&start) else {
                panic!("enum {enum_name} is not in the header");
            };
            let body = &header[at + start.len()..];
            let body = &body[..body.find("};").expect("unterminated enum")];
            for line in body.lines() {
                let line = line.trim();
                let Some((member, _)) = line.split_once('=') else {
                    continue;
                };
                let member = member.trim();
                if member.starts_with("RUVM_") && !member.ends_with("_ALL") {
                    out.push((format!("{enum_name}_{member}"), name_of(member)));
                }
            }
        }
    }
    out
}

enum Source {
    Defines(&'static str),
    Enum(&'static str),
}

struct Family {
    /// The Rust name of the generated table.
    table: &'static str,
    source: Source,
    /// What the names drop from the constants' names.
    strip: &'static str,
    /// The table's doc comment.
    doc: &'static str,
}

const FAMILIES: [Family; 11] = [
    Family {
        table: "FEATURES",
        source: Source::Defines("RUVM_FEATURE_"),
        strip: "RUVM_FEATURE_",
        doc: "The feature bits of `ruvm_info.features` (`RUVM_FEATURE_*`).",
    },
    Family {
        table: "ALLOC_FLAGS",
        source: Source::Enum("ruvm_alloc_flags"),
        strip: "RUVM_ALLOC_",
        doc: "The flags of `ruvm_mem_alloc.flags` (`enum ruvm_alloc_flags`).",
    },
    Family {
        table: "GPU_FLAGS",
        source: Source::Enum("ruvm_gpu_flags"),
        strip: "RUVM_GPU_",
        doc: "The flags of `ruvm_gpu_info.flags` (`enum ruvm_gpu_flags`).",
    },
    Family {
        table: "MAPPED",
        source: Source::Enum("ruvm_mapped"),
        strip: "RUVM_MAPPED_",
        doc: "The bits of `ruvm_mem_query.mapped` (`enum ruvm_mapped`).",
    },
    Family {
        table: "GPU_KINDS",
        source: Source::Enum("ruvm_gpu_kind"),
        strip: "RUVM_GPU_KIND_",
        doc: "The values of `ruvm_gpu_info.kind` (`enum ruvm_gpu_kind`).",
    },
    Family {
        table: "OP_KINDS",
        source: Source::Enum("ruvm_op_kind"),
        strip: "RUVM_OP_",
        doc: "The values of `ruvm_op.kind` (`enum ruvm_op_kind`).",
    },
    Family {
        table: "OP_FLAGS",
        source: Source::Enum("ruvm_op_flags"),
        strip: "RUVM_OP_",
        doc: "The index flags of `ruvm_op.flags` for COPY, FILL and FREE (`enum ruvm_op_flags`).",
    },
    Family {
        table: "POOL_REUSE",
        source: Source::Enum("ruvm_pool_reuse"),
        strip: "RUVM_POOL_REUSE_",
        doc: "The reuse policies of `ruvm_pool_info.reuse` (`enum ruvm_pool_reuse`).",
    },
    Family {
        table: "POOL_FLAGS",
        source: Source::Enum("ruvm_pool_flags"),
        strip: "RUVM_POOL_FLAG_",
        doc: "The flags of `ruvm_pool_info.pool_flags` (`enum ruvm_pool_flags`).",
    },
    Family {
        table: "PTR_TYPES",
        source: Source::Enum("ruvm_ptr_type"),
        strip: "RUVM_PTR_",
        doc: "The values of `ruvm_ptr_attrs.type` (`enum ruvm_ptr_type`).",
    },
    Family {
        table: "PTR_FLAGS",
        source: Source::Enum("ruvm_ptr_flags"),
        strip: "RUVM_PTR_",
        doc: "The flags of `ruvm_ptr_attrs.ptr_flags` (`enum ruvm_ptr_flags`).",
    },
];

fn main() {
    let top = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("../..");
    let header = top.join("include/uapi/linux/ruvm.h");
    let version = top.join("VERSION");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed={}", version.display());

    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_file(".*/ruvm\\.h")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .derive_debug(true)
        .generate()
        .expect("bindgen failed on include/uapi/linux/ruvm.h");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("uapi_generated.rs"))
        .expect("cannot write the generated bindings");

    let text = std::fs::read_to_string(&header).expect("cannot read the uapi header");
    let mut names = String::new();
    for f in &FAMILIES {
        writeln!(names, "/// {}", f.doc).expect("string write");
        writeln!(names, "pub const {}: &[(u64, &str)] = &[", f.table).expect("string write");
        for (constant, name) in bits(&text, f) {
            // CAST: every bit family of the header fits 64 bits.
            writeln!(names, "    (uapi::{constant} as u64, {name:?}),").expect("string write");
        }
        writeln!(names, "];").expect("string write");
    }
    std::fs::write(out.join("names_generated.rs"), names).expect("cannot write the names");

    let v = std::fs::read_to_string(&version).expect("cannot read VERSION");
    println!("cargo:rustc-env=RUVM_VERSION={}", v.trim());
}
