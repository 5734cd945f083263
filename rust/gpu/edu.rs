// SPDX-License-Identifier: GPL-2.0

//! ruvm's PCI driver for the test GPUs: QEMU `edu` devices (PCI 1234:11e8).
//!
//! Binding one enables it (memory decoding, bus mastering), sets its DMA mask (edu's engine
//! addresses 28 bits, so in the test guest every DMA address comes through the IOMMU) and
//! enters it in the GPU registry; unbinding it marks it gone there.
//!
//! The 7.2 `pci::Vendor` has no constant for QEMU's 0x1234 and no public constructor, so the
//! driver matches edu's class code (0x00ff00) and checks the ids in `probe`.

use kernel::{
    device::Core,
    devres::Devres,
    io::Io,
    new_mutex, pci,
    prelude::*,
    sync::{Arc, Mutex},
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

use crate::{
    bind::dma::{self, DmaDevice},
    gpu::{self, GpuDev, GpuInfo},
    uapi,
};

const EDU_VENDOR: u16 = 0x1234;
const EDU_DEVICE: u16 = 0x11e8;
const EDU_CLASS: u32 = 0x00ff00;
/// The width of edu's DMA addresses (QEMU's default for the device).
const EDU_DMA_BITS: u32 = 28;

/// The part of BAR 0 the engine uses.
const EDU_BAR_SIZE: usize = 0x100;
const REG_DMA_SRC: usize = 0x80;
const REG_DMA_DST: usize = 0x88;
const REG_DMA_COUNT: usize = 0x90;
const REG_DMA_CMD: usize = 0x98;
/// Command bits: start (cleared by the device when done), and direction device -> memory.
const CMD_START: u32 = 1 << 0;
const CMD_TO_MEMORY: u32 = 1 << 1;
/// The device's own buffer, in its DMA address space, and the largest transfer: QEMU 7.2's edu
/// aborts on a transfer of the whole 4096-byte buffer.
const EDU_BUFFER: u64 = 0x40000;
const EDU_MAX_TRANSFER: usize = 4095;
/// How long a transfer may take (edu completes each on a 100 ms timer).
const TRANSFER_TIMEOUT_MS: i64 = 5000;

/// edu's DMA engine: the test GPU's copy engine. Access to its registers is revoked when the
/// device is unbound (`Devres`). It has one set of registers and one buffer, so one copy piece
/// at a time runs on it (`busy`, held per piece, never across a whole copy; a leaf lock).
#[pin_data]
pub(crate) struct EduEngine {
    bar: Devres<pci::Bar<'static, EDU_BAR_SIZE>>,
    #[pin]
    busy: Mutex<()>,
}

impl EduEngine {
    /// The largest piece [`Self::copy`] moves.
    pub(crate) const MAX_PIECE: usize = EDU_MAX_TRANSFER;

    fn write(&self, value: u32, offset: usize) -> Result {
        self.bar
            .try_access_with(|bar| bar.try_write32(value, offset))
            .ok_or(ENODEV)?
    }

    fn read(&self, offset: usize) -> Result<u32> {
        self.bar
            .try_access_with(|bar| bar.try_read32(offset))
            .ok_or(ENODEV)?
    }

    /// One transfer of `len` bytes, waiting for it to finish.
    fn transfer(&self, src: u64, dst: u64, len: usize, to_memory: bool) -> Result {
        if len == 0 || len > EDU_MAX_TRANSFER {
            return Err(EINVAL);
        }
        // edu addresses 28 bits: the low 32 bits are the whole address.
        let (src, dst) = (u32::try_from(src)?, u32::try_from(dst)?);
        // A transfer that timed out may still run, and edu ignores its DMA registers until it
        // ends: its end is waited for before this one is set up.
        self.wait_idle()?;
        self.write(src, REG_DMA_SRC)?;
        self.write(dst, REG_DMA_DST)?;
        self.write(u32::try_from(len)?, REG_DMA_COUNT)?;
        let dir = if to_memory { CMD_TO_MEMORY } else { 0 };
        self.write(CMD_START | dir, REG_DMA_CMD)?;
        self.wait_idle()
    }

    /// Waits until no transfer runs (at most [`TRANSFER_TIMEOUT_MS`]: `ETIMEDOUT`).
    fn wait_idle(&self) -> Result {
        let start = Instant::<Monotonic>::now();
        while self.read(REG_DMA_CMD)? & CMD_START != 0 {
            if start.elapsed() > Delta::from_millis(TRANSFER_TIMEOUT_MS) {
                return Err(ETIMEDOUT);
            }
            fsleep(Delta::from_millis(1));
        }
        Ok(())
    }

    /// Reads `len` bytes at DMA address `src` into the device's buffer: the first half of a copy,
    /// alone (for tests that aim the engine at an address on purpose).
    pub(crate) fn read_into_device(&self, src: u64, len: usize) -> Result {
        let _busy = self.busy.lock();
        self.transfer(src, EDU_BUFFER, len, false)
    }

    /// Copies `len` bytes (at most [`Self::MAX_PIECE`]) from DMA address `src` to `dst`, through
    /// the device's buffer: memory -> device, then device -> memory.
    pub(crate) fn copy(&self, dst: u64, src: u64, len: usize) -> Result {
        let _busy = self.busy.lock();
        self.transfer(src, EDU_BUFFER, len, false)?;
        self.transfer(EDU_BUFFER, dst, len, true)
    }
}

/// The driver.
pub(crate) struct EduDriver;

/// A bound edu device: its registry entry, unregistered when it is unbound (dropping its
/// mappings while the device is still bound).
pub(crate) struct EduGpu {
    dev: Arc<GpuDev>,
}

impl Drop for EduGpu {
    fn drop(&mut self) {
        gpu::unregister(&self.dev);
    }
}

kernel::pci_device_table!(
    EDU_TABLE,
    MODULE_EDU_TABLE,
    <EduDriver as pci::Driver>::IdInfo,
    [(pci::DeviceId::from_class(EDU_CLASS, 0xffffff), ())]
);

impl pci::Driver for EduDriver {
    type IdInfo = ();
    type Data<'bound> = EduGpu;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &EDU_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: &'bound Self::IdInfo,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        probe(pdev)
    }
}

