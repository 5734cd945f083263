// SPDX-License-Identifier: GPL-2.0

//! String module parameters: 7.2's `module!` macro makes integer parameters only.
//!
//! C header: [`include/linux/moduleparam.h`](srctree/include/linux/moduleparam.h)
//!
//! [`str_param!`] declares one the way `module!` declares its own: a `struct kernel_param` in
//! the module's `__param` section (read by the kernel when it parses the load's arguments, before
//! module init), with `parm`/`parmtype` strings in `.modinfo` for `modinfo`. Its value is kept
//! in a [`StrParam`]: copied once, at most [`STR_PARAM_MAX`] bytes, never in sysfs. The state is
//! declared by the module that owns it; this file holds none.

use kernel::ffi::{c_char, c_int};

use kernel::{bindings, prelude::*, str::CStr, sync::SetOnce};

/// The longest value a string parameter keeps, in bytes (a longer one fails the load).
pub(crate) const STR_PARAM_MAX: usize = 256;

/// A string parameter's value.
#[derive(Clone, Copy)]
struct Value {
    bytes: [u8; STR_PARAM_MAX],
    len: usize,
}

/// A string module parameter's storage, declared by [`str_param!`].
pub(crate) struct StrParam {
    name: &'static str,
    value: SetOnce<Value>,
}

impl StrParam {
    #[doc(hidden)]
    pub(crate) const fn new(name: &'static str) -> Self {
        Self {
            name,
            value: SetOnce::new(),
        }
    }

    /// The value given at load, or empty when none was.
    pub(crate) fn value(&self) -> &[u8] {
        self.value
            .as_ref()
            .and_then(|v| v.bytes.get(..v.len))
            .unwrap_or(&[])
    }

    /// Keeps `arg`: `EINVAL` when it is too long, `EEXIST` when the parameter was given twice.
    fn set(&self, arg: &[u8]) -> Result {
        let mut value = Value {
            bytes: [0; STR_PARAM_MAX],
            len: arg.len(),
        };
        let Some(dst) = value.bytes.get_mut(..arg.len()) else {
            pr_err!(
                "{}: longer than {STR_PARAM_MAX} bytes ({})\n",
                self.name,
                arg.len()
            );
            return Err(EINVAL);
        };
        dst.copy_from_slice(arg);
        if self.value.populate(value) {
            Ok(())
        } else {
            pr_err!("{}: given more than once\n", self.name);
            Err(EEXIST)
        }
    }

    /// The address the kernel hands back to [`set`] (`kernel_param.arg`).
    #[doc(hidden)]
    pub(crate) const fn as_arg(&'static self) -> *mut c_void {
        core::ptr::from_ref(self).cast_mut().cast()
    }
}

/// The kernel's `set` callback of every string parameter.
///
/// # Safety
///
/// `val` is NULL or a NUL-terminated string; `param` is a `kernel_param` made by [`str_param!`],
/// whose `arg` is a `&'static StrParam`. The kernel calls it so.
unsafe extern "C" fn set(val: *const c_char, param: *const bindings::kernel_param) -> c_int {
    if val.is_null() || param.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: `val` is a NUL-terminated string the kernel keeps for this call (contract).
    let arg = unsafe { CStr::from_char_ptr(val) };
    // SAFETY: `param` is a `kernel_param` of `str_param!`, whose `arg` points to a static
    // `StrParam` (contract); reading the union's `arg` field reads what the macro wrote there.
    let storage = unsafe { &*((*param).__bindgen_anon_1.arg.cast::<StrParam>()) };
    match storage.set(arg.to_bytes()) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// A `.modinfo` string as the array the section holds (evaluated at compile time only: `N` is
/// the string's length, so every index is in bounds).
#[doc(hidden)]
pub(crate) const fn modinfo<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut rest = s.as_bytes();
    let mut i = 0;
    while let Some((&b, tail)) = rest.split_first() {
        if i < N {
            out[i] = b;
        }
        i += 1;
        rest = tail;
    }
    out
}

/// The operations of every string parameter.
#[doc(hidden)]
pub(crate) static STR_PARAM_OPS: bindings::kernel_param_ops = bindings::kernel_param_ops {
    flags: 0,
    set: Some(set),
    get: None,
    free: None,
};

/// Declares a string module parameter:
/// `str_param!(pub(crate) static NAME, "name", "description");` then `NAME.value()`.
macro_rules! str_param {
    ($vis:vis static $static:ident, $name:literal, $desc:literal) => {
        $vis static $static: $crate::bind::param::StrParam =
            $crate::bind::param::StrParam::new($name);

        const _: () = {
            #[link_section = "__param"]
            #[used(compiler)]
            static PARAM: ::kernel::module_param::KernelParam =
                ::kernel::module_param::KernelParam::new(::kernel::bindings::kernel_param {
                    name: ::core::concat!($name, "\0").as_ptr().cast(),
                    // Only the address of the module's `struct module`, which the kernel fills in
                    // when it loads the module.
                    mod_: &raw mut ::kernel::bindings::__this_module,
                    ops: ::core::ptr::from_ref(&$crate::bind::param::STR_PARAM_OPS),
                    // Not in sysfs.
                    perm: 0,
                    level: -1,
                    flags: 0,
                    __bindgen_anon_1: ::kernel::bindings::kernel_param__bindgen_ty_1 {
                        arg: $static.as_arg(),
                    },
                });

            #[link_section = ".modinfo"]
            #[used(compiler)]
            static PARMTYPE: [u8; ::core::concat!("parmtype=", $name, ":charp\0").len()] =
                $crate::bind::param::modinfo(::core::concat!("parmtype=", $name, ":charp\0"));

            #[link_section = ".modinfo"]
            #[used(compiler)]
            static PARM: [u8; ::core::concat!("parm=", $name, ":", $desc, "\0").len()] =
                $crate::bind::param::modinfo(::core::concat!("parm=", $name, ":", $desc, "\0"));
        };
    };
}
pub(crate) use str_param;
