// SPDX-License-Identifier: GPL-2.0

//! Prints what the loaded ruvm module is, and allocates, maps, fills and checks one mem.
//!
//! `cargo run --example info` (with ruvm loaded and `/dev/ruvm` present).

use libruvm::{c_string, cmd, names, uapi, Ruvm, UserMap};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Ruvm::open()?;
    let mut info = uapi::ruvm_info::default();
    dev.call(cmd::INFO, &mut info)?;
    println!(
        "ruvm {} (ABI {}), features: {}",
        c_string(&info.version),
        info.abi_version,
        names::bit_names(names::FEATURES, info.features).join(" ")
    );

    let mut alloc = uapi::ruvm_mem_alloc {
        size: 64 << 10,
        flags: uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO,
        ..Default::default()
    };
    dev.call(cmd::MEM_ALLOC, &mut alloc)?;
    let q = dev.mem_query(alloc.handle)?;
    let map = UserMap::of_mem(&dev, &q)?;
    map.write(4097, 0x5a);
    dev.map_kernel(alloc.handle)?;
    let mut check = uapi::ruvm_mem_fill {
        handle: alloc.handle,
        offset: 4097,
        length: 1,
        kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
        seed: 0x5a,
        ..Default::default()
    };
    dev.call(cmd::MEM_VERIFY, &mut check)?;
    println!(
        "mem {}: {} chunks of {} bytes; the byte written through mmap reads back through the kernel: {}",
        alloc.handle,
        alloc.chunk_count,
        alloc.chunk_size,
        if check.mismatches == 0 { "yes" } else { "no" }
    );
    drop(map);
    dev.mem_free(alloc.handle)?;
    Ok(())
}