fn probe(pdev: &pci::Device<Core<'_>>) -> Result<EduGpu> {
    let (vendor, device) = (pdev.vendor_id().as_raw(), pdev.device_id());
    if (vendor, device) != (EDU_VENDOR, EDU_DEVICE) {
        // Same class, another device: not ours.
        return Err(ENODEV);
    }
    let bdf = pdev.dev_id();
    // CAST: `dev_id` is bus << 8 | devfn; each part is a byte.
    let (bus, devfn) = ((bdf >> 8) as u8, (bdf & 0xff) as u8);
    if gpu::is_host(bus, devfn) {
        // Named as a host GPU: used for DMA mapping only, never bound.
        return Err(ENODEV);
    }
    let attached = |pdev: &pci::Device<Core<'_>>| {
        dev_err!(
            pdev,
            "attached as a host GPU: detach it before binding ruvm-edu\n"
        );
        EEXIST
    };
    // Attached at run time as a host GPU: left alone (the registry checks again, atomically,
    // when the GPU registers below).
    let addr = gpu::PciAddr {
        domain: 0,
        bus,
        devfn,
    };
    if gpu::pci_present(addr) {
        return Err(attached(pdev));
    }
    pdev.enable_device_mem()?;
    pdev.set_master();
    dma::set_mask::<EDU_DMA_BITS>(pdev)?;
    let bar = pdev
        .iomap_region_sized::<EDU_BAR_SIZE>(0, c"ruvm-edu")?
        .into_devres()?;
    let engine = KBox::pin_init(
        try_pin_init!(EduEngine {
            bar,
            busy <- new_mutex!(()),
        }),
        GFP_KERNEL,
    )?;
    let dev = gpu::register(
        GpuInfo {
            kind: uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU,
            vendor,
            device,
            domain: 0,
            // CAST: `dev_id` is bus << 8 | devfn; each part is a byte.
            bus: (bdf >> 8) as u8,
            devfn: (bdf & 0xff) as u8,
            dma_mask_bits: EDU_DMA_BITS,
            page_sizes: gpu::TEST_PAGE_SIZES,
        },
        DmaDevice::new(pdev),
        Some(gpu::Engine::Edu(engine)),
    )
    .map_err(|e| if e == EEXIST { attached(pdev) } else { e })?;
    dev_info!(pdev, "test GPU {} (edu)\n", dev.id);
    Ok(EduGpu { dev })
}
