// SPDX-License-Identifier: GPL-2.0

//! Generates the Rust view of `include/uapi/linux/ruvm.h` with bindgen: the header is the
//! single source of truth for the ABI, shared with the module.

use std::{env, path::PathBuf};

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

    let v = std::fs::read_to_string(&version).expect("cannot read VERSION");
    println!("cargo:rustc-env=RUVM_VERSION={}", v.trim());
}
