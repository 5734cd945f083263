// SPDX-License-Identifier: GPL-2.0

//! ruvm's PCI driver for the test GPUs: QEMU `edu` devices (PCI 1234:11e8).
//!
//! Binding one enables it (memory decoding, bus mastering), sets its DMA mask (edu's engine
//! addresses 28 bits, so in the test guest every DMA address comes through the IOMMU), requests
//! its interrupt and enters it in the GPU registry; unbinding it marks it gone there.
//!
//! A transfer's end comes from the device's interrupt (edu raises 0x100 when a DMA asked to do
//! so finishes): the engine waits for the handler's signal, not by polling, so the test GPU is
//! a real asynchronous signaller (a stream's fences signal after it).
//!
//! The 7.2 `pci::Vendor` has no constant for QEMU's 0x1234 and no public constructor, so the
//! driver matches edu's class code (0x00ff00) and checks the ids in `probe`.

use kernel::{
    device::{Bound, Core, Device},
    devres::Devres,
    io::Io,
    irq::{self, IrqReturn},
    new_mutex, pci,
    prelude::*,
    sync::{Arc, Mutex},
};

use crate::{
    bind::{
        completion::Done,
        dma::{self, DmaDevice},
    },
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
/// The interrupt status (raised interrupts, ORed) and acknowledge (clears the bits written).
const REG_IRQ_STATUS: usize = 0x24;
const REG_IRQ_ACK: usize = 0x64;
/// Command bits: start (cleared by the device when done), direction device -> memory, and
/// raise [`IRQ_DMA`] when done.
const CMD_START: u32 = 1 << 0;
const CMD_TO_MEMORY: u32 = 1 << 1;
const CMD_IRQ: u32 = 1 << 2;
/// The interrupt a finished DMA raises.
const IRQ_DMA: u32 = 0x100;
/// The device's own buffer, in its DMA address space, and the largest transfer: QEMU 7.2's edu
/// aborts on a transfer of the whole 4096-byte buffer.
const EDU_BUFFER: u64 = 0x40000;
const EDU_MAX_TRANSFER: usize = 4095;
/// How long a transfer may take (edu completes each on a 100 ms timer).
const TRANSFER_TIMEOUT_MS: u32 = 5000;

/// edu's DMA engine: the test GPU's copy engine. Access to its registers is revoked when the
/// device is unbound (`Devres`). It has one set of registers and one buffer, so one copy piece
/// at a time runs on it (`busy`, held per piece, never across a whole copy; a leaf lock).
#[pin_data]
pub(crate) struct EduEngine {
    bar: Devres<pci::Bar<'static, EDU_BAR_SIZE>>,
    #[pin]
    busy: Mutex<()>,
    /// Signalled by the interrupt handler when a transfer ends.
    #[pin]
    done: Done,
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
        // A transfer that timed out may still run: edu ignores the DMA registers until it ends,
        // so its end (and its interrupt) is waited for before this one is set up.
        if self.read(REG_DMA_CMD)? & CMD_START != 0 {
            for _ in 0..2 {
                self.done.wait(TRANSFER_TIMEOUT_MS);
                if self.read(REG_DMA_CMD)? & CMD_START == 0 {
                    break;
                }
            }
            if self.read(REG_DMA_CMD)? & CMD_START != 0 {
                return Err(ETIMEDOUT);
            }
        }
        self.write(src, REG_DMA_SRC)?;
        self.write(dst, REG_DMA_DST)?;
        self.write(u32::try_from(len)?, REG_DMA_COUNT)?;
        let dir = if to_memory { CMD_TO_MEMORY } else { 0 };
        // No transfer is running (one at a time, under `busy`): nothing signals before this.
        self.done.reset();
        self.write(CMD_START | CMD_IRQ | dir, REG_DMA_CMD)?;
        // The interrupt says it ended; the command register confirms (a signal left over from
        // an earlier transfer that timed out is not taken for this one's).
        for _ in 0..2 {
            if !self.done.wait(TRANSFER_TIMEOUT_MS) {
                return Err(ETIMEDOUT);
            }
            if self.read(REG_DMA_CMD)? & CMD_START == 0 {
                return Ok(());
            }
        }
        Err(ETIMEDOUT)
    }

    /// The interrupt handler's part: acknowledges a DMA interrupt and signals the waiter.
    /// Whether the interrupt was this device's.
    fn interrupt(&self) -> bool {
        let Ok(status) = self.read(REG_IRQ_STATUS) else {
            return false;
        };
        if status & IRQ_DMA == 0 {
            return false;
        }
        let _ = self.write(status, REG_IRQ_ACK);
        self.done.signal();
        true
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

/// edu's interrupt handler.
pub(crate) struct EduIrq {
    engine: Arc<EduEngine>,
}

impl irq::Handler for EduIrq {
    fn handle(&self, _dev: &Device<Bound>) -> IrqReturn {
        if self.engine.interrupt() {
            IrqReturn::Handled
        } else {
            IrqReturn::None
        }
    }
}

/// A bound edu device: its registry entry, unregistered when it is unbound (dropping its
/// mappings while the device is still bound, and while its interrupt is still requested: a
/// transfer in flight during the removal ends by it), then its interrupt.
#[pin_data(PinnedDrop)]
pub(crate) struct EduGpu {
    dev: Arc<GpuDev>,
    #[pin]
    irq: irq::Registration<EduIrq>,
}

#[pinned_drop]
impl PinnedDrop for EduGpu {
    fn drop(self: Pin<&mut Self>) {
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
        pin_init::pin_init_scope(move || {
            let engine = prepare(pdev)?;
            // Its INTx line (shared): MSI would add the kernel's MSI and interrupt-remapping
            // allocations to every probe, for one vector that fires at most every 100 ms.
            let intx = pci::IrqTypes::default().with(pci::IrqType::Intx);
            let vector = *pdev.alloc_irq_vectors(1, 1, intx)?.start();
            let handler = EduIrq {
                engine: engine.clone(),
            };
            // The interrupt first, the registry entry last: a failure of either leaves no
            // GPU registered.
            Ok(try_pin_init!(EduGpu {
                irq <- pdev.request_irq(
                    vector,
                    irq::Flags::SHARED,
                    c"ruvm-edu",
                    Ok::<_, Error>(handler)
                ),
                dev: register(pdev, engine)?,
            }? Error))
        })
    }
}

/// Checks the device is ours, enables it and maps its registers: its engine.
fn prepare(pdev: &pci::Device<Core<'_>>) -> Result<Arc<EduEngine>> {
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
    Arc::pin_init(
        try_pin_init!(EduEngine {
            bar,
            busy <- new_mutex!(()),
            done <- Done::new(),
        }),
        GFP_KERNEL,
    )
}

/// Enters the device in the GPU registry with its engine.
fn register(pdev: &pci::Device<Core<'_>>, engine: Arc<EduEngine>) -> Result<Arc<GpuDev>> {
    let (vendor, device) = (pdev.vendor_id().as_raw(), pdev.device_id());
    let bdf = pdev.dev_id();
    let attached = |pdev: &pci::Device<Core<'_>>| {
        dev_err!(
            pdev,
            "attached as a host GPU: detach it before binding ruvm-edu\n"
        );
        EEXIST
    };
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
    Ok(dev)
}
