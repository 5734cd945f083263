// SPDX-License-Identifier: GPL-2.0

//! ruvmctl: the userspace tool for ruvm. Every ioctl of `/dev/ruvm` is a subcommand; `selftest`
//! runs the in-guest test suite.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;

mod dev;
mod ktap;
mod selftest;
mod uapi;

#[derive(Parser)]
#[command(name = "ruvmctl", version = env!("RUVM_VERSION"), about = "Drive the ruvm kernel module through /dev/ruvm")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show the loaded module's version, ABI and features (RUVM_IOCTL_INFO).
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run the in-guest test suite; prints KTAP, exits 0 (pass), 1 (fail) or 4 (skip).
    Selftest {
        /// Run only the cases whose name contains this text.
        #[arg(long)]
        filter: Option<String>,
        /// List the cases and exit.
        #[arg(long)]
        list: bool,
        /// Add a case that fails, to prove the harness notices (for the runner's own tests).
        #[arg(long)]
        plant_failure: bool,
    },
    /// Make the module misbehave on purpose (needs enable_test_ioctls=1 and CAP_SYS_ADMIN).
    TestPlant {
        /// What to plant.
        what: Plant,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Plant {
    /// Hit a WARN_ON in the module.
    Warn,
}

#[derive(Serialize)]
struct InfoOut {
    version: String,
    abi_version: u32,
    features: u64,
    feature_names: Vec<&'static str>,
    test_ioctls: bool,
}

/// Names of the feature bits a module reports (none are defined by ABI 1 yet).
fn feature_names(_bits: u64) -> Vec<&'static str> {
    Vec::new()
}

fn info(json: bool) -> Result<(), String> {
    let d = dev::Ruvm::open().map_err(|e| e.to_string())?;
    let i = d
        .info()
        .map_err(|e| format!("RUVM_IOCTL_INFO: {}", e.desc()))?;
    let out = InfoOut {
        version: dev::c_string(&i.version),
        abi_version: i.abi_version,
        features: i.features,
        feature_names: feature_names(i.features),
        test_ioctls: i.test_ioctls != 0,
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?
        );
    } else {
        println!("ruvm {} (ABI {})", out.version, out.abi_version);
        let names = if out.feature_names.is_empty() {
            "none".to_owned()
        } else {
            out.feature_names.join(" ")
        };
        println!("features:    {names} ({:#x})", out.features);
        println!(
            "test ioctls: {}",
            if out.test_ioctls {
                "enabled"
            } else {
                "disabled"
            }
        );
        if out.abi_version != uapi::RUVM_ABI_VERSION {
            println!(
                "warning: ruvmctl speaks ABI {}, the module ABI {}",
                uapi::RUVM_ABI_VERSION,
                out.abi_version
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Info { json } => info(json),
        Cmd::Selftest { list: true, .. } => {
            selftest::list().iter().for_each(|n| println!("{n}"));
            Ok(())
        }
        Cmd::Selftest {
            filter,
            plant_failure,
            ..
        } => {
            return match selftest::run(filter.as_deref(), plant_failure) {
                Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
                Err(e) => {
                    eprintln!("ruvmctl: selftest output: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Cmd::TestPlant { what: Plant::Warn } => {
            dev::Ruvm::open().map_err(|e| e.to_string()).and_then(|d| {
                d.test_plant(uapi::ruvm_plant_RUVM_PLANT_WARN)
                    .map_err(|e| format!("RUVM_IOCTL_TEST_PLANT: {}", e.desc()))
            })
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ruvmctl: {e}");
            ExitCode::FAILURE
        }
    }
}
