// SPDX-License-Identifier: GPL-2.0

//! One open file of `/dev/ruvm`: its state and the ioctl dispatcher.
//!
//! Each command has one small handler that reads its argument structure from user space,
//! validates every field (reserved and unknown bits included) before acting, and writes the
//! structure back. Unknown commands are `ENOTTY` (Documentation/driver-api/ioctl.rst).

use kernel::{
    fs::File,
    ioctl::_IOC_SIZE,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    prelude::*,
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    bind::{cred, fops},
    uapi,
};

/// The state of one open file of `/dev/ruvm`.
///
/// Today the ABI has no per-file objects yet; allocations (and their handle table) will hang
/// off this structure, and dropping it will free everything the file still owns.
#[pin_data]
pub(crate) struct RuvmFile {}

#[vtable]
impl MiscDevice for RuvmFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        let me = KBox::try_pin_init(try_pin_init!(RuvmFile {}), GFP_KERNEL)?;
        // Last, so that a failure before it leaves no module reference behind.
        fops::pin_module(file)?;
        Ok(me)
    }

    fn ioctl(_me: Pin<&RuvmFile>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        // The command number encodes the argument size, so matching the whole number also
        // checks that the caller was built against the same structure layout.
        let user = UserSlice::new(UserPtr::from_addr(arg), _IOC_SIZE(cmd));
        match cmd {
            uapi::RUVM_IOCTL_INFO => info(user)?,
            uapi::RUVM_IOCTL_TEST_PLANT => test_plant(user)?,
            _ => return Err(ENOTTY),
        }
        Ok(0)
    }
}

/// `ENOSYS`, which the kernel crate has no constant for: what a disabled test ioctl returns,
/// as in UVM.
fn enosys() -> Error {
    // CAST: ENOSYS is 38, which fits a `c_int`.
    Error::from_errno(-(kernel::bindings::ENOSYS as i32))
}

/// True if every element of a reserved field is zero.
fn all_zero<T: Default + PartialEq>(fields: &[T]) -> bool {
    fields.iter().all(|f| *f == T::default())
}

/// `RUVM_IOCTL_INFO`: what the module is and what it supports.
fn info(user: UserSlice) -> Result {
    let (mut reader, mut writer) = user.reader_writer();
    let mut args: uapi::ruvm_info = reader.read()?;
    if args.flags != 0 || args.pad != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    args.abi_version = uapi::RUVM_ABI_VERSION;
    args.features = uapi::RUVM_FEATURES_ALL.into();
    args.test_ioctls = u32::from(crate::test_ioctls_enabled());
    args.version = [0; uapi::RUVM_VERSION_LEN as usize];
    // Keep the terminating NUL: copy at most `len - 1` bytes into the zeroed array.
    let room = args.version.len() - 1;
    for (dst, src) in args
        .version
        .iter_mut()
        .zip(crate::VERSION.bytes().take(room))
    {
        *dst = src;
    }
    writer.write(&args)
}

/// `RUVM_IOCTL_TEST_PLANT`: deliberately misbehave so tests can prove the harness notices.
fn test_plant(user: UserSlice) -> Result {
    if !crate::test_ioctls_enabled() {
        return Err(enosys());
    }
    cred::require_sys_admin()?;
    let args: uapi::ruvm_test_plant = user.reader().read()?;
    if args.flags != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    match args.what {
        uapi::ruvm_plant_RUVM_PLANT_WARN => {
            pr_info!("planting a WARN_ON as asked by a test\n");
            kernel::warn_on!(true);
            Ok(())
        }
        _ => Err(EINVAL),
    }
}
