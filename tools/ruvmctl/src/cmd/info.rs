// SPDX-License-Identifier: GPL-2.0

//! `ruvmctl info`: what the loaded module is (`RUVM_IOCTL_INFO`).

use anyhow::Result;
use libruvm::{c_string, cmd, names, uapi, Ruvm};
use serde::Serialize;

use crate::{
    output::{fields, Report},
    units::show_size,
};

#[derive(Serialize)]
pub struct Info {
    version: String,
    abi_version: u32,
    features: u64,
    feature_names: Vec<String>,
    test_ioctls: bool,
    live_mems: u64,
    live_bytes: u64,
    max_alloc_bytes: u64,
    max_file_bytes: u64,
}

pub fn info(d: &Ruvm) -> Result<Info> {
    let mut i = uapi::ruvm_info::default();
    super::call(d, cmd::INFO, &mut i)?;
    Ok(Info {
        version: c_string(&i.version),
        abi_version: i.abi_version,
        features: i.features,
        feature_names: names::bit_names(names::FEATURES, i.features),
        test_ioctls: i.test_ioctls != 0,
        live_mems: i.live_mems,
        live_bytes: i.live_bytes,
        max_alloc_bytes: i.max_alloc_bytes,
        max_file_bytes: i.max_file_bytes,
    })
}

impl Report for Info {
    fn render(&self) -> String {
        let names = if self.feature_names.is_empty() {
            "none".to_owned()
        } else {
            self.feature_names.join(" ")
        };
        let mut out = format!("ruvm {} (ABI {})\n", self.version, self.abi_version);
        out += &fields([
            ("features", format!("{names} ({:#x})", self.features)),
            (
                "test ioctls",
                if self.test_ioctls {
                    "enabled"
                } else {
                    "disabled"
                }
                .to_owned(),
            ),
            (
                "live mems",
                format!("{} ({} bytes)", self.live_mems, self.live_bytes),
            ),
            (
                "limits",
                format!(
                    "{} per mem, {} per open file",
                    show_size(self.max_alloc_bytes),
                    show_size(self.max_file_bytes)
                ),
            ),
        ]);
        if self.abi_version != uapi::RUVM_ABI_VERSION {
            out += &format!(
                "\nwarning: ruvmctl speaks ABI {}, the module ABI {}",
                uapi::RUVM_ABI_VERSION,
                self.abi_version
            );
        }
        out
    }
}
